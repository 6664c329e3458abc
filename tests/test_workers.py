"""Where chunks run: the local process pool gives the in-process tables; ``--workers`` is checked early."""

from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pytest

from fedroute import cli
from fedroute.simulation.experiments.kit import Sweep
from fedroute.simulation.sweep import SweepSpec, run_sweep, run_sweeps
from fedroute.simulation.workers import AUTO, ChunkRunner, resolve_workers, usable_cpus
from fedroute.core.methods import method_settings
from fedroute.tasks.linear import LinearTask


def _task(cell: dict) -> LinearTask:
    return LinearTask(num_clients=8, init="spread", init_spread=cell["rho"], seed=cell["seed"])


def _reduce(history, tasks, cells) -> pd.DataFrame:
    return pd.DataFrame({"rho": [c["rho"] for c in cells], "seed": [c["seed"] for c in cells], "pid": os.getpid(),
                         "final_norm": np.linalg.norm(history.cluster_models[-1], axis=(1, 2)),
                         "routed_to_1": history.route_counts[..., 1].sum(axis=0)})


def _failing_task(cell: dict) -> LinearTask:
    raise ValueError(f"cell {cell} is broken")


CELLS = [{"rho": rho, "seed": seed} for rho in (0.5, 2.0, 8.0) for seed in range(4)]


def _sweeps() -> list:
    greedy = SweepSpec("greedy", method_settings("greedy", preset="linear"), 15, _task, _reduce)
    exp3 = SweepSpec("exp3", method_settings("exp3", preset="linear"), 25, _task, _reduce)
    return [([greedy], CELLS, 5), ([exp3, greedy], CELLS[:7], 2)]


def test_a_process_pool_gives_the_in_process_tables_in_order() -> None:
    """Several sweeps share one queue (chunks of unequal size, finishing out of order): every sweep's table equals
    its in-process table, row for row; the chunks really ran in other processes; seconds add up per method."""
    alone = [run_sweep(specs, cells, chunk_size, progress=False) for specs, cells, chunk_size in _sweeps()]
    seconds: dict[str, float] = {}
    with ChunkRunner(workers=2) as runner:
        assert runner.parallel and runner.kind == "processes"
        pooled = run_sweeps(_sweeps(), progress=False, runner=runner, seconds=seconds)
        again = Sweep(runner=runner).many(_sweeps())  # the same warm pool serves another call
    for table, reference in zip(pooled, alone):
        assert set(table["pid"]) and os.getpid() not in set(table["pid"])
        pd.testing.assert_frame_equal(table.drop(columns="pid"), reference.drop(columns="pid"), check_exact=True)
    for table, reference in zip(again, pooled):
        pd.testing.assert_frame_equal(table.drop(columns="pid"), reference.drop(columns="pid"), check_exact=True)
    assert set(seconds) == {"greedy", "exp3"} and all(value > 0 for value in seconds.values())
    assert list(pooled[1]["method"]) == ["exp3"] * 7 + ["greedy"] * 7


def test_in_process_runner_starts_nothing_and_a_closed_runner_refuses() -> None:
    runner = ChunkRunner(workers=1)
    assert not runner.parallel and runner.kind == "in-process"
    with pytest.raises(RuntimeError, match="open"):
        list(runner.run(max, [(1, 2)]))
    with runner:
        assert list(runner.run(max, [(1, 2), (5, 3)], order=[1, 0])) == [(1, 5), (0, 2)]


def test_a_failing_chunk_raises_its_error_in_the_caller() -> None:
    spec = SweepSpec("greedy", method_settings("greedy", preset="linear"), 5, _failing_task, _reduce)
    with pytest.raises(ValueError, match="is broken"):
        run_sweep([spec], CELLS[:4], chunk_size=2, workers=2, progress=False)


@pytest.mark.parametrize("value, quick, expected", [(AUTO, False, usable_cpus()), (AUTO, True, 1), (None, False, usable_cpus()),
                                                    ("3", False, 3), (1, True, 1), (4, True, 4)])
def test_resolve_workers(value, quick, expected) -> None:
    assert resolve_workers(value, quick) == expected


def test_auto_is_one_process_where_a_pool_does_not_pay() -> None:
    assert resolve_workers(AUTO, pool_pays=False) == 1 and resolve_workers("3", pool_pays=False) == 3
    assert resolve_workers(AUTO, quick=False, pool_pays=True) == usable_cpus()


@pytest.mark.parametrize("value", [0, -2, "0", "two", "2.5", 2.5, True, ""])
def test_bad_workers_are_rejected_naming_the_field(value) -> None:
    with pytest.raises(ValueError, match=r"workers = .* is invalid; allowed: 'auto' or an integer ≥ 1"):
        resolve_workers(value)


def test_the_cli_rejects_bad_workers_before_running_anything(tmp_path, capsys) -> None:
    assert cli.main(["reproduce", "linear", "--quick", "--out", str(tmp_path), "--workers", "0"]) == 2
    assert "--workers = '0' is invalid; allowed: 'auto' or an integer ≥ 1" in capsys.readouterr().err
    assert not any(tmp_path.iterdir())


def _die(code: int) -> None:
    os._exit(code)


def test_a_dying_worker_gives_a_clear_error() -> None:
    with ChunkRunner(workers=2) as runner, pytest.raises(RuntimeError, match="worker process of the local pool died"):
        list(runner.run(_die, [(3,)]))


def test_gmm_runs_in_one_process_by_default(tmp_path, monkeypatch) -> None:
    """``--workers auto`` gives GMM one process (its chunks share cached fits); other experiments get the CPUs;
    an explicit ``--workers`` is obeyed."""
    import fedroute.simulation.experiments.kit as kit

    seen = []

    def fake_run_experiment(experiment, config, out, workers, ray_address, progress):
        seen.append((experiment.name, workers))
        raise SystemExit(0)

    monkeypatch.setattr(kit, "run_experiment", fake_run_experiment)
    for arguments in (["gmm"], ["linear"], ["gmm", "--workers", "2"], ["linear", "--quick"]):
        with pytest.raises(SystemExit):
            cli.main(["reproduce", *arguments, "--out", str(tmp_path)])
    assert seen == [("gmm", 1), ("linear", usable_cpus()), ("gmm", 2), ("linear", 1)]
