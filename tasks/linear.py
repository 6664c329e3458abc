"""Two-group linear regression (paper §2, EXPERIMENTS E1/E2); pure numpy.

Group ``g`` draws ``x ~ N(0, I_d)`` and ``y = xᵀθ_g + ε``, ``ε ~ N(0, σ²)``,
with ``θ_0 = +(Δ/2) e_0`` and ``θ_1 = -(Δ/2) e_0`` (so ``θ̄ = 0`` and
``‖θ_1 - θ_0‖ = Δ``).  Client ``i`` belongs to group ``i mod 2`` (balanced,
``α = ½``).  The loss is ``½ mean (xᵀw - y)²``, whose population version is
``½‖w - θ_g‖² + σ²/2``.  The local update is ``E`` full-batch gradient steps
with learning rate ``η_loc``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from fedroute.core.randomness import Purpose, generator
from fedroute.core.task import checked_client_ids, validate_task_settings

__all__ = ["LinearTask", "LinearClients", "LinearSamples", "INIT_MODES", "gaussian_regression_samples"]


def gaussian_regression_samples(seed: int, client_ids: NDArray[np.int64], parameters: NDArray[np.floating],
                                num_samples: int, noise_std: float) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Each client's ``num_samples`` pairs ``y = x·θ + σ ε`` with ``x, ε`` standard normal.

    Client ``i``'s draws come from ``(seed, i, 0, Purpose.DATA)`` (inputs first, then
    noise), so its data do not depend on which other clients are drawn.

    Parameters
    ----------
    seed : int
    client_ids : ndarray of int, shape (n,)
    parameters : ndarray, shape (n, d)
        Each client's ``θ`` (its group's).
    num_samples : int
    noise_std : float
        ``σ``.

    Returns
    -------
    inputs : ndarray, shape (n, num_samples, d)
    targets : ndarray, shape (n, num_samples)
    """
    dimension = parameters.shape[-1]
    inputs = np.empty((len(client_ids), num_samples, dimension))
    targets = np.empty((len(client_ids), num_samples))
    for row, client in enumerate(client_ids):
        rng = generator(seed, client, 0, Purpose.DATA)
        inputs[row] = rng.standard_normal((num_samples, dimension))
        targets[row] = inputs[row] @ parameters[row] + noise_std * rng.standard_normal(num_samples)
    return inputs, targets


INIT_MODES = ("spread", "collapsed", "copies")


@dataclass(frozen=True)
class LinearSamples:
    """Raw samples of a batch of linear-task clients, shape (n, s, d) and (n, s)."""

    client_ids: NDArray[np.int64]
    groups: NDArray[np.int64]
    train_inputs: NDArray[np.float64]
    train_targets: NDArray[np.float64]
    test_inputs: NDArray[np.float64]
    test_targets: NDArray[np.float64]


@dataclass(frozen=True)
class LinearClients:
    """Training and held-out data of a batch of linear-task clients.

    The squared loss only needs each client's moments, so the data are kept as
    ``Σ̂ = XᵀX/s``, ``b = Xᵀy/s`` and ``c = yᵀy/s`` per split:
    ``½ mean (xᵀw - y)² = ½ (wᵀΣ̂w - 2bᵀw + c)`` and its gradient is ``Σ̂w - b``.
    This makes the loss and update cost ``O(d²)`` per client and model instead
    of ``O(s·d)``.
    """

    client_ids: NDArray[np.int64]
    groups: NDArray[np.int64]
    num_examples: NDArray[np.int64]
    train_moments: tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]
    test_moments: tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]
    local_steps: int
    learning_rate: float

    def losses(self, cluster_models: NDArray[np.floating], split: str = "train") -> NDArray[np.float64]:
        """``½ mean (xᵀw_k - y)²`` for every client and model, shape (n, K).

        ``cluster_models`` is ``(K, d)`` (shared) or ``(n, K, d)`` (one set per client).
        """
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        second, cross, target = self.train_moments if split == "train" else self.test_moments
        models = np.asarray(cluster_models, dtype=np.float64)
        if models.ndim == 2:
            models = models[None]
        quadratic = np.sum(models * np.matmul(models, second), axis=-1)
        return 0.5 * (quadratic - 2.0 * np.sum(models * cross[:, None, :], axis=-1) + target[:, None])

    def local_update(
        self, models: NDArray[np.floating], client_index: NDArray[np.int64], round_index: int
    ) -> NDArray[np.floating]:
        """``E`` full-batch gradient steps of model ``j`` on client ``client_index[j]``."""
        second, cross, _ = self.train_moments
        second, cross = second[client_index], cross[client_index]
        weights = np.array(models, dtype=np.float64, copy=True)
        for _ in range(self.local_steps):
            gradient = np.matmul(second, weights[:, :, None])[:, :, 0] - cross
            weights -= self.learning_rate * gradient
        return weights


def _moments(inputs: NDArray[np.float64], targets: NDArray[np.float64]):
    """``(XᵀX/s, Xᵀy/s, yᵀy/s)`` per client."""
    samples = inputs.shape[1]
    return (np.matmul(inputs.transpose(0, 2, 1), inputs) / samples,
            np.matmul(inputs.transpose(0, 2, 1), targets[:, :, None])[:, :, 0] / samples,
            np.sum(targets * targets, axis=1) / samples)


@dataclass(frozen=True)
class LinearTask:
    """Configuration of the two-group linear task.

    Parameters
    ----------
    num_clients : int
        ``n`` (≥ 2), balanced over the two groups.
    dimension : int
        ``d`` (≥ 2).
    group_distance : float
        ``Δ = ‖θ_1 - θ_0‖`` (> 0).
    samples_per_client, test_samples_per_client : int
        Training and held-out samples per client (≥ 1).
    noise_std : float
        ``σ`` (≥ 0).
    local_steps : int
        ``E`` (≥ 1).
    learning_rate : float
        ``η_loc`` in ``(0, 1]``.
    init : {"spread", "collapsed"}
        ``spread``: ``w_k^0 = θ̄ + ρ z_k``, ``z_k ~ N(0, I)`` (paper §4).
        ``collapsed``: ``w_0^0 = θ̄`` and ``w_k^0 = θ̄ + ρ u_k`` with ``u_k``
        random unit vectors orthogonal to ``θ_1 - θ_0``: every group prefers
        cluster 0 and the start lies in the certified starvation basin for any
        ``ρ > 0``.  ``copies``: ``K`` identical copies of ``spread``'s first
        model ``θ̄ + ρ z_0`` (the symmetric start: every loss ties).
    init_spread : float
        ``ρ`` (≥ 0).
    seed : int
        Data and initialisation seed (≥ 0).
    """

    num_clients: int = 80
    dimension: int = 5
    group_distance: float = 4.0
    samples_per_client: int = 40
    test_samples_per_client: int = 40
    noise_std: float = 0.5
    local_steps: int = 1
    learning_rate: float = 0.5
    init: str = "spread"
    init_spread: float = 3.0
    seed: int = 0
    name: str = "linear"

    def __post_init__(self) -> None:
        validate_task_settings(self, "linear", integers=(
            "num_clients", "dimension", "samples_per_client", "test_samples_per_client", "local_steps", "seed"),
            numbers=("group_distance", "noise_std", "learning_rate", "init_spread"), checks=lambda: [
            (self.num_clients >= 2, "num-clients", self.num_clients, "an integer ≥ 2"),
            (self.dimension >= 2, "dimension", self.dimension, "an integer ≥ 2"),
            (self.group_distance > 0, "group-distance", self.group_distance, "> 0"),
            (self.samples_per_client >= 1, "samples-per-client", self.samples_per_client, "an integer ≥ 1"),
            (self.test_samples_per_client >= 1, "test-samples-per-client", self.test_samples_per_client, "≥ 1"),
            (self.noise_std >= 0, "noise-std", self.noise_std, "≥ 0"),
            (self.local_steps >= 1, "local-steps", self.local_steps, "an integer ≥ 1"),
            (0 < self.learning_rate <= 1, "learning-rate", self.learning_rate, "(0, 1]"),
            (self.init in INIT_MODES, "init", self.init, f"one of {INIT_MODES}"),
            (self.init_spread >= 0, "init-spread", self.init_spread, "≥ 0"),
            (self.seed >= 0, "seed", self.seed, "an integer ≥ 0"),
        ])

    @property
    def group_parameters(self) -> NDArray[np.float64]:
        """``θ_g`` as a (2, d) array."""
        theta = np.zeros((2, self.dimension))
        theta[0, 0], theta[1, 0] = self.group_distance / 2, -self.group_distance / 2
        return theta

    @property
    def group_proportions(self) -> NDArray[np.float64]:
        """``(α, 1 - α)`` of the client population."""
        groups = self.groups(np.arange(self.num_clients))
        return np.bincount(groups, minlength=2) / self.num_clients

    def groups(self, client_ids: NDArray[np.int64]) -> NDArray[np.int64]:
        """Latent group of each client (evaluation only)."""
        return np.asarray(client_ids, dtype=np.int64) % 2

    def samples(self, client_ids: NDArray[np.int64]) -> LinearSamples:
        """Raw samples of the given clients; each client's data depends only on ``(seed, id)``."""
        client_ids = checked_client_ids(client_ids, self.num_clients)
        groups = self.groups(client_ids)
        theta = self.group_parameters
        total = self.samples_per_client + self.test_samples_per_client
        inputs, targets = gaussian_regression_samples(self.seed, client_ids, theta[groups], total, self.noise_std)
        split = self.samples_per_client
        return LinearSamples(client_ids=client_ids, groups=groups,
                             train_inputs=inputs[:, :split], train_targets=targets[:, :split],
                             test_inputs=inputs[:, split:], test_targets=targets[:, split:])

    def clients(self, client_ids: NDArray[np.int64]) -> LinearClients:
        """The given clients' data as loss moments (see :class:`LinearClients`)."""
        samples = self.samples(client_ids)
        return LinearClients(
            client_ids=samples.client_ids, groups=samples.groups,
            num_examples=np.full(len(samples.client_ids), self.samples_per_client, dtype=np.int64),
            train_moments=_moments(samples.train_inputs, samples.train_targets),
            test_moments=_moments(samples.test_inputs, samples.test_targets),
            local_steps=self.local_steps, learning_rate=self.learning_rate,
        )

    def initial_models(self, num_clusters: int) -> NDArray[np.float64]:
        """``W^0`` of shape (K, d) (see ``init``)."""
        rng = generator(self.seed, 0, 0, Purpose.INIT)
        pooled = self.group_parameters.mean(axis=0)
        directions = rng.standard_normal((num_clusters, self.dimension))
        if self.init == "spread":
            return pooled + self.init_spread * directions
        if self.init == "copies":
            return np.repeat(pooled + self.init_spread * directions[:1], num_clusters, axis=0)
        directions[:, 0] = 0.0  # orthogonal to θ_1 - θ_0
        directions /= np.linalg.norm(directions, axis=1, keepdims=True)
        models = pooled + self.init_spread * directions
        models[0] = pooled
        return models
