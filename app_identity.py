"""Which fedroute files a process runs: their directory and a fingerprint of their code.

fedroute's ServerApp asks every node for both (with the node-config query,
:mod:`fedroute.server.federation`) and stops when a ClientApp runs other code
than the server: in Flower 1.42's local simulation, a SuperLink left running by
an earlier ``flwr run`` in another folder keeps that folder first on its Ray
workers' ``sys.path``, so the ClientApps import that folder's modules instead
of the run's app (docs/plugin.md, "Flower traps").

The fingerprint hashes the package's own Python files (the root modules and the
sub-packages a FAB carries), so a checkout and the FAB built from it agree.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

__all__ = ["APP_DIRECTORIES", "app_files", "app_fingerprint"]

APP_DIRECTORIES = ("core", "client", "strategies", "server", "simulation", "tasks", "monitoring")
"""The sub-packages whose code the fingerprint covers (with the root's ``*.py``)."""


def app_files() -> Path:
    """The directory of the running ``fedroute`` package (a FAB's, or an installed or checked-out copy)."""
    return Path(__file__).resolve().parent


@functools.lru_cache(maxsize=4)
def app_fingerprint(root: Path | None = None) -> str:
    """sha256 (first 16 hex digits) over the relative paths and contents of the package's ``*.py`` files."""
    root = app_files() if root is None else root
    paths = sorted([*root.glob("*.py"), *(path for name in APP_DIRECTORIES for path in (root / name).rglob("*.py")
                                          if "__pycache__" not in path.parts)])
    digest = hashlib.sha256()
    for path in paths:
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]
