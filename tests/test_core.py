"""The core (``fedroute.core``) is Flower- and torch-free: both runtimes drive it."""

from __future__ import annotations

import subprocess
import sys


def test_the_core_imports_without_flower_or_torch() -> None:
    probe = """
import importlib, pkgutil, sys
import fedroute.core as core
names = [info.name for info in pkgutil.iter_modules(core.__path__)]
for name in names:
    importlib.import_module("fedroute.core." + name)
heavy = sorted(key for key in sys.modules if key.split(".")[0] in ("flwr", "torch", "ray", "torchvision"))
assert not heavy, heavy
assert {"settings", "agent", "client_step", "aggregation", "influence", "methods", "task"} <= set(names), names
print("ok", len(names))
"""
    completed = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.startswith("ok")
