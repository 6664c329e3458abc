"""Run-config keys derived from settings dataclasses: field ``a_b`` ↔ key ``a-b``."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import fields

__all__ = ["config_key", "dashed_keys"]


def config_key(field_name: str) -> str:
    """The run-config key of a settings field: its name with dashes (``block_length`` → ``block-length``)."""
    return field_name.replace("_", "-")


def dashed_keys(settings: type, exclude: Collection[str] = ()) -> dict[str, str]:
    """Run-config key → field name, for every field of the dataclass ``settings`` not in ``exclude``.

    Parameters
    ----------
    settings : type
        A dataclass (an instance works too).
    exclude : collection of str
        Field names that are no run-config keys.

    Returns
    -------
    dict
        ``{config_key(name): name}`` in the order of the fields.
    """
    names = [field.name for field in fields(settings)]
    unknown = set(exclude) - set(names)
    if unknown:
        raise ValueError(f"{settings.__name__} has no fields {sorted(unknown)} to exclude")
    return {config_key(name): name for name in names if name not in exclude}
