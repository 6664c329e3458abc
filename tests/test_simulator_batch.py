"""A batch of runs gives exactly what each run gives alone; sweeps do not depend on workers."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from fedroute.simulation.simulator import simulate, simulate_batch
from fedroute.simulation.sweep import SweepSpec, chunked, run_sweep
from fedroute.core.methods import method_settings
from fedroute.tasks.linear import LinearTask


@pytest.mark.parametrize("method", ["greedy", "exp3", "sync-entry"])
def test_batch_equals_single_runs(method: str) -> None:
    settings = method_settings(method, preset="linear", entry_threshold=1.0, hysteresis_min_rounds=3)
    tasks = [LinearTask(num_clients=10, init=init, init_spread=rho, seed=seed)
             for init, rho, seed in [("spread", 0.5, 0), ("collapsed", 3.0, 1), ("spread", 4.0, 2)]]
    batch = simulate_batch(tasks, settings, 40, [5, 6, 7])
    for index, task in enumerate(tasks):
        single = simulate(task, settings, 40, 5 + index)
        np.testing.assert_array_equal(batch.routes[:, index], single.routes)
        np.testing.assert_allclose(batch.cluster_models[:, index], single.cluster_models, atol=1e-12, rtol=0)
        np.testing.assert_allclose(batch.masses[:, index], single.masses, atol=1e-15)


def _task(cell: dict) -> LinearTask:
    return LinearTask(num_clients=8, init="spread", init_spread=cell["rho"], seed=cell["seed"])


def _reduce(history, tasks, cells) -> pd.DataFrame:
    return pd.DataFrame({"rho": [c["rho"] for c in cells], "seed": [c["seed"] for c in cells],
                         "final_norm": np.linalg.norm(history.cluster_models[-1], axis=(1, 2)),
                         "routed_to_1": history.route_counts[..., 1].sum(axis=0)})


def test_sweep_rows_do_not_depend_on_chunking() -> None:
    cells = [{"rho": rho, "seed": seed} for rho in (0.5, 2.0) for seed in range(5)]
    spec = SweepSpec("exp3", method_settings("exp3", preset="linear"), 20, _task, _reduce)
    whole = run_sweep([spec], cells, chunk_size=100, progress=False)
    pieces = run_sweep([spec], cells, chunk_size=3, progress=False)
    pd.testing.assert_frame_equal(whole, pieces)
    assert list(whole.columns[:3]) == ["method", "rho", "seed"] and len(whole) == len(cells)
    assert [len(chunk) for chunk in chunked(cells, 4)] == [4, 4, 2]


def test_model_rounds_keep_only_the_asked_states() -> None:
    task = LinearTask(num_clients=6, init="spread", seed=1)
    settings = method_settings("exp3", preset="linear")
    full = simulate_batch([task], settings, 12, [1])
    sparse = simulate_batch([task], settings, 12, [1], model_rounds=[0, 11, 12])
    np.testing.assert_array_equal(sparse.cluster_models, full.cluster_models[[0, 11, 12]])
    np.testing.assert_array_equal(sparse.routes, full.routes)
    with pytest.raises(ValueError, match="model_rounds"):
        simulate_batch([task], settings, 12, [1], model_rounds=[13])
