#!/usr/bin/env python3
"""Print the app's dependencies for the SuperExec image: ``[project].dependencies`` without Flower.

    python3 docker/requirements.py pyproject.toml > requirements.txt

The image keeps its own Flower (flwr/superexec); fedroute itself is not installed:
every run brings the app's code in its FAB (fedroute_app.py).  Standard library only.
"""

from __future__ import annotations

import re
import sys
import tomllib


def app_requirements(pyproject: str) -> list[str]:
    """The ``[project].dependencies`` of ``pyproject`` whose distribution is not ``flwr``."""
    with open(pyproject, "rb") as stream:
        dependencies = tomllib.load(stream)["project"]["dependencies"]
    return [dependency for dependency in dependencies
            if re.split(r"[\s\[<>=!~;@]", dependency, maxsplit=1)[0].lower() != "flwr"]


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    print("\n".join(app_requirements(sys.argv[1])))
