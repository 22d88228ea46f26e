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
import statistics
import sys

PHASES = ("device_alloc", "upload", "verify", "execute", "download", "release")
PHASE_LABELS = {"device_alloc": "alloc"}
# One colour per arm, the same in every panel.
ARM_COLOURS = {"pageable": "#d62728", "pinned": "#1f77b4", "staged": "#2ca02c"}


def load_report(path: str) -> dict:
    """The report at ``path``; ValueError when it is not a bench report."""
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    if not isinstance(doc, dict) or "groups" not in doc or "config" not in doc:
        raise ValueError(f"{path} is not a report of pinstage bench --json")
    return doc


def _used_binds(arm_run: dict) -> list:
    binds = [b for b in arm_run["binds"] if not b.get("dropped")]
    return binds or arm_run["binds"]


def phase_medians(doc: dict) -> dict:
    """{arm: {phase: median seconds over every measured round of every group}}."""
    per_arm: dict = {}
    for group in doc["groups"]:
        for arm_run in group["arms"]:
            phases = per_arm.setdefault(arm_run["arm"], {p: [] for p in PHASES})
            for bind in _used_binds(arm_run):
                for p in PHASES:
                    phases[p].append(bind["phases"].get(p, 0.0))
    return {arm: {p: statistics.median(v) if v else 0.0 for p, v in phases.items()}
            for arm, phases in per_arm.items()}


def render(doc: dict):
    """A matplotlib Figure of the report (not yet saved)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = list(doc["config"]["arms"])
    groups = doc["groups"]
    fig, (ax_lat, ax_up, ax_ph) = plt.subplots(1, 3, figsize=(16, 5.2))
    width = 0.8 / max(len(arms), 1)
    xs = list(range(1, len(groups) + 1))
    memcpy = []
    for i, arm in enumerate(arms):
        lat, up = [], []
        for group in groups:
            stats = next(a["stats"] for a in group["arms"] if a["arm"] == arm)
            lat.append(stats["min_seconds"] * 1e3)
            up.append(stats["upload_gbps"])
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
    verdicts = [f"{a['arm']}: {a['verdict']} ({a['groups_agreeing']} of {len(doc['groups'])}"
                f" groups agree)" for a in doc.get("summary", {}).get("arms", [])
                if a["arm"] != config.get("reference_arm") and "verdict" in a]
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
        doc = load_report(args.report)
    except (OSError, ValueError) as e:
        print(f"cannot plot: {e}", file=sys.stderr)
        return 2
    save_atomically(render(doc), out)
    print(out)
    return 0


def save_atomically(fig, out: str) -> None:
    """Saves ``fig`` as PNG to a temporary file next to ``out``, then renames it over."""
    import os
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
