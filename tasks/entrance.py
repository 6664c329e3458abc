"""Conditioning a task's start on a collapsed entrance (EXPERIMENTS E5, E6; paper §4).

A *collapsed entrance*: at ``W^0`` the clients' controller-free greedy choices
(the lowest training loss, ties to the lowest index) leave at least one of the
``K`` models unused (``K^0 < K``).  A task whose start is ``centre + jitter``
conditions it by taking the first of its init draws ``j = 0, 1, …`` that is one
(draw 0 being the start as it falls): :func:`first_collapsed_draw`.
"""

from __future__ import annotations

from typing import Callable, Optional

import numpy as np
from numpy.typing import NDArray

from fedroute.core.task import ClientBatch

__all__ = ["ENTRANCES", "first_collapsed_draw", "conditioned_start"]

ENTRANCES = ("any", "collapsed")
"""Round-zero entrances: the start as it falls (init draw 0), or the first collapsed draw."""


def first_collapsed_draw(draw: Callable[[int], NDArray[np.float64]], clients: ClientBatch,
                         num_clusters: int, max_draws: int) -> Optional[tuple[NDArray[np.float64], int]]:
    """``(W^0, draws)`` of the first draw ``draw(j)``, ``j < max_draws``, whose greedy choices on
    ``clients``' training losses use fewer than ``num_clusters`` models; ``None`` if none does."""
    for index in range(max_draws):
        models = draw(index)
        if len(np.unique(np.argmin(clients.losses(models), axis=1))) < num_clusters:
            return models, index + 1
    return None


def conditioned_start(entrance: str, draw: Callable[[int], NDArray[np.float64]], clients: Callable[[], ClientBatch],
                      num_clusters: int, max_draws: int, task: str) -> tuple[NDArray[np.float64], int]:
    """``(W^0, draws)`` of an ``entrance``: ``"any"`` draw 0; ``"collapsed"`` :func:`first_collapsed_draw`
    over ``clients()`` (all the task's clients).  ``task`` names the task and its start in errors.

    Raises
    ------
    ValueError
        ``"collapsed"`` with ``num_clusters < 2``, or no collapsed draw within ``max_draws``.
    """
    if entrance == "any":
        return draw(0), 1
    if num_clusters < 2:
        raise ValueError(f"{task}: 'entrance' = 'collapsed' needs num_clusters ≥ 2, got {num_clusters}; "
                         "allowed: entrance 'any' for one cluster")
    found = first_collapsed_draw(draw, clients(), num_clusters, max_draws)
    if found is None:
        raise ValueError(f"{task}: no collapsed entrance in max-init-draws = {max_draws} draws; allowed: a larger "
                         "'max-init-draws', another 'init-jitter', or entrance 'any'")
    return found
