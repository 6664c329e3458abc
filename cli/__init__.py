"""The ``fedroute`` command line: one module per sub-command group (``fedroute COMMAND --help``).

:func:`main` is the ``fedroute`` console script (and ``python -m fedroute``); :func:`build_parser` builds
its parser, :data:`DESCRIPTION` lists the commands.  Importing this package is light: a command imports
what it runs (Flower, the deployment tooling, the simulator) only when it runs.
"""

from __future__ import annotations

from fedroute.cli.parser import DESCRIPTION, build_parser, main, version_text

__all__ = ["main", "build_parser", "version_text", "DESCRIPTION"]
