"""The headline result through Flower (``flwr run``, Ray simulation): from the same collapsed
start and seed, EXP3 recovers and Greedy IFCA does not.

40 clients (two groups of 20), the main job's collapsed start (both cluster models at the
pooled optimum, everyone prefers cluster 0), seed 0, ``T = 60`` rounds, EXP3 over
{Greedy, Rank Hedge} in blocks of 5 rounds.  ``T`` was chosen with the batched simulator
(same configuration): over seeds 0–29, EXP3 ends with ``R_T < 0.5`` and two usable models in
21 of 30 runs at ``T = 30``, 29 of 30 at ``T = 40`` and ``50``, and in all 30 at ``T = 60``;
for seed 0, ``R_t`` stays below 0.5 from round 36 on and ``R_60 = 0.109``.  Greedy cannot
recover from this start on any seed: cluster 1 is never routed to, so it never changes.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedroute.core.metrics import recovery_error
from fedroute.deployment.launcher import run_flower_app
from fedroute.simulation.simulator import simulate
from fedroute.simulation.summary import RECOVERY_THRESHOLD
from support.app_config import app_settings

pytestmark = pytest.mark.process  # every test here reads a `flwr run` (Ray simulation)

NUM_CLIENTS, NUM_ROUNDS = 40, 60
RUN_CONFIG = {"method": "greedy,exp3", "num-clients": NUM_CLIENTS, "num-server-rounds": NUM_ROUNDS, "seed": 0,
              "block-length": 5, "init": "collapsed"}


def test_exp3_recovers_and_greedy_does_not_on_the_same_seed(flower_app: Path, tmp_path: Path) -> None:
    result = run_flower_app(flower_app, {**RUN_CONFIG, "results-dir": str(tmp_path)}, num_supernodes=NUM_CLIENTS,
                            timeout=900)
    assert result.completed, f"status {result.status!r}\n{result.stdout[-4000:]}"
    (directory,) = [path for path in tmp_path.iterdir() if path.is_dir()]
    summary = json.loads((directory / "summary.json").read_text())
    assert list(summary) == ["greedy", "exp3"]

    exp3, greedy = summary["exp3"], summary["greedy"]
    assert exp3["recovery_error"] < RECOVERY_THRESHOLD and exp3["recovered"]
    assert exp3["usable_models_train"] == exp3["usable_models_test"] == 2
    assert exp3["assignment_accuracy_test"] == 1.0
    assert greedy["recovery_error"] >= RECOVERY_THRESHOLD and not greedy["recovered"]
    assert greedy["usable_models_train"] == greedy["usable_models_test"] == 1 and greedy["persistent_collapse"]
    for method in summary.values():
        assert method["evaluated_clients"] == NUM_CLIENTS and method["rejected_replies"] == 0

    rounds = pd.read_csv(directory / "rounds.csv")
    greedy_rounds = rounds[rounds.method == "greedy"]
    assert (greedy_rounds.routed_1 == 0).all() and not greedy_rounds.changed_1.any()  # cluster 1 starves

    # The same start and seed: both methods began from W^0 of this run config, and the
    # Flower result is the simulator's (R_T to the last bit of float64 noise).
    settings = app_settings(RUN_CONFIG)
    for method in settings.methods:
        history = simulate(settings.task, settings.routing[method], NUM_ROUNDS, settings.seed)
        expected = float(recovery_error(history.cluster_models[-1], settings.task.group_parameters))
        np.testing.assert_allclose(summary[method]["recovery_error"], expected, rtol=0, atol=1e-12, err_msg=method)
