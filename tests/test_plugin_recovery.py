"""Issue 10's plugin case through ``flwr run``: a user's own model recovers with default settings.

The app (``tests/apps/boundaries``) uses the public API only: a 2-16-2 torch MLP, 15
clients in 3 groups whose decision boundaries are rotated by 0/120/240°, ``K = 3``
clusters starting as identical copies of one module, ``method_settings(method,
num_clusters=3)`` without a preset.  The generic default EXP3 separates the groups
and ends within 10 % of per-group training; Greedy IFCA does not.
"""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import fedroute
from fedroute.deployment.launcher import run_flower_app

NUM_CLIENTS, NUM_GROUPS, NUM_ROUNDS = 15, 3, 40


@pytest.fixture(scope="module")
def app_dir(repository: Path) -> Path:
    return repository / "tests" / "apps" / "boundaries"


@pytest.fixture(scope="module")
def task(app_dir: Path):
    sys.path.insert(0, str(app_dir))
    try:
        from boundaries_app import task
    finally:
        sys.path.remove(str(app_dir))
    return task


def _alone_losses(task, seed: int, rounds: int) -> np.ndarray:
    """Held-out loss of one model per group trained on that group alone (FedAvg of its clients), same start."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny tensors: more threads only contend (70 s instead of 2.5 s on a busy machine)
    try:
        return _train_alone(task, seed, rounds)
    finally:
        torch.set_num_threads(threads)


def _train_alone(task, seed: int, rounds: int) -> np.ndarray:
    torch.manual_seed(seed)
    start = task.make_model().state_dict()
    data = [task.client_data(client, seed) for client in range(NUM_CLIENTS)]
    losses = []
    for group in range(NUM_GROUPS):
        members = [d for d in data if d.group == group]
        state = {name: value.clone() for name, value in start.items()}
        for _ in range(rounds):
            trained = []
            for member in members:
                model = task.make_model()
                model.load_state_dict(state)
                task.train(model, member.train, 5, 0.5)
                trained.append(model.state_dict())
            state = {name: torch.stack([t[name] for t in trained]).mean(0) for name in state}
        model = task.make_model()
        model.load_state_dict(state)
        with torch.no_grad():
            losses.append(np.mean([task.mean_loss(model, member.test) for member in members]))
    return np.array(losses)


def _outcome(evaluation: list[dict], reference: np.ndarray) -> tuple[bool, bool, list[float]]:
    """(separated, converged, ratios): each group's plurality held-out choice, and its loss there vs alone."""
    choices = {g: [int(np.argmin(r["test_losses"])) for r in evaluation if r["group"] == g] for g in range(NUM_GROUPS)}
    plurality = {g: max(set(c), key=c.count) for g, c in choices.items()}
    separated = len(set(plurality.values())) == NUM_GROUPS
    ratios = [float(np.mean([r["test_losses"][plurality[g]] for r in evaluation if r["group"] == g]) / reference[g])
              for g in range(NUM_GROUPS)]
    return separated, separated and max(ratios) <= 1.10, ratios


def test_the_app_uses_only_the_public_api(app_dir: Path) -> None:
    imported: set[str] = set()
    for path in sorted(app_dir.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("fedroute"):
                assert node.module == "fedroute", f"{path.name}: from {node.module} import …"
                imported.update(alias.name for alias in node.names)
            elif isinstance(node, ast.Import):
                assert not any(alias.name.startswith("fedroute") for alias in node.names), path.name
    assert imported == {"ClusteredRouting", "method_settings", "cluster_models_from_torch",
                        "routing_train", "routing_evaluate", "routing_query"} and imported <= set(fedroute.__all__)


@pytest.mark.process
def test_default_exp3_recovers_from_identical_copies_and_greedy_does_not(app_dir: Path, task, tmp_path: Path):
    results = tmp_path / "boundaries.json"
    run = run_flower_app(app_dir, {"results-path": str(results), "num-server-rounds": NUM_ROUNDS},
                         num_supernodes=NUM_CLIENTS, timeout=600)
    assert run.completed, f"status {run.status!r}\n{run.stdout[-4000:]}"
    summary = json.loads(results.read_text())
    reference = _alone_losses(task, 0, NUM_ROUNDS)
    for method in ("exp3", "greedy"):
        assert not summary[method]["rejected"]
        assert [row["num_replies"] for row in summary[method]["history"]] == [NUM_CLIENTS] * NUM_ROUNDS
    separated, converged, ratios = _outcome(summary["exp3"]["final_evaluation"], reference)
    assert separated and converged, f"default EXP3: separated {separated}, loss / alone {ratios}"
    history = summary["exp3"]["history"]
    assert all(row["routed_0"] * row["routed_1"] * row["routed_2"] > 0 for row in history[-5:])
    greedy_separated, greedy_converged, greedy_ratios = _outcome(summary["greedy"]["final_evaluation"], reference)
    assert not greedy_converged, f"Greedy: separated {greedy_separated}, loss / alone {greedy_ratios}"
    assert all(row["routed_2"] == 0 for row in summary["greedy"]["history"])  # a cluster never trained
    print(f"plugin recovery: {run.wall_seconds:.1f} s wall; EXP3 loss / alone {np.round(ratios, 3).tolist()}, "
          f"Greedy {np.round(greedy_ratios, 3).tolist()}")
