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
         str(GROUPS), "--rounds", "2", "--arms", ",".join(ARMS), "--json", str(out), "--quiet"],
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
