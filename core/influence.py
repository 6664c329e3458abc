"""Bounded influence of a single reply on the cluster models and the routing masses.

A reply's ``num-examples`` and model values are the client's claim.  Without
bounds one node claiming ``n = 10⁹`` owns every cluster it routes to and,
through the masses every client receives, everyone's routing.  The bounds here
are applied by both runtimes — the strategies (:class:`~fedroute.strategies.clustered.ClusteredRouting`
and :class:`~fedroute.strategies.fedcam.FedCAM`, cluster parts and global part
alike) and the batched simulator — in the one server update :func:`aggregate_round`:

1. **Sample-weight cap** (on by default): each reply's weight is
   ``min(n_i, c · m)`` with ``m`` the round's *lower median* of the claimed
   ``n`` (an order statistic, not moved by one large claim) and
   ``c = max_weight_ratio`` (default :data:`DEFAULT_MAX_WEIGHT_RATIO`).  The
   capped weights are used for the cluster averages *and* the masses, so one
   reply's share of either is at most ``c·m / (c·m + Σ_{j≠i} w_j)`` — for one
   node of ten clients with equal ``n``: ``4/13 ≈ 0.31`` of the masses, and
   ``4/(4+h)`` of a cluster it shares with ``h`` honest replies.  Honest rounds
   in which no client claims more than ``c`` times the median are aggregated
   exactly as before (bit for bit).
2. **Update-norm bound** (optional): ``w_i − W_k`` (the reply minus the model
   it was trained from) is scaled down to at most ``max_update_norm`` in L2.
3. **Robust rule** (optional): per cluster, the coordinate-wise median or the
   trimmed mean (Flower's ``FedTrimmedAvg`` maths: :func:`trim_mean`, the same
   operations as ``flwr.serverapp.strategy.fedtrimmedavg.trim_mean``) of the replies
   instead of the weighted mean.  Both ignore the sample weights (as Flower's
   ``FedMedian``/``FedTrimmedAvg`` do).  With at least two honest replies in a
   cluster the median stays within their coordinate range; the trimmed mean
   does when ``⌊β·m⌋`` is at least the number of bad replies.

Whatever the rule, a non-finite aggregate is never committed: that cluster
keeps its model and its replies are reported as discarded.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Optional

import numpy as np
from numpy.typing import NDArray

from fedroute.core.aggregation import SERVER_UPDATES, hard_update_checked, ifca_gradient_step, routing_masses
from fedroute.core.validation import invalid

__all__ = ["InfluenceBounds", "AGGREGATION_RULES", "DEFAULT_MAX_WEIGHT_RATIO", "RoundAggregate",
           "capped_weights", "trim_mean", "clip_updates", "robust_update", "aggregate_round"]

AGGREGATION_RULES = ("weighted-mean", "median", "trimmed-mean")
"""``weighted-mean``: the paper's hard update (FedAvg per cluster); ``median``:
coordinate-wise median; ``trimmed-mean``: coordinate-wise mean without the
``⌊β·m⌋`` largest and smallest values."""

DEFAULT_MAX_WEIGHT_RATIO = 4.0
"""Default cap ``c``: a reply weighs at most 4 × the round's lower-median ``n``."""

MAX_WEIGHT_RATIO_LIMIT = 1e6


@dataclass(frozen=True)
class InfluenceBounds:
    """How much one reply may move a cluster model and the masses (see the module docstring).

    Parameters
    ----------
    max_weight_ratio : float, default 4.0
        Cap ``c`` on a reply's weight relative to the round's lower-median
        ``num-examples`` (≥ 1; ``math.inf`` turns the cap off).
    max_update_norm : float, optional
        Largest L2 norm of a reply's update ``w_i − W_k`` (> 0); ``None``: no bound.
    aggregation : str, default "weighted-mean"
        One of :data:`AGGREGATION_RULES`.
    trim_fraction : float, default 0.2
        ``β`` of ``trimmed-mean``: the fraction cut at each end, in ``[0, 0.5)``
        (Flower's ``FedTrimmedAvg`` default).
    server_update : str, default "average"
        One of :data:`~fedroute.core.aggregation.SERVER_UPDATES`: ``average`` (the paper's hard
        update: IFCA's model averaging) or ``ifca-gradient`` (IFCA's gradient step, ``Σ∇/m``:
        applied to the aggregate of any ``aggregation`` rule).
    """

    max_weight_ratio: float = DEFAULT_MAX_WEIGHT_RATIO
    max_update_norm: Optional[float] = None
    aggregation: str = "weighted-mean"
    trim_fraction: float = 0.2
    server_update: str = "average"

    def __post_init__(self) -> None:
        ratio = self.max_weight_ratio
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or math.isnan(ratio) or \
                not (ratio == math.inf or 1.0 <= ratio <= MAX_WEIGHT_RATIO_LIMIT):
            raise invalid("'max_weight_ratio'", ratio, f"a number in [1, {MAX_WEIGHT_RATIO_LIMIT:g}] or inf (no cap)")
        norm = self.max_update_norm
        if norm is not None and (isinstance(norm, bool) or not isinstance(norm, (int, float))
                                 or not 0.0 < norm < math.inf):
            raise invalid("'max_update_norm'", norm, "a finite number > 0, or None")
        if self.aggregation not in AGGREGATION_RULES:
            raise invalid("'aggregation'", self.aggregation, str(AGGREGATION_RULES))
        beta = self.trim_fraction
        if isinstance(beta, bool) or not isinstance(beta, (int, float)) or not 0.0 <= beta < 0.5:
            raise invalid("'trim_fraction'", beta, "a number in [0, 0.5)")
        if self.server_update not in SERVER_UPDATES:
            raise invalid("'server_update'", self.server_update, str(SERVER_UPDATES))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready fields (``inf`` as the string ``"inf"``)."""
        values = asdict(self)
        if values["server_update"] == "average":  # the paper's update: the fields (and checkpoints) of before
            del values["server_update"]
        if values["max_weight_ratio"] == math.inf:
            values["max_weight_ratio"] = "inf"
        return values


def trim_mean(array: NDArray[np.floating], cut_fraction: float) -> NDArray[np.floating]:
    """Coordinate-wise mean along axis 0 without the ``⌊β·m⌋`` smallest and largest values.

    The operations of Flower's ``FedTrimmedAvg`` (``flwr.serverapp.strategy.fedtrimmedavg.trim_mean``,
    itself SciPy's ``trim_mean``), written here so that :mod:`fedroute.core` imports no Flower;
    ``tests/test_identity_and_influence.py`` checks that both give the same values.
    """
    if not 0.0 <= cut_fraction < 0.5:
        raise invalid("trim_fraction", cut_fraction, "a number in [0, 0.5)")
    count = array.shape[0]
    lower = int(cut_fraction * count)
    upper = count - lower
    return np.mean(np.partition(array, (lower, upper - 1), axis=0)[lower:upper], axis=0)


def capped_weights(num_examples: NDArray[np.floating], max_ratio: float,
                   run_index: Optional[NDArray[np.int64]] = None, num_runs: int = 1) -> NDArray[np.float64]:
    """``min(n_i, c · m)`` with ``m`` the lower median of the round's ``n`` (the ``⌊(m-1)/2⌋``-th smallest).

    With ``run_index`` (the batched simulator) each run's replies are capped at the lower
    median of that run's own replies.  The values are returned unchanged (the same floats)
    where the cap does not bind.
    """
    weights = np.asarray(num_examples, dtype=np.float64)
    if weights.size == 0 or max_ratio == math.inf:
        return weights
    if run_index is None:
        lower_median = np.partition(weights, (weights.size - 1) // 2)[(weights.size - 1) // 2]
        cap = max_ratio * lower_median
        return np.minimum(weights, cap) if np.any(weights > cap) else weights
    run_index = np.asarray(run_index, dtype=np.int64)
    order = np.lexsort((weights, run_index))
    counts = np.bincount(run_index, minlength=num_runs)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    present = counts > 0
    medians = np.zeros(num_runs)
    medians[present] = weights[order][starts[present] + (counts[present] - 1) // 2]
    cap = max_ratio * medians[run_index]
    return np.where(weights > cap, cap, weights) if np.any(weights > cap) else weights


def clip_updates(client_models: NDArray[np.floating], reference_models: NDArray[np.floating],
                 max_norm: float) -> NDArray[np.float64]:
    """Each ``w_i`` moved towards its reference ``W`` until ``‖w_i − W‖₂ ≤ max_norm``.

    Overflow-free for any finite inputs: the difference is formed from halves
    and rescaled by its largest entry before its norm is taken.
    """
    models = np.asarray(client_models, dtype=np.float64)
    reference = np.asarray(reference_models, dtype=np.float64)
    half = models / 2 - reference / 2  # (w - W) / 2, never overflows
    largest = np.max(np.abs(half), axis=1, initial=0.0)
    safe = np.where(largest > 0, largest, 1.0)
    unit = half / safe[:, None]  # entries in [-1, 1]
    unit_norm = np.linalg.norm(unit, axis=1)  # ‖w - W‖ = 2 · largest · unit_norm
    with np.errstate(over="ignore"):  # an overflow to inf means "far": clipped, as it should be
        too_far = largest * unit_norm > max_norm / 2  # ‖w − W‖ / 2 > bound / 2
    clipped = models.copy()
    if too_far.any():
        clipped[too_far] = reference[too_far] + unit[too_far] * (max_norm / unit_norm[too_far])[:, None]
    return clipped


def robust_update(cluster_models: NDArray[np.floating], client_models: NDArray[np.floating],
                  routes: NDArray[np.int64], rule: str, trim_fraction: float = 0.2,
                  ) -> tuple[NDArray[np.floating], NDArray[np.bool_]]:
    """Per cluster, the coordinate-wise median or trimmed mean of its replies (unweighted).

    Same contract as :func:`~fedroute.core.aggregation.hard_update_checked`:
    a cluster nobody routed to is kept, and so is one whose aggregate is not finite.
    """
    if rule not in ("median", "trimmed-mean"):
        raise invalid("rule", rule, "'median', 'trimmed-mean'")
    updated = np.array(cluster_models, copy=True)
    non_finite = np.zeros(updated.shape[0], dtype=bool)
    models = np.asarray(client_models, dtype=np.float64)
    routes = np.asarray(routes, dtype=np.int64)
    def aggregate(members: NDArray[np.float64]) -> NDArray[np.floating]:
        with np.errstate(over="ignore", invalid="ignore"):
            value = np.median(members, axis=0) if rule == "median" else trim_mean(members, trim_fraction)
        return np.asarray(value).astype(updated.dtype)

    for cluster in np.unique(routes):
        members = models[routes == cluster]
        value = aggregate(members)
        if not np.all(np.isfinite(value)):  # the mean of the middle values overflowed: average scaled values
            scale = max(2, len(members))
            with np.errstate(over="ignore", invalid="ignore"):
                value = (aggregate(members / scale).astype(np.float64) * scale).astype(updated.dtype)
        if np.all(np.isfinite(value)):
            updated[cluster] = value
        else:
            non_finite[cluster] = True
    return updated, non_finite


@dataclass(frozen=True)
class RoundAggregate:
    """What one round's replies did to the models and the masses."""

    models: NDArray[np.floating]
    """The updated models, shape (K, P) (or (R, K, P) for batched runs)."""
    weights: NDArray[np.float64]
    """Each reply's weight after the cap, shape (m,)."""
    kept: NDArray[np.bool_]
    """Replies whose cluster took the update (False: that cluster's aggregate was not finite)."""
    non_finite_clusters: NDArray[np.bool_]
    """Clusters that kept their model because their aggregate was not finite, shape (K,) (or (R, K))."""
    masses: Optional[NDArray[np.float64]]
    """Routing masses of the kept replies (capped weights); ``None`` if no reply was kept (one run); shape
    (R, K) for batched runs (zeros for a run without a kept reply)."""
    restarted: Optional[NDArray[np.bool_]] = None
    """Clusters the server step returned to their start model (``restart_idle_spares``), shaped as
    ``non_finite_clusters``; ``None``: none."""


def aggregate_round(cluster_models: NDArray[np.floating], client_models: NDArray[np.floating],
                    routes: NDArray[np.int64], num_examples: NDArray[np.floating],
                    bounds: InfluenceBounds, run_index: Optional[NDArray[np.int64]] = None) -> RoundAggregate:
    """One round's update under ``bounds``: cap the weights, bound the updates, aggregate per cluster.

    The one server update of both runtimes: the Flower strategies call it with one
    run's replies, the batched simulator with the replies of ``R`` runs at once
    (``run_index``); the result of a run does not depend on the batch it is in.

    Parameters
    ----------
    cluster_models : ndarray, shape (K, P), or (R, K, P) with ``run_index``
        ``W^t``.
    client_models : ndarray, shape (m, P)
        The validated replies ``w_i^+`` (finite), in the order they are summed.
    routes : ndarray of int, shape (m,)
        Each reply's cluster.
    num_examples : ndarray, shape (m,)
        The claimed ``n_i``.
    bounds : InfluenceBounds
    run_index : ndarray of int, shape (m,), optional
        The run of each reply (batched runs).

    Returns
    -------
    RoundAggregate
        ``masses`` are the kept replies' routing masses, shape (K,) or (R, K).
    """
    routes = np.asarray(routes, dtype=np.int64)
    cluster_models = np.asarray(cluster_models)
    num_runs = 1 if run_index is None else cluster_models.shape[0]
    weights = capped_weights(num_examples, bounds.max_weight_ratio, run_index, num_runs)
    models = client_models
    if bounds.max_update_norm is not None and len(routes):
        start = cluster_models[routes] if run_index is None else cluster_models[np.asarray(run_index), routes]
        models = clip_updates(client_models, start, bounds.max_update_norm)
    if bounds.aggregation == "weighted-mean":
        updated, non_finite = hard_update_checked(cluster_models, models, routes, weights, run_index)
    elif run_index is None:
        updated, non_finite = robust_update(cluster_models, models, routes, bounds.aggregation, bounds.trim_fraction)
    else:
        updated, non_finite = _robust_update_runs(cluster_models, models, routes, np.asarray(run_index), bounds)
    if not len(routes):
        kept = np.zeros(0, dtype=bool)
    else:
        kept = ~(non_finite[routes] if run_index is None else non_finite[np.asarray(run_index), routes])
    if bounds.server_update == "ifca-gradient" and kept.any():
        updated = ifca_gradient_step(cluster_models, updated, routes[kept], weights[kept],
                                     None if run_index is None else np.asarray(run_index)[kept])
    num_clusters = cluster_models.shape[-2]
    if run_index is None:
        masses = routing_masses(routes[kept], weights[kept], num_clusters) if kept.any() else None
    else:
        masses = routing_masses(routes[kept], weights[kept], num_clusters, np.asarray(run_index)[kept], num_runs)
    return RoundAggregate(models=updated, weights=weights, kept=kept, non_finite_clusters=non_finite, masses=masses)


def _robust_update_runs(cluster_models: NDArray[np.floating], client_models: NDArray[np.floating],
                        routes: NDArray[np.int64], run_index: NDArray[np.int64], bounds: InfluenceBounds,
                        ) -> tuple[NDArray[np.floating], NDArray[np.bool_]]:
    """:func:`robust_update` run by run (batched runs)."""
    updated = np.array(cluster_models, copy=True)
    non_finite = np.zeros(updated.shape[:2], dtype=bool)
    for run in np.unique(run_index):
        rows = run_index == run
        updated[run], non_finite[run] = robust_update(cluster_models[run], client_models[rows], routes[rows],
                                                      bounds.aggregation, bounds.trim_fraction)
    return updated, non_finite
