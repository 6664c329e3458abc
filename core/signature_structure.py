"""Two groups on one cluster, read from its clients' class signatures: a re-seed's source that no count shows.

The re-seed (:func:`fedroute.core.health.reseeding`) copies into an empty cluster the model of a cluster whose own
clients' update directions part in two, or else of a *crowded* one (more clients than a typical cluster's).  Neither
sees a small group that shares a majority group's model — a minority of 3 clients beside 9: a third more clients
than a typical cluster, and after the first rounds the two groups' update directions at their shared model no longer
part (``docs/algorithm.md``, "Copies split by update direction").  The empty cluster is then declared spare and the
small group trains on the majority's model for the rest of the run.  The clients' class signatures
(:mod:`fedroute.core.signatures`: each class's mean input, sketched) do not depend on any model: the signed own
clients of a cluster that two groups share part in two on them (:func:`~fedroute.core.signature_start.two_groups`).

A cluster is *read* when at least :data:`MIN_SIGNED_CLIENTS` of its counted own clients (those whose latest Greedy
choice it is) sent a signature, and *parts* when their 2-way partition shows two groups with at least
:data:`MIN_SIDE_CLIENTS` clients a side.  The server step reads it beside the update
directions (``reseed_by_signature``): a cluster parted by either is a re-seed's source and not a cluster that
serves one group, and the re-seed then holds the two parts on the two copies
(:func:`fedroute.core.signature_start.regrouped_state`).  Pure functions; both runtimes call them from
:func:`fedroute.core.server_step.server_step`.
"""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np
from numpy.typing import NDArray

from fedroute.core.federation import FederationState
from fedroute.core.signature_start import (SignatureState, in_client_order, signature_parts_of, signed_own_clients,
                                          two_groups)

__all__ = ["SignatureStructure", "either_structure", "MIN_SIGNED_CLIENTS", "MIN_SIDE_CLIENTS"]

Reading = Callable[[int], tuple[NDArray[np.bool_], NDArray[np.bool_]]]
"""``structured(run) -> (read, parted)``, each ``(K,) bool``."""

MIN_SIGNED_CLIENTS = 8
"""Signed own clients a cluster needs for its signatures to be read: a 2-way partition of one group's signatures
(noise around their centre) stays under the ``split_silhouette`` of 0.25 in 99 % of draws from 8 clients up
(:func:`~fedroute.core.signature_start.two_groups`); below it, one group can look like two."""

MIN_SIDE_CLIENTS = 2
"""Signed clients on each side of a parting: a group is seen when at least two of its clients agree."""


class SignatureStructure:
    """``structure(run) -> (read, parted)``, each ``(K,) bool``: per cluster of ``run``, whether its signed own
    clients were read and whether they part in two groups (module docstring); computed once per run.

    Parameters
    ----------
    signatures : SignatureState or None
        Every known client's signature (rows of ``federation``); ``None``: nothing is read.
    federation : FederationState
    counted : ndarray of bool, shape (m,)
        The clients whose latest report counts (:meth:`FederationState.counted`).
    num_clusters : int
    min_silhouette : float
        ``split_silhouette``.
    """

    def __init__(self, signatures: Optional[SignatureState], federation: FederationState,
                 counted: NDArray[np.bool_], num_clusters: int, min_silhouette: float) -> None:
        self.signatures, self.federation, self.num_clusters = signatures, federation, num_clusters
        self.min_silhouette = min_silhouette
        self.signed = signed_own_clients(signatures, federation, counted)
        self._read: dict[int, tuple[NDArray[np.bool_], NDArray[np.bool_]]] = {}

    def __call__(self, run: int) -> tuple[NDArray[np.bool_], NDArray[np.bool_]]:
        if run not in self._read:
            read = np.zeros(self.num_clusters, dtype=bool)
            parted = np.zeros(self.num_clusters, dtype=bool)
            in_run = self.signed & (self.federation.run_index == run)
            for cluster in range(self.num_clusters):
                rows = in_client_order(self.federation, np.flatnonzero(in_run & (self.federation.preferred == cluster)))
                if len(rows) < MIN_SIGNED_CLIENTS:
                    continue
                similarity, labels = signature_parts_of(self.signatures, rows, 2)
                sides = np.bincount(labels, minlength=2)
                read[cluster] = True
                parted[cluster] = bool(sides.min() >= MIN_SIDE_CLIENTS
                                       and two_groups(similarity, labels, self.min_silhouette))
            self._read[run] = (read, parted)
        return self._read[run]


def either_structure(directions: Optional[Reading], signatures: Optional[SignatureStructure]) -> Optional[Reading]:
    """``structured(run)`` reading both: a cluster parts when either parts it, and is read when the update
    directions read it or its signatures part it (``directions``: the update directions'
    ``_RoundStructure.structure`` of :mod:`fedroute.core.server_step`, or None).  The signatures only add evidence of
    two groups: a cluster they read whole is not counted as one group's."""
    if signatures is None:
        return directions

    def structured(run: int) -> tuple[NDArray[np.bool_], NDArray[np.bool_]]:
        parted = signatures(run)[1]
        if directions is None:
            return parted.copy(), parted.copy()
        read_d, parted_d = directions(run)
        return read_d | parted, parted_d | parted
    return structured
