"""Clients compared on the classes they share: a partition of the clients that label skew does not drive.

Under label skew inside groups (every client of a group holding its own mix of the classes), each
client-level signal we measured follows the client's label mix more than its group: its update
direction, its losses over the models, the mean of its inputs (docs/algorithm.md, "The suite").  What
a group shares is what each class *looks like* — not which classes a client holds.  So a client's
signature is per class (:func:`class_means`): the mean feature vector of its samples of class ``y``;
two clients are compared only on the classes both hold, each class's means centred over the clients
that hold it (:func:`shared_class_similarity`); and a spectral partition of that similarity
(:func:`spectral_parts`) parts the clients.

Pure, deterministic numpy functions, for a batch of clients.  A client that sends its signature sends a
*sketch* (:func:`sketched_signatures`): each class mean projected on ``d`` random directions drawn from the
run's seed (:func:`sketch_matrix`, the same for every client and both runtimes), and its class counts.
"""

from __future__ import annotations

from typing import Any, Iterable, Optional

import numpy as np
from numpy.typing import NDArray

from fedroute.core.randomness import Purpose, generator
from fedroute.core.validation import invalid

__all__ = ["MIN_CLASS_SAMPLES", "CLASS_SAMPLE_FIELDS", "class_means", "shared_class_similarity", "spectral_parts",
           "refined_parts", "pairwise_refined_parts", "signature_parts", "sketch_matrix", "sketched_signatures",
           "has_class_samples", "batch_class_means", "labelled_signature"]

CLASS_SAMPLE_FIELDS = ("train_inputs", "train_labels", "train_weights", "num_classes")
"""What a :class:`~fedroute.core.task.ClientBatch` carries for :func:`batch_class_means` (the classification tasks)."""

MIN_CLASS_SAMPLES = 2
"""Samples of a class a client needs for its mean of that class to count (one sample is not a mean)."""

KMEANS_ITERATIONS = 50
"""Assignment/centroid iterations of the k-means on the spectral embedding (it settles in a few)."""


def class_means(features: NDArray[np.floating], labels: NDArray[np.integer], weights: NDArray[np.floating],
                num_classes: int) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
    """Every client's mean feature vector per class, and how many of its samples each class has.

    Parameters
    ----------
    features : ndarray, shape (n, S, F)
        ``S`` sample slots per client (padded); the features of each sample (e.g. its flattened inputs).
    labels : ndarray of int, shape (n, S)
        Class of each sample, in ``[0, num_classes)``.
    weights : ndarray, shape (n, S)
        A sample counts where its weight is positive (padding has weight 0).
    num_classes : int
        ``C``.

    Returns
    -------
    means : ndarray, shape (n, C, F)
        Mean features of the client's samples of each class (0 where it has none).
    counts : ndarray of int, shape (n, C)
        Samples of each class.
    """
    features = np.asarray(features, dtype=np.float64)
    labels = np.asarray(labels, dtype=np.int64)
    present = np.asarray(weights) > 0
    if features.ndim != 3 or labels.shape != features.shape[:2] or present.shape != labels.shape:
        raise ValueError(f"features must be (n, S, F) with labels and weights (n, S); got {features.shape}, "
                         f"{labels.shape}, {present.shape}")
    if np.any(present & ((labels < 0) | (labels >= num_classes))):
        raise invalid("labels", sorted(set(labels[present].tolist()) - set(range(num_classes)))[:5],
                      f"integers in [0, {num_classes - 1}]")
    one_hot = (labels[..., None] == np.arange(num_classes)) & present[..., None]          # (n, S, C)
    counts = one_hot.sum(axis=1).astype(np.int64)                                          # (n, C)
    sums = np.einsum("nsc,nsf->ncf", one_hot.astype(np.float64), features)
    means = np.divide(sums, counts[..., None], out=np.zeros_like(sums), where=counts[..., None] > 0)
    return means, counts


def shared_class_similarity(means: NDArray[np.floating], counts: NDArray[np.integer],
                            min_samples: int = MIN_CLASS_SAMPLES) -> NDArray[np.float64]:
    """Similarity of every pair of clients on the classes both hold: ``(n, n)``, in ``[−1, 1]``.

    A client holds class ``y`` when it has at least ``min_samples`` samples of it.  Each class's means are
    centred by their average over the clients that hold it (what the class looks like in every group
    drops out), then normalised; two clients' similarity is the mean cosine of their centred means over
    the classes both hold, 0 where they share none.  The diagonal is 1 for a client that holds a class.
    """
    means = np.asarray(means, dtype=np.float64)
    holds = np.asarray(counts) >= min_samples                                               # (n, C)
    held = holds.sum(axis=0)                                                                # (C,)
    centre = np.divide((means * holds[..., None]).sum(axis=0), held[:, None],
                       out=np.zeros(means.shape[1:]), where=held[:, None] > 0)              # (C, F)
    centred = (means - centre[None]) * holds[..., None]
    norms = np.linalg.norm(centred, axis=2, keepdims=True)
    unit = np.divide(centred, norms, out=np.zeros_like(centred), where=norms > 0)
    cosines = np.einsum("icf,jcf->ij", unit, unit)                                          # summed over classes
    shared = holds.astype(np.float64) @ holds.T.astype(np.float64)                          # classes both hold
    return np.divide(cosines, shared, out=np.zeros_like(cosines), where=shared > 0)


def spectral_parts(similarity: NDArray[np.floating], num_parts: int) -> NDArray[np.int64]:
    """A ``num_parts``-way partition of the clients by their similarity (normalised spectral clustering).

    The affinity is the similarity with negative values cut to 0 and the diagonal removed; the clients are
    embedded by the eigenvectors of the ``num_parts`` smallest eigenvalues of the normalised Laplacian (rows
    normalised), and k-means in that embedding parts them: the first centre is the client farthest from the
    embedding's mean, each next one the client farthest from the centres so far (ties to the lowest index),
    then assignment and centroid steps until the parts stop changing.  Parts are numbered in the order of
    their first client.  Deterministic.

    Parameters
    ----------
    similarity : ndarray, shape (n, n), symmetric
    num_parts : int
        In ``[1, n]``.

    Returns
    -------
    ndarray of int, shape (n,)
    """
    similarity = np.asarray(similarity, dtype=np.float64)
    n = len(similarity)
    if similarity.shape != (n, n):
        raise ValueError(f"similarity must be square (n, n), got shape {similarity.shape}")
    if not 1 <= num_parts <= n:
        raise invalid("num_parts", num_parts, f"an integer in [1, {n}] (the number of clients)")
    if num_parts == 1:
        return np.zeros(n, dtype=np.int64)
    affinity = np.maximum((similarity + similarity.T) / 2, 0.0)
    np.fill_diagonal(affinity, 0.0)
    degree = affinity.sum(axis=1)
    scale = np.divide(1.0, np.sqrt(degree), out=np.zeros(n), where=degree > 0)
    laplacian = np.eye(n) - scale[:, None] * affinity * scale[None, :]
    _, vectors = np.linalg.eigh(laplacian)
    embedding = vectors[:, :num_parts]
    norms = np.linalg.norm(embedding, axis=1, keepdims=True)
    embedding = np.divide(embedding, norms, out=np.zeros_like(embedding), where=norms > 0)
    labels = _kmeans(embedding, num_parts)
    _, first = np.unique(labels, return_index=True)
    order = np.argsort(np.argsort(first))
    return order[labels].astype(np.int64)


def _kmeans(points: NDArray[np.float64], num_parts: int) -> NDArray[np.int64]:
    """k-means with farthest-first seeding (the first seed the point farthest from the mean)."""
    seeds = [int(np.argmax(np.linalg.norm(points - points.mean(axis=0), axis=1)))]
    while len(seeds) < num_parts:
        distance = np.min(np.linalg.norm(points[:, None, :] - points[seeds][None], axis=2), axis=1)
        distance[seeds] = -1.0
        seeds.append(int(np.argmax(distance)))
    centres = points[seeds]
    labels = np.full(len(points), -1, dtype=np.int64)
    for _ in range(KMEANS_ITERATIONS):
        new = np.argmin(np.linalg.norm(points[:, None, :] - centres[None], axis=2), axis=1).astype(np.int64)
        if np.array_equal(new, labels):
            break
        labels = new
        centres = np.stack([points[labels == part].mean(axis=0) if np.any(labels == part) else centres[part]
                            for part in range(num_parts)])
    return labels


def refined_parts(similarity: NDArray[np.floating], labels: NDArray[np.integer]) -> NDArray[np.int64]:
    """A partition improved client by client: each joins the part it is most similar to on average.

    Every client's mean similarity to the *other* members of each part is computed, and every client moves to
    the part with the highest one where it is higher than its own part's (ties to the lower part; the only
    member of a part stays), until no client moves (at most :data:`KMEANS_ITERATIONS` times) — a local search
    on the partition's average association.  A step that would leave a part empty is not taken (the previous
    partition is kept).  Deterministic.

    On ``digits-skew`` (16-dimensional sketches, seeds 100–104 and 110–119: 15 partitions of 24 clients) it
    halved the misplaced clients of the spectral partitions, 20 to 10, and made 5 of the 12 inexact ones exact.

    Parameters
    ----------
    similarity : ndarray, shape (n, n)
    labels : ndarray of int, shape (n,)
        A partition into parts ``0 … P−1``.

    Returns
    -------
    ndarray of int, shape (n,)
    """
    similarity = np.array(similarity, dtype=np.float64)
    np.fill_diagonal(similarity, 0.0)
    labels = np.asarray(labels, dtype=np.int64)
    num_parts = int(labels.max()) + 1 if len(labels) else 0
    for _ in range(KMEANS_ITERATIONS):
        members = (labels[:, None] == np.arange(num_parts)[None]).astype(np.float64)          # (n, P)
        others = members.sum(axis=0)[None, :] - members                                         # without self
        mean = np.divide(similarity @ members, others, out=np.full(members.shape, -np.inf), where=others > 0)
        rows = np.arange(len(labels))
        mean[rows, labels] = np.where(others[rows, labels] > 0, mean[rows, labels], np.inf)   # alone: stays
        best = np.argmax(mean, axis=1).astype(np.int64)
        moved = np.where(mean[rows, best] > mean[rows, labels], best, labels)
        if np.array_equal(moved, labels) or len(np.unique(moved)) < num_parts:
            break
        labels = moved
    return labels


def pairwise_refined_parts(means: NDArray[np.floating], counts: NDArray[np.integer], labels: NDArray[np.integer],
                           min_samples: int = MIN_CLASS_SAMPLES) -> NDArray[np.int64]:
    """A partition refined pair of parts by pair, each pair compared on its own clients.

    :func:`shared_class_similarity` centres each class over the clients it compares.  Over a whole federation
    of more than two groups, the direction that sets some groups apart from the others dominates what is left
    after centring, and two groups on the same side of it look alike: on ``digits-skew`` (seed 102, 16-dimensional
    sketches) a client's mean similarity was 0.73 to its own group and 0.77 to another, and the partition put it
    with the other.  Compared on their own clients, centred over those alone, what two parts share drops out
    and what tells them apart is left.  So for every pair of parts ``(a, b)``: the similarity of the clients of
    ``a`` and ``b`` alone, and :func:`refined_parts` between the two; sweeps over the pairs until no client moves
    (at most :data:`KMEANS_ITERATIONS` sweeps).  A pair with fewer than three clients is left as it is.
    Deterministic.

    Measured on ``K = G`` scenarios of the suite (16-dimensional sketches, all clients, the partition of
    :func:`spectral_parts` refined by :func:`refined_parts` before): ``digits-skew`` seeds 100–119, misplaced
    clients 10 → 0; seeds 120–159 (held out), 13 → 1; ``digits-lognormal`` seeds 120–159, 7 → 3;
    ``boundaries-skew``, ``digits``, ``digits-minority``, ``digits-minority-noisy``, ``digits-poor``,
    ``digits-g8``: 0 → 0.

    Parameters
    ----------
    means : ndarray, shape (n, C, F)
        Class means (or their sketches), as :func:`shared_class_similarity` takes them.
    counts : ndarray, shape (n, C)
    labels : ndarray of int, shape (n,)
        A partition into parts ``0 … P−1``.
    min_samples : int
        As :func:`shared_class_similarity`.

    Returns
    -------
    ndarray of int, shape (n,)
    """
    means, counts = np.asarray(means, dtype=np.float64), np.asarray(counts)
    labels = np.array(labels, dtype=np.int64)
    num_parts = int(labels.max()) + 1 if len(labels) else 0
    for _ in range(KMEANS_ITERATIONS):
        moved = False
        for first in range(num_parts):
            for second in range(first + 1, num_parts):
                pair = np.flatnonzero((labels == first) | (labels == second))
                if len(pair) < 3:
                    continue
                sides = (labels[pair] == second).astype(np.int64)
                refined = refined_parts(shared_class_similarity(means[pair], counts[pair], min_samples), sides)
                if not np.array_equal(refined, sides):
                    labels[pair] = np.where(refined == 1, second, first)
                    moved = True
        if not moved:
            break
    return labels


def signature_parts(features: NDArray[np.floating], labels: NDArray[np.integer], weights: NDArray[np.floating],
                    num_classes: int, num_parts: int) -> NDArray[np.int64]:
    """The clients parted on the classes they share: :func:`class_means`, :func:`shared_class_similarity`,
    :func:`spectral_parts`."""
    means, counts = class_means(features, labels, weights, num_classes)
    return spectral_parts(shared_class_similarity(means, counts), num_parts)


def sketch_matrix(num_features: int, dim: int, seed: int) -> NDArray[np.float64]:
    """The signature's random projection ``(F, d)``: standard normal entries over ``√d``, drawn from the run's seed
    (``Purpose.SKETCH``), so that every client of a run projects on the same directions."""
    if num_features < 1 or dim < 1:
        raise invalid("the signature's size", (num_features, dim), "at least one feature and one dimension")
    return generator(int(seed), 0, 0, Purpose.SKETCH).standard_normal((int(num_features), int(dim))) / np.sqrt(dim)


def sketched_signatures(means: NDArray[np.floating], counts: NDArray[np.integer], dim: int,
                        seed: int) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Class means ``(n, C, F)`` projected to ``(n, C, d)`` (:func:`sketch_matrix`), and the counts as floats."""
    means = np.asarray(means, dtype=np.float64)
    return means @ sketch_matrix(means.shape[-1], dim, seed), np.asarray(counts, dtype=np.float64)


def has_class_samples(clients: object) -> bool:
    """Whether a batch of clients carries its class samples (:data:`CLASS_SAMPLE_FIELDS`): a classification task
    whose clients can send a signature."""
    return all(hasattr(clients, name) for name in CLASS_SAMPLE_FIELDS)


def batch_class_means(clients: object) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
    """:func:`class_means` of a batch of clients that carry their samples (:data:`CLASS_SAMPLE_FIELDS`),
    inputs flattened: ``(n, C, F)`` and ``(n, C)``.

    Raises
    ------
    ValueError
        Naming the fields the task's clients lack (only classification tasks with their samples have a signature).
    """
    if not has_class_samples(clients):
        missing = [name for name in CLASS_SAMPLE_FIELDS if not hasattr(clients, name)]
        raise invalid("clients", f"a batch without {', '.join(missing)}", "a batch that carries "
                      f"{', '.join(CLASS_SAMPLE_FIELDS)} (a classification task's samples)",
                      "ask has_class_samples(clients) first: a task without them has no signature (the signature "
                      "start's clients then send none)")
    inputs = np.asarray(getattr(clients, "train_inputs"))
    return class_means(inputs.reshape(inputs.shape[0], inputs.shape[1], -1), getattr(clients, "train_labels"),
                       getattr(clients, "train_weights"), int(getattr(clients, "num_classes")))


def labelled_signature(batches: Iterable[tuple[Any, Any]], num_classes: int, dim: int,
                       seed: int) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """One client's sketched signature from its labelled data, one pass over ``(inputs, labels)`` batches.

    Parameters
    ----------
    batches : iterable of (array-like, array-like)
        Inputs ``(B, ...)`` (flattened per sample) and integer labels ``(B,)``: e.g. a torch ``DataLoader``'s
        batches as numpy arrays.
    num_classes, dim, seed : int

    Returns
    -------
    means : ndarray, shape (1, C, d)
    counts : ndarray, shape (1, C)
    """
    sums: Optional[NDArray[np.float64]] = None
    counts = np.zeros(num_classes, dtype=np.int64)
    for inputs, labels in batches:
        features = np.asarray(inputs, dtype=np.float64).reshape(len(labels), -1)
        labels = np.asarray(labels, dtype=np.int64).reshape(-1)
        if np.any((labels < 0) | (labels >= num_classes)):
            raise invalid("signature labels", sorted(set(labels.tolist()) - set(range(num_classes)))[:5],
                          f"integers in [0, {num_classes - 1}]", "pass the task's number of classes as num_classes")
        if sums is None:
            sums = np.zeros((num_classes, features.shape[1]))
        np.add.at(sums, labels, features)
        counts += np.bincount(labels, minlength=num_classes)
    if sums is None:
        raise invalid("signature data", "no batch", "at least one (inputs, labels) batch")
    means = np.divide(sums, counts[:, None], out=np.zeros_like(sums), where=counts[:, None] > 0)
    return sketched_signatures(means[None], counts[None], dim, seed)
