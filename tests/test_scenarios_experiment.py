"""``fedroute reproduce scenarios`` (issue 10): starts, references, judging, and the quick suite end to end."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedroute.cli import main
from fedroute.simulation.experiments.scenarios import (
    DEV_FIRST_SEED,
    EXPERIMENT,
    QUICK_SCENARIOS, SCENARIOS,
    ScenarioConfig,
    StartedTask,
    _judge,
    cluster_reference_losses,
    final_rounds,
    initial_models,
    make_fedcam_cell_task,
    reference_losses,
    reduce_scenario,
    perturbation_ratios,
    late_start_rounds,
    shared_reference_losses,
)
from fedroute.core.methods import GREEDY, method_settings
from fedroute.simulation.experiments.kit import RunLosses
from fedroute.simulation.simulator import simulate_batch


def test_starts_warm_copies_noise_random_and_collapsed():
    scenario = SCENARIOS["collinear"]
    warm = initial_models(scenario, "warm", 5)
    assert warm.shape == (3, 5) and (warm == warm[0]).all()
    task = scenario.make_task(5)
    theta_bar = task.group_parameters.mean(axis=0)
    assert np.linalg.norm(warm[0] - theta_bar) < 0.2  # FedAvg on everyone: near the pooled optimum
    noisy = initial_models(scenario, "noisy", 5)
    assert not (noisy == noisy[0]).all() and np.abs(noisy - warm).max() < 0.06
    random = initial_models(scenario, "random", 5)
    assert len({tuple(row) for row in random}) == 3
    collapsed = initial_models(scenario, "collapsed", 5)
    np.testing.assert_allclose(collapsed[0], theta_bar)
    with pytest.raises(ValueError, match="no collapsed start"):
        initial_models(SCENARIOS["boundaries"], "collapsed", 0)


def test_reference_is_each_group_trained_alone_from_the_first_model():
    scenario = SCENARIOS["collinear"]
    tasks = [StartedTask(scenario.make_task(seed), initial_models(scenario, "random", seed)) for seed in (1, 2)]
    result = reference_losses(tasks, 3, [0, 3])
    for r, started in enumerate(tasks):
        clients = started.clients(np.arange(started.num_clients))
        for g in range(3):
            members = np.flatnonzero(clients.groups == g)
            model = np.asarray(started.start_models[0], dtype=np.float64)
            test0 = clients.losses(model[None], "test")[members, 0].mean()
            for t in range(3):
                model = clients.local_update(np.repeat(model[None], len(members), 0), members, t).mean(axis=0)
            assert result[0][r, g] == pytest.approx(test0)
            assert result[3][r, g] == pytest.approx(clients.losses(model[None], "test")[members, 0].mean())


def test_the_perturbation_check_trains_round_0_with_one_client_per_group():
    scenario = SCENARIOS["collinear"]
    tasks = [StartedTask(scenario.make_task(seed), initial_models(scenario, "random", seed)) for seed in (1, 2)]
    result = reference_losses(tasks, 3, [3], perturbed=True)
    for r, started in enumerate(tasks):
        clients = started.clients(np.arange(started.num_clients))
        for g in range(3):
            members = np.flatnonzero(clients.groups == g)
            model = np.asarray(started.start_models[0], dtype=np.float64)
            for t in range(3):
                playing = members[:1] if t == 0 else members          # round 0: the group's first client alone
                model = clients.local_update(np.repeat(model[None], len(playing), 0), playing, t).mean(axis=0)
            assert result[3][r, g] == pytest.approx(clients.losses(model[None], "test")[members, 0].mean())
    assert not np.allclose(result[3], reference_losses(tasks, 3, [3])[3])
    # Moved by 10 % up in one group and 25 % down in another: the check reads 1.25 (symmetric in the direction).
    np.testing.assert_allclose(perturbation_ratios([[1.0, 2.0], [1.0, 1.0]], [[1.1, 1.6], [1.0, 1.0]]), [1.25, 1.0])


def test_the_late_start_check_trains_nobody_before_its_round():
    scenario = SCENARIOS["collinear"]
    tasks = [StartedTask(scenario.make_task(seed), initial_models(scenario, "random", seed)) for seed in (1, 2)]
    result = reference_losses(tasks, 3, [1, 4], late_start=2)
    for r, started in enumerate(tasks):
        clients = started.clients(np.arange(started.num_clients))
        for g in range(3):
            members = np.flatnonzero(clients.groups == g)
            model = np.asarray(started.start_models[0], dtype=np.float64)
            assert result[1][r, g] == pytest.approx(clients.losses(model[None], "test")[members, 0].mean())
            for t in (2, 3):                                          # rounds 0 and 1: nobody trains
                model = clients.local_update(np.repeat(model[None], len(members), 0), members, t).mean(axis=0)
            assert result[4][r, g] == pytest.approx(clients.losses(model[None], "test")[members, 0].mean())
    assert not np.allclose(result[4], reference_losses(tasks, 3, [4])[4])
    assert late_start_rounds(SCENARIOS["digits-p10"]) == 10 and late_start_rounds(SCENARIOS["digits"]) == 1
    assert late_start_rounds(SCENARIOS["digits-p25"]) == 4


def test_judging_converged_and_no_harm():
    def row(method, seed, separated, losses, routed):
        return {"scenario": "s", "start": "warm", "seed": seed, "method": method, "separated": separated,
                "group_losses": json.dumps(losses), "routed_test_loss": routed,
                "group_models": json.dumps(list(range(len(losses))))}

    runs = pd.DataFrame([
        row("greedy", 0, True, [1.0, 1.0], 1.0), row("exp3", 0, True, [1.05, 1.0], 1.03),    # Greedy converged
        row("greedy", 1, False, [3.0, 1.0], 2.0), row("exp3", 1, True, [1.0, 1.11], 1.0),    # 11 % > 10 %
        row("greedy", 2, True, [1.2, 1.0], 1.0), row("exp3", 2, False, [1.0, 1.0], 1.0),
    ])
    references = pd.DataFrame([{"scenario": "s", "start": "warm", "seed": s,
                                "cluster_reference_losses": "[[1.0, 1.0], [1.0, 1.0]]"} for s in range(3)])
    judged = _judge(runs, references).set_index(["method", "seed"])
    assert judged.loc[("greedy", 0), "converged"] and not judged.loc[("exp3", 1), "converged"]
    assert not judged.loc[("greedy", 2), "converged"]  # separated but 20 % above the reference
    assert not judged.loc[("exp3", 0), "no_harm"]  # routed 1.03 > 1.02 × Greedy's 1.0
    assert np.isnan(judged.loc[("exp3", 1), "no_harm"]) and np.isnan(judged.loc[("greedy", 0), "no_harm"])
    assert not judged.loc[("exp3", 2), "greedy_converged"]


def test_each_group_is_judged_against_the_reference_from_its_own_clusters_start():
    scenario = SCENARIOS["collinear"]
    tasks = [StartedTask(scenario.make_task(seed), initial_models(scenario, "random", seed)) for seed in (1, 2)]
    per_cluster = cluster_reference_losses(tasks, 3, 4)
    assert per_cluster.shape == (2, 3, 3)
    for k in range(3):
        np.testing.assert_array_equal(per_cluster[:, k], reference_losses(tasks, 3, [4], start_cluster=k)[4])
    assert not np.allclose(per_cluster[:, 0], per_cluster[:, 1])        # different starts, different references
    # w_0^0's reference, already trained by the caller, is read, not trained again
    trained = reference_losses(tasks, 3, [2, 4])
    np.testing.assert_array_equal(cluster_reference_losses(tasks, 3, 4, first=trained), per_cluster)
    read = cluster_reference_losses(tasks, 3, 4, first={t: 2.0 * value for t, value in trained.items()})
    np.testing.assert_array_equal(read[:, 0], 2.0 * per_cluster[:, 0])
    np.testing.assert_array_equal(read[:, 1:], per_cluster[:, 1:])
    warm = [StartedTask(scenario.make_task(1), initial_models(scenario, "warm", 1))]
    same = cluster_reference_losses(warm, 3, 4)
    np.testing.assert_array_equal(same[:, 1], same[:, 0])
    # A run whose group 1 ended on cluster 0 with the loss of cluster 0's reference converged; judged against
    # cluster 1's reference (twice as large) the same loss would pass anyway, against half of it it would not.
    runs = pd.DataFrame([{"scenario": "s", "start": "random", "seed": 0, "method": method, "separated": True,
                          "group_losses": json.dumps([1.0, 2.0]), "routed_test_loss": 1.5,
                          "group_models": json.dumps(models)} for method, models in (("greedy", [1, 0]),
                                                                                     ("exp3", [0, 1]))])
    references = pd.DataFrame([{"scenario": "s", "start": "random", "seed": 0,
                                "cluster_reference_losses": "[[1.0, 2.0], [2.0, 1.0]]"}])
    judged = _judge(runs, references).set_index("method")
    assert json.loads(judged.loc["greedy", "group_ratios"]) == [0.5, 1.0] and judged.loc["greedy", "converged"]
    assert json.loads(judged.loc["exp3", "group_ratios"]) == [1.0, 2.0] and not judged.loc["exp3", "converged"]


def test_groups_that_must_share_a_model_are_judged_against_their_shared_reference():
    scenario = SCENARIOS["collinear"]
    tasks = [StartedTask(scenario.make_task(seed), initial_models(scenario, "random", seed)) for seed in (1, 2)]
    # Run 0 ended with groups 0 and 1 on model 1 and group 2 on model 0; run 1 with one group per model.
    partitions = np.array([[1, 1, 0], [2, 0, 1]])
    shared = shared_reference_losses(tasks, 3, partitions, 3)
    per_cluster = cluster_reference_losses(tasks, 3, 3)
    assert shared[0, 2] == pytest.approx(per_cluster[0, 0, 2])          # alone on its model: its alone reference
    np.testing.assert_allclose(shared[1], per_cluster[1, [2, 0, 1], [0, 1, 2]])
    started = tasks[0]
    clients = started.clients(np.arange(started.num_clients))
    members = np.flatnonzero(clients.groups <= 1)                       # groups 0 and 1 train model 1 together
    model = np.asarray(started.start_models[1], dtype=np.float64)
    for t in range(3):
        model = clients.local_update(np.repeat(model[None], len(members), 0), members, t).mean(axis=0)
    test = clients.losses(model[None], "test")[:, 0]
    for g in (0, 1):
        assert shared[0, g] == pytest.approx(test[clients.groups == g].mean())
        assert shared[0, g] > per_cluster[0, 1, g]                      # sharing costs: above its alone reference
    # Judging: the run whose groups 0 and 1 share is converged on the shared reference, and its group 0, alone in
    # Greedy's run, is not harmed by sharing; a shared group 20 % above its shared reference is not converged.
    def row(method, models, losses, routed):
        return {"scenario": "s", "start": "random", "seed": 0, "method": method, "separated": True,
                "group_models": json.dumps(models), "group_losses": json.dumps(losses), "routed_test_loss": routed}

    for exp3_losses, converged in (([2.0, 2.1, 1.0], True), ([2.4, 2.1, 1.0], False)):
        runs = pd.DataFrame([row("greedy", [0, 1, 1], [1.0, 2.0, 2.0], 1.7), row("exp3", [1, 1, 0], exp3_losses, 1.6)])
        references = pd.DataFrame([{"scenario": "s", "start": "random", "seed": 0,
                                    "cluster_reference_losses": "[[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]]"}])
        partition_references = pd.DataFrame([
            {"scenario": "s", "start": "random", "seed": 0, "group_models": "[0, 1, 1]",
             "shared_reference_losses": "[1.0, 2.0, 2.0]"},
            {"scenario": "s", "start": "random", "seed": 0, "group_models": "[1, 1, 0]",
             "shared_reference_losses": "[2.0, 2.0, 1.0]"}])
        judged = _judge(runs, references, partition_references).set_index("method")
        assert judged.loc["greedy", "converged"] and judged.loc["exp3", "converged"] == converged
        assert judged.loc["exp3", "group_harm"] == (0.0 if converged else 1.0)
        # Against the alone references, sharing group 0 would read as harm (2.0 × where Greedy had 1.0 ×).
        alone = _judge(runs, references).set_index("method")
        assert alone.loc["exp3", "group_harm"] == 1.0


def test_the_end_is_judged_on_the_median_over_the_last_rounds_models():
    assert final_rounds(250) == list(range(241, 251)) and final_rounds(3) == [0, 1, 2, 3]
    assert final_rounds(7, 1) == [7]
    with pytest.raises(ValueError, match="window = 0 is invalid; allowed: an integer ≥ 1"):
        final_rounds(7, 0)
    scenario = SCENARIOS["collinear"]
    tasks = [StartedTask(scenario.make_task(seed), initial_models(scenario, "random", seed)) for seed in (1, 2)]
    # The references: the median of each start's alone reference over the window's models, not the last one.
    windowed = cluster_reference_losses(tasks, 3, 5, window=3)
    for k in range(3):
        per_round = reference_losses(tasks, 3, [3, 4, 5], start_cluster=k)
        np.testing.assert_allclose(windowed[:, k], np.median([per_round[t] for t in (3, 4, 5)], axis=0))
        assert not np.allclose(windowed[:, k], per_round[5])
    # The runs: a group's loss is the median over W^{T-9} … W^T of its mean held-out loss on its plurality model,
    # the routed loss the median over rounds T-10 … T-1 of each round's routes on that round's models.
    history = simulate_batch(tasks, method_settings(GREEDY, num_clusters=3), 12, [1, 2],
                             model_rounds=final_rounds(12, 11))
    cells = [{"scenario": "collinear", "start": "random", "seed": s} for s in (1, 2)]
    rows = reduce_scenario(history, tasks, cells, 3, window=10)
    assert SCENARIOS["digits-p25"].final_window == 10 and SCENARIOS["digits"].final_window == 10   # every scenario
    per_round = [RunLosses(tasks)(state, "test") for state in history.cluster_models]      # W^1 … W^12
    last = per_round[-1]
    for r in range(2):
        groups, models = history.groups[r], json.loads(rows.loc[r, "group_models"])
        expected = [np.median([losses[r][groups == g, models[g]].mean() for losses in per_round[1:]])
                    for g in range(3)]
        np.testing.assert_allclose(json.loads(rows.loc[r, "group_losses"]), expected)
        assert not np.allclose(expected, [last[r][groups == g, models[g]].mean() for g in range(3)])
        routed = [np.mean(per_round[j][r][np.arange(30), history.routes[2 + j][r]]) for j in range(10)]  # round 2 + j
        assert rows.loc[r, "routed_test_loss"] == pytest.approx(np.median(routed))
    # Round t's routes are scored with W^t (the routes change in rounds 1 and 2 here: a shifted pairing would show).
    early = simulate_batch(tasks, method_settings(GREEDY, num_clusters=3), 3, [1, 2], model_rounds=[1, 2, 3])
    assert (early.routes[2] != early.routes[1]).any()
    two = reduce_scenario(early, tasks, cells, 3, window=2)
    early_losses = [RunLosses(tasks)(state, "test") for state in early.cluster_models]   # W^1, W^2, W^3
    for r in range(2):
        assert two.loc[r, "routed_test_loss"] == pytest.approx(np.median(
            [np.mean(early_losses[j][r][np.arange(30), early.routes[1 + j][r]]) for j in range(2)]))
    final = reduce_scenario(history, tasks, cells, 3)                  # window 1: W^T, and W^{T-1}'s routes
    for r in range(2):
        groups, models = history.groups[r], json.loads(final.loc[r, "group_models"])
        np.testing.assert_allclose(json.loads(final.loc[r, "group_losses"]),
                                   [last[r][groups == g, models[g]].mean() for g in range(3)])
        assert final.loc[r, "routed_test_loss"] == pytest.approx(
            np.mean(per_round[-2][r][np.arange(30), history.routes[-1][r]]))


def test_config_rejects_bad_values_naming_the_field():
    for changes, key in [(dict(scenarios=("mnist",)), "scenarios"), (dict(seeds=0), "seeds"),
                         (dict(methods=("exp3",)), "methods"), (dict(first_seed=-1), "first_seed")]:
        with pytest.raises(ValueError, match=f"'{key}'"):
            ScenarioConfig(**changes)


def test_fedcam_sees_pairs_on_the_mlp_scenarios_and_combined_models_elsewhere():
    from fedroute.simulation.fedcam import FedCAMTask

    digits = make_fedcam_cell_task({"scenario": "digits", "start": "random", "seed": 0})
    assert isinstance(digits, FedCAMTask)
    start = digits.initial_models(4)  # [Θ_glob^0 | W^0]: the scenario's start behind the task's global start
    parameters = digits.task.task.num_parameters
    np.testing.assert_array_equal(start[:, parameters:], digits.task.start_models)
    np.testing.assert_array_equal(start[0, :parameters], digits.task.task.initial_global_model())
    gmm = make_fedcam_cell_task({"scenario": "gmm", "start": "random", "seed": 0})
    assert isinstance(gmm, StartedTask) and not hasattr(gmm, "initial_global_model")


def test_study_config_runs_the_variants_on_the_development_seeds(capsys):
    study = EXPERIMENT.configure("study")
    assert study.first_seed == DEV_FIRST_SEED > ScenarioConfig().first_seed + ScenarioConfig().seeds - 1
    default = study.settings("default", SCENARIOS["gmm-k4"])
    plain = study.settings("no-duplicates", SCENARIOS["gmm-k4"])
    assert default.consolidate_duplicates and not plain.consolidate_duplicates
    assert plain == replace(default, consolidate_duplicates=False)
    assert study.settings("always-explore", SCENARIOS["gmm-k4"]) == replace(default, explore_on="always")
    former = study.settings("exploit-0.5", SCENARIOS["gmm-k4"])  # the former default: a final exploitation phase
    assert former.exploitation_fraction == 0.5 and former.explore_on == "always" and not former.reseed_empty
    assert main(["reproduce", "scenarios", "--config", "studies", "--out", "unused"]) == 2
    assert "'studies' is invalid; allowed: paper, study" in capsys.readouterr().err


@pytest.fixture(scope="module")
def quick_suite(reproduced) -> Path:
    """``fedroute reproduce scenarios --quick`` (what every experiment writes: tests/test_experiment_kit.py)."""
    return reproduced("scenarios")


def test_quick_suite_judges_every_run_and_states_the_done_criteria(quick_suite: Path):
    runs = pd.read_parquet(quick_suite / "runs.parquet")
    full = [name for name in QUICK_SCENARIOS if SCENARIOS[name].fraction == 1.0 and not SCENARIOS[name].late_group]
    assert len(runs) == 2 * (3 * len(QUICK_SCENARIOS) + len(full))  # FedCAM's simulator: full participation only
    assert set(runs["method"]) == {"greedy", "exp3", "sync-entry", "fedcam"}
    assert (~runs["converged"] | runs["separated"]).all()
    assert (runs.loc[runs["converged"], "worst_ratio"] <= 1.1).all()
    assert runs.loc[runs["method"] == "greedy", "no_harm"].isna().all()
    claims = json.loads((quick_suite / "claims.json").read_text())
    assert any(c["claim"].startswith("exp3 separates and converges") for c in claims)
    config = json.loads((quick_suite / "config.json").read_text())
    assert config["derived"]["routing"]["exp3"]["tie_breaking"] == "random"


def test_quick_suite_default_recovers_the_symmetric_digits_start_that_greedy_keeps(quick_suite: Path):
    runs = pd.read_parquet(quick_suite / "runs.parquet").set_index(["scenario", "method"])
    digits_greedy, digits_exp3 = runs.loc[("digits", "greedy")], runs.loc[("digits", "exp3")]
    assert not digits_greedy["separated"].any()  # identical warm copies: every tie to cluster 0
    assert digits_exp3["separated"].all()  # one model per group (converging: T = 80 here, 250 in the suite)
    assert (digits_exp3["worst_ratio"].to_numpy() < digits_greedy["worst_ratio"].to_numpy()).all()
    assert digits_exp3["converged"].any()
