#!/usr/bin/env python3
"""Sorts the failures of a sanitizer ctest run (its --output-junit file).

LeakSanitizer's stop-the-world tracer sometimes segfaults at process exit on a loaded
machine ("Tracer caught signal 11", google/sanitizers#1353): the test body passed and no
leak was reported, the checker itself crashed. Exit 0 when every failure is exactly
that (so the caller may rerun those tests once); exit 1, naming them, when any failure
is anything else; exit 2 when there is no failure to sort.
"""
import sys
import xml.etree.ElementTree as ET

TRACER_CRASH = ("Tracer caught signal", "LeakSanitizer has encountered a fatal error")
# Any of these means the sanitizer or the test found a real problem.
REAL_PROBLEM = ("ERROR: LeakSanitizer: detected memory leaks", "ERROR: AddressSanitizer",
                "runtime error:", "[  FAILED  ]")


def is_tracer_crash(output: str) -> bool:
    return (all(s in output for s in TRACER_CRASH) and "[  PASSED  ]" in output
            and not any(s in output for s in REAL_PROBLEM))


def failures(junit_path: str) -> dict:
    """Name -> output of every failed test case in the junit file."""
    out = {}
    for case in ET.parse(junit_path).getroot().iter("testcase"):
        if case.find("failure") is not None or case.find("error") is not None:
            out[case.get("name")] = case.findtext("system-out") or ""
    return out


def main(argv: list) -> int:
    if len(argv) != 2:
        print(f"usage: {argv[0]} JUNIT_XML", file=sys.stderr)
        return 2
    failed = failures(argv[1])
    if not failed:
        print(f"{argv[1]}: no failed test to sort", file=sys.stderr)
        return 2
    real = sorted(n for n, o in failed.items() if not is_tracer_crash(o))
    if real:
        print("real failures (not LeakSanitizer's tracer crash): " + ", ".join(real),
              file=sys.stderr)
        return 1
    print("LeakSanitizer's tracer crashed at exit after these tests passed; "
          "rerunning them once: " + ", ".join(sorted(failed)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
