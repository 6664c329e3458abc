"""Rotated decision boundaries: a 2-16-2 MLP on 2-D points, groups whose boundaries are rotated.

The plugin case of issue 10 and a scenario of ``fedroute reproduce scenarios``.
A new model the paper never ran: small, nonlinear, and its groups conflict
everywhere (two half-planes whose normals differ by 120° disagree on two thirds
of the plane).

Data (ours)
-----------
``G`` groups (default 3); client ``i`` is in group ``i mod G``.  Group ``g``'s
boundary normal is ``u_g = (cos φ_g, sin φ_g)`` with ``φ_g = 2π g / G``
(0°, 120°, 240° for ``G = 3``).  A client draws ``x ~ N(0, I_2)`` and a label
``y ~ Bernoulli(σ(s · u_gᵀx))`` (a logistic teacher of sharpness
``s = label_sharpness``), from ``generator(seed, client_id, 0, Purpose.DATA)``:
``samples_per_client`` training and ``test_samples_per_client`` held-out samples.
The soft labels give every group a loss floor above zero (the teacher's
cross-entropy; ≈ 0.19 nats at ``s = 5``), so "within 10 % of a per-group model"
is a statement about models, not about how fast a loss reaches zero.

Model and update
----------------
``torch.nn.Sequential(Linear(2, H), ReLU(), Linear(H, 2))`` with ``H =
hidden_units = 16`` as a flat float32 vector (``W1, b1, W2, b2``; ``P = 82``),
the mean cross-entropy, and ``local_steps`` full-batch SGD steps of
``learning_rate`` — the kernels of :mod:`fedroute.tasks.characters` (batched
over clients, runs and models).  ``initial_models(K)`` are ``K`` independent
draws of torch's ``nn.Linear`` default initialisation (``U(±1/√fan_in)``),
cluster ``k`` from ``generator(seed, k, 0, Purpose.INIT)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from fedroute.core.randomness import Purpose, generator
from fedroute.core.task import checked_client_ids, validate_task_settings
from fedroute.tasks.characters import CharactersClients, _init_parameters, client_batch, mlp_num_parameters, \
    zero_output_layer

__all__ = ["BoundariesTask"]


@dataclass(frozen=True)
class BoundariesTask:
    """Configuration of the rotated-boundaries task (see the module docstring).

    Parameters
    ----------
    num_clients : int
        ``n`` (≥ ``num_groups``); client ``i`` is in group ``i mod G``.
    num_groups : int
        ``G`` (≥ 1), boundaries rotated by ``360°/G``.
    samples_per_client, test_samples_per_client : int
        Training and held-out points per client (≥ 1).
    label_sharpness : float
        ``s`` (> 0), the teacher's logit scale.
    hidden_units : int
        ``H`` (≥ 1).
    local_steps : int
        Full-batch SGD steps per executed update (≥ 1).
    learning_rate : float
        SGD learning rate (> 0).
    seed : int
        Data and initialisation seed (≥ 0).
    """

    num_clients: int = 15
    num_groups: int = 3
    samples_per_client: int = 200
    test_samples_per_client: int = 200
    label_sharpness: float = 5.0
    hidden_units: int = 16
    local_steps: int = 5
    learning_rate: float = 0.5
    seed: int = 0
    name: str = "boundaries"

    def __post_init__(self) -> None:
        validate_task_settings(
            self, "boundaries",
            ("num_clients", "num_groups", "samples_per_client", "test_samples_per_client", "hidden_units",
             "local_steps", "seed"),
            ("label_sharpness", "learning_rate"),
            lambda: [
                (self.num_groups >= 1, "num-groups", self.num_groups, "an integer ≥ 1"),
                (self.num_clients >= self.num_groups, "num-clients", self.num_clients,
                 f"an integer ≥ num-groups ({self.num_groups})"),
                (self.samples_per_client >= 1, "samples-per-client", self.samples_per_client, "an integer ≥ 1"),
                (self.test_samples_per_client >= 1, "test-samples-per-client", self.test_samples_per_client,
                 "an integer ≥ 1"),
                (self.label_sharpness > 0, "label-sharpness", self.label_sharpness, "> 0"),
                (self.hidden_units >= 1, "hidden-units", self.hidden_units, "an integer ≥ 1"),
                (self.local_steps >= 1, "local-steps", self.local_steps, "an integer ≥ 1"),
                (self.learning_rate > 0, "learning-rate", self.learning_rate, "> 0"),
                (self.seed >= 0, "seed", self.seed, "an integer ≥ 0"),
            ])

    @property
    def num_parameters(self) -> int:
        """``P = 2H + H + 2H + 2``."""
        return mlp_num_parameters(2, self.hidden_units, 2)

    @property
    def normals(self) -> NDArray[np.float64]:
        """Boundary normals ``u_g``, shape (G, 2)."""
        angles = 2.0 * np.pi * np.arange(self.num_groups) / self.num_groups
        return np.stack([np.cos(angles), np.sin(angles)], axis=1)

    def groups(self, client_ids: NDArray[np.int64]) -> NDArray[np.int64]:
        """Latent group of each client (evaluation only)."""
        return np.asarray(client_ids, dtype=np.int64) % self.num_groups

    def clients(self, client_ids: NDArray[np.int64]) -> CharactersClients:
        """Data of the given clients; a client's points depend only on ``(seed, id)``."""
        client_ids = checked_client_ids(client_ids, self.num_clients)
        groups = self.groups(client_ids)
        total = self.samples_per_client + self.test_samples_per_client
        train, test = [], []
        for client, group in zip(client_ids, groups):
            rng = generator(self.seed, client, 0, Purpose.DATA)
            points = rng.standard_normal((total, 2))
            probability = 1.0 / (1.0 + np.exp(-self.label_sharpness * points @ self.normals[group]))
            labels = (rng.random(total) < probability).astype(np.int64)
            points = points.astype(np.float32)
            train.append((points[:self.samples_per_client], labels[:self.samples_per_client]))
            test.append((points[self.samples_per_client:], labels[self.samples_per_client:]))
        return client_batch(client_ids, groups, train, test, self.samples_per_client, self.test_samples_per_client,
                            self.hidden_units, 2, self.local_steps, self.learning_rate)

    def initial_models(self, num_clusters: int) -> NDArray[np.float32]:
        """``K`` independent default initialisations, shape (K, P) float32."""
        return np.stack([_init_parameters(self.seed, 2, self.hidden_units, 2, stream=k)
                         for k in range(num_clusters)])

    def initial_global_model(self) -> NDArray[np.float32]:
        """FedCAM's ``Θ_glob^0`` (output-sum form): the first initial model with a zero output layer."""
        return zero_output_layer(self.initial_models(1)[0], 2, self.hidden_units, 2)
