"""The influence bounds where they bind: the Flower strategies (in process) ≡ the batched simulator.

One client of eight claims 100 × its samples (:mod:`support.claims`, in every reply and in the
simulator's task), so the 4 × lower-median weight cap binds in every round in which it plays,
in the cluster averages, the masses (and synchronized entry's provisional masses) and FedCAM's
global part; a separate configuration also bounds the update norm so tightly that it binds.
For every method the strategy's models after every round equal the simulator's within
``1e-12``, and the bounds matter: the same simulation without them (the uncapped hard update)
gives other models.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from flwr.app import MessageType

from fedroute.client import app as client_app
from fedroute.core.influence import InfluenceBounds
from fedroute.core.methods import EXP3, FEDCAM, GREEDY, SYNC_ENTRY
from fedroute.core.participation import Participation
from fedroute.server.app import make_strategy, run_method
from fedroute.server.run_config import RunSettings, parse_run_config
from fedroute.simulation.fedcam import simulate_fedcam_batch
from fedroute.simulation.simulator import simulate
from support.app_config import app_run_config
from support.claims import ClaimingTask, claiming_handlers
from support.grid import InProcessGrid

pytestmark = pytest.mark.usefixtures("task_identity")

NUM_CLIENTS, NUM_ROUNDS, CLAIMANT, FACTOR = 8, 12, 0, 100
ATOL = 1e-12
UPDATE_NORM = 0.05
"""Small against the linear task's local steps (a round moves a model by ≈ 0.1–1 at the start)."""
CONFIGS = {"cap": {}, "cap-and-norm": {"max-update-norm": UPDATE_NORM}}
METHODS = (GREEDY, EXP3, SYNC_ENTRY, FEDCAM)


def _settings(method: str, config: str) -> tuple[dict[str, Any], RunSettings]:
    run_config = app_run_config({"num-clients": NUM_CLIENTS, "num-server-rounds": NUM_ROUNDS, "seed": 3,
                                 "method": method, "entry-threshold": 0.77, **CONFIGS[config]})
    return run_config, parse_run_config(run_config)


def _flower_models(run_config: dict[str, Any], settings: RunSettings, method: str, directory: Path
                   ) -> tuple[np.ndarray, Any]:
    """``W^0 … W^T`` of the strategy run in this process on the built-in ClientApp, and the strategy."""
    handlers = {MessageType.TRAIN: client_app.train, MessageType.QUERY: client_app.provisional,
                MessageType.EVALUATE: client_app.evaluate}
    grid = InProcessGrid(claiming_handlers(handlers, {CLAIMANT: FACTOR}), NUM_CLIENTS, run_config)
    strategy = make_strategy(settings, method, directory)
    kept: dict[int, list[np.ndarray]] = {}
    run_method(grid, settings, method, strategy, kept)
    assert not strategy.rejected
    return np.stack([np.stack(kept[t]) for t in range(NUM_ROUNDS + 1)]), strategy


def _simulated(settings: RunSettings, method: str, influence: InfluenceBounds) -> Any:
    """The simulator's history on the claiming task under ``influence`` (FedCAM: its own simulator)."""
    task = ClaimingTask(settings.task, {CLAIMANT: FACTOR})
    if method == FEDCAM:
        batch = simulate_fedcam_batch([task], settings.routing[method], NUM_ROUNDS, [settings.seed],
                                      influence=influence)
        return batch.cluster_models[:, 0], batch.masses[:, 0]
    history = simulate(task, settings.routing[method], NUM_ROUNDS, settings.seed, influence=influence,
                       participation=Participation(settings.fraction_train, settings.min_train_nodes,
                                                   settings.report_memory))
    return history.cluster_models, history.masses


def test_the_claimant_is_capped_in_both_runtimes() -> None:
    """The configuration does what the module claims: the claim exceeds the cap (4 × the median)."""
    _, settings = _settings(GREEDY, "cap")
    claims = ClaimingTask(settings.task, {CLAIMANT: FACTOR}).clients(np.arange(NUM_CLIENTS)).num_examples
    assert claims[CLAIMANT] > settings.influence.max_weight_ratio * np.median(claims)
    assert settings.influence.max_weight_ratio == 4.0 and settings.influence.max_update_norm is None


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("method", METHODS)
def test_flower_equals_the_simulator_where_the_bounds_bind(method: str, config: str, tmp_path: Path) -> None:
    run_config, settings = _settings(method, config)
    flower, strategy = _flower_models(run_config, settings, method, tmp_path)
    models, masses = _simulated(settings, method, settings.influence)
    assert flower.shape == models.shape
    for t in range(NUM_ROUNDS + 1):
        np.testing.assert_allclose(flower[t], models[t], rtol=0, atol=ATOL, err_msg=f"{method}, W^{t}")
    flower_masses = np.array([[row[f"mass_{k}"] for k in range(masses.shape[1])] for row in strategy.history])
    np.testing.assert_allclose(flower_masses, masses, rtol=0, atol=ATOL, err_msg=method)
    # The bounds bind: without them (the uncapped hard update) the same run gives other models.
    unbounded = replace(settings.influence, max_weight_ratio=math.inf, max_update_norm=None)
    uncapped, uncapped_masses = _simulated(settings, method, unbounded)
    assert np.abs(uncapped[1:] - models[1:]).max() > 1e-6, f"{method}: the bounds did not bind"
    assert np.abs(uncapped_masses - masses).max() > 1e-6, f"{method}: the cap did not bind in the masses"
    if config == "cap-and-norm":  # the norm bound binds on its own, besides the cap
        capped_only, _ = _simulated(settings, method, replace(settings.influence, max_update_norm=None))
        assert np.abs(capped_only[1:] - models[1:]).max() > 1e-6, f"{method}: the update norm did not bind"
