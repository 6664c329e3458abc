"""The example app ``examples/digits_cnn``: public API only, and it runs under ``flwr run`` (Ray simulation)."""

from __future__ import annotations

import ast
import json
import math
import tomllib
from pathlib import Path

import pytest

import fedroute
from fedroute.deployment.launcher import run_flower_app

NUM_CLIENTS, NUM_ROUNDS, NUM_CLUSTERS = 12, 3, 4


@pytest.fixture(scope="module")
def example(repository: Path) -> Path:
    return repository / "examples" / "digits_cnn"


def test_example_uses_only_the_public_api(example: Path) -> None:
    with open(example / "pyproject.toml", "rb") as stream:
        app = tomllib.load(stream)["tool"]["flwr"]["app"]
    assert app["components"] == {"serverapp": "digits_app.server:app", "clientapp": "digits_app.client:app"}
    assert app["config"]["num-clusters"] == NUM_CLUSTERS and app["config"]["method"] == "exp3"
    imported: set[str] = set()
    for path in sorted(example.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    assert not alias.name.startswith("fedroute"), f"{path.name}: import {alias.name}"
            elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("fedroute"):
                assert node.module == "fedroute", f"{path.name}: from {node.module} import …"
                imported.update(alias.name for alias in node.names)
    assert imported and imported <= set(fedroute.__all__), imported
    assert {"ClusteredRouting", "routing_train", "routing_evaluate", "cluster_models_from_torch"} <= imported


@pytest.mark.process
def test_example_app_runs_in_flower_simulation(example: Path, tmp_path: Path) -> None:
    results = tmp_path / "digits.json"
    run = run_flower_app(example, {"num-server-rounds": NUM_ROUNDS, "min-nodes": NUM_CLIENTS,
                                   "results-path": str(results)}, num_supernodes=NUM_CLIENTS, timeout=300)
    assert run.completed, f"status {run.status!r}\n{run.stdout[-4000:]}"
    assert "usable models" in run.stdout
    summary = json.loads(results.read_text())
    assert summary["num_clusters"] == NUM_CLUSTERS and not summary["rejected"]
    assert [row["num_replies"] for row in summary["history"]] == [NUM_CLIENTS] * NUM_ROUNDS
    evaluation = summary["final_evaluation"]
    assert sorted(row["client_id"] for row in evaluation) == list(range(NUM_CLIENTS))
    for row in evaluation:
        assert row["group"] == row["client_id"] % 4
        for key in ("train_losses", "test_losses"):
            assert len(row[key]) == NUM_CLUSTERS and all(math.isfinite(v) and v > 0 for v in row[key])
    print(f"example app: {run.wall_seconds:.1f} s wall (Ray start-up included)")
