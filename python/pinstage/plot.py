"""Draw a pinstage report as one PNG, whatever its kind (``report_kind``):

- an A/B bench (``pinstage bench <task> --json``): the minimum bind latency per group and
  arm; the upload rate per group and arm with the plain-memcpy baseline as a line; and the
  bind's phases (alloc, upload, verify, execute, download, release) stacked per arm;
- a load bench (``pinstage bench load --json``): the best GB/s of every arm, warm and cold
  side by side; and every target's measured value against its goal, met or not;
- a steps bench (``pinstage bench <scene> --steps N --json``): staging and execute time
  per step, resident against a full bind per step; and the bytes each step moved.

Run as ``python3 -m pinstage.plot REPORT.json --out FILE.png`` or through
``pinstage plot``. This module needs only matplotlib and the report, not the compiled
extension. Legends sit outside the axes, so they never cover a bar.
"""

from __future__ import annotations

import argparse
import json
import os
import stat
import statistics
import sys

PHASES = ("device_alloc", "upload", "verify", "execute", "download", "release")
PHASE_LABELS = {"device_alloc": "alloc"}
# One colour per arm, the same in every panel.
ARM_COLOURS = {"pageable": "#d62728", "pinned": "#1f77b4", "staged": "#2ca02c"}


# One colour per load arm and per step mode, the same in every panel.
LOAD_COLOURS = {"warm": "#1f77b4", "cold": "#ff7f0e"}
MODE_COLOURS = {"resident": "#2ca02c", "full": "#d62728"}


def report_kind(doc: dict) -> str:
    """"ab", "load" or "steps"; ValueError for anything else."""
    if isinstance(doc, dict) and doc.get("kind") == "steps" and "records" in doc:
        return "steps"
    if isinstance(doc, dict) and "groups" in doc and "config" in doc:
        return "ab"
    if isinstance(doc, dict) and isinstance(doc.get("arms"), dict) and "targets" in doc:
        return "load"
    raise ValueError("it is not a report of pinstage bench --json, bench load --json or "
                     "bench <scene> --steps --json")


def load_report(path: str) -> dict:
    """The report at ``path``; ValueError when it is no report ``report_kind`` knows."""
    # O_NONBLOCK, then fstat: a FIFO given as the report would block a plain open forever.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ValueError("it is not a regular file (a FIFO, device or directory)")
    os.set_blocking(fd, True)
    with os.fdopen(fd, encoding="utf-8") as f:
        doc = json.load(f)
    report_kind(doc)
    return doc


def _key(obj, key: str, where: str):
    """``obj[key]``; ValueError naming the key's path (``where`` is obj's) when obj is not
    an object or has no such key, so a damaged report never ends in a bare KeyError."""
    if not isinstance(obj, dict):
        raise ValueError(f"{where or 'the report'} is not an object")
    if key not in obj:
        raise ValueError(f"{where + '.' if where else ''}{key} is missing")
    return obj[key]


def _arm_runs(group: dict, g: int):
    """(path, run) for each arm run of groups[g]."""
    where = f"groups[{g}]"
    return [(f"{where}.arms[{i}]", run) for i, run in enumerate(_key(group, "arms", where))]


def _arm_run(group: dict, g: int, arm: str):
    """(path, run) of ``arm`` in groups[g]. Every group runs every arm of config.arms, so a
    missing one means a damaged or edited report: an error naming both, not a gap."""
    for where, run in _arm_runs(group, g):
        if _key(run, "arm", where) == arm:
            return where, run
    raise ValueError(f"config.arms lists '{arm}', but groups[{g}] has no run of it "
                     "(every group runs every arm; the report is damaged or edited)")


def _used_binds(arm_run: dict, where: str) -> list:
    all_binds = _key(arm_run, "binds", where)
    binds = [b for b in all_binds if not b.get("dropped")]
    return binds or all_binds


def phase_medians(doc: dict) -> dict:
    """{arm: {phase: median seconds over every measured round of every group}}."""
    per_arm: dict = {}
    for g, group in enumerate(_key(doc, "groups", "")):
        for where, arm_run in _arm_runs(group, g):
            phases = per_arm.setdefault(_key(arm_run, "arm", where), {p: [] for p in PHASES})
            for b, bind in enumerate(_used_binds(arm_run, where)):
                bind_phases = _key(bind, "phases", f"{where}.binds[{b}]")
                for p in PHASES:
                    phases[p].append(bind_phases.get(p, 0.0))
    return {arm: {p: statistics.median(v) if v else 0.0 for p, v in phases.items()}
            for arm, phases in per_arm.items()}


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _legend_outside(ax):
    """The legend right of the axes, where it cannot cover a bar or a tick label."""
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)


def render(doc: dict):
    """A matplotlib Figure of the report (not yet saved), by its kind."""
    return {"ab": render_ab, "load": render_load, "steps": render_steps}[report_kind(doc)](doc)


def render_load(doc: dict):
    """Best GB/s per arm, warm and cold side by side; each target against its goal."""
    plt = _pyplot()
    arms = _key(doc, "arms", "")
    names = sorted({key.split("/")[0] for key in arms})
    fig, (ax_rate, ax_goal) = plt.subplots(1, 2, figsize=(16, 5.6))
    width = 0.4
    for i, temp in enumerate(("warm", "cold")):
        xs, ys = [], []
        for n, name in enumerate(names):
            key = f"{name}/{temp}"
            if key in arms:
                xs.append(n + (i - 0.5) * width)
                ys.append(_key(arms[key], "best_gbps", f"arms.{key}"))
        if xs:
            ax_rate.bar(xs, ys, width, label=temp, color=LOAD_COLOURS[temp], gid=f"rate:{temp}")
    ax_rate.set_xticks(range(len(names)))
    ax_rate.set_xticklabels(names, rotation=30, ha="right", fontsize="small")
    ax_rate.set_ylabel("GB/s (best round)")
    ax_rate.set_title("load rate per arm")
    _legend_outside(ax_rate)
    targets = _key(doc, "targets", "")
    keys = list(targets)
    for n, key in enumerate(keys):
        t = _key(targets, key, "targets")
        value = _key(t, "value", f"targets.{key}")
        goal = _key(t, "goal", f"targets.{key}")
        met = _key(t, "met", f"targets.{key}")
        ax_goal.barh(n, value, 0.6, color="#2ca02c" if met else "#d62728", gid=f"target:{key}")
        ax_goal.plot([goal, goal], [n - 0.4, n + 0.4], color="black", linewidth=2)
        ax_goal.text(max(value, goal) * 1.02, n,
                     f"{value:.2f} ({'>=' if t.get('at_least') else '<='} {goal:.2f}: "
                     f"{'met' if met else 'NOT met'})", va="center", fontsize="small")
    ax_goal.set_yticks(range(len(keys)))
    ax_goal.set_yticklabels(keys, fontsize="small")
    ax_goal.invert_yaxis()
    ax_goal.set_xlim(0, max([1.0] + [max(t["value"], t["goal"]) for t in targets.values()]) * 1.5)
    ax_goal.set_title("targets (bar: measured; black line: goal; green: met)")
    fig.suptitle(f"pinstage bench load: {doc.get('path', '?')}, "
                 f"{doc.get('bytes', 0) / 1e6:,.1f} MB, {doc.get('rounds', '?')} round(s)")
    fig.tight_layout()
    return fig


def render_steps(doc: dict):
    """Per step, resident against full: staging and execute time; bytes moved."""
    plt = _pyplot()
    records = _key(doc, "records", "")
    steps = int(_key(doc, "steps", ""))
    fig, (ax_time, ax_bytes) = plt.subplots(1, 2, figsize=(16, 5.6))
    width = 0.4
    xs = list(range(1, steps + 1))
    for i, mode in enumerate(("resident", "full")):
        staging, execute, moved = [], [], []
        for step in xs:
            rows = [r for r in records if r.get("mode") == mode and r.get("step") == step]
            if not rows:
                raise ValueError(f"records have no step {step} of mode '{mode}'")
            staging.append(statistics.median(r["staging_seconds"] for r in rows) * 1e3)
            execute.append(statistics.median(r["execute_seconds"] for r in rows) * 1e3)
            moved.append(rows[0]["uploaded_bytes"] + rows[0]["downloaded_bytes"])
        offs = [x + (i - 0.5) * width for x in xs]
        colour = MODE_COLOURS[mode]
        ax_time.bar(offs, staging, width, color=colour, label=f"{mode}: staging",
                    gid=f"staging:{mode}")
        ax_time.plot(offs, execute, marker="o", linestyle=":", color=colour,
                     label=f"{mode}: execute", gid=f"execute:{mode}")
        ax_bytes.bar(offs, moved, width, color=colour, label=mode, gid=f"moved:{mode}")
    for ax, title, unit in ((ax_time, "staging (all but execute) and execute per step", "ms"),
                            (ax_bytes, "bytes moved per step (up + down)", "bytes")):
        ax.set_yscale("log")
        ax.set_title(title)
        ax.set_xlabel("step")
        ax.set_ylabel(unit + " (log)")
        ax.set_xticks(xs)
        _legend_outside(ax)
    fig.suptitle(f"{doc.get('scene', '?')}, {doc.get('description', '')}: staging "
                 f"{doc.get('staging_speedup', 0):.0f}x lower resident, a resident step moves "
                 f"{doc.get('moved_fraction', 0) * 100:.4f}% of a full bind's bytes")
    fig.tight_layout()
    return fig


def render_ab(doc: dict):
    """The A/B bench's three panels."""
    plt = _pyplot()

    arms = list(_key(_key(doc, "config", ""), "arms", "config"))
    groups = _key(doc, "groups", "")
    fig, (ax_lat, ax_up, ax_ph) = plt.subplots(1, 3, figsize=(16, 5.2))
    width = 0.8 / max(len(arms), 1)
    xs = list(range(1, len(groups) + 1))
    memcpy = []
    for i, arm in enumerate(arms):
        lat, up = [], []
        for g, group in enumerate(groups):
            where, run = _arm_run(group, g, arm)
            stats = _key(run, "stats", where)
            lat.append(_key(stats, "min_seconds", where + ".stats") * 1e3)
            up.append(_key(stats, "upload_gbps", where + ".stats"))
            if stats.get("memcpy_gbps"):
                memcpy.append(stats["memcpy_gbps"])
        offs = [x + (i - (len(arms) - 1) / 2) * width for x in xs]
        colour = ARM_COLOURS.get(arm)
        ax_lat.bar(offs, lat, width, label=arm, color=colour, gid=f"latency:{arm}")
        ax_up.bar(offs, up, width, label=arm, color=colour, gid=f"upload:{arm}")
    if memcpy:
        ax_up.axhline(statistics.median(memcpy), color="black", linestyle="--",
                      label="memcpy baseline", gid="memcpy")
    for ax, title, unit in ((ax_lat, "min bind latency per group", "ms"),
                            (ax_up, "upload rate per group", "GB/s")):
        ax.set_title(title)
        ax.set_xlabel("group")
        ax.set_ylabel(unit)
        ax.set_xticks(xs)
        _legend_outside(ax)

    medians = phase_medians(doc)
    bottoms = [0.0] * len(arms)
    for p in PHASES:
        heights = [medians.get(arm, {}).get(p, 0.0) * 1e3 for arm in arms]
        if not any(heights):
            continue
        ax_ph.bar(arms, heights, 0.6, bottom=bottoms, label=PHASE_LABELS.get(p, p),
                  gid=f"phase:{p}")
        bottoms = [b + h for b, h in zip(bottoms, heights)]
    ax_ph.set_ylim(0, max(bottoms + [0.0]) * 1.15 or 1.0)  # the whole stack, from 0
    ax_ph.set_title("bind phases per arm (median)")
    ax_ph.set_ylabel("ms")
    _legend_outside(ax_ph)

    fig.suptitle(_title(doc))
    fig.tight_layout()
    return fig


# On sim the A/B difference is the model's, not a card's: the title says so (issue 42).
SIM_NOTE = ("sim: the effect comes from sim's copy-engine model (pageable through one "
            "thread's driver bounce, pinned on every core), not from a device")


def _size(doc: dict) -> str:
    """'2 layers, 2.04 GB per bind': the size knob's value (config[size_name]) and the
    bytes a bind uploads (sizes.input_bytes); '' when the report has neither."""
    config, parts = doc["config"], []
    for key, value in config.items():
        if f"{key}_automatic" in config and isinstance(value, int) and not isinstance(value, bool):
            parts.append(f"{value} {key}")
    input_bytes = doc.get("sizes", {}).get("input_bytes")
    if isinstance(input_bytes, int):
        parts.append(f"{input_bytes / 1e9:.2f} GB per bind")
    return ", ".join(parts)


def _title(doc: dict) -> str:
    config = doc["config"]
    backend = config.get("backend", "?")
    title = f"{doc.get('benchmark', 'pinstage bench')} on {backend}"
    size = _size(doc)
    if size:
        title += f": {size}"
    summary = doc.get("summary", {}).get("arms", [])
    verdicts = [f"{_key(a, 'arm', f'summary.arms[{i}]')}: {a['verdict']} "
                f"({_key(a, 'groups_agreeing', f'summary.arms[{i}]')} of {len(doc['groups'])}"
                f" groups agree)" for i, a in enumerate(summary)
                if "verdict" in a and a.get("arm") != config.get("reference_arm")]
    lines = [title] + (["; ".join(verdicts)] if verdicts else [])
    if backend == "sim":
        lines.append(SIM_NOTE)
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m pinstage.plot", description=__doc__)
    parser.add_argument("report", help="a report from pinstage bench --json")
    parser.add_argument("--out", help="the PNG to write (default: REPORT with .png)")
    args = parser.parse_args(argv)
    out = args.out or (args.report[:-5] if args.report.endswith(".json") else args.report) + ".png"
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        print("matplotlib is not installed (Debian: apt install python3-matplotlib)",
              file=sys.stderr)
        return 3
    try:
        fig = render(load_report(args.report))
    except (OSError, ValueError) as e:
        print(f"cannot plot {args.report}: {e}", file=sys.stderr)
        return 2
    save_atomically(fig, out)
    print(out)
    return 0


def write_atomically(path, write, mode: str = "w") -> None:
    """Calls ``write(f)`` on a temporary file next to ``path`` (opened with ``mode``), syncs
    it, then renames it over ``path``: a reader sees the old file or the new one, never a
    part. A symlink at ``path`` is followed and stays a link (as the C++ atomic writer
    does). The benches' JSON (bench/benchargs.py) is written through it too."""
    import tempfile
    path = os.path.realpath(os.fspath(path))
    directory = os.path.dirname(path)
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".tmp-", dir=directory)
    try:
        with os.fdopen(fd, mode) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def save_atomically(fig, out: str) -> None:
    """Saves ``fig`` as PNG to a temporary file next to ``out``, then renames it over."""
    write_atomically(out, lambda f: fig.savefig(f, format="png", dpi=110), "wb")


if __name__ == "__main__":
    sys.exit(main())
