"""The repository's Flower app: its root and its run config defaults, read once."""

from __future__ import annotations

import functools
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fedroute.server.run_config import RunSettings

REPOSITORY = Path(__file__).resolve().parents[2]
"""The repository root (the Flower app; its ``pyproject.toml`` holds ``[tool.flwr.app]``)."""


@functools.lru_cache(maxsize=1)
def _pyproject_app() -> dict[str, Any]:
    with open(REPOSITORY / "pyproject.toml", "rb") as stream:
        return tomllib.load(stream)["tool"]["flwr"]["app"]


def app_defaults() -> dict[str, Any]:
    """A fresh copy of ``[tool.flwr.app.config]``: the run config ``flwr run`` starts from."""
    return dict(_pyproject_app()["config"])


def app_components() -> dict[str, str]:
    """``[tool.flwr.app.components]``: the ServerApp and ClientApp references (``module:attribute``)."""
    return dict(_pyproject_app()["components"])


def app_run_config(overrides: Mapping[str, Any] | None = None, **changes: Any) -> dict[str, Any]:
    """The defaults with ``overrides`` and then ``changes`` (run-config keys) applied."""
    return {**app_defaults(), **(overrides or {}), **changes}


def app_settings(overrides: Mapping[str, Any] | None = None, **changes: Any) -> RunSettings:
    """The parsed run config a ``flwr run`` with these overrides gets (``parse_run_config``)."""
    from fedroute.server.run_config import parse_run_config

    return parse_run_config(app_run_config(overrides, **changes))
