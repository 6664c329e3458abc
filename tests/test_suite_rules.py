"""Rules of the test suite itself: test modules share helpers only through ``tests/support``, and a test
that starts Flower processes carries the ``process`` marker (the fast loop ``pytest -m "not process"``)."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from support.process_guard import FLOWER_EXECUTABLES, program_name

TESTS = Path(__file__).resolve().parent


def _imported_modules(path: Path) -> set[str]:
    """Every module name ``path`` imports (``import a.b`` → ``a.b``; ``from a import b`` → ``a``, ``a.b``)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _is_test_module(name: str) -> bool:
    parts = name.split(".")
    return parts[0] in ("tests", "conftest") or any(part.startswith("test_") for part in parts)


def test_no_test_module_imports_another_test_module() -> None:
    """Shared helpers live in ``tests/support`` (fixtures in ``tests/conftest.py``), never in a test module."""
    sources = sorted(TESTS.glob("*.py")) + sorted((TESTS / "support").glob("*.py"))
    assert len(sources) > 40 and (TESTS / "support" / "grid.py") in sources  # the scan sees the suite
    offending = {path.relative_to(TESTS).as_posix(): sorted(filter(_is_test_module, _imported_modules(path)))
                 for path in sources}
    assert {path: names for path, names in offending.items() if names} == {}


def test_the_scan_recognises_test_module_imports(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text("import os\nfrom test_plugin import TASK\nimport tests.support\nfrom support.grid import x\n"
                     "from . import sibling\n")
    assert sorted(filter(_is_test_module, _imported_modules(probe))) == [
        "test_plugin", "test_plugin.TASK", "tests.support"]


@pytest.mark.parametrize(("args", "name"), [
    (["/venv/bin/flwr", "run", "."], "flwr"), ("flower-superlink --insecure", "flower-superlink"),
    ([Path("/x/ray"), "start"], "ray"), ([b"/usr/bin/python3", "-c", "1"], "python3"), ([], ""),
])
def test_program_names(args: object, name: str) -> None:
    assert program_name(args) == name


GUARDED_SUITE = '''
import subprocess
import pytest

FLWR = {flwr!r}

def test_unmarked_starts_flwr():
    subprocess.run([FLWR, "run", "."], check=True)

def test_unmarked_hides_the_refusal():
    try:
        subprocess.run([FLWR, "--version"], check=True)
    except Exception:
        pass

def test_unmarked_other_programs_are_fine():
    subprocess.run(["true"], check=True)

@pytest.mark.process
def test_marked_starts_flwr():
    subprocess.run([FLWR, "run", "."], check=True)
'''


def test_an_unmarked_test_that_starts_flower_fails_naming_the_marker(tmp_path: Path) -> None:
    """The suite's conftest refuses ``flwr`` (here a stand-in script of that name) in an unmarked test, even
    when the code under test swallows the error; a marked test and other programs run."""
    suite = tmp_path / "suite"
    suite.mkdir()
    shutil.copy(TESTS / "conftest.py", suite / "conftest.py")
    shutil.copytree(TESTS / "support", suite / "support", ignore=shutil.ignore_patterns("__pycache__"))
    flwr = tmp_path / "bin" / "flwr"
    flwr.parent.mkdir()
    flwr.write_text("#!/bin/sh\nexit 0\n")
    flwr.chmod(0o755)
    assert "flwr" in FLOWER_EXECUTABLES
    (suite / "test_guarded.py").write_text(GUARDED_SUITE.format(flwr=str(flwr)))
    completed = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rf", str(suite)],
                               capture_output=True, text=True, timeout=120, cwd=suite,
                               env={**os.environ, "FEDROUTE_TEST_PROGRESS_SECONDS": "0"})
    output = completed.stdout + completed.stderr
    assert completed.returncode == 1, output
    assert "2 failed, 2 passed" in output, output
    failed = sorted(line.split("::")[1].split()[0] for line in output.splitlines() if line.startswith("FAILED"))
    assert failed == ["test_unmarked_hides_the_refusal", "test_unmarked_starts_flwr"], output
    assert "starts `flwr` but is not marked `process`" in output, output
    assert "started ['flwr'] without the `process` marker" in output, output
