"""Partial participation: which clients play a round, and how long a client's last report counts.

Both runtimes sample the same clients: a round's sample is a pure function of the run
seed, the *client ids* available and the round ``t``, never of Flower's node ids (which
Flower draws anew for every simulation, so a sample over node ids differs from run to
run).  Every available client gets the uniform ``u_i = uniform(seed, i, t, NODE_SAMPLING)``
(:mod:`fedroute.core.randomness`) and the ``m`` clients with the smallest ``u_i`` play,

    m = min(a, max(min_clients, ⌊a · fraction⌋))       (a = clients available),

Flower's own ``FedAvg`` rule for the sample size.  A client's draw does not depend on who
else is available, so a client that disconnects changes nobody else's draw (only ``m``).

The federation's state that routing reads (masses, the clusters' preferred shares) is
estimated from every client's *latest* report, not from the clients sampled this round
(:mod:`fedroute.core.federation`); a report counts for ``memory`` rounds after the round
it was made in.  :func:`report_memory` is the default: the number of rounds within which
a client is sampled at least once with probability ``1 − 1/100`` — ``1`` with full
participation (the round's own replies, as without sampling), ``17`` at ``fraction =
0.25``, ``44`` at ``0.1``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import numpy as np
from numpy.typing import NDArray

from fedroute.core.randomness import Purpose, uniform
from fedroute.core.validation import invalid

__all__ = ["Participation", "sample_size", "report_memory", "participating", "MISSED_ROUND_PROBABILITY"]

MISSED_ROUND_PROBABILITY = 0.01
""":func:`report_memory` keeps a report until a client has been missed this unlikely."""


def sample_size(available: int, fraction: float, min_clients: int) -> int:
    """``min(a, max(min_clients, ⌊a · fraction⌋))``: the clients a round samples out of ``a`` available."""
    return min(int(available), max(int(min_clients), int(available * fraction)))


def report_memory(fraction: float) -> int:
    """Rounds a client's latest report counts: ``⌈ln(0.01) / ln(1 − f)⌉`` (1 at ``f = 1``).

    A client sampled with probability ``f`` per round is missed ``L`` rounds in a row with
    probability ``(1 − f)^L``; ``L`` is the smallest length at which that is at most
    :data:`MISSED_ROUND_PROBABILITY`.
    """
    if not 0.0 < fraction <= 1.0:
        raise invalid("fraction", fraction, "(0, 1]")
    if fraction >= 1.0:
        return 1
    return max(1, math.ceil(math.log(MISSED_ROUND_PROBABILITY) / math.log1p(-fraction) - 1e-12))


@dataclass(frozen=True)
class Participation:
    """Who plays a round, and how long a report counts.

    Parameters
    ----------
    fraction : float, default 1.0
        Share of the available clients sampled per round, in ``(0, 1]``.
    min_clients : int, default 1
        At least this many clients per round (≥ 1; all of them when fewer are available).
    memory : int, optional
        Rounds a client's latest report counts in the federation's estimate (≥ 1);
        ``None``: :func:`report_memory` of ``fraction``.
    """

    fraction: float = 1.0
    min_clients: int = 1
    memory: Optional[int] = None

    def __post_init__(self) -> None:
        if isinstance(self.fraction, bool) or not isinstance(self.fraction, (int, float)) \
                or not 0.0 < float(self.fraction) <= 1.0:
            raise invalid("fraction_train", self.fraction,
                          "a number in (0, 1] (the share of the available clients sampled per round)")
        if isinstance(self.min_clients, bool) or int(self.min_clients) != self.min_clients or self.min_clients < 1:
            raise invalid("min_train_nodes", self.min_clients, "an integer ≥ 1")
        if self.memory is not None and (isinstance(self.memory, bool) or int(self.memory) != self.memory
                                        or self.memory < 1):
            raise invalid("report_memory", self.memory,
                          "an integer ≥ 1 (rounds a client's latest report counts), or None for the default")

    @property
    def samples_everyone(self) -> bool:
        """Whether every available client plays every round."""
        return self.fraction >= 1.0

    @property
    def report_rounds(self) -> int:
        """``L``: rounds a client's latest report counts (:attr:`memory` or :func:`report_memory`)."""
        return int(self.memory) if self.memory is not None else report_memory(float(self.fraction))

    def evidence_rounds(self, reports: int) -> int:
        """Federation rounds in which a client reports about ``reports`` times: ``⌈reports / f⌉`` (``reports`` at ``f = 1``).

        A patience that waits for the clients' evidence (:attr:`RoutingSettings.duplicate_patience
        <fedroute.core.settings.RoutingSettings.duplicate_patience>`) counts reports, not rounds: a client
        sampled one round in four has reported once in four rounds.
        """
        return int(reports) if self.fraction >= 1.0 else int(math.ceil(int(reports) / float(self.fraction) - 1e-9))

    def sample(self, client_ids: NDArray[np.int64], seed: int, round_index: int) -> NDArray[np.int64]:
        """The sorted ids of the clients that play round ``t`` out of the available ``client_ids``."""
        client_ids = np.unique(np.asarray(client_ids, dtype=np.int64))
        mask = participating(client_ids, np.zeros(len(client_ids), dtype=np.int64), np.full(len(client_ids), seed),
                             1, round_index, self)
        return client_ids[mask]


def participating(client_ids: NDArray[np.int64], run_index: NDArray[np.int64], seeds: NDArray[np.int64],
                  num_runs: int, round_index: int, participation: Participation,
                  available: Optional[NDArray[np.bool_]] = None) -> NDArray[np.bool_]:
    """Which clients play round ``t``, for the clients of ``R`` batched runs at once.

    Parameters
    ----------
    client_ids : ndarray of int, shape (m,)
        Each client's id (the randomness coordinate), unique within its run.
    run_index : ndarray of int, shape (m,)
        The run each client belongs to (zeros for one run).
    seeds : ndarray of int, shape (m,)
        Each client's run seed.
    num_runs : int
        ``R``.
    round_index : int
        ``t``.
    participation : Participation
    available : ndarray of bool, shape (m,), optional
        Clients that can be sampled (connected, joined); all by default.

    Returns
    -------
    ndarray of bool, shape (m,)
        In each run, the ``sample_size`` available clients with the smallest
        ``uniform(seed, id, t, NODE_SAMPLING)`` (ties, which have probability 2⁻⁵³,
        to the lower id).
    """
    client_ids = np.asarray(client_ids, dtype=np.int64)
    run_index = np.asarray(run_index, dtype=np.int64)
    available = np.ones(len(client_ids), dtype=bool) if available is None else np.asarray(available, dtype=bool)
    if participation.samples_everyone:
        return available.copy()
    counts = np.bincount(run_index[available], minlength=num_runs)
    sizes = np.array([sample_size(count, participation.fraction, participation.min_clients) for count in counts])
    draws = np.where(available, uniform(seeds, client_ids, round_index, Purpose.NODE_SAMPLING), np.inf)
    order = np.lexsort((client_ids, draws, run_index))             # by run, then draw, then id
    starts = np.searchsorted(run_index[order], np.arange(num_runs))
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order)) - starts[run_index[order]]
    return available & (rank < sizes[run_index])
