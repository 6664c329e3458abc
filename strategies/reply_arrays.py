"""Checks of a reply's model records: array names, declared shapes, dtypes and payload sizes, finite values.

Arrays are checked against the template by their declared shape, dtype and payload size *before*
they are decoded, and decoded in place (:func:`~fedroute.strategies.records.decode_array`); Flower's
``Array`` is only duck-typed (``dtype``/``shape``/``data``).
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
from numpy.typing import NDArray

from fedroute.strategies.records import NPY_HEADER_LIMIT, decode_array
from fedroute.strategies.reply_fields import required_record
from fedroute.strategies.reply_text import ReplyRejected, describe, names_text, printable, shape_text

__all__ = ["validate_model_record", "decoded_checked"]

def shape_mismatch(key: str, name: str, shape: Any, dtype: Any, expected: NDArray) -> ReplyRejected:
    return ReplyRejected(f"{key} array '{name}' has shape {shape_text(shape)} and dtype {printable(dtype, 40)}; "
                         f"expected {expected.shape} and {expected.dtype}")


def decoded_checked(key: str, name: str, array: Any, expected: NDArray) -> NDArray:
    """One array of a reply, checked against ``expected`` before and after decoding.

    The declared shape and dtype (fields of Flower's ``Array``) and the payload
    size are checked first, so an oversized or mislabelled payload is refused
    without being decoded; then the values are read in place.
    """
    try:
        shape, dtype, data = tuple(array.shape), str(array.dtype), array.data
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError
    except Exception as error:  # not an Array (e.g. a number from a MetricRecord)
        raise ReplyRejected(f"{key} array '{name}' cannot be decoded: it is {describe(array)}") from error
    if shape != expected.shape or dtype != str(expected.dtype):
        raise shape_mismatch(key, name, shape, dtype, expected)
    if not expected.nbytes <= len(data) <= expected.nbytes + NPY_HEADER_LIMIT:
        raise ReplyRejected(f"{key} array '{name}' has a payload of {len(data)} bytes; "
                            f"expected {expected.nbytes} bytes of values plus a header")
    try:
        values = decode_array(array)
    except Exception as error:  # a corrupt or pickled payload must not crash the server
        raise ReplyRejected(f"{key} array '{name}' cannot be decoded ({type(error).__name__})") from error
    if values.shape != expected.shape or values.dtype != expected.dtype:  # the payload may contradict its fields
        raise shape_mismatch(key, name, values.shape, values.dtype, expected)
    return values


def validate_model_record(content: Mapping[str, Any], key: str, template: Mapping[str, NDArray]) -> dict[str, NDArray]:
    """The arrays of ArrayRecord ``key``: same names, shapes and dtypes as ``template``, all finite.

    The returned arrays may be read-only views of the reply's payload.
    """
    record = required_record(content, key, "ArrayRecord")
    try:
        items = list(record.items())
    except AttributeError as error:
        raise ReplyRejected(f"'{key}' is not an ArrayRecord") from error
    names = [name for name, _ in items]
    if names != list(template):
        raise ReplyRejected(f"{key} arrays {names_text(names)} ({len(names)}) differ from {list(template)}")
    model = {}
    for name, array in items:
        values = decoded_checked(key, name, array, template[name])
        if not np.all(np.isfinite(values)):
            raise ReplyRejected(f"{key} array '{name}' has NaN or Inf entries")
        model[name] = values
    return model
