"""Rotated digits: an MLP on scikit-learn's 8×8 digits, client groups that see the images rotated.

A scenario of ``fedroute reproduce scenarios`` (issue 10): a nonlinear model with
``G = 4`` groups whose inputs differ by a rotation of 0°, 90°, 180° or 270° (labels
kept) — every group needs its own model for most digits, unlike the characters task
where only 6 and 9 conflict.

Data (ours)
-----------
Client ``c`` is in group ``g = c mod G`` and is the ``j = c div G``-th of the
group's ``m = n/G`` clients.  Each group deals the whole dataset among its own
clients: the 1,797 images of ``load_digits`` (pixels ``/16``, the cached loader of
:mod:`fedroute.tasks.characters`) are permuted with ``generator(seed, g, 0,
Purpose.DATA)`` and client ``j`` gets the permuted positions ``j, j+m, …``
(an image appears once per group, rotated differently in each: the groups are
different tasks, so sharing the pool leaks nothing, and every group has
≈ 1,440 training and 360 held-out images — enough that a per-group model does
not overfit within the scenario's budget).  The client sees its images rotated
by ``90° · g`` (``np.rot90``, both splits); its first
``round(test_fraction · s_c)`` images are held out.

Model and update
----------------
A one-hidden-layer ReLU MLP ``64-H-10`` (``H = hidden_units``), float32, the mean
cross-entropy (the loss of routing and evaluation) and ``local_steps`` full-batch
SGD steps of ``learning_rate`` with weight decay ``λ = weight_decay`` (``w ← w −
η (∇L + λ w)``, as a torch optimiser's ``weight_decay``) — the kernels of
:mod:`fedroute.tasks.characters`.  Weight decay is what makes the scenario's
"converged" test meaningful: without it the held-out loss of equally trained
per-group models differed by up to ±40 % with their training history (pooled
rounds first, or another start); with ``λ = 10⁻³`` by at most ≈ ±12 %
(development seeds 100–103, ``T = 250``).  ``initial_models(K)`` are ``K``
independent draws of torch's default ``nn.Linear`` initialisation (cluster ``k``
from ``generator(seed, k, 0, Purpose.INIT)``).
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

import numpy as np
from numpy.typing import NDArray

from fedroute.core.randomness import Purpose, generator
from fedroute.core.task import checked_client_ids, validate_task_settings
from fedroute.tasks.characters import CharactersClients, _digits, _init_parameters, client_batch, mlp_num_parameters, \
    zero_output_layer

__all__ = ["DigitRotationsTask", "DecayedClients"]

_PIXELS, _CLASSES = 64, 10


@dataclass(frozen=True)
class DecayedClients(CharactersClients):
    """:class:`~fedroute.tasks.characters.CharactersClients` whose local SGD steps decay the weights."""

    weight_decay: float = 0.0

    def local_update(
        self, models: NDArray[np.floating], client_index: NDArray[np.int64], round_index: int
    ) -> NDArray[np.float32]:
        """``local_steps`` full-batch steps ``w ← w − η (∇L + λ w)`` of row ``j`` on client ``client_index[j]``."""
        if self.weight_decay == 0:
            return super().local_update(models, client_index, round_index)
        weights = np.array(models, dtype=np.float32, copy=True)
        client_index = np.asarray(client_index, dtype=np.int64)
        for _ in range(self.local_steps):
            weights -= np.float32(self.learning_rate) * (self.gradients(weights, client_index)
                                                        + np.float32(self.weight_decay) * weights)
        return weights

    def output_sum_update(
        self, global_models: NDArray[np.floating], cluster_models: NDArray[np.floating],
        client_index: NDArray[np.int64], round_index: int,
    ) -> tuple[NDArray[np.float32], NDArray[np.float32]]:
        """FedCAM's output-sum steps with the same decay: each step ``θ ← θ − (η/2)(∇L + λ θ)`` on both parts."""
        if self.weight_decay == 0:
            return super().output_sum_update(global_models, cluster_models, client_index, round_index)
        single = replace(self, local_steps=1)
        glob = np.array(global_models, dtype=np.float32, copy=True)
        cluster = np.array(cluster_models, dtype=np.float32, copy=True)
        decay = np.float32(0.5 * self.learning_rate * self.weight_decay)
        for _ in range(self.local_steps):
            stepped_glob, stepped_cluster = CharactersClients.output_sum_update(single, glob, cluster, client_index,
                                                                                round_index)
            glob, cluster = stepped_glob - decay * glob, stepped_cluster - decay * cluster
        return glob, cluster


def _mirrored(images: NDArray, group: int) -> NDArray:
    """Groups 4–7 see the images transposed (then rotated like groups 0–3)."""
    return np.swapaxes(images, 1, 2) if group >= 4 else images


@dataclass(frozen=True)
class DigitRotationsTask:
    """Configuration of the rotated-digits task (see the module docstring).

    Parameters
    ----------
    num_clients : int
        ``n``, a multiple of ``num_groups`` with at most 1,797 / 5 clients per group;
        client ``c`` is in group ``c mod G``.
    num_groups : int
        ``G`` in ``1..8``: rotations by 0°, 90°, 180°, 270° (groups 0–3), then the same
        rotations of the transposed (mirrored) images (groups 4–7: the eight symmetries
        of the square).
    test_fraction : float
        Held-out share of each client's images, in ``(0, 1)``.
    hidden_units : int
        ``H`` (≥ 1).
    local_steps : int
        Full-batch SGD steps per executed update (≥ 1).
    learning_rate : float
        SGD learning rate (> 0).
    weight_decay : float
        ``λ`` (≥ 0) of the local SGD steps.
    seed : int
        Data and initialisation seed (≥ 0).
    """

    num_clients: int = 24
    num_groups: int = 4
    test_fraction: float = 0.5
    hidden_units: int = 32
    local_steps: int = 5
    learning_rate: float = 1.0
    weight_decay: float = 1e-3
    seed: int = 0
    name: str = "digit-rotations"

    def __post_init__(self) -> None:
        per_group_limit = len(_digits()[1]) // 5
        validate_task_settings(
            self, "digit-rotations", ("num_clients", "num_groups", "hidden_units", "local_steps", "seed"),
            ("test_fraction", "learning_rate", "weight_decay"),
            lambda: [
                (1 <= self.num_groups <= 8, "num-groups", self.num_groups, "an integer in [1, 8]"),
                (self.num_clients % self.num_groups == 0
                 and self.num_groups <= self.num_clients <= self.num_groups * per_group_limit,
                 "num-clients", self.num_clients,
                 f"a multiple of num-groups ({self.num_groups}) with at most {per_group_limit} per group"),
                (0 < self.test_fraction < 1, "test-fraction", self.test_fraction, "(0, 1)"),
                (self.hidden_units >= 1, "hidden-units", self.hidden_units, "an integer ≥ 1"),
                (self.local_steps >= 1, "local-steps", self.local_steps, "an integer ≥ 1"),
                (self.learning_rate > 0, "learning-rate", self.learning_rate, "> 0"),
                (self.weight_decay >= 0, "weight-decay", self.weight_decay, "≥ 0"),
                (self.seed >= 0, "seed", self.seed, "an integer ≥ 0"),
            ])

    @property
    def num_parameters(self) -> int:
        """``P`` of the MLP."""
        return mlp_num_parameters(_PIXELS, self.hidden_units, _CLASSES)

    def groups(self, client_ids: NDArray[np.int64]) -> NDArray[np.int64]:
        """Latent group (quarter turns, then mirrored quarter turns) of each client (evaluation only)."""
        return np.asarray(client_ids, dtype=np.int64) % self.num_groups

    def _lengths(self) -> tuple[int, int]:
        """The largest client's train and held-out counts (seed-independent: they follow from the dealing)."""
        total, per_group = len(_digits()[1]), self.num_clients // self.num_groups
        sizes = [len(range(position, total, per_group)) for position in range(per_group)]
        tests = [int(round(self.test_fraction * size)) for size in sizes]
        return max(s - t for s, t in zip(sizes, tests)), max(tests)

    def clients(self, client_ids: NDArray[np.int64]) -> "DecayedClients":
        """Data of the given clients (a client's images depend only on the seed, ``n`` and its id)."""
        client_ids = checked_client_ids(client_ids, self.num_clients)
        images, labels = _digits()
        per_group = self.num_clients // self.num_groups
        groups = self.groups(client_ids)
        train, test = [], []
        for client, group in zip(client_ids, groups):
            order = generator(self.seed, group, 0, Purpose.DATA).permutation(len(labels))
            chosen = order[client // self.num_groups::per_group]
            pixels = np.rot90(_mirrored(images[chosen], int(group)), k=int(group) % 4,
                              axes=(1, 2)).reshape(len(chosen), -1)
            held_out = int(round(self.test_fraction * len(chosen)))
            test.append((pixels[:held_out], labels[chosen][:held_out]))
            train.append((pixels[held_out:], labels[chosen][held_out:]))
        batch = client_batch(client_ids, groups, train, test, *self._lengths(), self.hidden_units, _CLASSES,
                             self.local_steps, self.learning_rate)
        return DecayedClients(**{f.name: getattr(batch, f.name) for f in fields(batch)},
                              weight_decay=self.weight_decay)

    def initial_models(self, num_clusters: int) -> NDArray[np.float32]:
        """``K`` independent default initialisations, shape (K, P) float32."""
        return np.stack([_init_parameters(self.seed, _PIXELS, self.hidden_units, _CLASSES, stream=k)
                         for k in range(num_clusters)])

    def initial_global_model(self) -> NDArray[np.float32]:
        """FedCAM's ``Θ_glob^0`` (output-sum form): the first initial model with a zero output layer."""
        return zero_output_layer(self.initial_models(1)[0], _PIXELS, self.hidden_units, _CLASSES)
