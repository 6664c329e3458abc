"""Which torch device a client computes on (run-config ``client-device``).

``auto``
    ``cuda`` when torch sees a GPU (``torch.cuda.is_available()``), else ``cpu``.
``cpu``
    The CPU.
``cuda`` / ``cuda:N``
    The (N-th) GPU; fails early, naming the key, when torch sees none (or fewer
    than ``N + 1``).

:func:`check_device_name` validates the text without torch (the ServerApp checks
the run config before round 1); :func:`resolve_device` picks the device where
the client runs.  In a Flower simulation each client needs GPU resources from
Ray to see a GPU: ``fedroute flower --num-gpus 0.25`` (four clients per GPU).
"""

from __future__ import annotations

import re
from typing import Any

from fedroute.core.validation import invalid

__all__ = ["DEVICE_CHOICES", "check_device_name", "resolve_device"]

DEVICE_CHOICES = ("auto", "cpu", "cuda", "cuda:N")
"""Allowed forms of run-config ``client-device``."""

_CUDA = re.compile(r"^cuda(?::(\d+))?$")


def check_device_name(name: Any) -> str:
    """``name`` if it is one of :data:`DEVICE_CHOICES` (``N`` an integer ≥ 0).

    Raises
    ------
    ValueError
        Naming run-config ``client-device`` and the allowed values.
    """
    text = str(name).strip().lower()
    if text in ("auto", "cpu") or _CUDA.match(text):
        return text
    raise invalid("run-config 'client-device'", name, "'auto', 'cpu', 'cuda' or 'cuda:N' (N = the GPU's index, e.g. "
                  "'cuda:0')")


def resolve_device(name: Any = "auto") -> Any:
    """The ``torch.device`` run-config ``client-device = name`` asks for, on this machine.

    Raises
    ------
    ValueError
        ``cuda``/``cuda:N`` while torch sees no GPU or fewer than ``N + 1`` (the message says how to get one
        in a Flower simulation and that ``cpu``/``auto`` work without).
    """
    import torch

    text = check_device_name(name)
    if text == "cpu":
        return torch.device("cpu")
    available = torch.cuda.is_available()
    if text == "auto":
        return torch.device("cuda" if available else "cpu")
    match = _CUDA.match(text)
    index = int(match.group(1)) if match and match.group(1) is not None else 0
    count = torch.cuda.device_count() if available else 0
    if index >= count:
        raise ValueError(f"run-config 'client-device' = {name!r}, but torch sees {count} GPU(s) here"
                         f"{' (torch.cuda.is_available() is False)' if not available else ''}; use 'auto' or 'cpu', "
                         "install a CUDA build of torch, or in a Flower simulation give each client a GPU share "
                         "(fedroute flower --num-gpus 0.5)")
    return torch.device(text)
