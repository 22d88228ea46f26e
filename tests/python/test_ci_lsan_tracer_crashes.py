"""scripts/lsan_tracer_crashes.py on the junit file of a real ctest run.

Each case is a tiny CTest project whose tests print what a sanitized gtest binary
prints, so the script is checked against ctest's own junit format."""
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "lsan_tracer_crashes.py"

PASSED = "[  PASSED  ] 1 test."
TRACER = ("Tracer caught signal 11: addr=0xf8 pc=0x7f63208e80f0 sp=0x7f631b7fed10\n"
          "==4391==LeakSanitizer has encountered a fatal error.")
LEAK = "==7==ERROR: LeakSanitizer: detected memory leaks"


def junit_of(tmp_path, tests):
    """Runs ctest on tests {name: (output, exit code)}; returns its junit file."""
    src = tmp_path / "src"
    src.mkdir()
    lines = ["cmake_minimum_required(VERSION 3.21)", "project(t NONE)", "enable_testing()"]
    for name, (output, rc) in tests.items():
        (src / f"{name}.txt").write_text(output + "\n")
        lines.append(f"add_test(NAME {name} COMMAND sh -c "
                     f"\"cat ${{CMAKE_CURRENT_SOURCE_DIR}}/{name}.txt; exit {rc}\")")
    (src / "CMakeLists.txt").write_text("\n".join(lines) + "\n")
    build = tmp_path / "build"
    subprocess.run(["cmake", "-S", src, "-B", build], check=True, capture_output=True)
    junit = tmp_path / "junit.xml"
    subprocess.run(["ctest", "--output-junit", junit], cwd=build, capture_output=True)
    return junit


def sort(junit):
    return subprocess.run([sys.executable, SCRIPT, junit], capture_output=True, text=True)


def test_only_tracer_crashes_may_be_rerun(tmp_path):
    r = sort(junit_of(tmp_path, {"ok": (PASSED, 0), "crash": (PASSED + "\n" + TRACER, 1)}))
    assert r.returncode == 0, r.stderr
    assert "rerunning them once: crash" in r.stdout


@pytest.mark.parametrize("output", [
    "[  FAILED  ] 1 test.\n" + TRACER,      # the test itself failed too
    PASSED + "\n" + LEAK,                   # a real leak
    PASSED + "\n" + TRACER + "\n" + LEAK,   # a leak reported beside the crash
    TRACER,                                 # crashed before gtest's summary
    "Segmentation fault",                   # any other failure
])
def test_any_other_failure_is_real(tmp_path, output):
    r = sort(junit_of(tmp_path, {"crash": (PASSED + "\n" + TRACER, 1), "bad": (output, 1)}))
    assert r.returncode == 1
    assert "real failures (not LeakSanitizer's tracer crash): bad" in r.stderr


def test_a_run_without_failures_is_a_usage_error(tmp_path):
    r = sort(junit_of(tmp_path, {"ok": (PASSED, 0)}))
    assert r.returncode == 2
    assert "no failed test to sort" in r.stderr
