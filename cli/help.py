"""Help texts of the ``fedroute`` commands: descriptions as written, defaults shown, no markup."""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ["HelpFormatter", "wrapped", "add_command"]


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Descriptions as written (:func:`wrapped`), an option's default shown where it has a value."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.default not in (None, False, [], argparse.SUPPRESS) and action.option_strings \
                and "default" not in text:
            text += " (default: %(default)s)"
        return text


def wrapped(text: str, width: int = 79) -> str:
    """``text`` with its prose lines filled to ``width``; indented lines (examples) kept as they are."""
    import textwrap

    return "\n".join(line if line.startswith(" ") or not line else textwrap.fill(line, width)
                     for line in text.splitlines())


def add_command(commands: Any, name: str, summary: str, description: str = "") -> argparse.ArgumentParser:
    """A sub-command whose ``--help`` opens with ``summary`` (and ``description``)."""
    return commands.add_parser(name, help=summary, description=wrapped(f"{summary}.\n\n{description}".strip()),
                               formatter_class=HelpFormatter)
