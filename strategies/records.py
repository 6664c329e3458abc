"""Conversions between Flower records and the numpy arrays the routing maths uses."""

from __future__ import annotations

from typing import Mapping, Optional, Sequence

import numpy as np
from flwr.app import Array, ArrayRecord
from numpy.typing import NDArray

from fedroute import protocol

__all__ = ["pack_cluster_models", "unpack_cluster_models", "arrays_of", "array_record"]


def arrays_of(record: ArrayRecord) -> dict[str, NDArray]:
    """Named numpy arrays of an ArrayRecord, in order."""
    return {name: array.numpy() for name, array in record.items()}


def array_record(arrays: Mapping[str, NDArray]) -> ArrayRecord:
    """An ArrayRecord holding the given named numpy arrays."""
    return ArrayRecord({name: Array(np.ascontiguousarray(value)) for name, value in arrays.items()})


def pack_cluster_models(cluster_models: Sequence[Mapping[str, NDArray]]) -> ArrayRecord:
    """All ``K`` models in one ArrayRecord (keys ``cluster-k/<array name>``).

    Flower's ``Strategy.start`` carries one ArrayRecord between rounds; this is it.
    """
    packed = {}
    for cluster, arrays in enumerate(cluster_models):
        for name, value in arrays.items():
            packed[f"{protocol.cluster_key(cluster)}/{name}"] = value
    return array_record(packed)


def unpack_cluster_models(packed: ArrayRecord, num_clusters: Optional[int] = None) -> list[dict[str, NDArray]]:
    """Inverse of :func:`pack_cluster_models`: the ``K`` models as dicts of numpy arrays.

    Parameters
    ----------
    packed : ArrayRecord
        Keys ``cluster-<k>/<array name>`` (e.g. ``Result.arrays`` of ``ClusteredRouting.start``).
    num_clusters : int, optional
        ``K``; inferred from the keys (largest ``k`` + 1) when omitted.

    Returns
    -------
    list of dict
        One ``{array name: ndarray}`` per cluster, in the packed order.

    Raises
    ------
    ValueError
        If a key is not ``cluster-<k>/<name>``, names a cluster outside ``0..K-1``,
        or a cluster has no arrays.
    """
    entries = []
    for key, array in packed.items():
        prefix, _, name = key.partition("/")
        index = prefix[len(protocol.CLUSTER_PREFIX):]
        if not prefix.startswith(protocol.CLUSTER_PREFIX) or not name or not index.isdigit():
            raise ValueError(f"packed cluster-model key {key!r} is not 'cluster-<k>/<name>'")
        entries.append((int(index), name, array))
    if num_clusters is None:
        num_clusters = max((cluster for cluster, _, _ in entries), default=-1) + 1
    models: list[dict[str, NDArray]] = [{} for _ in range(num_clusters)]
    for cluster, name, array in entries:
        if not 0 <= cluster < num_clusters:
            raise ValueError(f"packed key 'cluster-{cluster}/{name}' names cluster {cluster}; "
                             f"allowed: 0..{num_clusters - 1}")
        models[cluster][name] = array.numpy()
    if not models or any(not model for model in models):
        raise ValueError(f"packed record does not hold all {num_clusters} cluster models")
    return models
