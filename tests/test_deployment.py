"""Native deployment: real ``flower-superlink`` / ``flower-supernode`` processes on 127.0.0.1.

The configuration and helpers are :mod:`support.deployment`'s (3 SuperNodes, a
few rounds: deployment rounds take ≈ 9 s on 2 cores).  Lost SuperNodes and a
killed server side are in ``tests/test_faults.py``.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedroute.deployment.launcher import run_flower_app
from fedroute.deployment.local import CONNECTION, LocalFederation
from support.deployment import CONFIG, NUM_NODES, home_processes, results_dir

pytestmark = pytest.mark.process


def test_deployment_with_tls_equals_the_ray_simulation(flower_app: Path, repository_fab: Path, tmp_path: Path,
                                                       no_fedroute_bin: Path) -> None:
    """Both runtimes from an environment where `import fedroute` fails (the FAB carries the app), with
    num-clients = "auto" (the SuperNodes' num-partitions).  The two runs are independent (own FLWR_HOME, ports
    and Ray): the Ray simulation runs while the deployment, which mostly waits on Flower's polls, runs too."""
    config = {**CONFIG, "num-clients": "auto", "num-server-rounds": 3}
    logs = tmp_path / "logs"
    with ThreadPoolExecutor(max_workers=1) as background:
        simulation = background.submit(run_flower_app, flower_app, {**config, "results-dir": str(tmp_path / "sim")},
                                       num_supernodes=NUM_NODES, timeout=300, environment_bin=no_fedroute_bin)
        with LocalFederation(flower_app, NUM_NODES, tls=True, log_dir=logs,
                             environment_bin=no_fedroute_bin) as federation:
            connection = (federation.flwr_home / "config.toml").read_text()
            assert f"[superlink.{CONNECTION}]" in connection and "root-certificates" in connection
            assert "insecure" not in connection
            result = federation.run({**config, "results-dir": str(tmp_path / "deploy")}, timeout=400)
            home = federation.flwr_home
        simulated = results_dir(simulation.result(), tmp_path / "sim", tmp_path)
    deployed = results_dir(result, tmp_path / "deploy", logs)
    assert result.results_dir == deployed
    assert not home_processes(home), "a process of the deployment outlived the federation"

    # The models exactly: both runtimes run the same ServerApp and ClientApp functions on the same inputs
    # (messages carry float64 losslessly, the hard update sums in client order); a difference is a runtime
    # bug, not rounding.
    sim_models, dep_models = np.load(simulated / "cluster_models.npz"), np.load(deployed / "cluster_models.npz")
    assert sorted(sim_models.files) == sorted(dep_models.files) == ["exp3/cluster-0", "exp3/cluster-1"]
    for name in sim_models.files:
        np.testing.assert_array_equal(dep_models[name], sim_models[name], err_msg=name)
    pd.testing.assert_frame_equal(pd.read_csv(deployed / "routes.csv"), pd.read_csv(simulated / "routes.csv"))
    sim_rounds = pd.read_csv(simulated / "rounds.csv").drop(columns="seconds")
    dep_rounds = pd.read_csv(deployed / "rounds.csv").drop(columns="seconds")
    # The round table's means over replies may add them in arrival order, which differs between runtimes:
    # equal to float64 rounding (1e-12, the runtimes' contract).
    pd.testing.assert_frame_equal(dep_rounds, sim_rounds, check_exact=False, rtol=1e-12, atol=1e-12)
    # The configuration is not trivial: both clusters are used and EXP3 updates at the block end.
    assert dep_rounds.routed_1.sum() > 0 and dep_rounds.exp3_weight_spread.iloc[-1] > 0
    summary = json.loads((deployed / "summary.json").read_text())["exp3"]
    assert summary["evaluated_clients"] == NUM_NODES and summary["rejected_replies"] == 0
    _ran_the_fab_without_an_installed_fedroute(repository_fab, home, no_fedroute_bin, simulated, deployed, logs)


def _ran_the_fab_without_an_installed_fedroute(fab: Path, home: Path, bin_dir: Path, simulated: Path,
                                               deployed: Path, logs: Path) -> None:
    """Both runs ran the FAB `flwr build` makes of the repository (its files, by its hash) in the environment
    without fedroute."""
    import hashlib

    fab_hash = hashlib.sha256(fab.read_bytes()).hexdigest()
    for directory in (simulated, deployed):
        config = json.loads((directory / "config.json").read_text())
        assert config["python"] == str(bin_dir / "python"), config["python"]
        assert Path(config["app_files"]).name == f"fedroute.fedroute.0.1.0.{fab_hash[:8]}", config["app_files"]
        assert config["federation"] == {"num_clients": NUM_NODES, "num_nodes": NUM_NODES, "source": "num-partitions"}
    assert config["app_files"].startswith(str(home / "apps"))
    for log in ("superlink", *(f"supernode-{index}" for index in range(NUM_NODES))):
        assert f"$ {bin_dir}/flower-" in (logs / f"{log}.log").read_text(), log


def test_every_process_stops_when_the_body_fails(repository: Path, tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="boom"):
        with LocalFederation(repository, 1, log_dir=tmp_path / "logs") as federation:
            home = federation.flwr_home
            assert federation.online_supernodes() == 1 and len(home_processes(home)) >= 3  # link, node, exec
            raise RuntimeError("boom")
    assert not home_processes(home)
    assert not home.exists()  # its own temporary FLWR_HOME is removed
