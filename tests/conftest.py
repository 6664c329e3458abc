"""Shared fixtures: hermetic Flower runs of the real app (Ray simulation)."""

from __future__ import annotations

from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def repository() -> Path:
    """The repository root (the Flower app)."""
    return REPOSITORY
