"""A client's controller state across rounds: ``Context.state``, and optionally a file.

States are stored per completed round (``<run-key>@<t>``) and the latest two
are kept.  Round ``t`` always starts from the newest state of a round before
``t``, so a round the server sends again (after the server side restarted
from a checkpoint) is replayed from the same state and gives the same result.
With a state directory (node config ``state-dir``, or run config
``client-state-dir`` in simulation) the same entries are also written to
``<dir>/<run-key>/client-<id>.npz`` atomically, so a restarted SuperNode, or a
new Flower run resuming a checkpoint, continues where the client was.
"""

from __future__ import annotations

import io
import logging
import os
import tempfile
from pathlib import Path
from typing import Optional

import numpy as np
from flwr.app import Array, ArrayRecord, Context

from fedroute import protocol
from fedroute.client.agent import AgentState
from fedroute.client.settings import RoutingSettings

__all__ = ["load_agent_state", "save_agent_state", "state_directory"]

logger = logging.getLogger("fedroute")
KEPT_ROUNDS = 2


def state_directory(context: Context) -> Optional[Path]:
    """The client's state directory, if configured (node config first)."""
    value = context.node_config.get("state-dir") or context.run_config.get("client-state-dir") or ""
    return Path(str(value)) if value else None


def _rounds_in_context(context: Context, run_key: str) -> dict[int, str]:
    prefix = f"{protocol.STATE_PREFIX}{run_key}@"
    return {int(key[len(prefix):]): key for key in context.state.keys() if key.startswith(prefix)}


def _file(directory: Path, run_key: str, client_id: int) -> Path:
    return directory / run_key / f"client-{client_id}.npz"


def _read_file(path: Path) -> dict[int, dict[str, np.ndarray]]:
    if not path.exists():
        return {}
    with np.load(path, allow_pickle=False) as stored:
        states: dict[int, dict[str, np.ndarray]] = {}
        for name in stored.files:
            round_text, _, field = name.partition("/")
            states.setdefault(int(round_text), {})[field] = stored[name]
    return states


def _write_file(path: Path, states: dict[int, dict[str, np.ndarray]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    buffer = io.BytesIO()
    np.savez(buffer, **{f"{round_index}/{field}": value
                        for round_index, arrays in states.items() for field, value in arrays.items()})
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(handle, "wb") as stream:
        stream.write(buffer.getvalue())
    os.replace(temporary, path)


def load_agent_state(
    context: Context, run_key: str, settings: RoutingSettings, round_index: int,
    client_id: int, directory: Optional[Path] = None,
) -> AgentState:
    """The newest stored state of a round before ``round_index``, or a fresh one.

    A stored state whose arm count differs from ``settings`` (a changed
    controller set) is discarded rather than misread.
    """
    in_context = {t: key for t, key in _rounds_in_context(context, run_key).items() if t < round_index}
    arrays = None
    if in_context:
        key = in_context[max(in_context)]
        arrays = {name: array.numpy() for name, array in context.state[key].items()}
    elif directory is not None:
        on_disk = {t: state for t, state in _read_file(_file(directory, run_key, client_id)).items() if t < round_index}
        if on_disk:
            arrays = on_disk[max(on_disk)]
    if arrays is not None:
        state = AgentState.from_arrays(arrays)
        if state.exp3_log_weights.shape == (1, settings.num_arms):
            return state
        logger.warning("client %d: stored state does not fit the controller set; starting afresh", client_id)
    elif round_index > 0:
        logger.info("client %d: no stored state before round %d; starting afresh", client_id, round_index)
    return AgentState.initial(1, settings)


def save_agent_state(
    context: Context, run_key: str, state: AgentState, round_index: int,
    client_id: int, directory: Optional[Path] = None,
) -> None:
    """Store the state after round ``round_index``; keep the newest two rounds."""
    arrays = state.to_arrays()
    context.state[f"{protocol.STATE_PREFIX}{run_key}@{round_index}"] = ArrayRecord(
        {name: Array(np.ascontiguousarray(value)) for name, value in arrays.items()})
    stored = _rounds_in_context(context, run_key)
    kept = sorted(t for t in stored if t <= round_index)[-KEPT_ROUNDS:]
    for t, key in stored.items():
        if t not in kept:
            del context.state[key]
    if directory is not None:
        path = _file(directory, run_key, client_id)
        on_disk = {t: s for t, s in _read_file(path).items() if t < round_index}
        on_disk[round_index] = arrays
        _write_file(path, {t: on_disk[t] for t in sorted(on_disk)[-KEPT_ROUNDS:]})
