"""Evaluation metrics for clustered federated learning (pure numpy).

Conventions
-----------
* Arrays have a leading axis of clients where relevant.
* ``losses`` is an ``(n_clients, K)`` array: the loss of every cluster model on
  every client.  Greedy choices are ``argmin`` over the last axis with ties
  broken towards the lowest index (``np.argmin``).
* ``groups`` are integer labels ``0..G-1``; they are used for evaluation only.
* ``routes`` are integer cluster ids ``0..K-1``.
* Maps from groups to clusters (``recovery_error``, ``assignment_accuracy``)
  are injective when ``G <= K`` (``itertools.permutations(range(K), G)``).
  ``assignment_accuracy`` with ``G > K`` uses all maps
  (``itertools.product(range(K), repeat=G)``), which then cannot be injective.

This module imports nothing from the rest of ``fedroute``.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import numpy as np
from numpy.typing import ArrayLike

__all__ = [
    "MAX_CANDIDATE_MAPS",
    "assignment_accuracy",
    "certified_starvation_basin",
    "common_preferred_cluster",
    "composition",
    "femnist_recovery_levels",
    "greedy_choices",
    "group_routing_matrix",
    "persistent_collapse",
    "recovery_error",
    "round_zero_attraction",
    "routed_loss",
    "usable_models",
    "weak_cluster_mass",
]

#: Largest number of group->cluster maps enumerated by one call (8! = 40,320).
MAX_CANDIDATE_MAPS = 40_320


# --------------------------------------------------------------------------- #
# Validation helpers
# --------------------------------------------------------------------------- #
def _as_real(x: ArrayLike, name: str, min_ndim: int = 0) -> np.ndarray:
    """Return ``x`` as a finite float array with at least ``min_ndim`` axes."""
    arr = np.asarray(x)
    if arr.dtype == bool or not np.issubdtype(arr.dtype, np.number):
        raise ValueError(f"{name} must be a real-valued array, got dtype {arr.dtype}")
    arr = arr.astype(float)
    if arr.ndim < min_ndim:
        raise ValueError(f"{name} must have at least {min_ndim} axes, got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must contain only finite values")
    return arr


def _as_losses(x: ArrayLike, name: str) -> np.ndarray:
    """Return ``x`` as a finite ``(..., n, K)`` float array with ``n, K >= 1``."""
    arr = _as_real(x, name, min_ndim=2)
    if arr.shape[-1] < 1 or arr.shape[-2] < 1:
        raise ValueError(f"{name} must have shape (..., n >= 1, K >= 1), got {arr.shape}")
    return arr


def _as_labels(x: ArrayLike, name: str, upper: int | None = None,
               ndim: int | None = 1) -> np.ndarray:
    """Return ``x`` as an integer array with values in ``[0, upper)``."""
    arr = np.asarray(x)
    if arr.dtype == bool or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{name} must be an integer array, got dtype {arr.dtype}")
    if ndim is not None and arr.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} axis/axes, got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError(f"{name} must not be empty")
    if arr.min() < 0 or (upper is not None and arr.max() >= upper):
        bound = f"{upper - 1}" if upper is not None else "inf"
        raise ValueError(f"{name} must take values in 0..{bound}, got range "
                         f"[{arr.min()}, {arr.max()}]")
    return arr.astype(np.intp)


def _positive_int(x: int, name: str) -> int:
    if isinstance(x, bool) or not isinstance(x, (int, np.integer)) or x < 1:
        raise ValueError(f"{name} must be a positive integer, got {x!r}")
    return int(x)


def _num_groups(groups: np.ndarray, num_groups: int | None) -> int:
    """Return ``G``: ``num_groups`` if given (checked), else ``max(groups) + 1``."""
    if num_groups is None:
        return int(groups.max()) + 1
    num_groups = _positive_int(num_groups, "num_groups")
    if groups.max() >= num_groups:
        raise ValueError(f"groups must take values in 0..{num_groups - 1} "
                         f"(num_groups={num_groups}), got max {groups.max()}")
    return num_groups


def _check_same_length(a: np.ndarray, a_name: str, b: np.ndarray, b_name: str) -> None:
    if a.shape != b.shape:
        raise ValueError(f"{a_name} and {b_name} must have the same shape, "
                         f"got {a.shape} and {b.shape}")


def _scalar_or_array(x: np.ndarray) -> bool | int | float | np.ndarray:
    """Turn a 0-d result into a Python scalar; leave batched results as arrays."""
    return x.item() if np.ndim(x) == 0 else x


def _group_cluster_maps(num_groups: int, num_clusters: int) -> Iterator[tuple[int, ...]]:
    """Maps groups -> clusters: injective if ``G <= K``, otherwise arbitrary."""
    if num_groups <= num_clusters:
        count = int(np.prod(np.arange(num_clusters - num_groups + 1, num_clusters + 1)))
        maps = itertools.permutations(range(num_clusters), num_groups)
    else:
        count = num_clusters**num_groups
        maps = itertools.product(range(num_clusters), repeat=num_groups)
    if count > MAX_CANDIDATE_MAPS:
        raise ValueError(f"{count} group->cluster maps for G={num_groups}, K={num_clusters}; "
                         f"at most {MAX_CANDIDATE_MAPS} are enumerated")
    return maps


# --------------------------------------------------------------------------- #
# Greedy choices and attraction
# --------------------------------------------------------------------------- #
def greedy_choices(losses: ArrayLike) -> np.ndarray:
    """Cluster each client picks greedily: the argmin of its losses.

    Parameters
    ----------
    losses : array_like, shape (..., n, K)
        Loss of every cluster model on every client.

    Returns
    -------
    numpy.ndarray of int, shape (..., n)
        ``argmin_k losses[..., i, k]``; ties go to the lowest index.
    """
    return np.argmin(_as_losses(losses, "losses"), axis=-1)


def group_routing_matrix(routes: ArrayLike, groups: ArrayLike, num_clusters: int,
                         num_groups: int | None = None) -> np.ndarray:
    """Fraction of each group routed to each cluster.

    Parameters
    ----------
    routes : array_like of int, shape (n,)
        Cluster id ``0..K-1`` of each client.
    groups : array_like of int, shape (n,)
        Group label ``0..G-1`` of each client.
    num_clusters : int
        Number of clusters ``K``.
    num_groups : int, optional
        Number of groups ``G``; defaults to ``max(groups) + 1``.

    Returns
    -------
    numpy.ndarray, shape (G, K)
        ``M[g, k] = |{i in I_g : routes[i] = k}| / |I_g|``.  The row of a group
        with no clients is NaN.
    """
    num_clusters = _positive_int(num_clusters, "num_clusters")
    routes = _as_labels(routes, "routes", num_clusters)
    groups = _as_labels(groups, "groups")
    _check_same_length(routes, "routes", groups, "groups")
    num_groups = _num_groups(groups, num_groups)
    counts = np.zeros((num_groups, num_clusters))
    np.add.at(counts, (groups, routes), 1.0)
    sizes = counts.sum(axis=1, keepdims=True)
    with np.errstate(invalid="ignore"):
        return counts / sizes


def round_zero_attraction(losses: ArrayLike, groups: ArrayLike,
                          num_groups: int | None = None) -> np.ndarray:
    """Attraction matrix ``A0`` of the greedy choices at round zero.

    Parameters
    ----------
    losses : array_like, shape (n, K)
        Loss of every cluster model on every client at the initial models.
    groups : array_like of int, shape (n,)
        Group label ``0..G-1`` of each client.
    num_groups : int, optional
        Number of groups ``G``; defaults to ``max(groups) + 1``.

    Returns
    -------
    numpy.ndarray, shape (G, K)
        ``A0[g, k]`` = fraction of clients of group ``g`` whose argmin (ties to
        the lowest index) is ``k``.  The row of an empty group is NaN.
    """
    losses = _as_losses(losses, "losses")
    if losses.ndim != 2:
        raise ValueError(f"losses must have shape (n, K), got {losses.shape}")
    return group_routing_matrix(np.argmin(losses, axis=-1), groups, losses.shape[-1], num_groups)


def usable_models(losses: ArrayLike) -> int | np.ndarray:
    """Number ``K_eval`` of distinct models chosen greedily by the clients.

    Parameters
    ----------
    losses : array_like, shape (..., n, K)
        Loss of every cluster model on every client.

    Returns
    -------
    int or numpy.ndarray of int, shape (...)
        Number of distinct values of ``argmin_k losses[..., i, k]`` over ``i``.
    """
    losses = _as_losses(losses, "losses")
    chosen = np.argmin(losses, axis=-1)[..., None] == np.arange(losses.shape[-1])
    return _scalar_or_array(np.any(chosen, axis=-2).sum(axis=-1))


# --------------------------------------------------------------------------- #
# Two-group linear case
# --------------------------------------------------------------------------- #
def _models_and_theta(cluster_models: ArrayLike, theta: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    models = _as_real(cluster_models, "cluster_models", min_ndim=2)
    theta = _as_real(theta, "theta", min_ndim=2)
    if theta.ndim != 2 or theta.shape[0] < 1:
        raise ValueError(f"theta must have shape (G, d), got {theta.shape}")
    if models.shape[-1] != theta.shape[-1] or models.shape[-2] < 1:
        raise ValueError(f"cluster_models must have shape (..., K, d) with d={theta.shape[-1]}, "
                         f"got {models.shape}")
    return models, theta


def _population_losses(models: np.ndarray, theta: np.ndarray) -> np.ndarray:
    """``L[..., g, k] = 0.5 ||w_k - theta_g||^2``, shape (..., G, K)."""
    return 0.5 * np.sum((models[..., None, :, :] - theta[:, None, :]) ** 2, axis=-1)


def _distances(models: np.ndarray, theta: np.ndarray) -> np.ndarray:
    """``D[..., g, k] = ||w_k - theta_g||``, shape (..., G, K)."""
    return np.sqrt(2.0 * _population_losses(models, theta))


def common_preferred_cluster(cluster_models: ArrayLike, theta: ArrayLike) -> int | np.ndarray:
    """Cluster preferred by every group under ``L_g(w) = 0.5 ||w - theta_g||^2``.

    Parameters
    ----------
    cluster_models : array_like, shape (..., K, d)
        Cluster models, with optional leading batch axes.
    theta : array_like, shape (G, d)
        Group parameters.

    Returns
    -------
    int or numpy.ndarray of int, shape (...)
        The common argmin ``j`` (ties to the lowest index), or -1 when the
        groups do not share a preference.
    """
    models, theta = _models_and_theta(cluster_models, theta)
    preferred = np.argmin(_population_losses(models, theta), axis=-1)
    shared = np.all(preferred == preferred[..., :1], axis=-1)
    return _scalar_or_array(np.where(shared, preferred[..., 0], -1))


def certified_starvation_basin(cluster_models: ArrayLike, theta: ArrayLike,
                               alpha: float) -> bool | np.ndarray:
    """Whether two cluster models lie in the certified starvation basin.

    With ``L_g(w) = 0.5 ||w - theta_g||^2``, if both groups prefer the same
    cluster ``j`` (ties to the lowest index), the starved cluster is
    ``s = 1 - j`` and ``theta_bar = alpha theta_0 + (1 - alpha) theta_1``.  The
    pair is in the basin iff ``||theta_bar - theta_g|| < ||w_s - theta_g||`` for
    both groups ``g``; without a common preference it is not.

    Parameters
    ----------
    cluster_models : array_like, shape (..., 2, d)
        Two cluster models, with optional leading batch axes (e.g. 20,000
        initialisation pairs).
    theta : array_like, shape (2, d)
        Parameters of group 0 and group 1.
    alpha : float
        Proportion of group 0, in ``[0, 1]``.

    Returns
    -------
    bool or numpy.ndarray of bool, shape (...)
        Membership of the basin.  See also :func:`common_preferred_cluster`.
    """
    models, theta = _models_and_theta(cluster_models, theta)
    if models.shape[-2] != 2 or theta.shape[0] != 2:
        raise ValueError(f"cluster_models must have shape (..., 2, d) and theta (2, d), "
                         f"got {models.shape} and {theta.shape}")
    if isinstance(alpha, bool) or not np.isscalar(alpha) or not 0.0 <= float(alpha) <= 1.0:
        raise ValueError(f"alpha must be a number in [0, 1], got {alpha!r}")
    common = np.asarray(common_preferred_cluster(models, theta))
    starved = np.where(common >= 0, 1 - common, 0)
    w_starved = np.take_along_axis(models, starved[..., None, None], axis=-2)  # (..., 1, d)
    theta_bar = alpha * theta[0] + (1.0 - alpha) * theta[1]
    bar_distance = np.linalg.norm(theta_bar - theta, axis=-1)  # (2,)
    starved_distance = _distances(w_starved, theta)[..., 0]  # (..., 2)
    in_basin = (common >= 0) & np.all(bar_distance < starved_distance, axis=-1)
    return _scalar_or_array(in_basin)


def recovery_error(cluster_models: ArrayLike, theta: ArrayLike) -> float | np.ndarray:
    """Recovery error ``R = min_pi max_g ||w_{pi(g)} - theta_g||``.

    The minimum runs over injective maps ``pi`` from the ``G`` groups to the
    ``K >= G`` clusters (for ``K = G = 2``: the two permutations), so the
    error does not depend on how the clusters are labelled.

    Parameters
    ----------
    cluster_models : array_like, shape (..., K, d)
        Cluster models, with optional leading batch axes.
    theta : array_like, shape (G, d)
        Group parameters; requires ``G <= K``.

    Returns
    -------
    float or numpy.ndarray, shape (...)
    """
    models, theta = _models_and_theta(cluster_models, theta)
    num_groups, num_clusters = theta.shape[0], models.shape[-2]
    if num_groups > num_clusters:
        raise ValueError(f"theta must have at most K={num_clusters} rows (G <= K), "
                         f"got G={num_groups}")
    distances = _distances(models, theta)
    group_index = np.arange(num_groups)
    best = np.full(distances.shape[:-2], np.inf)
    for cluster_of_group in _group_cluster_maps(num_groups, num_clusters):
        worst = distances[..., group_index, list(cluster_of_group)].max(axis=-1)
        best = np.minimum(best, worst)
    return _scalar_or_array(best)


# --------------------------------------------------------------------------- #
# Routing outcomes
# --------------------------------------------------------------------------- #
def persistent_collapse(route_counts: ArrayLike) -> bool | np.ndarray:
    """Whether at most one cluster ever received an update.

    Parameters
    ----------
    route_counts : array_like, shape (..., T, K)
        Number of clients (or mass) routed to each cluster at each round;
        must be non-negative.

    Returns
    -------
    bool or numpy.ndarray of bool, shape (...)
        True iff at most one column has a positive entry over all ``T`` rounds
        (so a run in which no cluster is ever updated also counts as collapsed).
    """
    counts = _as_real(route_counts, "route_counts", min_ndim=2)
    if np.any(counts < 0):
        raise ValueError("route_counts must be non-negative")
    updated = np.any(counts > 0, axis=-2)
    return _scalar_or_array(updated.sum(axis=-1) <= 1)


def routed_loss(test_losses: ArrayLike, routes: ArrayLike) -> float | np.ndarray:
    """Mean over clients of the test loss of the model each client is routed to.

    Parameters
    ----------
    test_losses : array_like, shape (..., n, K)
        Test loss of every cluster model on every client.
    routes : array_like of int, shape (..., n)
        Cluster id ``0..K-1`` of each client.

    Returns
    -------
    float or numpy.ndarray, shape (...)
        ``mean_i test_losses[..., i, routes[..., i]]``.
    """
    losses = _as_losses(test_losses, "test_losses")
    routes = _as_labels(routes, "routes", losses.shape[-1], ndim=None)
    if routes.shape != losses.shape[:-1]:
        raise ValueError(f"routes must have shape {losses.shape[:-1]} to match test_losses, "
                         f"got {routes.shape}")
    picked = np.take_along_axis(losses, routes[..., None], axis=-1)[..., 0]
    return _scalar_or_array(picked.mean(axis=-1))


def weak_cluster_mass(routing_matrix: ArrayLike, group_proportions: ArrayLike,
                      weak_cluster: int) -> float | np.ndarray:
    """Population mass routed to the weak cluster: ``sum_g alpha_g M[g, weak]``.

    Parameters
    ----------
    routing_matrix : array_like, shape (..., G, K)
        ``M[g, k]``, fraction of group ``g`` routed to cluster ``k``.
    group_proportions : array_like, shape (G,)
        Non-negative proportions ``alpha_g`` summing to one.
    weak_cluster : int
        Index of the weak cluster, in ``0..K-1``.

    Returns
    -------
    float or numpy.ndarray, shape (...)
    """
    matrix = np.asarray(routing_matrix, dtype=float)
    if matrix.ndim < 2:
        raise ValueError(f"routing_matrix must have shape (..., G, K), got {matrix.shape}")
    alpha = _as_real(group_proportions, "group_proportions", min_ndim=1)
    if alpha.shape != (matrix.shape[-2],):
        raise ValueError(f"group_proportions must have shape ({matrix.shape[-2]},), "
                         f"got {alpha.shape}")
    if np.any(alpha < 0) or not np.isclose(alpha.sum(), 1.0):
        raise ValueError("group_proportions must be non-negative and sum to 1")
    num_clusters = matrix.shape[-1]
    if (isinstance(weak_cluster, bool) or not isinstance(weak_cluster, (int, np.integer))
            or not 0 <= weak_cluster < num_clusters):
        raise ValueError(f"weak_cluster must be an integer in 0..{num_clusters - 1}, "
                         f"got {weak_cluster!r}")
    return _scalar_or_array(matrix[..., weak_cluster] @ alpha)


def composition(routes: ArrayLike, groups: ArrayLike, sample_weights: ArrayLike,
                num_clusters: int, num_groups: int | None = None) -> np.ndarray:
    """Share of each cluster's aggregation weight contributed by each group.

    Parameters
    ----------
    routes : array_like of int, shape (n,)
        Cluster id ``0..K-1`` of each client.
    groups : array_like of int, shape (n,)
        Group label ``0..G-1`` of each client.
    sample_weights : array_like, shape (n,)
        Non-negative aggregation weight of each client (e.g. its sample count).
    num_clusters : int
        Number of clusters ``K``.
    num_groups : int, optional
        Number of groups ``G``; defaults to ``max(groups) + 1``.

    Returns
    -------
    numpy.ndarray, shape (G, K)
        ``beta[h, k]`` = (weight of group-``h`` clients routed to ``k``) /
        (weight of all clients routed to ``k``).  A column whose total weight
        is zero (nobody routed there) is NaN.
    """
    num_clusters = _positive_int(num_clusters, "num_clusters")
    routes = _as_labels(routes, "routes", num_clusters)
    groups = _as_labels(groups, "groups")
    weights = _as_real(sample_weights, "sample_weights", min_ndim=1)
    _check_same_length(routes, "routes", groups, "groups")
    _check_same_length(routes, "routes", weights, "sample_weights")
    if np.any(weights < 0):
        raise ValueError("sample_weights must be non-negative")
    num_groups = _num_groups(groups, num_groups)
    mass = np.zeros((num_groups, num_clusters))
    np.add.at(mass, (groups, routes), weights)
    total = mass.sum(axis=0, keepdims=True)
    with np.errstate(invalid="ignore"):
        return mass / total


def assignment_accuracy(losses_or_routes: ArrayLike, groups: ArrayLike, num_clusters: int,
                        num_groups: int | None = None) -> float:
    """Best group-balanced accuracy of the routes over maps groups -> clusters.

    ``A = max_m (1/G) sum_g |I_g|^{-1} sum_{i in I_g} 1{r_i = m(g)}``, where the
    maps ``m`` are injective when ``G <= K`` and arbitrary when ``G > K``
    (every group then simply takes its most frequent cluster).

    Parameters
    ----------
    losses_or_routes : array_like
        Either routes, an integer array of shape (n,) with values ``0..K-1``,
        or losses of shape (n, K), in which case the routes are the greedy
        choices (:func:`greedy_choices`).
    groups : array_like of int, shape (n,)
        Group label ``0..G-1`` of each client; every group must be non-empty.
    num_clusters : int
        Number of clusters ``K``.
    num_groups : int, optional
        Number of groups ``G``; defaults to ``max(groups) + 1``.

    Returns
    -------
    float
        Accuracy in ``[0, 1]``.
    """
    num_clusters = _positive_int(num_clusters, "num_clusters")
    values = np.asarray(losses_or_routes)
    if values.ndim == 2:
        if values.shape[-1] != num_clusters:
            raise ValueError(f"losses_or_routes as losses must have shape (n, {num_clusters}), "
                             f"got {values.shape}")
        routes = greedy_choices(values)
    elif values.ndim == 1:
        routes = _as_labels(values, "losses_or_routes", num_clusters)
    else:
        raise ValueError(f"losses_or_routes must be routes (n,) or losses (n, K), "
                         f"got shape {values.shape}")
    matrix = group_routing_matrix(routes, groups, num_clusters, num_groups)
    if np.any(np.isnan(matrix)):
        raise ValueError("groups must contain at least one client of every group 0..G-1")
    group_index = np.arange(matrix.shape[0])
    best = 0.0
    for cluster_of_group in _group_cluster_maps(matrix.shape[0], num_clusters):
        best = max(best, float(matrix[group_index, list(cluster_of_group)].mean()))
    return best


# --------------------------------------------------------------------------- #
# FEMNIST recovery levels
# --------------------------------------------------------------------------- #
def femnist_recovery_levels(k_train_history: ArrayLike, k_test_history: ArrayLike,
                            acc_train: float, acc_test: float, window: int = 20,
                            num_groups: int = 2) -> dict[str, bool]:
    """Nested recovery levels of a FEMNIST run.

    Parameters
    ----------
    k_train_history, k_test_history : array_like of int, shape (S,)
        Usable models ``K_eval`` on the training / test clients at each of the
        ``S`` evaluated states, in order.
    acc_train, acc_test : float
        Assignment accuracy in ``[0, 1]`` at the final state.
    window : int, default 20
        Number of final states that must all be joint for ``sustained``
        (the paper uses the 20 states ``W^781..W^800``); requires ``S >= window``.
    num_groups : int, default 2
        Number of groups; a state is recovered when ``K_eval == num_groups``.

    Returns
    -------
    dict[str, bool]
        ``training``: ``k_train[-1] == num_groups``;
        ``joint``: ``training`` and ``k_test[-1] == num_groups``;
        ``sustained``: ``k_train == k_test == num_groups`` at each of the last
        ``window`` states;
        ``exact``: ``joint`` and ``acc_train == acc_test == 1``.
    """
    k_train = _as_labels(k_train_history, "k_train_history")
    k_test = _as_labels(k_test_history, "k_test_history")
    _check_same_length(k_train, "k_train_history", k_test, "k_test_history")
    window = _positive_int(window, "window")
    num_groups = _positive_int(num_groups, "num_groups")
    if window > k_train.size:
        raise ValueError(f"window must be in 1..{k_train.size} (the history length), got {window}")
    for name, value in (("acc_train", acc_train), ("acc_test", acc_test)):
        if not np.isscalar(value) or not 0.0 <= float(value) <= 1.0:
            raise ValueError(f"{name} must be a number in [0, 1], got {value!r}")
    joint_states = (k_train == num_groups) & (k_test == num_groups)
    joint = bool(joint_states[-1])
    return {
        "training": bool(k_train[-1] == num_groups),
        "joint": joint,
        "sustained": bool(np.all(joint_states[-window:])),
        "exact": joint and float(acc_train) == 1.0 and float(acc_test) == 1.0,
    }
