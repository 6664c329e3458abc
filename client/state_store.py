"""A client's controller state across rounds: ``Context.state``, and optionally a file.

States are stored per completed round (``<run-key>@<t>``, a ConfigRecord of
flat lists: a few small vectors, cheaper to store and read than arrays) and the
latest two are kept.  Round ``t`` always starts from the newest state of a round before
``t``, so a round the server sends again (after the server side restarted
from a checkpoint) is replayed from the same state and gives the same result.
With a state directory (node config ``state-dir``, or run config
``client-state-dir`` in simulation) the same entries are also written to
``<dir>/<run-key>/client-<id>.npz`` atomically, so a restarted SuperNode, or a
new Flower run resuming a checkpoint, continues where the client was.

A state file that cannot be read (truncated, not an ``.npz``, wrong content)
is moved aside to ``client-<id>.npz.corrupt-<time>`` with a WARNING and the
client starts afresh; so does a client whose state is missing after round 0
(a restarted node without a state directory): it says so at WARNING.  Files
are written to a temporary file, flushed to disk and renamed.  The run key
names a directory and must match ``[A-Za-z0-9._-]+``
(:func:`fedroute.protocol.check_path_name`).
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path
from typing import Optional

import numpy as np
from flwr.app import ConfigRecord, Context

from fedroute import protocol
from fedroute.atomic_files import atomic_write
from fedroute.core.agent import AgentState
from fedroute.core.settings import RoutingSettings
from fedroute.core.validation import invalid

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
    protocol.check_path_name(run_key, "run key")
    if isinstance(client_id, bool) or not isinstance(client_id, (int, np.integer)) or client_id < 0:
        raise invalid("client id", client_id, "an integer ≥ 0")
    return directory / run_key / f"client-{int(client_id)}.npz"


def _read_file(path: Path) -> dict[int, dict[str, np.ndarray]]:
    """The stored states by round; ``{}`` if there is no file, or if it is unreadable (moved aside)."""
    if not path.exists():
        return {}
    try:
        with np.load(path, allow_pickle=False) as stored:
            states: dict[int, dict[str, np.ndarray]] = {}
            for name in stored.files:
                round_text, _, field = name.partition("/")
                states.setdefault(int(round_text), {})[field] = stored[name]
        return states
    except Exception as error:  # zipfile.BadZipFile, EOFError, ValueError, OSError, ...
        aside = path.with_name(f"{path.name}.corrupt-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}")
        try:
            os.replace(path, aside)
        except OSError:
            aside = path
        logger.warning("client state file %s cannot be read (%s); moved to %s, the client starts afresh",
                       path, type(error).__name__, aside.name)
        return {}


def _write_file(path: Path, states: dict[int, dict[str, np.ndarray]]) -> None:
    atomic_write(path, lambda stream: np.savez(stream, **{
        f"{round_index}/{field}": value for round_index, arrays in states.items() for field, value in arrays.items()}))


def _arrays_of_record(record: ConfigRecord, template: AgentState) -> dict[str, np.ndarray]:
    """The state arrays stored in ``record`` (:func:`save_agent_state`), shaped and typed as ``template``'s;
    ``{}`` if they do not fit (e.g. a changed controller set)."""
    try:
        return {name: np.asarray(record[name], dtype=value.dtype).reshape(value.shape)
                for name, value in template.to_arrays().items()}
    except (KeyError, ValueError, TypeError):
        return {}


def load_agent_state(
    context: Context, run_key: str, settings: RoutingSettings, round_index: int,
    client_id: int, directory: Optional[Path] = None, plays_every_round: bool = True,
) -> AgentState:
    """The newest stored state of a round before ``round_index``, or a fresh one.

    A stored state whose arm count differs from ``settings`` (a changed
    controller set) is discarded rather than misread.  A client without a stored
    state after round 0 starts afresh: a WARNING when it should have played every
    round (``plays_every_round``: full participation), an INFO line otherwise (under
    partial participation a client's first round may come at any ``t``).
    """
    in_context = {t: key for t, key in _rounds_in_context(context, run_key).items() if t < round_index}
    arrays = None
    template = AgentState.initial(1, settings)
    if in_context:
        arrays = _arrays_of_record(context.state[in_context[max(in_context)]], template)
    elif directory is not None:
        on_disk = {t: state for t, state in _read_file(_file(directory, run_key, client_id)).items() if t < round_index}
        if on_disk:
            arrays = on_disk[max(on_disk)]
    if arrays is not None:
        try:
            state = AgentState.from_arrays(arrays)
            fresh = template.to_arrays()
            fits = all(value.shape == fresh[name].shape and value.dtype.kind == fresh[name].dtype.kind
                       for name, value in state.to_arrays().items())
        except (KeyError, ValueError, TypeError, IndexError):
            fits = False
        if fits:
            return state
        logger.warning("client %d: stored state does not fit the controller set; starting afresh", client_id)
    elif round_index > 0 and plays_every_round:
        logger.warning("client %d: no stored state before round %d (a restarted node without its state "
                       "directory?); its controller state starts afresh", client_id, round_index)
    elif round_index > 0:
        logger.info("client %d plays its first round at t=%d (partial participation: sampled for the first "
                    "time, or joining late)", client_id, round_index)
    return AgentState.initial(1, settings)


def save_agent_state(
    context: Context, run_key: str, state: AgentState, round_index: int,
    client_id: int, directory: Optional[Path] = None,
) -> None:
    """Store the state after round ``round_index``; keep the newest two rounds."""
    arrays = state.to_arrays()
    context.state[f"{protocol.STATE_PREFIX}{run_key}@{round_index}"] = ConfigRecord(
        {name: value.ravel().tolist() for name, value in arrays.items()})
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
