"""Shared fixtures: hermetic Flower runs of the real app (Ray simulation)."""

from __future__ import annotations

from pathlib import Path

import pytest

REPOSITORY = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def repository() -> Path:
    """The repository root (the Flower app)."""
    return REPOSITORY


@pytest.fixture()
def test_app(repository: Path, tmp_path: Path):
    """``make(name)``: a Flower app in ``tmp_path/name`` whose ClientApp is ``tests/apps/<name>/<name>_client.py``
    and whose ServerApp and run config are fedroute's."""
    import json
    import shutil
    import tomllib

    def make(name: str) -> Path:
        app_dir = tmp_path / name
        app_dir.mkdir()
        shutil.copy(repository / "tests" / "apps" / name / f"{name}_client.py", app_dir)
        with open(repository / "pyproject.toml", "rb") as stream:
            defaults = tomllib.load(stream)["tool"]["flwr"]["app"]["config"]
        config_lines = "\n".join(f"{key} = {json.dumps(value)}" for key, value in defaults.items())
        (app_dir / "pyproject.toml").write_text(
            '[build-system]\nrequires = ["setuptools>=61"]\nbuild-backend = "setuptools.build_meta"\n\n'
            f'[project]\nname = "{name}"\nversion = "0.1.0"\ndependencies = []\n\n'
            '[tool.flwr.app]\npublisher = "fedroute-tests"\n\n'
            '[tool.flwr.app.components]\nserverapp = "fedroute.server.app:app"\n'
            f'clientapp = "{name}_client:app"\n\n'
            f"[tool.flwr.app.config]\n{config_lines}\n"
        )
        return app_dir

    return make
