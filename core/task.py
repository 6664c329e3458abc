"""What a task gives the routing runtimes: client data with vectorised loss and update.

A task's models are flat parameter vectors (``(P,)``); ``K`` cluster models are
a ``(K, P)`` array.  A :class:`ClientBatch` holds the data of ``n`` clients
(all of them in the batched simulator, one in a Flower ClientApp) and computes
every client's loss of every model and the local update, vectorised.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol, Sequence

import numpy as np
from numpy.typing import NDArray

from fedroute.core.validation import invalid

__all__ = ["ClientBatch", "Task", "checked_client_ids", "validate_task_settings"]


class ClientBatch(Protocol):
    """Data of a batch of clients (leading axis = clients)."""

    client_ids: NDArray[np.int64]
    """Global client ids (randomness coordinates), shape (n,)."""
    groups: NDArray[np.int64]
    """Latent group of each client, for evaluation only, shape (n,)."""
    num_examples: NDArray[np.int64]
    """Training samples per client ``n_i``, shape (n,)."""

    def losses(self, cluster_models: NDArray[np.floating], split: str = "train") -> NDArray[np.float64]:
        """Mean loss of every model on every client: ``(K, P)`` or ``(n, K, P)`` → ``(n, K)``.

        With a 3-D input, client ``i`` is scored on its own set ``cluster_models[i]``
        (the simulator batches several runs as one client axis).  ``split`` is
        ``"train"`` or ``"test"``.
        """

    def local_update(
        self, models: NDArray[np.floating], client_index: NDArray[np.int64], round_index: int
    ) -> NDArray[np.floating]:
        """Local training of model row ``j`` on client ``client_index[j]`` (an index into the batch)."""


class Task(Protocol):
    """A learning task: makes client batches and initial cluster models."""

    name: str
    num_clients: int

    def clients(self, client_ids: NDArray[np.int64]) -> ClientBatch:
        """The data of the given clients."""

    def initial_models(self, num_clusters: int) -> NDArray[np.floating]:
        """``W^0`` as a ``(K, P)`` array."""


def checked_client_ids(client_ids: Any, num_clients: int) -> NDArray[np.int64]:
    """``client_ids`` as a 1-D int64 array, each in ``[0, num_clients - 1]``.

    Raises
    ------
    ValueError
        If an id lies outside that range (the message gives the range and the ids).
    """
    client_ids = np.atleast_1d(np.asarray(client_ids, dtype=np.int64))
    if client_ids.size and (client_ids.min() < 0 or client_ids.max() >= num_clients):
        raise ValueError(f"client ids must lie in [0, {num_clients - 1}], got {client_ids.tolist()}")
    return client_ids


def validate_task_settings(
    task: Any, label: str, integers: Sequence[str], numbers: Sequence[str],
    checks: Callable[[], Sequence[tuple[bool, str, Any, str]]],
) -> None:
    """Validate a task dataclass: types first, then the range ``checks``.

    Errors read ``<label> task setting '<run-config key>' = <value> is invalid; allowed: <range>``.

    Parameters
    ----------
    task : dataclass instance
    label : str
        The task's name in messages.
    integers, numbers : sequences of field names
        Fields that must be integers (not bools) / finite numbers.
    checks : callable
        Returns ``(holds, key, value, allowed)`` tuples; called after the type checks.
    """
    def fail(key: str, value: Any, allowed: str) -> None:
        raise invalid(f"{label} task setting '{key}'", value, allowed)

    for name in integers:
        value = getattr(task, name)
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            fail(name.replace("_", "-"), value, "an integer")
    for name in numbers:
        value = getattr(task, name)
        if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) \
                or not np.isfinite(value):
            fail(name.replace("_", "-"), value, "a finite number")
    for holds, key, value, allowed in checks():
        if not holds:
            fail(key, value, allowed)
