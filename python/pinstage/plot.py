"""Draw a ``pinstage bench --json`` report as one PNG.

Three panels: the minimum bind latency per group and arm; the upload rate per group and
arm with the plain-memcpy baseline as a line; and the bind's phases (alloc, upload,
verify, execute, download, release) stacked per arm. Run as
``python3 -m pinstage.plot REPORT.json --out FILE.png`` or through ``pinstage plot``.
This module needs only matplotlib and the report, not the compiled extension.
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


def load_report(path: str) -> dict:
    """The report at ``path``; ValueError when it is not a bench report."""
    # O_NONBLOCK, then fstat: a FIFO given as the report would block a plain open forever.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ValueError("it is not a regular file (a FIFO, device or directory)")
    os.set_blocking(fd, True)
    with os.fdopen(fd, encoding="utf-8") as f:
        doc = json.load(f)
    if not isinstance(doc, dict) or "groups" not in doc or "config" not in doc:
        raise ValueError("it is not a report of pinstage bench --json (no groups or config)")
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


def render(doc: dict):
    """A matplotlib Figure of the report (not yet saved)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
        ax.legend(fontsize="small")

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
    ax_ph.legend(fontsize="small")

    fig.suptitle(_title(doc))
    fig.tight_layout()
    return fig


def _title(doc: dict) -> str:
    config = doc["config"]
    title = f"{doc.get('benchmark', 'pinstage bench')} on {config.get('backend', '?')}"
    summary = doc.get("summary", {}).get("arms", [])
    verdicts = [f"{_key(a, 'arm', f'summary.arms[{i}]')}: {a['verdict']} "
                f"({_key(a, 'groups_agreeing', f'summary.arms[{i}]')} of {len(doc['groups'])}"
                f" groups agree)" for i, a in enumerate(summary)
                if "verdict" in a and a.get("arm") != config.get("reference_arm")]
    return title + ("\n" + "; ".join(verdicts) if verdicts else "")


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


def save_atomically(fig, out: str) -> None:
    """Saves ``fig`` as PNG to a temporary file next to ``out``, then renames it over."""
    import tempfile
    directory = os.path.dirname(os.path.abspath(out))
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(out) + ".tmp-", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            fig.savefig(f, format="png", dpi=110)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, out)
    except BaseException:
        os.unlink(tmp)
        raise


if __name__ == "__main__":
    sys.exit(main())
