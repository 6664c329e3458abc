"""The one form of a setting's error: ``<field> = <value> is invalid; allowed: <allowed>``.

Every check of a setting (run-config keys, routing settings, task settings) raises
the error :func:`invalid` builds, so a message always names the setting, shows the
value it got and says what it takes.
"""

from __future__ import annotations

from typing import Any, Optional

__all__ = ["invalid", "shown"]


def shown(value: Any, limit: Optional[int] = None) -> str:
    """``repr(value)`` for an error message, cut after ``limit`` characters (``None``: whole)."""
    text = repr(value)
    return text if limit is None or len(text) <= limit else f"{text[:limit]}..."


def invalid(field: str, value: Any, allowed: str, fix: Optional[str] = None, *,
            limit: Optional[int] = None) -> ValueError:
    """The error for a setting that got a value it does not take (raise it).

    Parameters
    ----------
    field : str
        What the setting is called where the user set it, e.g. ``"run-config 'seed'"``
        or ``"routing setting 'block_length'"``.
    value : object
        The value it got (shown with ``repr``).
    allowed : str
        What it takes, e.g. ``"an integer in [0, 10]"``.
    fix : str, optional
        A hint appended after ``"; "`` (an example of a valid setting, say).
    limit : int, optional
        Cut the shown value after this many characters (long text from a config file).

    Returns
    -------
    ValueError
        ``"<field> = <value> is invalid; allowed: <allowed>[; <fix>]"``.
    """
    message = f"{field} = {shown(value, limit)} is invalid; allowed: {allowed}"
    return ValueError(message if fix is None else f"{message}; {fix}")
