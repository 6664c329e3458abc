"""A non-editable ``pip install .`` exposes every sub-package, the app components and the
California Housing table shipped for offline use."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from support.app_config import app_components

SUBPACKAGES = ("cli", "core", "client", "strategies", "server", "deployment", "simulation", "simulation.experiments", "tasks", "monitoring")


def test_non_editable_install_exposes_fedroute(repository: Path, tmp_path: Path) -> None:
    # Build from a clean copy: a checkout's build/ and *.egg-info (left by earlier builds) would
    # otherwise feed files into the wheel that the packaging configuration does not name.
    source = tmp_path / "source"
    shutil.copytree(repository, source, ignore=shutil.ignore_patterns(
        ".git", "build", "dist", "*.egg-info", ".venv*", "results", "certificates", "__pycache__"))
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--target", str(target), str(source)],
        check=True, capture_output=True, text=True, cwd=tmp_path,
    )
    assert not (target / "fedroute" / "tests").exists() and not (target / "fedroute" / "bench").exists()
    # The installed package's components (a plugin app names them); the repository's own pyproject names
    # fedroute_app's, for the FAB (tests/test_fab.py).
    components = {"serverapp": "fedroute.server.app:app", "clientapp": "fedroute.client.app:app"}
    probe = f"""
import importlib, sys
import fedroute
assert fedroute.__file__.startswith({str(target)!r}), fedroute.__file__
for name in {SUBPACKAGES!r}:
    module = importlib.import_module("fedroute." + name)
    assert module.__file__.startswith({str(target)!r}), module.__file__
from flwr.clientapp import ClientApp
from flwr.serverapp import ServerApp
server_module, server_attr = {components['serverapp']!r}.split(":")
client_module, client_attr = {components['clientapp']!r}.split(":")
assert isinstance(getattr(importlib.import_module(server_module), server_attr), ServerApp)
assert isinstance(getattr(importlib.import_module(client_module), client_attr), ClientApp)
assert "torch" not in sys.modules, "the linear app must not import torch"
# Offline, the default housing loader reads the table installed with the package.
import hashlib, os
import sklearn.datasets
from fedroute.tasks import housing
def unreachable(*args, **kwargs):
    raise OSError("simulated: no network")
sklearn.datasets.fetch_california_housing = unreachable
os.environ.pop(housing.DATA_FILE_ENV, None)
frame, path = housing.load_california_housing_from()
assert str(path).startswith({str(target)!r}) and path == housing.EMBEDDED_TABLE, path
assert frame.shape == (20640, 9), frame.shape
assert hashlib.sha256(path.read_bytes()).hexdigest() == housing.EMBEDDED_TABLE_SHA256
assert (path.parent / "README.md").is_file()
print("ok")
"""
    completed = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=tmp_path,
                               env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"})
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip() == "ok"
    entry_points = next(target.glob("fedroute-*.dist-info")) / "entry_points.txt"
    assert "fedroute = fedroute.cli:main" in entry_points.read_text()
