"""Conversions between Flower records and the numpy arrays the routing maths uses."""

from __future__ import annotations

from typing import Mapping, Sequence

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


def unpack_cluster_models(packed: ArrayRecord, num_clusters: int) -> list[dict[str, NDArray]]:
    """Inverse of :func:`pack_cluster_models`."""
    models: list[dict[str, NDArray]] = [{} for _ in range(num_clusters)]
    for key, array in packed.items():
        prefix, _, name = key.partition("/")
        if not prefix.startswith(protocol.CLUSTER_PREFIX) or not name:
            raise ValueError(f"packed cluster-model key {key!r} is not 'cluster-<k>/<name>'")
        cluster = int(prefix[len(protocol.CLUSTER_PREFIX):])
        if not 0 <= cluster < num_clusters:
            raise ValueError(f"packed key {key!r} names cluster {cluster}; allowed: 0..{num_clusters - 1}")
        models[cluster][name] = array.numpy()
    if any(not model for model in models):
        raise ValueError(f"packed record does not hold all {num_clusters} cluster models")
    return models
