"""The suite's progress lines (tests/conftest.py): a slow test is never silent."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

SLOW_TEST = """
import time

def test_slow():
    time.sleep(1.5)
"""


def _run_slow_suite(repository: Path, tmp_path: Path, interval: str) -> str:
    shutil.copy(repository / "tests" / "conftest.py", tmp_path / "conftest.py")
    shutil.copytree(repository / "tests" / "support", tmp_path / "support")  # what the conftest imports
    (tmp_path / "test_slow.py").write_text(SLOW_TEST)
    completed = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
                               capture_output=True, text=True, timeout=60, cwd=tmp_path,
                               env={**os.environ, "FEDROUTE_TEST_PROGRESS_SECONDS": interval})
    assert completed.returncode == 0, completed.stdout + completed.stderr
    return completed.stdout


def test_a_slow_test_prints_progress_through_output_capture(repository: Path, tmp_path: Path) -> None:
    output = _run_slow_suite(repository, tmp_path, "0.4")
    lines = [line for line in output.splitlines() if line.startswith("[still running")]
    assert len(lines) >= 2, output
    assert all("test_slow.py::test_slow (call; suite 0 min" in line for line in lines), lines


def test_no_progress_line_when_turned_off(repository: Path, tmp_path: Path) -> None:
    assert "[still running" not in _run_slow_suite(repository, tmp_path, "0")
