"""Conversions between Flower records and the numpy arrays the routing maths uses."""

from __future__ import annotations

import math
from functools import lru_cache
from io import BytesIO
from typing import Mapping, Optional, Sequence

import numpy as np
from flwr.app import Array, ArrayRecord
from flwr.common.constant import SType
from numpy.typing import NDArray

from fedroute import protocol

__all__ = ["pack_cluster_models", "pack_cluster_records", "unpack_cluster_models", "arrays_of", "array_record",
           "decode_array", "encode_array", "encodes", "kept_records", "initial_models", "NPY_HEADER_LIMIT"]

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
        count = int(math.prod(array.shape))
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


_PLAIN_KINDS = frozenset("biufc")
"""dtype kinds whose ``.npy`` payload is the values' bytes (booleans, integers, floats, complex numbers)."""


@lru_cache(maxsize=256)
def _npy_header(dtype: str, shape: tuple[int, ...]) -> bytes:
    """The header ``np.save`` writes before the values of a C-ordered array of ``dtype`` (``dtype.str``) and
    ``shape``: the same for every array of that layout, so made once."""
    zeros = np.zeros(shape, dtype=dtype)
    buffer = BytesIO()
    np.save(buffer, zeros, allow_pickle=False)
    data = buffer.getvalue()
    return data[:len(data) - zeros.nbytes]


@lru_cache(maxsize=256)
def _dtype_name(dtype: np.dtype) -> str:
    """``str(dtype)``, the ``Array``'s ``dtype`` field (numpy computes it in Python on every call)."""
    return str(dtype)


def _plain(value: NDArray) -> Optional[tuple[NDArray, tuple[int, ...], bytes]]:
    """``value`` C-ordered, its shape and its ``.npy`` header — or ``None`` if its dtype is not plain
    numeric (its payload is then not just the values' bytes)."""
    value = np.ascontiguousarray(value)
    if value.dtype.kind not in _PLAIN_KINDS:
        return None
    shape = tuple(int(size) for size in value.shape)
    return value, shape, _npy_header(value.dtype.str, shape)


def encode_array(value: NDArray) -> Array:
    """``Array(np.ascontiguousarray(value))`` — the same fields and bytes — without ``np.save`` per array.

    Flower's ``Array(ndarray)`` writes the ``.npy`` file into a buffer and builds the ``Array``
    twice; for a plain numeric dtype the payload is the (cached) header followed by the values'
    bytes, so it is assembled directly.  Other dtypes take Flower's constructor.
    """
    if (plain := _plain(value)) is None:
        return Array(np.ascontiguousarray(value))
    value, shape, header = plain
    return Array(dtype=_dtype_name(value.dtype), shape=shape, stype=SType.NUMPY, data=header + value.tobytes())


def array_record(arrays: Mapping[str, NDArray]) -> ArrayRecord:
    """An ArrayRecord holding the given named numpy arrays (:func:`encode_array`)."""
    return ArrayRecord({name: encode_array(value) for name, value in arrays.items()})


def encodes(record: ArrayRecord, arrays: Mapping[str, NDArray]) -> bool:
    """Whether ``record`` holds exactly what :func:`array_record` makes of ``arrays``: the same names,
    dtypes, shapes and payload bytes (``-0.0`` and ``0.0`` differ here; dtypes other than plain
    numeric ones never match)."""
    if list(record.keys()) != list(arrays):
        return False
    for name, array in record.items():
        if (plain := _plain(arrays[name])) is None:
            return False
        value, shape, header = plain
        data = array.data
        if array.stype != SType.NUMPY or array.dtype != _dtype_name(value.dtype) or tuple(array.shape) != shape \
                or len(data) != len(header) + value.nbytes or not data.startswith(header):
            return False
        payload = np.frombuffer(data, dtype=np.uint8, count=value.nbytes, offset=len(header))
        if not np.array_equal(payload, value.reshape(-1).view(np.uint8)):  # bytes, in place: no copy of the model
            return False
    return True


def kept_records(records: Optional[Sequence[Optional[ArrayRecord]]],
                 models: Sequence[Mapping[str, NDArray]]) -> Optional[list[Optional[ArrayRecord]]]:
    """Of the records of the previous models (``None`` where none was made), those that still encode
    ``models``, model by model (:func:`encodes`), ``None`` for the others; ``None`` for all when nothing
    was encoded or the number of models differs."""
    if records is None or len(records) != len(models):
        return None
    return [record if record is not None and encodes(record, model) else None
            for record, model in zip(records, models)]


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
