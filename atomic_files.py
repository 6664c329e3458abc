"""Crash-safe file writes: a temporary file in the same directory, ``fsync``, then a rename.

A crash leaves either the previous complete file or the new one, never a torn
file.  Used for checkpoints, client state files and result files.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import IO, Any, Callable

__all__ = ["atomic_write", "sync_directory"]


def atomic_write(path: Path, write: Callable[[IO[Any]], Any], mode: str = "wb") -> Path:
    """Write ``path`` through ``write(stream)`` on a temporary file, ``fsync``, rename; return ``path``.

    The temporary file is removed if ``write`` fails; the rename is made durable
    with :func:`sync_directory`.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(handle, mode) as stream:
            write(stream)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
    sync_directory(path.parent)
    return path


def sync_directory(directory: Path) -> None:
    """Make renames in ``directory`` durable (where the platform allows it)."""
    try:
        handle = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(handle)
    except OSError:
        pass
    finally:
        os.close(handle)
