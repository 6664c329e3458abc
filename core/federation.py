"""The federation's state as routing reads it: every known client's latest report.

Routing decisions that read the federation — the masses ``μ`` (underused clusters,
Reversal, the entry test, consolidation) and the share of clients that prefer each
cluster — must not depend on which clients happened to be sampled in a round.  The
server therefore keeps, per client, its latest valid report (round, executed route,
Greedy preference, claimed ``num-examples``) and estimates, after every round,

* the masses ``μ̂_k``: the share of the counted clients' weight whose latest route is ``k``;
* the preferred masses ``p̂_k``: the share whose latest Greedy choice (lowest-loss cluster,
  its ties broken as the client's Greedy breaks them) is ``k``;

over the clients whose latest report is at most ``L`` rounds old
(:attr:`fedroute.core.participation.Participation.report_rounds`; ``L = 1`` with full
participation, where both are this round's own replies, exactly as before partial
participation existed).  Weights are the claimed ``num-examples`` capped at
``max_weight_ratio ×`` the lower median of the counted clients' claims (the influence
bound of :mod:`fedroute.core.influence`).  A run in which no report counts keeps its
previous estimate.

One implementation serves both runtimes: the Flower strategy keeps one
:class:`FederationState` for its clients (ids in arrival order), the batched simulator
one for the clients of all its runs (``run_index``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

import numpy as np
from numpy.typing import NDArray

from fedroute.core.aggregation import routing_masses
from fedroute.core.influence import capped_weights

__all__ = ["FederationState", "FederationEstimate", "estimate_federation"]


@dataclass(frozen=True)
class FederationState:
    """Every known client's latest valid report (leading axis: known clients).

    Attributes
    ----------
    client_ids : ndarray of int, shape (m,)
    run_index : ndarray of int, shape (m,)
        The run of each client (zeros in Flower).
    last_round : ndarray of int, shape (m,)
        ``t`` of the client's latest report, ``-1`` before any.
    route : ndarray of int, shape (m,)
        Its executed hard route in that round.
    preferred : ndarray of int, shape (m,)
        Its Greedy choice in that round.
    num_examples : ndarray of float, shape (m,)
        Its claimed ``num-examples``.
    losses : ndarray, shape (m, K)
        Its training losses of the ``K`` cluster models in that round (NaN before any report).
    """

    client_ids: NDArray[np.int64]
    run_index: NDArray[np.int64]
    last_round: NDArray[np.int64]
    route: NDArray[np.int64]
    preferred: NDArray[np.int64]
    num_examples: NDArray[np.float64]
    losses: NDArray[np.float64]

    @classmethod
    def of_clients(cls, client_ids: NDArray[np.int64], num_clusters: int,
                   run_index: Optional[NDArray[np.int64]] = None) -> "FederationState":
        """Known clients that have not reported yet."""
        client_ids = np.asarray(client_ids, dtype=np.int64)
        minus_one = np.full(len(client_ids), -1, dtype=np.int64)
        return cls(client_ids=client_ids,
                   run_index=np.zeros(len(client_ids), np.int64) if run_index is None
                   else np.asarray(run_index, dtype=np.int64),
                   last_round=minus_one, route=minus_one.copy(), preferred=minus_one.copy(),
                   num_examples=np.zeros(len(client_ids)), losses=np.full((len(client_ids), num_clusters), np.nan))

    @property
    def num_clusters(self) -> int:
        return int(self.losses.shape[1])

    def known_clients(self, num_runs: int = 1) -> NDArray[np.int64]:
        """Clients that have reported at least once, per run."""
        return np.bincount(self.run_index[self.last_round >= 0], minlength=num_runs).astype(np.int64)

    def positions(self, client_ids: NDArray[np.int64]) -> tuple["FederationState", NDArray[np.int64]]:
        """The rows of ``client_ids`` (one run), adding the clients not known yet at the end."""
        client_ids = np.asarray(client_ids, dtype=np.int64)
        row_of = {int(client): row for row, client in enumerate(self.client_ids)}
        new = [int(client) for client in dict.fromkeys(client_ids.tolist()) if int(client) not in row_of]
        state = self
        if new:
            added = FederationState.of_clients(np.array(new, dtype=np.int64), self.num_clusters)
            state = FederationState(**{name: np.concatenate([getattr(self, name), getattr(added, name)])
                                       for name in self.__dataclass_fields__})
            row_of.update({client: len(self.client_ids) + j for j, client in enumerate(new)})
        return state, np.array([row_of[int(client)] for client in client_ids], dtype=np.int64)

    def record(self, rows: NDArray[np.int64], round_index: int, routes: NDArray[np.int64],
               preferred: NDArray[np.int64], num_examples: NDArray[np.floating],
               losses: Optional[NDArray[np.floating]] = None) -> "FederationState":
        """The state after the reports of round ``t`` by the clients in ``rows``."""
        rows = np.asarray(rows, dtype=np.int64)
        updated = {name: np.array(getattr(self, name), copy=True)
                   for name in ("last_round", "route", "preferred", "num_examples", "losses")}
        updated["last_round"][rows] = round_index
        updated["route"][rows] = routes
        updated["preferred"][rows] = preferred
        updated["num_examples"][rows] = num_examples
        if losses is not None:
            updated["losses"][rows] = losses
        return replace(self, **updated)

    def counted(self, round_index: int, report_rounds: int) -> NDArray[np.bool_]:
        """Clients whose latest report, after round ``t``, is at most ``L`` rounds old."""
        return (self.last_round >= 0) & (self.last_round > round_index - report_rounds)


@dataclass(frozen=True)
class FederationEstimate:
    """What routing reads of the federation after a round (one row per run).

    Attributes
    ----------
    masses : ndarray, shape (R, K)
        ``μ̂``.
    preferred_masses : ndarray, shape (R, K)
        ``p̂``.
    reporting : ndarray of int, shape (R,)
        Clients counted in each run (0: the run kept its previous estimate).
    """

    masses: NDArray[np.float64]
    preferred_masses: NDArray[np.float64]
    reporting: NDArray[np.int64]


def estimate_federation(state: FederationState, round_index: int, report_rounds: int, num_clusters: int,
                        num_runs: int = 1, max_weight_ratio: float = float("inf"),
                        previous: Optional[FederationEstimate] = None) -> FederationEstimate:
    """``μ̂`` and ``p̂`` after round ``t`` from the counted clients' latest reports (module docstring).

    Parameters
    ----------
    state : FederationState
    round_index : int
        ``t`` of the round that just ended.
    report_rounds : int
        ``L`` (≥ 1).
    num_clusters : int
        ``K``.
    num_runs : int
        ``R``.
    max_weight_ratio : float
        Cap ``c`` of a client's weight relative to the lower median of the counted claims.
    previous : FederationEstimate, optional
        Kept for a run in which no report counts (zeros without it).

    Returns
    -------
    FederationEstimate
    """
    counted = state.counted(round_index, report_rounds)
    runs = state.run_index[counted]
    weights = capped_weights(state.num_examples[counted], max_weight_ratio, runs, num_runs)
    masses = routing_masses(state.route[counted], weights, num_clusters, runs, num_runs)
    preferred = routing_masses(state.preferred[counted], weights, num_clusters, runs, num_runs)
    reporting = np.bincount(runs, minlength=num_runs).astype(np.int64)
    if previous is not None and np.any(reporting == 0):
        silent = reporting == 0
        masses[silent], preferred[silent] = previous.masses[silent], previous.preferred_masses[silent]
    return FederationEstimate(masses=masses, preferred_masses=preferred, reporting=reporting)
