"""The one form of a setting's error (fedroute.core.validation) and the dashed run-config keys."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from fedroute.core.config_keys import dashed_keys
from fedroute.core.validation import invalid


def test_the_error_names_the_setting_its_value_and_what_it_takes() -> None:
    error = invalid("run-config 'seed'", -1, "an integer ≥ 0")
    assert isinstance(error, ValueError) and str(error) == "run-config 'seed' = -1 is invalid; allowed: an integer ≥ 0"
    hinted = invalid("x", "a", "'b'", fix="e.g. x = 'b'")
    assert str(hinted) == "x = 'a' is invalid; allowed: 'b'; e.g. x = 'b'"


def test_a_long_value_is_cut_only_when_asked() -> None:
    long = "v" * 100
    assert str(invalid("k", long, "short", limit=10)) == "k = 'vvvvvvvvv... is invalid; allowed: short"
    assert repr(long) in str(invalid("k", long, "short"))


def test_dashed_keys_are_the_fields_with_dashes_but_the_excluded() -> None:
    @dataclass
    class Settings:
        block_length: int = 1
        name: str = "x"

    assert dashed_keys(Settings) == {"block-length": "block_length", "name": "name"}
    assert dashed_keys(Settings, exclude=("name",)) == {"block-length": "block_length"}
    with pytest.raises(ValueError, match="no fields"):
        dashed_keys(Settings, exclude=("typo",))
