"""Conversions between Flower records and the numpy arrays the routing maths uses."""

from __future__ import annotations

from typing import Mapping, Optional, Sequence

import numpy as np
from flwr.app import Array, ArrayRecord
from numpy.typing import NDArray

from fedroute import protocol

__all__ = ["pack_cluster_models", "pack_cluster_records", "unpack_cluster_models", "arrays_of", "array_record",
           "decode_array", "initial_models", "NPY_HEADER_LIMIT"]

_NPY_MAGIC = b"\x93NUMPY"
NPY_HEADER_LIMIT = 4096
"""Bytes a payload may hold beyond its values (the ``.npy`` header; numpy writes 128)."""


def decode_array(array: Array) -> NDArray:
    """An ``Array``'s values without ``np.load``: a read-only view of its bytes.

    ``Array.numpy()`` parses the ``.npy`` header with ``ast.literal_eval``
    (~0.1 ms per array) and copies the payload; the dtype and shape are
    already fields of the ``Array``, so the values are read in place.
    Anything unusual (another serialisation, Fortran order, a size that does
    not match the declared shape) takes ``Array.numpy()``.  Callers that must
    bound memory check ``len(array.data)`` first (see
    :func:`fedroute.strategies.validation.validate_model_record`).
    """
    data = array.data
    try:
        dtype = np.dtype(array.dtype)
        count = int(np.prod(array.shape, dtype=np.int64))
        if array.stype != "numpy.ndarray" or data[:6] != _NPY_MAGIC or dtype.hasobject:
            raise ValueError
        length_bytes = 2 if data[6] == 1 else 4  # format version 1.0, else 2.0/3.0
        header_start = 8 + length_bytes
        offset = header_start + int.from_bytes(data[8:header_start], "little")
        if b"'fortran_order': False" not in data[header_start:offset] or \
                len(data) - offset != count * dtype.itemsize:
            raise ValueError
        return np.frombuffer(data, dtype=dtype, count=count, offset=offset).reshape(array.shape)
    except (ValueError, TypeError, IndexError):
        return array.numpy()


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
    return pack_cluster_records([array_record(arrays) for arrays in cluster_models])


def pack_cluster_records(records: Sequence[ArrayRecord]) -> ArrayRecord:
    """The packed record (as :func:`pack_cluster_models`) of ``K`` per-cluster ArrayRecords.

    The packed record holds the very ``Array`` objects of ``records``: nothing is
    encoded again.
    """
    packed = ArrayRecord()  # item by item: ArrayRecord(dict) would make new Array objects
    for cluster, record in enumerate(records):
        for name, array in record.items():
            packed[f"{protocol.cluster_key(cluster)}/{name}"] = array
    return packed


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
            raise ValueError(_unpacked_key_error(key, num_clusters))
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


def initial_models(initial_arrays: ArrayRecord | Sequence[ArrayRecord], num_clusters: int) -> list[dict[str, NDArray]]:
    """The ``K`` initial models of ``Strategy.start``: one ArrayRecord each, or all packed in one."""
    if isinstance(initial_arrays, ArrayRecord):
        return unpack_cluster_models(initial_arrays, num_clusters)
    if len(initial_arrays) != num_clusters:
        raise ValueError(f"initial_arrays holds {len(initial_arrays)} models; num_clusters = {num_clusters}")
    return [arrays_of(record) for record in initial_arrays]


def _unpacked_key_error(key: str, num_clusters: Optional[int]) -> str:
    """Why ``key`` cannot be a packed cluster-model key, and what to pass instead.

    The usual cause is one model's ``ArrayRecord`` (what ``FedAvg.start`` takes, e.g.
    ``ArrayRecord(net.state_dict())``) given where ``K`` models are expected.
    """
    k = "K" if num_clusters is None else f"K = {num_clusters}"
    return (f"packed cluster-model key {key!r} is not 'cluster-<k>/<name>': this looks like one model's "
            f"ArrayRecord (FedAvg's initial_arrays), but clustered routing needs {k} models. Pass a list of "
            "K ArrayRecords, one per cluster: fedroute.cluster_models_from_torch([Net() for _ in range(K)]) "
            "(K modules, e.g. K seeds), or cluster_models_from_torch([net] * K) to start every cluster from "
            "one model (docs/plugin.md)")
