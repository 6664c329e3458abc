"""Atomic checkpoints of a strategy: cluster models, masses, history and the round counter.

:func:`save_checkpoint` / :func:`load_checkpoint` are the file format; :func:`run_identity` is what a
resumed run must match; :func:`checkpoint_meta` and :func:`restore_run` map a run's :class:`~fedroute.strategies.state.RunState` to and from it.

One ``checkpoint.npz`` per strategy, replaced atomically (temporary file +
``os.replace``) after every round: a crash leaves either the previous or the
new checkpoint, never a torn one.  Arrays are stored by name; everything else
goes into a JSON ``meta`` entry, including an ``identity`` (settings, seed,
``K``) that a resumed run must match.  A checkpoint that cannot be read stops
the run with a :class:`CheckpointError` naming the file; it is never skipped
(that would restart the run from round 1 and overwrite it).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional

import numpy as np
from numpy.typing import NDArray

from fedroute.atomic_files import atomic_write
from fedroute.core.server_step import ServerState
from fedroute.strategies.identity import ClientBindings
from fedroute.strategies.rejections import RejectionLog
from fedroute.strategies.validation import printable

if TYPE_CHECKING:
    from fedroute.core.influence import InfluenceBounds
    from fedroute.core.participation import Participation
    from fedroute.core.settings import RoutingSettings
    from fedroute.strategies.algorithms import Algorithm
    from fedroute.strategies.state import RunState

__all__ = ["save_checkpoint", "load_checkpoint", "check_arrays", "stored_masses", "CheckpointError", "CHECKPOINT_FILE",
           "checkpoint_meta", "restore_run", "run_identity"]

CHECKPOINT_FILE = "checkpoint.npz"


class CheckpointError(ValueError):
    """A checkpoint file is unreadable or does not fit the run; the message names the file."""


def save_checkpoint(directory: Path, arrays: Mapping[str, NDArray], meta: Mapping[str, Any]) -> Path:
    """Write ``arrays`` and ``meta`` to ``directory/checkpoint.npz`` atomically."""
    return atomic_write(directory / CHECKPOINT_FILE, lambda stream: np.savez(
        stream, __meta__=np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8),
        **{name: np.asarray(value) for name, value in arrays.items()}))


def load_checkpoint(directory: Path) -> Optional[tuple[dict[str, NDArray], dict[str, Any]]]:
    """``(arrays, meta)`` from ``directory/checkpoint.npz``, or ``None`` if there is none.

    Raises
    ------
    CheckpointError
        The file exists but is not a readable checkpoint (truncated, not an
        ``.npz``, no or malformed ``__meta__``); the message names it.
    """
    path = directory / CHECKPOINT_FILE
    if not path.exists():
        return None
    try:
        with np.load(path, allow_pickle=False) as stored:
            if "__meta__" not in stored.files:
                raise ValueError("it has no '__meta__' entry")
            arrays = {name: stored[name] for name in stored.files if name != "__meta__"}
            meta = json.loads(stored["__meta__"].tobytes().decode())
        if not isinstance(meta, dict):
            raise ValueError("its '__meta__' entry is not a JSON object")
    except Exception as error:  # zipfile.BadZipFile, OSError, ValueError, EOFError, UnicodeDecodeError, ...
        raise CheckpointError(f"checkpoint {path} cannot be read ({type(error).__name__}: {str(error)[:200]}); "
                              "restore it, or delete it to start the run afresh") from None
    return arrays, meta


def check_arrays(path: Path, arrays: Mapping[str, NDArray], expected: Mapping[str, NDArray]) -> None:
    """Raise :class:`CheckpointError` (naming ``path`` and the array) unless every expected array is
    there with the expected shape and dtype, and finite."""
    for name, value in expected.items():
        if name not in arrays or arrays[name].shape != value.shape or arrays[name].dtype != value.dtype:
            found = "missing" if name not in arrays else f"{arrays[name].shape} {arrays[name].dtype}"
            raise CheckpointError(f"checkpoint {path}: array '{name}' is {found}; expected {value.shape} {value.dtype}")
        if not np.all(np.isfinite(arrays[name])):
            raise CheckpointError(f"checkpoint {path}: array '{name}' has NaN or Inf entries")


def stored_masses(values: Any, num_clusters: int) -> Optional[NDArray[np.float64]]:
    """Masses from a checkpoint's meta: ``None`` or ``K`` finite numbers ≥ 0 (else ``ValueError``)."""
    if values is None:
        return None
    masses = np.asarray(values, dtype=np.float64)
    if masses.shape != (num_clusters,) or not np.all(np.isfinite(masses)) or np.any(masses < 0):
        raise ValueError(f"masses of shape {masses.shape}; expected {num_clusters} finite numbers ≥ 0")
    return masses


def _listed(masses: Optional[NDArray[np.float64]]) -> Optional[list[float]]:
    return None if masses is None else masses.tolist()


def run_identity(strategy_name: str, routing: "RoutingSettings", seed: int, run_key: str,
                 influence: "InfluenceBounds", participation: "Participation",
                 template: Mapping[str, NDArray]) -> dict[str, Any]:
    """What a checkpoint must match to be resumed: the strategy class, its settings, the models' layout."""
    return {"class": strategy_name, "routing": routing.to_dict(), "seed": seed, "run_key": run_key,
            "influence": influence.to_dict(),
            "participation": {"fraction": float(participation.fraction), "min_clients": participation.min_clients,
                              "report_rounds": participation.report_rounds},
            "template": {name: [list(value.shape), str(value.dtype)] for name, value in template.items()}}


def checkpoint_meta(identity: Mapping[str, Any], server_round: int, state: "RunState",
                    alarms: Mapping[str, Any]) -> dict[str, Any]:
    """The ``meta`` entry of a run's checkpoint after ``server_round`` (``alarms``: the alarm state)."""
    return {
        "identity": dict(identity),
        "server_round": server_round,
        "routing_masses": _listed(state.routing_masses),
        "provisional_masses": _listed(state.provisional_masses),
        "preferred_masses": _listed(state.preferred_masses),
        "server": state.server.to_json(),
        "history": state.history,
        "client_routes": {str(t): {str(c): r for c, r in routes.items()} for t, routes in state.client_routes.items()},
        "rejected": state.rejections.to_json(),
        "bindings": state.bindings.to_json(),
        "alarms": dict(alarms),
    }


def restore_run(path: Path, stored: tuple[dict[str, NDArray], dict[str, Any]], identity: Mapping[str, Any],
                state: "RunState", algorithm: "Algorithm", load_alarms: Callable[[Any], None]) -> int:
    """Restore ``state`` from a loaded checkpoint made with the same ``identity``; return its round.

    Raises
    ------
    CheckpointError
        Other settings, or a malformed entry (the message names ``path``).
    """
    arrays, meta = stored
    if meta.get("identity") != identity:
        raise CheckpointError(f"the checkpoint {path} was made with other settings "
                              f"({meta.get('identity')}); delete it or choose another checkpoint directory")
    check_arrays(path, arrays, algorithm.checkpoint_arrays(state))
    try:
        algorithm.restore_arrays(state, arrays)
        state.routing_masses = stored_masses(meta["routing_masses"], state.num_clusters)
        state.provisional_masses = stored_masses(meta["provisional_masses"], state.num_clusters)
        state.preferred_masses = stored_masses(meta["preferred_masses"], state.num_clusters)
        state.server = ServerState.from_json(meta["server"])
        state.history = list(meta["history"])
        state.client_routes = {int(t): {int(c): int(r) for c, r in routes.items()}
                               for t, routes in meta["client_routes"].items()}
        state.rejections = RejectionLog.from_json(meta["rejected"])
        state.bindings = ClientBindings.from_json(meta.get("bindings", []))
        if "alarms" in meta:
            load_alarms(meta["alarms"])
        state.resumed_from_round = int(meta["server_round"])
        if state.resumed_from_round < 1:
            raise ValueError(f"server_round = {state.resumed_from_round} < 1")
    except (KeyError, TypeError, ValueError, AttributeError) as error:
        raise CheckpointError(f"checkpoint {path} is malformed ({type(error).__name__}: "
                              f"{printable(error)}); delete it or choose another checkpoint directory") from None
    return state.resumed_from_round
