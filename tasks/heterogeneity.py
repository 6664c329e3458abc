"""Federations that look like real ones: unequal, noisy, skewed and data-poor groups over a scenario task.

A :class:`HeterogeneousTask` wraps a task whose clients are a
:class:`~fedroute.tasks.characters.CharactersClients` batch (padded samples with per-sample
weights: the MLP tasks ``digit-rotations`` and ``boundaries``) and changes who is in the
federation and what each client holds, without touching the base task's kernels:

* ``group_sizes`` — how many clients each latent group has (a *minority* group): the
  federation's client ``c`` is the ``c``-th smallest base client id among the first
  ``group_sizes[g]`` base clients of every group ``g`` (base client ``g + G·j`` is the
  ``j``-th of group ``g``); the base task needs ``G · max(group_sizes)`` clients;
* ``label_noise`` — per group, the share of each client's *training* labels replaced by a
  uniformly drawn other class (the held-out labels stay clean: what a group's model should
  learn is its clean task);
* ``sample_sigma`` — log-normal sample counts: client ``c`` keeps
  ``max(min_samples, round(q_c · s_c))`` of its ``s_c`` training samples, ``q_c =
  min(1, exp(σ z_c − σ²))``, ``z_c`` standard normal (median share ``e^{−σ²}``);
* ``poor_groups`` / ``poor_share`` — every client of those groups keeps only that share of
  its training samples (a data-poor group);
* ``label_skew`` — Dirichlet(``α``) label skew *inside* every group: client ``c`` draws class
  proportions ``p_c ~ Dir(α·1)`` and keeps a sample of class ``y`` with probability
  ``p_c[y] / max p_c`` (both splits: its held-out data follow its own label mix).

Every draw is a pure function of ``(seed, client, purpose)`` through
:func:`fedroute.core.randomness.generator` with purpose ``DATA`` and a draw index per kind
(``client + (1 + kind)·2³²``), so a client's data do not depend on which other clients
are built alongside.  A client keeps at least ``min_samples`` training samples (and one
held-out sample).  The weights stay ``1/n_i`` on the samples a client keeps, so every loss
is still the mean over its own samples, and ``num_examples`` is its kept count.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Optional

import numpy as np
from numpy.typing import NDArray

from fedroute.core.randomness import Purpose, generator
from fedroute.core.task import checked_client_ids
from fedroute.core.validation import invalid

__all__ = ["Heterogeneity", "HeterogeneousTask"]

_NOISE, _COUNTS, _SKEW = 1, 2, 3
"""Draw indices of the three kinds of per-client draws."""


@dataclass(frozen=True)
class Heterogeneity:
    """How a federation departs from balanced, clean, equally sized groups (module docstring).

    Parameters
    ----------
    group_sizes : tuple of int, optional
        Clients per group; ``None``: the base task's own clients.
    label_noise : tuple of float, optional
        Per group, the share of training labels replaced (each in ``[0, 1)``).
    sample_sigma : float
        ``σ ≥ 0`` of the log-normal sample counts (0: every client keeps its samples).
    poor_groups : tuple of int
        Groups whose clients keep only ``poor_share`` of their training samples.
    poor_share : float
        In ``(0, 1]``.
    label_skew : float, optional
        ``α > 0`` of the within-group Dirichlet label skew; ``None``: none.
    min_samples : int
        Fewest training samples a client keeps (≥ 1).
    """

    group_sizes: Optional[tuple[int, ...]] = None
    label_noise: Optional[tuple[float, ...]] = None
    sample_sigma: float = 0.0
    poor_groups: tuple[int, ...] = ()
    poor_share: float = 1.0
    label_skew: Optional[float] = None
    min_samples: int = 5

    def __post_init__(self) -> None:
        checks = [
            (self.group_sizes is None or (len(self.group_sizes) >= 1 and all(int(n) >= 1 for n in self.group_sizes)),
             "group_sizes", self.group_sizes, "None or positive client counts, one per group"),
            (self.label_noise is None or all(0.0 <= float(r) < 1.0 for r in self.label_noise),
             "label_noise", self.label_noise, "None or one share in [0, 1) per group"),
            (self.sample_sigma >= 0, "sample_sigma", self.sample_sigma, "a number ≥ 0"),
            (0.0 < self.poor_share <= 1.0, "poor_share", self.poor_share, "(0, 1]"),
            (self.label_skew is None or self.label_skew > 0, "label_skew", self.label_skew, "None or > 0"),
            (int(self.min_samples) >= 1, "min_samples", self.min_samples, "an integer ≥ 1"),
        ]
        for holds, name, value, allowed in checks:
            if not holds:
                raise invalid(f"heterogeneity setting '{name}'", value, allowed)


@dataclass(frozen=True, eq=False)
class HeterogeneousTask:
    """A base task's federation changed by a :class:`Heterogeneity` (see the module docstring).

    Parameters
    ----------
    base : task
        A task with ``num_groups``, ``groups(ids)``, ``clients(ids)`` returning a
        :class:`~fedroute.tasks.characters.CharactersClients` batch, ``initial_models(K)``.
    heterogeneity : Heterogeneity
    """

    base: Any
    heterogeneity: Heterogeneity = field(default_factory=Heterogeneity)

    def __post_init__(self) -> None:
        sizes = self.heterogeneity.group_sizes
        if sizes is not None:
            num_groups = int(self.base.num_groups)
            if len(sizes) != num_groups:
                raise ValueError(f"group_sizes has {len(sizes)} entries; the base task has {num_groups} groups")
            if num_groups * max(sizes) > self.base.num_clients:
                raise ValueError(f"group_sizes {sizes} need a base task with ≥ {num_groups * max(sizes)} clients "
                                 f"(it has {self.base.num_clients})")

    @property
    def name(self) -> str:
        return self.base.name

    @property
    def seed(self) -> int:
        return int(self.base.seed)

    @property
    def num_groups(self) -> int:
        return int(self.base.num_groups)

    @property
    def base_client_ids(self) -> NDArray[np.int64]:
        """The base task's client behind each client of this federation."""
        sizes = self.heterogeneity.group_sizes
        if sizes is None:
            return np.arange(self.base.num_clients, dtype=np.int64)
        groups = self.num_groups
        return np.sort(np.concatenate([g + groups * np.arange(size) for g, size in enumerate(sizes)])).astype(np.int64)

    @property
    def num_clients(self) -> int:
        return len(self.base_client_ids)

    def groups(self, client_ids: NDArray[np.int64]) -> NDArray[np.int64]:
        """Latent group of each client (evaluation only)."""
        return np.asarray(self.base.groups(self.base_client_ids[checked_client_ids(client_ids, self.num_clients)]))

    def initial_models(self, num_clusters: int) -> NDArray[np.floating]:
        return self.base.initial_models(num_clusters)

    def initial_global_model(self) -> NDArray[np.floating]:
        return self.base.initial_global_model()

    def clients(self, client_ids: NDArray[np.int64]) -> Any:
        """The clients' data: the base task's clients, relabelled, noised and subsampled."""
        client_ids = checked_client_ids(client_ids, self.num_clients)
        batch = self.base.clients(self.base_client_ids[client_ids])
        spec = self.heterogeneity
        train_labels, train_keep = np.array(batch.train_labels, copy=True), batch.train_weights > 0
        test_keep = batch.test_weights > 0
        for row, client in enumerate(client_ids):
            group = int(batch.groups[row])
            if spec.label_noise is not None and spec.label_noise[group] > 0:
                train_labels[row] = self._noised(int(client), train_labels[row], train_keep[row], batch.num_classes,
                                                 float(spec.label_noise[group]))
            if spec.label_skew is not None:
                rng = self._draw(int(client), _SKEW)
                proportions = rng.dirichlet(np.full(batch.num_classes, spec.label_skew))
                accept = proportions / proportions.max()
                uniforms = rng.random((2, train_keep.shape[1] + test_keep.shape[1]))
                train_keep[row] = _kept(train_keep[row], uniforms[0, :train_keep.shape[1]]
                                        < accept[batch.train_labels[row]], spec.min_samples)
                test_keep[row] = _kept(test_keep[row], uniforms[1, :test_keep.shape[1]]
                                       < accept[batch.test_labels[row]], 1)
            share = self._share(int(client), group)
            if share < 1.0:
                train_keep[row] = _first_share(train_keep[row], share, spec.min_samples)
        return replace(batch, client_ids=np.asarray(client_ids, dtype=np.int64), train_labels=train_labels,
                       train_weights=_mean_weights(train_keep), test_weights=_mean_weights(test_keep),
                       num_examples=train_keep.sum(axis=1).astype(np.int64))

    def _draw(self, client: int, kind: int) -> np.random.Generator:
        return generator(self.seed, client + kind * 2**32, 0, Purpose.DATA)

    def _noised(self, client: int, labels: NDArray[np.int64], real: NDArray[np.bool_], num_classes: int,
                rate: float) -> NDArray[np.int64]:
        rng = self._draw(client, _NOISE)
        flip = (rng.random(len(labels)) < rate) & real
        shift = rng.integers(1, num_classes, size=len(labels))           # another class, uniformly
        return np.where(flip, (labels + shift) % num_classes, labels)

    def _share(self, client: int, group: int) -> float:
        spec = self.heterogeneity
        share = spec.poor_share if group in spec.poor_groups else 1.0
        if spec.sample_sigma > 0:
            z = self._draw(client, _COUNTS).standard_normal()
            share *= min(1.0, float(np.exp(spec.sample_sigma * z - spec.sample_sigma ** 2)))
        return share


def _kept(real: NDArray[np.bool_], accepted: NDArray[np.bool_], minimum: int) -> NDArray[np.bool_]:
    """``real & accepted``, topped up with the first rejected real samples to ``minimum``."""
    kept = real & accepted
    missing = min(int(real.sum()), minimum) - int(kept.sum())
    if missing > 0:
        kept[np.flatnonzero(real & ~accepted)[:missing]] = True
    return kept


def _first_share(real: NDArray[np.bool_], share: float, minimum: int) -> NDArray[np.bool_]:
    """The first ``max(minimum, round(share · s))`` of the real samples."""
    positions = np.flatnonzero(real)
    count = min(len(positions), max(minimum, int(round(share * len(positions)))))
    kept = np.zeros_like(real)
    kept[positions[:count]] = True
    return kept


def _mean_weights(kept: NDArray[np.bool_]) -> NDArray[np.float32]:
    """``1/n_i`` on the kept samples, 0 elsewhere (the mean over a client's own samples)."""
    counts = np.maximum(kept.sum(axis=1, keepdims=True), 1).astype(np.float32)
    return np.where(kept, np.float32(1.0) / counts, np.float32(0.0)).astype(np.float32)
