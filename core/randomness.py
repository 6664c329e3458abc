"""Counter-based randomness: every draw is a pure function of its coordinates.

docs/algorithm.md, rules §8 requires each random draw to be a pure function of
``(seed, client_id, round, purpose)`` so that the Flower runtime (one client
per process) and the batched simulator (all clients at once) make the *same*
draws.  ``numpy.random.default_rng([seed, client, round, purpose])`` has that
property but costs ~20 µs per generator and cannot be vectorised, which would
make the paper's sweeps (millions of client-rounds) slow.  We therefore hash
the coordinates with the SplitMix64 finaliser, a bijective 64-bit mixer with
full avalanche, and map the result to a double in ``[0, 1)``.  The function is
vectorised: any argument may be an array and they broadcast.  Bulk draws that
happen once per client (its data, initial models) use
:func:`generator`, i.e. ``numpy.random.default_rng`` seeded with the same
coordinates.  See ``docs/algorithm.md`` for this documented deviation.
"""

from __future__ import annotations

from enum import IntEnum

import numpy as np
from numpy.typing import ArrayLike, NDArray

__all__ = ["Purpose", "uniform", "generator"]


class Purpose(IntEnum):
    """Named purposes of random draws (the fourth coordinate of every draw)."""

    ARM = 1
    """EXP3 arm (controller) choice."""
    ROUTE = 2
    """Hard route sample ``r ~ π``."""
    DATA = 3
    """A client's data."""
    INIT = 4
    """Initial cluster models."""
    TASK = 5
    """Task-level constants (e.g. group parameters)."""
    NODE_SAMPLING = 6
    """Which nodes the server samples in a round."""
    PROBE = 7
    """Randomness inside a probe update (synchronized entry)."""
    TRAIN = 8
    """Randomness inside local training (mini-batches)."""
    TIE = 9
    """Random tie-breaking among exactly equal losses (``tie_breaking = "random"``)."""
    EVALUATE_SAMPLING = 10
    """Which nodes the server asks in an evaluation during training (``fraction_evaluate < 1``)."""
    LOSS_ROWS = 11
    """Which training rows a client scores the ``K`` models on (``DataLoss(max_rows=...)``, drawn once)."""
    SKETCH = 12
    """The random projection of the signature start, shared by every client
    (:func:`fedroute.core.signatures.sketch_matrix`)."""


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MUL1 = np.uint64(0xBF58476D1CE4E5B9)
_MUL2 = np.uint64(0x94D049BB133111EB)


def _splitmix64(values: NDArray[np.uint64]) -> NDArray[np.uint64]:
    """SplitMix64 finaliser applied element-wise (wrapping uint64 arithmetic)."""
    z = values + _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * _MUL1
    z = (z ^ (z >> np.uint64(27))) * _MUL2
    return z ^ (z >> np.uint64(31))


def uniform(
    seed: ArrayLike,
    client_id: ArrayLike,
    round_index: ArrayLike,
    purpose: int,
    draw: ArrayLike = 0,
) -> NDArray[np.float64]:
    """Uniform numbers in ``[0, 1)``, one per broadcast coordinate.

    Parameters
    ----------
    seed, client_id, round_index : array_like of int
        Coordinates of the draw; non-negative integers, broadcast together.
    purpose : int
        A :class:`Purpose`.
    draw : array_like of int, default 0
        Index of the draw when one purpose needs several numbers.

    Returns
    -------
    numpy.ndarray of float64
        Broadcast shape of the coordinates; the same coordinates always give
        the same number, whatever else is computed alongside.
    """
    coordinates = np.broadcast_arrays(
        np.asarray(seed, dtype=np.int64),
        np.asarray(client_id, dtype=np.int64),
        np.asarray(round_index, dtype=np.int64),
        np.asarray(draw, dtype=np.int64),
    )
    for name, values in zip(("seed", "client_id", "round_index", "draw"), coordinates):
        if values.size and values.min() < 0:
            raise ValueError(f"{name} must be a non-negative integer, got {values.min()}")
    with np.errstate(over="ignore"):
        state = _splitmix64(np.full(coordinates[0].shape, purpose, dtype=np.uint64))
        for values in coordinates:
            state = _splitmix64(state ^ values.astype(np.uint64))
    return (state >> np.uint64(11)).astype(np.float64) * (1.0 / 9007199254740992.0)


def generator(seed: int, client_id: int, round_index: int, purpose: int) -> np.random.Generator:
    """A NumPy generator for bulk draws at one coordinate (data, initial models).

    Parameters
    ----------
    seed, client_id, round_index : int
        Non-negative coordinates.
    purpose : int
        A :class:`Purpose`.

    Returns
    -------
    numpy.random.Generator
        ``numpy.random.default_rng([seed, client_id, round_index, purpose])``.
    """
    return np.random.default_rng([int(seed), int(client_id), int(round_index), int(purpose)])


def categorical(probabilities: NDArray[np.float64], uniforms: NDArray[np.float64]) -> NDArray[np.int64]:
    """Inverse-CDF sample of one category per row.

    Parameters
    ----------
    probabilities : ndarray, shape (..., m)
        Rows of non-negative weights summing to one (up to rounding).
    uniforms : ndarray, shape (...)
        One number in ``[0, 1)`` per row.

    Returns
    -------
    ndarray of int64, shape (...)
        The smallest index whose cumulative probability exceeds the uniform;
        a zero-probability category is never returned.
    """
    cumulative = np.cumsum(probabilities, axis=-1)
    threshold = uniforms[..., None] * cumulative[..., -1:]
    index = np.sum(cumulative <= threshold, axis=-1)
    return np.minimum(index, probabilities.shape[-1] - 1).astype(np.int64)


__all__.append("categorical")
