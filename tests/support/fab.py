"""``flwr build`` of the repository: the FAB a deployment runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def built_fab(repository: Path, directory: Path) -> Path:
    """``flwr build --app repository`` into ``directory``; the ``.fab`` file made."""
    directory.mkdir(parents=True, exist_ok=True)
    flwr = Path(sys.executable).parent / "flwr"
    completed = subprocess.run([str(flwr), "build", "--app", str(repository)], cwd=directory, capture_output=True,
                               text=True, timeout=120, env={**os.environ, "FLWR_HOME": str(directory / "home")})
    assert completed.returncode == 0, completed.stdout + completed.stderr
    (fab,) = directory.glob("*.fab")
    return fab
