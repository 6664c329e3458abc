"""The real app through Flower's Ray simulation (``flwr run``), against the simulator.

Equivalence (one parametrised harness, :data:`CASES`): the same configuration run
through ``flwr run`` (with ``save-round-models``) and through the batched simulator
gives, **at every round**, the same routes, masses, changed flags and entries, and
the same cluster models ``W^0 … W^T`` within the case's tolerance:

* ``linear``: every method (Greedy, EXP3 {gr, rh}, synchronized entry, FedCAM),
  12 clients, 20 rounds, an entry threshold that lets some clients enter at the
  synchronized entry and keeps others out; float64, ``atol = 1e-12``;
* ``housing``: EXP3 over {gr, com, rev} on the real table shipped with the
  package, 4 clients, 10 rounds, a seed on which Commitment and Reversal both
  execute a route Greedy would not; float64, ``atol = 1e-12``;
* ``characters``: synchronized entry (EXP3 over {gr, hys} in action mode) on the
  torch task, 4 clients, 5 rounds, ``α = 0.7``: the two transformed clients
  enter cluster 1 at the synchronized entry, the clean ones stay; float32
  models, see :data:`CHARACTERS_ATOL`;
* ``partial``: partial participation (``fraction-train = 0.25``: 4 of 16 clients a
  round, sampled from the client ids) with the generic default (exploration on
  evidence, the server's health view) on the linear task's collapsed start, 30
  rounds; the simulator samples the same clients; float64, ``atol = 1e-12``.

The linear run is also shared by the tests of the results files; a further run
uses a ClientApp whose partitions 0–3 send malformed replies.  The cases' runs and
the generic default's start two at a time when the module starts (``flower_runs``,
:mod:`support.runs_ahead`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable

import numpy as np
import pandas as pd
import pytest

from fedroute.core.controllers import COMMITMENT, CONTROLLER_IDS, REVERSAL
from fedroute.core.participation import Participation
from fedroute.deployment.launcher import run_flower_app
from fedroute.server.run_config import RunSettings
from fedroute.simulation.fedcam import simulate_fedcam_batch
from fedroute.simulation.simulator import simulate
from fedroute.tasks.housing import EMBEDDED_TABLE
from support.app_config import app_settings
from support.runs_ahead import RunsAhead, module_items

pytestmark = pytest.mark.process  # every test here reads a `flwr run` (Ray simulation)

NUM_CLIENTS, NUM_ROUNDS, BLOCK = 12, 20, 5
ENTRY_THRESHOLD = 0.77
"""Linear case: at the synchronized entry (``W^0``, everyone's Greedy choice is cluster 0) the
12 clients' benefits of cluster 1 are 0.55–0.76 for five of group 1 and 0.78–0.94 for the
others: 5 enter, 7 stay out."""
RUN_CONFIG = {
    "method": "all", "num-clients": NUM_CLIENTS, "num-server-rounds": NUM_ROUNDS, "seed": 3,
    "block-length": BLOCK, "entry-threshold": ENTRY_THRESHOLD, "hysteresis-min-rounds": 3,
    "save-round-models": True,
}
CHARACTERS_ATOL = 1e-6
"""Characters: the models are float32 (machine epsilon 1.2e-7, weights of order 1).  Both
runtimes run the same torch code and Flower's hard update averages in float64 and casts back
like the simulator's, so the models agree exactly on the reference machine (measured: 0 at
every round); the tolerance of a few float32 ulps allows torch to order its float32
reductions differently in a Ray worker (1 CPU, 1 intra-op thread) than in the test process
on machines with more cores."""


@dataclass(frozen=True)
class Case:
    """One configuration of the equivalence harness."""

    run_config: dict[str, Any]
    atol: float
    check: Callable[[RunSettings, dict[str, Any], pd.DataFrame], None] = field(default=lambda *args: None)
    """Asserts that the configuration exercises what the case is for (simulator histories, Flower rounds)."""


def _some_enter_some_stay_out(settings: RunSettings, histories: dict[str, Any], rounds: pd.DataFrame) -> None:
    entered = rounds[rounds.method == "sync-entry"].set_index("round_index").entered
    assert 0 < entered.loc[0] < settings.task.num_clients, "the threshold must discriminate at the entry"
    np.testing.assert_array_equal(np.flatnonzero(histories["sync-entry"].entered[0]), [1, 5, 7, 9, 11])


def _commitment_and_reversal_change_routes(settings: RunSettings, histories: dict[str, Any],
                                           rounds: pd.DataFrame) -> None:
    history = histories["exp3"]
    greedy_choice = history.train_losses.argmin(axis=-1)
    overruling = set(history.controllers[history.routes != greedy_choice].tolist())
    assert {CONTROLLER_IDS.index(COMMITMENT), CONTROLLER_IDS.index(REVERSAL)} <= overruling


def _transformed_clients_enter(settings: RunSettings, histories: dict[str, Any], rounds: pd.DataFrame) -> None:
    entered = rounds[rounds.method == "sync-entry"].set_index("round_index").entered
    assert entered.loc[0] == 2 and entered.sum() == 2
    np.testing.assert_array_equal(np.flatnonzero(histories["sync-entry"].entered[0]), [2, 3])  # group 1


def _partial_participation_explores(settings: RunSettings, histories: dict[str, Any], rounds: pd.DataFrame) -> None:
    played = histories["exp3"].played
    assert (played.sum(axis=1) == 4).all() and played.any(axis=0).all()   # 4 of 16 a round; everyone plays
    # Partial participation: the start does not explore; the collapsed start (cluster 1 nobody's best) is left
    # when the server re-seeds cluster 1 after collapse-patience rounds — the same in both runtimes.
    exp3 = rounds[rounds.method == "exp3"].set_index("round_index")
    patience = settings.routing["exp3"].collapse_patience
    assert (exp3.loc[:patience - 1, "routed_1"] == 0).all() and exp3.loc[patience:, "routed_1"].sum() > 0


CASES = {
    "linear": Case(RUN_CONFIG, atol=1e-12, check=_some_enter_some_stay_out),
    "housing": Case({"task": "housing", "method": "exp3", "num-clients": 4, "num-server-rounds": 10, "seed": 3,
                     "block-length": 2, "data-file": str(EMBEDDED_TABLE), "save-round-models": True},
                    atol=1e-12, check=_commitment_and_reversal_change_routes),
    "characters": Case({"task": "characters", "method": "sync-entry", "num-clients": 4, "num-server-rounds": 5,
                        "seed": 0, "alpha": 0.7, "pretrain-epochs": 5, "save-round-models": True},
                       atol=CHARACTERS_ATOL, check=_transformed_clients_enter),
    "partial": Case({"method": "greedy,exp3,sync-entry", "preset": "generic", "num-clients": 16,
                     "num-server-rounds": 30, "seed": 5, "fraction-train": 0.25, "save-round-models": True},
                    atol=1e-12, check=_partial_participation_explores),
}


def _results(result, results_root: Path) -> Path:
    assert result.completed, f"status {result.status!r}\n{result.stdout[-4000:]}"
    (directory,) = [path for path in results_root.iterdir() if path.is_dir()]
    return directory


GENERIC = "generic"
"""The run of :data:`GENERIC_CONFIG` (``generic_run``), next to the :data:`CASES`."""


def _run_config(name: str) -> dict[str, Any]:
    return GENERIC_CONFIG if name == GENERIC else CASES[name].run_config


def _flower_results(flower_app: Path, name: str, results_root: Path) -> Path:
    """The results directory of run ``name``'s ``flwr run`` (one SuperNode per client)."""
    config = _run_config(name)
    result = run_flower_app(flower_app, {**config, "results-dir": str(results_root)},
                            num_supernodes=int(config["num-clients"]), timeout=600)
    return _results(result, results_root)


def _runs_read_by(item: pytest.Item) -> list[str]:
    """The runs a test of this module reads (its case; the linear run through ``flower_run``; the generic run)."""
    callspec = getattr(item, "callspec", None)
    names = [callspec.params["case"]] if callspec is not None and "case" in callspec.params else []
    fixtures = getattr(item, "fixturenames", ())
    return names + ["linear"] * ("flower_run" in fixtures) + [GENERIC] * ("generic_run" in fixtures)


@pytest.fixture(scope="module")
def flower_runs(request: pytest.FixtureRequest, flower_app: Path,
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str], Path]]:
    """Run name (a case, or ``generic``) → results directory of its ``flwr run``.  Every run that a selected
    test of this module reads starts when the module's first test asks, two at a time in the order the tests
    read them (:mod:`support.runs_ahead`): each simulation is run once per module, while the tests check the
    ones before it."""
    ahead = RunsAhead(workers=2)

    def start(name: str) -> None:
        if name not in ahead:
            ahead.start(name, _flower_results, flower_app, name, tmp_path_factory.mktemp(f"results-{name}"))

    for item in module_items(request):
        for name in _runs_read_by(item):
            start(name)

    def run(name: str) -> Path:
        start(name)  # a run no test was known to read
        return ahead.result(name)

    try:
        yield run
    finally:
        ahead.close()


@pytest.fixture(scope="module")
def flower_run(flower_runs: Callable[[str], Path]) -> Path:
    return flower_runs("linear")


def _simulated(settings: RunSettings, method: str) -> Any:
    """The batched simulator's history of one method (FedCAM: its own simulator, combined models)."""
    if method != "fedcam":
        return simulate(settings.task, settings.routing[method], settings.num_rounds, settings.seed,
                        participation=Participation(settings.fraction_train, settings.min_train_nodes,
                                                    settings.report_memory), influence=settings.influence)
    batch = simulate_fedcam_batch([settings.task], settings.routing[method], settings.num_rounds, [settings.seed])
    return SimpleNamespace(routes=batch.routes[:, 0].astype(np.int64), masses=batch.masses[:, 0],
                           cluster_models=batch.cluster_models[:, 0], entered=np.zeros_like(batch.routes[:, 0]))


@pytest.mark.parametrize("case", list(CASES))
def test_flower_equals_the_simulator_at_every_round(case: str, flower_runs: Callable[[str], Path],
                                                    repository: Path) -> None:
    directory = flower_runs(case)
    settings = app_settings(CASES[case].run_config)
    num_clients, num_rounds = settings.task.num_clients, settings.num_rounds
    rounds = pd.read_csv(directory / "rounds.csv")
    routes = pd.read_csv(directory / "routes.csv")
    saved = np.load(directory / "round_models.npz")
    histories = {method: _simulated(settings, method) for method in settings.methods}
    largest_difference = 0.0
    for method, history in histories.items():
        table = routes[routes.method == method].pivot(index="round_index", columns="client_id", values="cluster")
        table = table.reindex(index=range(num_rounds), columns=range(num_clients)).fillna(-1)
        played = getattr(history, "played", np.ones(history.routes.shape, dtype=bool))
        np.testing.assert_array_equal(table.to_numpy(), np.where(played, history.routes, -1), err_msg=method)
        mine = rounds[rounds.method == method].sort_values("round_index")
        np.testing.assert_array_equal(mine.round_index, np.arange(num_rounds))
        clusters = range(settings.routing[method].num_clusters)
        np.testing.assert_allclose(mine[[f"mass_{k}" for k in clusters]].to_numpy(), history.masses,
                                   rtol=0, atol=1e-12, err_msg=method)
        np.testing.assert_array_equal(mine.entered, history.entered.sum(axis=1), err_msg=method)
        models = history.cluster_models                                   # (T+1, K, P)
        changed = np.any(models[1:] != models[:-1], axis=-1)             # (T, K)
        if method == "fedcam":  # Flower flags the cluster parts; the recorded models are the combined ones
            changed = (history.routes[..., None] == np.arange(len(clusters))).any(axis=1)
        np.testing.assert_array_equal(mine[[f"changed_{k}" for k in clusters]].to_numpy(), changed, err_msg=method)
        np.testing.assert_array_equal(saved[f"{method}/server_round"], np.arange(num_rounds + 1))
        flower_models = saved[f"{method}/cluster_models"]
        assert flower_models.shape == models.shape, method
        np.testing.assert_allclose(flower_models, models, rtol=0, atol=CASES[case].atol, err_msg=method)
        largest_difference = max(largest_difference, float(np.abs(flower_models - models).max()))
        final = np.load(directory / "cluster_models.npz")
        np.testing.assert_array_equal(np.stack([final[f"{method}/cluster-{k}"] for k in clusters]),
                                      flower_models[-1], err_msg=method)
    CASES[case].check(settings, histories, rounds)
    print(f"{case}: largest |Flower - simulator| model difference over all rounds = {largest_difference:.3g}")


def test_writes_every_result_file(flower_run: Path) -> None:
    for name in ("config.json", "rounds.csv", "rounds.parquet", "summary.json", "cluster_models.npz", "routes.csv",
                 "round_models.npz"):
        assert (flower_run / name).is_file(), name
    summary = json.loads((flower_run / "summary.json").read_text())
    assert set(summary) == {"greedy", "exp3", "sync-entry", "fedcam"}
    for method in summary.values():
        assert method["evaluated_clients"] == NUM_CLIENTS and method["rejected_replies"] == 0


def test_only_routed_clusters_change(flower_run: Path) -> None:
    rounds = pd.read_csv(flower_run / "rounds.csv")
    for cluster in range(2):
        routed = rounds[f"routed_{cluster}"] > 0
        np.testing.assert_array_equal(rounds[f"changed_{cluster}"].to_numpy(), routed.to_numpy())
    greedy = rounds[rounds.method == "greedy"]
    assert (greedy.routed_1 == 0).all() and not greedy.changed_1.any()  # collapsed start: cluster 1 starves


def test_client_state_persists_across_rounds(flower_run: Path) -> None:
    rounds = pd.read_csv(flower_run / "rounds.csv")
    for method, table in rounds.groupby("method"):
        if method == "fedcam":  # FedCAM keeps no controller state
            continue
        np.testing.assert_array_equal(table.min_rounds_played, table.server_round, err_msg=method)
        np.testing.assert_array_equal(table.max_rounds_played, table.server_round, err_msg=method)
    exp3 = rounds[rounds.method == "exp3"].set_index("round_index").exp3_weight_spread
    assert (exp3.loc[: BLOCK - 2] == 0).all()  # no EXP3 update before the first block ends
    assert (exp3.loc[BLOCK - 1:] > 0).all()  # updated at the block end and kept afterwards
    assert (rounds[rounds.method == "greedy"].exp3_weight_spread == 0).all()


def test_greedy_stays_collapsed_and_exp3_routes_to_both(flower_run: Path) -> None:
    summary = json.loads((flower_run / "summary.json").read_text())
    assert summary["greedy"]["persistent_collapse"] and summary["greedy"]["recovery_error"] >= 0.5
    assert summary["exp3"]["rounds_with_two_routed"] > 0


def test_flower_telemetry_and_alarms_equal_the_simulators(flower_run: Path, repository: Path, tmp_path: Path) -> None:
    from fedroute.simulation.recorded import simulate_run
    from support.telemetry import assert_same_telemetry

    settings = app_settings(RUN_CONFIG)
    simulated = simulate_run(settings, tmp_path)
    assert_same_telemetry(flower_run, tmp_path)
    summary = json.loads((flower_run / "summary.json").read_text())
    for method in settings.methods:
        assert summary[method]["alarms"] == simulated[method]["alarms"], method
    greedy = {alarm["kind"]: alarm for alarm in summary["greedy"]["alarms"]}
    assert greedy["collapsed-entrance"]["raised_round"] == 0 and greedy["collapsed-entrance"]["cleared_round"] is None
    assert greedy["starvation"]["clusters"] == [1] and greedy["starvation"]["cleared_round"] is None
    exp3 = summary["exp3"]["alarms"]
    assert [alarm["kind"] for alarm in exp3][:1] == ["collapsed-entrance"] and exp3[0]["cleared_round"] is not None
    assert any(alarm["kind"] == "recovery" for alarm in exp3) and not summary["exp3"]["active_alarms"]
    status = json.loads((flower_run / "status.json").read_text())
    assert status["state"] == "finished" and status["completed"] == list(settings.methods)


def test_malformed_replies_are_rejected_and_good_ones_aggregated(test_app, tmp_path: Path) -> None:
    app_dir = test_app("hostile")
    results_root = tmp_path / "results"
    num_clients, num_rounds = 10, 5
    result = run_flower_app(app_dir, {"method": "exp3", "num-clients": num_clients, "num-server-rounds": num_rounds,
                                      "results-dir": str(results_root)}, num_supernodes=num_clients, timeout=600)
    directory = _results(result, results_root)
    rounds = pd.read_csv(directory / "rounds.csv")
    assert (rounds.rejected == 4).all() and (rounds.num_replies == num_clients - 4).all()
    assert (rounds.routed_0 + rounds.routed_1 == num_clients - 4).all()
    routes = pd.read_csv(directory / "routes.csv")
    assert set(routes.client_id) == set(range(4, num_clients))
    models = np.load(directory / "cluster_models.npz")
    final = np.stack([models[f"exp3/cluster-{k}"] for k in range(2)])
    assert np.isfinite(final).all()
    assert rounds.changed_0.any() and rounds.changed_1.any()  # the good replies were aggregated
    summary = json.loads((directory / "summary.json").read_text())
    assert summary["exp3"]["rejected_replies"] == 4 * num_rounds


# ------------------------------------------------- the generic default (issue 10)
GENERIC_CONFIG = {
    "method": "all", "num-clients": NUM_CLIENTS, "num-server-rounds": NUM_ROUNDS, "seed": 3, "preset": "generic",
    "init": "copies", "block-length": BLOCK, "start-updates": 3,
}


@pytest.fixture(scope="module")
def generic_run(flower_runs: Callable[[str], Path]) -> Path:
    return flower_runs(GENERIC)


def test_generic_default_flower_and_simulator_agree(generic_run: Path, repository: Path) -> None:
    """Random ties, the synchronized-entry block start and exploration on evidence (the server's health
    broadcast) take the same code path in both runtimes: identical routes every round and equal models, from
    K identical copies; so does the start probe (``start-updates = 3``: round 0's clients on the copies chain
    three local updates, in the ClientApp as in the simulator)."""
    settings = app_settings(GENERIC_CONFIG)
    routes = pd.read_csv(generic_run / "routes.csv")
    models = np.load(generic_run / "cluster_models.npz")
    for method in ("exp3", "sync-entry"):
        routing = settings.routing[method]
        assert routing.tie_breaking == "random" and routing.explore_on == "collapse" and routing.block_length == BLOCK
        history = simulate(settings.task, routing, NUM_ROUNDS, settings.seed)
        table = routes[routes.method == method].pivot(index="round_index", columns="client_id", values="cluster")
        np.testing.assert_array_equal(table.to_numpy(), history.routes, err_msg=method)
        flower_models = np.stack([models[f"{method}/cluster-{k}"] for k in range(2)])
        np.testing.assert_allclose(flower_models, history.cluster_models[-1], atol=1e-5, rtol=0)
        assert routing.start_updates == 3
        unprobed = simulate(settings.task, replace(routing, start_updates=1), NUM_ROUNDS, settings.seed)
        assert np.abs(unprobed.cluster_models[-1] - flower_models).max() > 1e-3    # the probe changed the run
        assert set(table.loc[0]) == {0, 1}  # identical copies: random ties split the clients at t = 0
        # split-copies parts the copies' round-0 replies by update direction: each group on its own copy from
        # t = 1, no collapse sign, so every round is Greedy (explore-at-start is off in the generic default)
        assert routing.split_copies and not routing.explore_at_start
        assert (history.arms == -1).all()
        np.testing.assert_array_equal(history.routes[1:], history.train_losses[1:].argmin(axis=-1))
        groups = np.asarray(settings.task.groups(np.arange(NUM_CLIENTS)))
        assert len(set(zip(groups.tolist(), history.routes[-1].tolist()))) == len(set(groups.tolist())) == 2
    greedy_routes = routes[routes.method == "greedy"].pivot(index="round_index", columns="client_id", values="cluster")
    assert set(greedy_routes.loc[0]) == {0}  # Greedy IFCA keeps the lowest-index ties
