"""IFCA's synthetic task (Ghosh et al., 2020, §5.1): a mixture of ``p`` linear regressions; pure numpy.

As in the IFCA authors' synthetic code: ``m`` machines in ``p`` equal contiguous groups (machine ``i`` belongs
to group ``i // (m/p)``); group ``j``'s optimal weights are ``θ*_j = R·b_j`` with ``b_j`` i.i.d. Bernoulli(½)
entries (``R``: the separation); machine ``i`` of group ``j`` draws ``x ~ N(0, I_d)`` and ``y = xᵀθ*_j + σε``;
every cluster model starts at an independent Bernoulli(½) vector (IFCA's random initialisation, whatever
``R``), seeded by ``init_seed`` (IFCA's ``train_seed``) apart from the data's ``seed``.

fedroute's loss is ``½ mean (xᵀw − y)²`` (IFCA's is the mean squared error, twice it): a local step
``η_loc`` here is IFCA's step ``γ = η_loc / 2``.  Machines hold fewer samples than dimensions in IFCA's
setting (``n < d``), so losses and steps use the raw samples, ``O(n·d)`` per machine and model.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from fedroute.core.randomness import Purpose, generator
from fedroute.core.task import checked_client_ids, validate_task_settings
from fedroute.tasks.linear import gaussian_regression_samples

__all__ = ["MixtureTask", "MixtureClients"]


@dataclass(frozen=True)
class MixtureClients:
    """Training and held-out samples of a batch of machines: inputs ``(n, s, d)``, targets ``(n, s)``."""

    client_ids: NDArray[np.int64]
    groups: NDArray[np.int64]
    num_examples: NDArray[np.int64]
    train: tuple[NDArray[np.float64], NDArray[np.float64]]
    test: tuple[NDArray[np.float64], NDArray[np.float64]]
    local_steps: int
    learning_rate: float

    def losses(self, cluster_models: NDArray[np.floating], split: str = "train") -> NDArray[np.float64]:
        """``½ mean (xᵀw_k − y)²`` for every machine and model, shape (n, K); models (K, d) or (n, K, d)."""
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        inputs, targets = self.train if split == "train" else self.test
        models = np.asarray(cluster_models, dtype=np.float64)
        if models.ndim == 2:
            models = np.broadcast_to(models, (len(inputs), *models.shape))
        residuals = np.matmul(models, inputs.transpose(0, 2, 1)) - targets[:, None, :]   # (n, K, s)
        return 0.5 * np.mean(residuals * residuals, axis=-1)

    def local_update(
        self, models: NDArray[np.floating], client_index: NDArray[np.int64], round_index: int
    ) -> NDArray[np.floating]:
        """``E`` full-batch gradient steps of model ``j`` on machine ``client_index[j]``."""
        inputs, targets = self.train
        if not np.array_equal(client_index, np.arange(len(targets))):  # all machines in order: no copy
            inputs, targets = inputs[client_index], targets[client_index]
        weights = np.array(models, dtype=np.float64, copy=True)
        for _ in range(self.local_steps):
            residuals = np.matmul(inputs, weights[:, :, None])[:, :, 0] - targets               # (m, s)
            weights -= self.learning_rate * np.matmul(residuals[:, None, :], inputs)[:, 0] / inputs.shape[1]
        return weights


@dataclass(frozen=True)
class MixtureTask:
    """Configuration of IFCA's mixture of linear regressions.

    Parameters
    ----------
    num_clients : int
        ``m`` (a multiple of ``num_groups``).
    num_groups : int
        ``p`` (≥ 2).
    dimension : int
        ``d`` (≥ 1).
    samples_per_client, test_samples_per_client : int
        ``n`` and held-out samples per machine (≥ 1).
    separation : float
        ``R`` (> 0): ``θ*_j ∈ {0, R}^d``.
    noise_std : float
        ``σ`` (≥ 0).
    local_steps : int
        ``E`` (≥ 1).
    learning_rate : float
        ``η_loc`` in ``(0, 1]`` (IFCA's ``γ = η_loc / 2``).
    seed : int
        Data and ``θ*`` seed (IFCA's ``data_seed``).
    init_seed : int
        Initial models' seed (IFCA's ``train_seed``).
    """

    num_clients: int = 100
    num_groups: int = 2
    dimension: int = 50
    samples_per_client: int = 5
    test_samples_per_client: int = 5
    separation: float = 0.5
    noise_std: float = 0.1
    local_steps: int = 1
    learning_rate: float = 0.2
    seed: int = 0
    init_seed: int = 0
    name: str = "ifca-mixture"

    def __post_init__(self) -> None:
        validate_task_settings(
            self, "ifca-mixture", ("num_clients", "num_groups", "dimension", "samples_per_client",
                                   "test_samples_per_client", "local_steps", "seed", "init_seed"),
            ("separation", "noise_std", "learning_rate"), lambda: [
                (self.num_groups >= 2, "num-groups", self.num_groups, "an integer ≥ 2"),
                (self.num_clients >= self.num_groups and self.num_clients % self.num_groups == 0, "num-clients",
                 self.num_clients, f"a positive multiple of num-groups = {self.num_groups}"),
                (self.dimension >= 1, "dimension", self.dimension, "an integer ≥ 1"),
                (self.samples_per_client >= 1, "samples-per-client", self.samples_per_client, "an integer ≥ 1"),
                (self.test_samples_per_client >= 1, "test-samples-per-client", self.test_samples_per_client,
                 "an integer ≥ 1"),
                (self.separation > 0, "separation", self.separation, "> 0"),
                (self.noise_std >= 0, "noise-std", self.noise_std, "≥ 0"),
                (self.local_steps >= 1, "local-steps", self.local_steps, "an integer ≥ 1"),
                (0 < self.learning_rate <= 1, "learning-rate", self.learning_rate, "(0, 1]"),
                (self.seed >= 0, "seed", self.seed, "an integer ≥ 0"),
                (self.init_seed >= 0, "init-seed", self.init_seed, "an integer ≥ 0"),
            ])

    @property
    def group_parameters(self) -> NDArray[np.float64]:
        """``θ*_j = R·b_j``, ``b_j`` i.i.d. Bernoulli(½) entries, as a (p, d) array."""
        rng = generator(self.seed, 0, 0, Purpose.TASK)
        return self.separation * rng.binomial(1, 0.5, size=(self.num_groups, self.dimension)).astype(np.float64)

    def groups(self, client_ids: NDArray[np.int64]) -> NDArray[np.int64]:
        """Group of each machine: contiguous blocks of ``m / p`` (evaluation only)."""
        return np.asarray(client_ids, dtype=np.int64) // (self.num_clients // self.num_groups)

    def clients(self, client_ids: NDArray[np.int64]) -> MixtureClients:
        """The given machines' samples; each machine's depend only on ``(seed, id)``."""
        client_ids = checked_client_ids(client_ids, self.num_clients)
        groups, theta = self.groups(client_ids), self.group_parameters
        total = self.samples_per_client + self.test_samples_per_client
        inputs, targets = gaussian_regression_samples(self.seed, client_ids, theta[groups], total, self.noise_std)
        split = self.samples_per_client
        return MixtureClients(
            client_ids=client_ids, groups=groups,
            num_examples=np.full(len(client_ids), split, dtype=np.int64),
            train=(inputs[:, :split], targets[:, :split]), test=(inputs[:, split:], targets[:, split:]),
            local_steps=self.local_steps, learning_rate=self.learning_rate)

    def initial_models(self, num_clusters: int) -> NDArray[np.float64]:
        """``W^0``: ``K`` independent Bernoulli(½) vectors (IFCA's random initialisation), shape (K, d)."""
        rng = generator(self.init_seed, 0, 0, Purpose.INIT)
        return rng.binomial(1, 0.5, size=(num_clusters, self.dimension)).astype(np.float64)
