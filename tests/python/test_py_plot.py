"""`pinstage bench ... --json` draws a PNG next to its report, and pinstage.plot draws
every arm's bars and the memcpy line (checked on the Figure's artists, then the file)."""
import json
import re
import subprocess

import pytest

matplotlib = pytest.importorskip("matplotlib")

ARMS = ["pageable", "pinned", "staged"]
GROUPS = 2


@pytest.fixture(scope="module")
def report(cli, tmp_path_factory):
    out = tmp_path_factory.mktemp("plot") / "bench.json"
    done = subprocess.run(
        [str(cli), "bench", "synthetic", "--tensors", "2", "--bytes", "1M", "--groups",
         str(GROUPS), "--rounds", "2", "--arms", ",".join(ARMS), "--json", str(out)],
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return out, done.stdout


def test_bench_writes_the_png_next_to_the_report(report):
    path, stdout = report
    png = path.with_suffix(".png")
    assert f"picture: {png}" in stdout
    data = png.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    import matplotlib.image

    image = matplotlib.image.imread(str(png))
    height, width = image.shape[:2]
    assert (width, height) == (1760, 572)


def test_render_draws_every_arm_in_every_panel(report):
    from pinstage import plot

    doc = plot.load_report(str(report[0]))
    fig = plot.render(doc)
    ax_lat, ax_up, ax_ph = fig.axes
    for ax in (ax_lat, ax_up):
        containers = {c.get_label(): c for c in ax.containers}
        for arm in ARMS:
            bars = containers[arm]
            assert len(bars) == GROUPS
            assert all(bar.get_height() > 0 for bar in bars)
    # The upload panel's baseline, at the median memcpy rate of the report.
    lines = [line for line in ax_up.get_lines() if line.get_gid() == "memcpy"]
    assert len(lines) == 1
    # The phases are stacked per arm: the upload segment exists for all three arms.
    phases = {c.get_label(): c for c in ax_ph.containers}
    assert len(phases["upload"]) == len(ARMS)
    assert all(bar.get_height() > 0 for bar in phases["upload"])
    # Each segment starts where the ones below it end, and the axis shows the whole stack.
    tops = [0.0] * len(ARMS)
    for container in ax_ph.containers:
        for i, bar in enumerate(container):
            assert bar.get_y() == pytest.approx(tops[i]), (container.get_label(), ARMS[i])
            tops[i] += bar.get_height()
    assert len(ax_ph.containers) >= 2
    assert ax_ph.get_ylim()[0] == 0 and ax_ph.get_ylim()[1] >= max(tops)
    import matplotlib.pyplot

    matplotlib.pyplot.close(fig)


def test_plot_refuses_a_file_that_is_not_a_bench_report(tmp_path, cli):
    bad = tmp_path / "x.json"
    bad.write_text(json.dumps({"hello": 1}))
    done = subprocess.run([str(cli), "plot", str(bad), "--out", str(tmp_path / "x.png")],
                          capture_output=True, text=True)
    assert done.returncode == 1
    assert "not a report of pinstage bench --json" in done.stderr
    assert not (tmp_path / "x.png").exists()


def _without_arm(doc: dict, arm: str) -> dict:
    doc = json.loads(json.dumps(doc))
    for group in doc["groups"]:
        group["arms"] = [a for a in group["arms"] if a["arm"] != arm]
    return doc


def test_plot_names_a_config_arm_that_no_group_ran(report, tmp_path, cli):
    """An arm of config.arms missing from a group is an error naming the arm and the group
    (every group runs every arm, so the report is damaged): never StopIteration, and no
    bars of zeros that would read as a measurement."""
    from pinstage import plot

    bad = tmp_path / "no_staged.json"
    bad.write_text(json.dumps(_without_arm(plot.load_report(str(report[0])), "staged")))
    with pytest.raises(ValueError, match=r"config\.arms lists 'staged', but groups\[0\] has no "
                                         r"run of it"):
        plot.render(plot.load_report(str(bad)))
    done = subprocess.run([str(cli), "plot", str(bad), "--out", str(tmp_path / "x.png")],
                          capture_output=True, text=True)
    assert done.returncode == 1
    assert f"cannot plot {bad}: config.arms lists 'staged'" in done.stderr, done.stderr
    assert "StopIteration" not in done.stderr
    assert not (tmp_path / "x.png").exists()


@pytest.mark.parametrize("drop,path", [
    (lambda d: d["groups"][0]["arms"][1].pop("stats"), "groups[0].arms[1].stats"),
    (lambda d: d["groups"][1]["arms"][0]["stats"].pop("min_seconds"),
     "groups[1].arms[0].stats.min_seconds"),
    (lambda d: d["groups"][0]["arms"][0].pop("binds"), "groups[0].arms[0].binds"),
    (lambda d: d["config"].pop("arms"), "config.arms"),
])
def test_plot_names_a_missing_key(report, drop, path):
    from pinstage import plot

    doc = plot.load_report(str(report[0]))
    drop(doc)
    with pytest.raises(ValueError, match="^" + re.escape(path + " is missing") + "$"):
        plot.render(doc)


def test_plot_refuses_a_fifo_without_blocking(tmp_path):
    import os
    from pinstage import plot
    fifo = tmp_path / "report.json"
    os.mkfifo(fifo)
    with pytest.raises(ValueError, match="not a regular file"):
        plot.load_report(str(fifo))


def _small_checkpoint(path):
    import struct
    header = {"a": {"dtype": "F32", "shape": [256, 1024], "data_offsets": [0, 1 << 20]},
              "b": {"dtype": "BF16", "shape": [1024], "data_offsets": [1 << 20, (1 << 20) + 2048]}}
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + bytes((1 << 20) + 2048))


def _run(cli, *args):
    done = subprocess.run([str(cli), *args], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return done


def _legends_outside_the_axes(fig):
    """No legend overlaps the area of any axes (so none covers a bar)."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    for ax in fig.axes:
        legend = ax.get_legend()
        if legend is None:
            continue
        box = legend.get_window_extent(renderer)
        for other in fig.axes:
            assert not box.overlaps(other.get_window_extent(renderer)), ax.get_title()


def test_a_load_report_draws_every_arm_and_every_target(cli, tmp_path):
    from pinstage import plot

    ckpt = tmp_path / "c.safetensors"
    _small_checkpoint(ckpt)
    out = tmp_path / "load.json"
    _run(cli, "bench", "load", str(ckpt), "--rounds", "1", "--json", str(out), "-q")
    doc = plot.load_report(str(out))
    assert plot.report_kind(doc) == "load"
    fig = plot.render(doc)
    ax_rate, ax_goal = fig.axes
    arms = {key.split("/")[0] for key in doc["arms"]}
    for temp in ("warm", "cold"):
        bars = [c for c in ax_rate.containers if c.get_label() == temp]
        assert len(bars) == 1 and all(b.get_height() > 0 for b in bars[0])
    warm = [c for c in ax_rate.containers if c.get_label() == "warm"][0]
    assert len(warm) == len(arms)
    targets = [p for p in ax_goal.patches if (p.get_gid() or "").startswith("target:")]
    assert {p.get_gid()[7:] for p in targets} == set(doc["targets"])
    for p in targets:  # green when met, red when not
        met = doc["targets"][p.get_gid()[7:]]["met"]
        assert matplotlib.colors.to_hex(p.get_facecolor()) == ("#2ca02c" if met else "#d62728")
    _legends_outside_the_axes(fig)
    png = tmp_path / "load.png"
    _run(cli, "plot", str(out), "--out", str(png))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_steps_report_draws_both_modes_at_every_step(cli, tmp_path):
    from pinstage import plot

    out = tmp_path / "steps.json"
    _run(cli, "bench", "qwen3-decode", "--layers", "1", "--seq-len", "16", "--steps", "3",
         "--groups", "1", "--json", str(out), "-q")
    doc = plot.load_report(str(out))
    assert plot.report_kind(doc) == "steps"
    fig = plot.render(doc)
    ax_time, ax_bytes = fig.axes
    assert ax_time.get_yscale() == "log" and ax_bytes.get_yscale() == "log"
    for mode in ("resident", "full"):
        staging = [c for c in ax_time.containers if c.get_label() == f"{mode}: staging"][0]
        moved = [c for c in ax_bytes.containers if c.get_label() == mode][0]
        assert len(staging) == 3 and len(moved) == 3
        assert all(b.get_height() > 0 for b in staging)
        assert [line for line in ax_time.get_lines() if line.get_gid() == f"execute:{mode}"]
    resident = [c for c in ax_bytes.containers if c.get_label() == "resident"][0]
    full = [c for c in ax_bytes.containers if c.get_label() == "full"][0]
    assert resident[1].get_height() * 1000 < full[1].get_height()  # step 2: a tiny fraction
    _legends_outside_the_axes(fig)


def test_a_report_of_no_known_kind_is_refused(tmp_path):
    from pinstage import plot

    bad = tmp_path / "x.json"
    bad.write_text(json.dumps({"arms": [], "hello": 1}))
    with pytest.raises(ValueError, match="not a report of pinstage bench"):
        plot.load_report(str(bad))


def test_write_atomically_follows_a_symlink_and_leaves_no_temporary(tmp_path):
    from pinstage import plot
    real = tmp_path / "real.json"
    real.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(real)
    plot.write_atomically(link, lambda f: f.write("new"))
    assert link.is_symlink() and real.read_text() == "new"
    with pytest.raises(ZeroDivisionError):  # a failed write: the old bytes, no temporary
        plot.write_atomically(real, lambda f: 1 / 0)
    assert real.read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.json", "real.json"]
