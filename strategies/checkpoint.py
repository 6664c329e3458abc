"""Atomic checkpoints of a strategy: cluster models, masses, history and the round counter.

One ``checkpoint.npz`` per strategy, replaced atomically (temporary file +
``os.replace``) after every round: a crash leaves either the previous or the
new checkpoint, never a torn one.  Arrays are stored by name; everything else
goes into a JSON ``meta`` entry, including an ``identity`` (settings, seed,
``K``) that a resumed run must match.
"""

from __future__ import annotations

import io
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Mapping, Optional

import numpy as np
from numpy.typing import NDArray

__all__ = ["save_checkpoint", "load_checkpoint", "CHECKPOINT_FILE"]

CHECKPOINT_FILE = "checkpoint.npz"


def save_checkpoint(directory: Path, arrays: Mapping[str, NDArray], meta: Mapping[str, Any]) -> Path:
    """Write ``arrays`` and ``meta`` to ``directory/checkpoint.npz`` atomically."""
    directory.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    np.savez(buffer, __meta__=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8),
             **{name: np.asarray(value) for name, value in arrays.items()})
    handle, temporary = tempfile.mkstemp(dir=directory, prefix=".checkpoint.")
    with os.fdopen(handle, "wb") as stream:
        stream.write(buffer.getvalue())
        stream.flush()
        os.fsync(stream.fileno())
    path = directory / CHECKPOINT_FILE
    os.replace(temporary, path)
    return path


def load_checkpoint(directory: Path) -> Optional[tuple[dict[str, NDArray], dict[str, Any]]]:
    """``(arrays, meta)`` from ``directory/checkpoint.npz``, or ``None`` if there is none."""
    path = directory / CHECKPOINT_FILE
    if not path.exists():
        return None
    with np.load(path, allow_pickle=False) as stored:
        arrays = {name: stored[name] for name in stored.files if name != "__meta__"}
        meta = json.loads(stored["__meta__"].tobytes().decode())
    return arrays, meta
