"""Reply checks in bounded words: how a client-supplied value is named in a rejection reason.

A reason names the field and says what is wrong with it in bounded words: the type, shape or length
of a bad value, never the value itself (a reply may hold a list of millions of numbers or text meant
for a terminal).  :class:`ReplyRejected` is the error every check raises
(:mod:`~fedroute.strategies.validation`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["ReplyRejected", "TEXT_LIMIT", "printable", "describe", "shape_text", "names_text"]

TEXT_LIMIT = 200
"""Characters of client-supplied text (error reasons, record names) kept in a reason."""


class ReplyRejected(ValueError):
    """A reply failed validation; the message says which field and why."""


def printable(text: Any, limit: int = TEXT_LIMIT) -> str:
    """``text`` safe for a log line: control and non-ASCII characters escaped, at most ``limit`` characters.

    A longer text is cut and its length noted (``...(N characters)``).
    """
    text = text if isinstance(text, str) else str(text)
    escaped = text[:limit].encode("unicode_escape", errors="backslashreplace").decode("ascii")
    if len(text) <= limit and len(escaped) <= limit:
        return escaped
    return f"{escaped[:limit]}...({len(text)} characters)"


def describe(value: Any) -> str:
    """What ``value`` is, in bounded words (its type and size, never its content)."""
    if value is None:
        return "nothing"
    if isinstance(value, (list, tuple)):
        return f"a {type(value).__name__} of {len(value)} items"
    if isinstance(value, (str, bytes)):
        return f"a {type(value).__name__} of length {len(value)}"
    if isinstance(value, np.ndarray):
        return f"an array of shape {shape_text(value.shape)}"
    if isinstance(value, (bool, np.bool_)):
        return "a bool"
    if isinstance(value, (int, np.integer)):
        return "an int" if -2**63 <= value < 2**64 else "an int beyond 64 bits"
    if isinstance(value, (float, np.floating)):
        return "a float" if math.isfinite(value) else "a non-finite float"
    return f"a {printable(type(value).__name__, 40)}"


def shape_text(shape: Any) -> str:
    """A declared shape in bounded words."""
    try:
        dims = tuple(shape)
    except TypeError:
        return describe(shape)
    if len(dims) > 8:
        return f"<{len(dims)} dimensions>"
    return printable(str(dims), 80)


def names_text(names: Any, limit: int = 160) -> str:
    """Record or array names (client-supplied) in bounded words: escaped, at most ``limit`` characters."""
    names = list(names)
    text = "[" + ", ".join(repr(printable(name, 40)) for name in names[:5]) + (", ..." if len(names) > 5 else "") + "]"
    return text if len(text) <= limit else f"{text[:limit]}...]"
