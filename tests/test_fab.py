"""The FAB carries the app: built from the repository, it holds the package's code and runs where fedroute
is not installed.

* ``flwr build``: what the FAB holds (the package, README.md and LICENSE; no docs, benchmarks, tests, CI,
  compose files, experiment configs or examples).
* ``fedroute_app``: imported from a copy of the app's files, ``fedroute`` is that copy, even where another
  fedroute is installed and was imported first; a module the copy lacks does not come from the installed one.
* Flower's simulation pickles the ClientApp to its Ray workers: it comes back from the FAB's files, not from
  the unpickler's path (the SuperLink's working directory, an installed fedroute).
* Real processes (in ``tests/test_deployment.py``, whose TLS deployment and Ray simulation both run from an
  environment where ``import fedroute`` fails, ``conftest.no_fedroute_bin``): a SuperLink and SuperNodes run
  the FAB ``flwr build`` makes to completion, with ``num-clients = "auto"``; ``tests/test_conf.py`` runs a
  conf file on Flower's default federation from that environment.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.process  # flwr build, and processes that import the FAB's files


@pytest.fixture(scope="module")
def fab(repository_fab: Path) -> Path:
    return repository_fab


def test_the_fab_holds_the_package_and_nothing_else(fab: Path, repository: Path) -> None:
    names = zipfile.ZipFile(fab).namelist()
    tops = {name.split("/")[0] for name in names}
    assert tops == {".info", "pyproject.toml", "README.md", "LICENSE", "__init__.py", "__main__.py", "atomic_files.py",
                    "protocol.py", "fedroute_app.py", "app_identity.py", "cli", "core", "client", "strategies", "server", "deployment",
                    "simulation", "tasks", "monitoring", "data"}, tops
    tracked = subprocess.run(["git", "ls-files", "*.py"], cwd=repository, capture_output=True, text=True).stdout
    package = {name for name in tracked.split() if name.split("/")[0] in tops and "/test_" not in name}
    assert package <= set(names), sorted(package - set(names))  # every module of the package is in it
    assert fab.stat().st_size < 2_000_000, fab.stat().st_size
    print(f"FAB {fab.name}: {fab.stat().st_size} bytes, {len(names)} files")


def test_the_apps_files_are_fedroute_even_next_to_an_installed_one(repository: Path, tmp_path: Path) -> None:
    """The installed (editable) fedroute is imported first; ``fedroute_app`` of a copy replaces it."""
    copy = tmp_path / "extracted-fab"
    shutil.copytree(repository, copy, ignore=shutil.ignore_patterns(".git", "tests", "docs", "bench", "results",
                                                                      "__pycache__", "*.egg-info", ".venv*"))
    (copy / "monitoring" / "tensorboard.py").unlink()  # a module only the installed copy has
    probe = f"""
import importlib, sys
import fedroute, fedroute.protocol
assert fedroute.__file__.startswith({str(repository)!r}), fedroute.__file__
sys.path.insert(0, {str(copy)!r})
import fedroute_app
server = fedroute_app.serverapp
import fedroute.server.app as module
assert module.__file__.startswith({str(copy)!r}), module.__file__
assert sys.modules["fedroute"].__file__.startswith({str(copy)!r})
assert type(server).__name__ == "ServerApp" and fedroute_app.clientapp is not None
try:
    importlib.import_module("fedroute.monitoring.tensorboard")
except ModuleNotFoundError as error:
    assert "in the Flower app at" in str(error), error
else:
    raise AssertionError("fell back to the installed fedroute")
print("ok")
"""
    completed = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=tmp_path,
                               timeout=120)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip() == "ok"


def test_the_clientapp_unpickles_from_its_app_files_not_the_unpicklers_path(repository: Path,
                                                                            tmp_path: Path) -> None:
    """Flower's Ray simulation pickles the loaded ClientApp to its workers, whose path starts with the SuperLink's
    working directory (another checkout, if an earlier `flwr run` there started it) and holds the installed
    fedroute: the object must come back from the FAB's files."""
    fab_copy, stale = tmp_path / "extracted-fab", tmp_path / "stale-checkout"
    for copy in (fab_copy, stale):
        shutil.copytree(repository, copy, ignore=shutil.ignore_patterns(".git", "tests", "docs", "bench", "results",
                                                                          "__pycache__", "*.egg-info", ".venv*"))
    pickled = tmp_path / "clientapp.pickle"
    dump = (f"import sys; sys.path.insert(0, {str(fab_copy)!r})\n"
            f"import fedroute_app, ray.cloudpickle as cloudpickle\n"
            f"app = fedroute_app.clientapp\n"  # Flower caches the loaded object and sends a closure over it
            f"open({str(pickled)!r}, 'wb').write(cloudpickle.dumps(lambda: app))")
    load = (f"import sys, pickle; sys.path.insert(0, {str(stale)!r})\n"
            f"import fedroute_app, fedroute.client.app\n"  # the worker's own view first: stale and installed code
            f"app = pickle.loads(open({str(pickled)!r}, 'rb').read())()\n"
            f"print(sys.modules['fedroute.client.app'].__file__, type(app).__mro__[1].__name__)")
    for code, cwd in ((dump, fab_copy), (load, stale)):
        completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=cwd, timeout=120)
        assert completed.returncode == 0, completed.stderr
    assert completed.stdout.split() == [str(fab_copy / "client" / "app.py"), "ClientApp"]
