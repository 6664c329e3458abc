"""``flwr build`` of the repository: the FAB a deployment runs; and the app's files staged where ``flwr run`` reads
them quickly.

``flwr run APP`` builds the FAB from ``APP`` on every run, and Flower 1.42 lists every file under ``APP`` before
it applies the app's ``.gitignore`` (``flwr.cli.utils.collect_files``): a virtualenv inside the checkout (the
README's ``.venv``, CI's ``.venv-ci``; ≈ 50,000 files) costs 3–7 s per run.  :func:`staged_app` copies the
files Flower keeps into a directory of their own, once per session; the FAB built from it is the repository's,
byte for byte (checked where it is made).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path


def built_fab(repository: Path, directory: Path) -> Path:
    """``flwr build --app repository`` into ``directory``; the ``.fab`` file made."""
    directory.mkdir(parents=True, exist_ok=True)
    flwr = Path(sys.executable).parent / "flwr"
    completed = subprocess.run([str(flwr), "build", "--app", str(repository)], cwd=directory, capture_output=True,
                               text=True, timeout=120, env={**os.environ, "FLWR_HOME": str(directory / "home")})
    assert completed.returncode == 0, completed.stdout + completed.stderr
    (fab,) = directory.glob("*.fab")
    return fab


def app_files(app_dir: Path) -> list[str]:
    """The relative paths of the files Flower's builder keeps from ``app_dir`` (its publish rules and the
    app's ``.gitignore``), found without entering ``.git`` or a directory the ``.gitignore`` ignores."""
    from flwr.cli.utils import build_pathspec, filter_paths_for_publish, load_gitignore_patterns

    with warnings.catch_warnings():  # pathspec deprecates the "gitwildmatch" patterns Flower 1.42 builds
        warnings.simplefilter("ignore", DeprecationWarning)
        ignored = build_pathspec([".git/", *load_gitignore_patterns(app_dir / ".gitignore")])
        files: dict[str, Path] = {}
        for directory, subdirectories, names in os.walk(app_dir):
            relative = Path(directory).relative_to(app_dir)
            subdirectories[:] = [name for name in subdirectories
                                 if not ignored.match_file(f"{(relative / name).as_posix()}/")]
            for name in names:
                path = Path(directory) / name
                if not path.is_symlink():  # Flower skips symbolic links too
                    files[(relative / name).as_posix()] = path
        return sorted(filter_paths_for_publish(files))


def staged_app(app_dir: Path, destination: Path) -> Path:
    """A copy of the Flower app ``app_dir`` in ``destination`` holding only the files Flower's builder keeps.

    Parameters
    ----------
    app_dir : Path
        The Flower app (a directory with ``pyproject.toml``).
    destination : Path
        Where the copy goes (created; must not exist yet).

    Returns
    -------
    Path
        ``destination``.
    """
    for relative in app_files(app_dir):
        target = destination / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(app_dir / relative, target)
    return destination


def fab_bytes(app_dir: Path) -> bytes:
    """The FAB ``flwr run app_dir`` builds (Flower's own builder, in this process)."""
    from flwr.cli.build import build_fab_from_disk

    with warnings.catch_warnings():  # as in app_files
        warnings.simplefilter("ignore", DeprecationWarning)
        return build_fab_from_disk(app_dir)
