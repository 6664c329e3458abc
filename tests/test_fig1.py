"""Tests of E1 (paper Figure 1): population-level Greedy dynamics and the per-ρ table (what every experiment
writes: tests/test_experiment_kit.py)."""

import numpy as np
import pandas as pd
import pytest

from fedroute.core.randomness import Purpose, generator
from fedroute.simulation.experiments.fig1 import (
    FREQUENCIES, RUNS_COLUMNS, SUMMARY_COLUMNS, Fig1Config, fig1_claims, run_fig1)
from fedroute.simulation.population import greedy_population_dynamics
from fedroute.core.metrics import (
    certified_starvation_basin,
    common_preferred_cluster,
    persistent_collapse,
    recovery_error,
)

# Two groups in the plane with the linear task's convention: θ_0 = +2e_0, θ_1 = −2e_0
# (Δ = 4, θ̄ = θ̄_α = 0 for α = ½, ‖θ̄_α − θ_g‖ = 2).
THETA = np.array([[2.0, 0.0], [-2.0, 0.0]])
HAND_PAIRS = np.array([
    # In the basin: both groups prefer w_0 (distance ≤ 2.07 < √29), and the starved
    # w_1 = (0, 5) is at distance √29 > 2 from both θ_g.
    [[0.0, 0.5], [0.0, 5.0]],
    # Common preference, not in the basin: both prefer w_0 = θ_0 (distances 0 and 4
    # against 1.25 and √17.5625 ≈ 4.19), but w_1 is within 1.25 < 2 of θ_0.  Rounds 0
    # and 1 update w_0 only (w_0 = (1, 0), then (0.5, 0)); at round 2 group 0 is
    # 1.5 > 1.25 from w_0 and escapes to w_1: the groups split and both recover.
    [[2.0, 0.0], [2.0, 1.25]],
    # No common preference: group 0 -> w_0, group 1 -> w_1 from the start.
    [[1.0, 0.0], [-1.0, 0.0]],
])


def naive_dynamics(initial_models, theta, weights, eta, rounds):
    """The update rule written literally, one start and one cluster at a time."""
    final = np.array(initial_models, dtype=float)
    ever = np.zeros(final.shape[:2], dtype=bool)
    for n in range(final.shape[0]):
        w = final[n]
        for _ in range(rounds):
            routes = [int(np.argmin([0.5 * np.sum((w_k - theta_g) ** 2) for w_k in w])) for theta_g in theta]
            new = w.copy()
            for k in range(w.shape[0]):
                groups = [g for g, r in enumerate(routes) if r == k]
                mass = sum(weights[g] for g in groups)
                if mass > 0:
                    ever[n, k] = True
                    new[k] = w[k] - eta * sum(weights[g] * (w[k] - theta[g]) for g in groups) / mass
            w[:] = new
    return final, ever


@pytest.fixture(scope="module")
def quick_summary() -> pd.DataFrame:
    return run_fig1(Fig1Config.quick())


# ------------------------------------------------------------------ dynamics --
def test_hand_cases_metrics_at_initialisation():
    np.testing.assert_array_equal(common_preferred_cluster(HAND_PAIRS, THETA), [0, 0, -1])
    np.testing.assert_array_equal(certified_starvation_basin(HAND_PAIRS, THETA, 0.5), [True, False, False])


def test_hand_cases_after_one_and_three_rounds():
    final, ever = greedy_population_dynamics(HAND_PAIRS, THETA, 0.5, 0.5, 1)
    np.testing.assert_array_equal(final, [[[0.0, 0.25], [0.0, 5.0]],
                                          [[1.0, 0.0], [2.0, 1.25]],
                                          [[1.5, 0.0], [-1.5, 0.0]]])
    np.testing.assert_array_equal(ever, [[True, False], [True, False], [True, True]])

    final, ever = greedy_population_dynamics(HAND_PAIRS, THETA, 0.5, 0.5, 3)
    np.testing.assert_array_equal(final, [[[0.0, 0.0625], [0.0, 5.0]],
                                          # round 2: w_0 -> (0.5 + (-2 - 0.5)/2, 0), w_1 -> (2, 1.25/2)
                                          [[-0.75, 0.0], [2.0, 0.625]],
                                          [[1.875, 0.0], [-1.875, 0.0]]])
    np.testing.assert_array_equal(ever, [[True, False], [True, True], [True, True]])


def test_hand_cases_long_run_basin_starves_and_the_others_recover():
    final, ever = greedy_population_dynamics(HAND_PAIRS, THETA, 0.5, 0.5, 200)
    np.testing.assert_array_equal(ever, [[True, False], [True, True], [True, True]])
    np.testing.assert_array_equal(persistent_collapse(ever[:, None, :].astype(float)), [True, False, False])
    # Basin start: the starved model never moves; the active one reaches θ̄_α = 0.
    np.testing.assert_array_equal(final[0, 1], HAND_PAIRS[0, 1])
    np.testing.assert_allclose(final[0, 0], [0.0, 0.0], atol=1e-12)
    # The escaping start ends specialised with swapped labels, the split start in order.
    np.testing.assert_allclose(final[1], THETA[::-1], atol=1e-12)
    np.testing.assert_allclose(final[2], THETA, atol=1e-12)
    errors = recovery_error(final, THETA)
    assert errors[0] == pytest.approx(np.sqrt(29.0))  # ≥ Δ/4: terminal non-recovery
    assert errors[1] < 1e-12 and errors[2] < 1e-12


def test_ties_route_to_the_lowest_index_and_the_pool_is_alpha_weighted():
    start = np.zeros((1, 2, 2))  # identical models: every group ties, picks cluster 0
    final, ever = greedy_population_dynamics(start, THETA, 0.25, 0.5, 1)
    # θ̄_α = 0.25 (2, 0) + 0.75 (-2, 0) = (-1, 0); w_0 moves half way; w_1 is not routed.
    np.testing.assert_array_equal(final[0], [[-0.5, 0.0], [0.0, 0.0]])
    np.testing.assert_array_equal(ever[0], [True, False])
    final, ever = greedy_population_dynamics(start, THETA, [0.25, 0.75], 1.0, 0)
    np.testing.assert_array_equal(final, start)
    assert not ever.any()


def test_vectorised_dynamics_match_the_literal_rule():
    rng = np.random.default_rng(7)
    theta = rng.standard_normal((3, 4))
    start = 1.5 * rng.standard_normal((60, 3, 4))
    weights = np.array([0.2, 0.0, 0.8])  # a massless group routes but updates nothing
    expected_final, expected_ever = naive_dynamics(start, theta, weights, 0.7, 15)
    final, ever = greedy_population_dynamics(start, theta, weights, 0.7, 15)
    np.testing.assert_array_equal(ever, expected_ever)
    np.testing.assert_allclose(final, expected_final, rtol=0, atol=1e-12)
    # Two groups, the E1 setting.
    start = 3.0 * rng.standard_normal((40, 2, 5))
    theta = Fig1Config().theta
    expected_final, expected_ever = naive_dynamics(start, theta, np.array([0.5, 0.5]), 0.5, 20)
    final, ever = greedy_population_dynamics(start, theta, 0.5, 0.5, 20)
    np.testing.assert_array_equal(ever, expected_ever)
    np.testing.assert_allclose(final, expected_final, rtol=0, atol=1e-12)


@pytest.mark.parametrize("kwargs", [
    dict(eta=0.0), dict(eta=1.5), dict(rounds=-1), dict(alpha=[0.5, 0.3, 0.2]), dict(alpha=-0.1),
    dict(initial_models=np.zeros((3, 2))), dict(theta=np.zeros((2, 3))),
])
def test_dynamics_reject_invalid_inputs(kwargs):
    arguments = dict(initial_models=HAND_PAIRS, theta=THETA, alpha=0.5, eta=0.5, rounds=3)
    arguments.update(kwargs)
    with pytest.raises(ValueError):
        greedy_population_dynamics(**arguments)


# -------------------------------------------------------------- experiment --
def test_quick_and_paper_settings():
    quick = Fig1Config.quick()
    assert (quick.pairs, quick.rounds, len(quick.rhos)) == (2_000, 50, 4)
    full = Fig1Config()
    assert (full.pairs, full.rounds, full.dimension, full.group_distance) == (20_000, 200, 5, 4.0)
    np.testing.assert_array_equal(full.theta[:, 0], [2.0, -2.0])


def test_initialisation_is_a_pure_function_of_the_cell():
    config = Fig1Config.quick()
    z = generator(config.seed, 0, 2, Purpose.INIT).standard_normal((config.pairs, 2, config.dimension))
    np.testing.assert_array_equal(config.initial_models(2), config.rhos[2] * z)
    other = Fig1Config.quick(rhos=(0.1, 0.2, 3.0))
    np.testing.assert_array_equal(other.initial_models(2), 3.0 * z)


def test_tiny_grid_rho_zero_by_hand():
    # ρ = 0: w_0 = w_1 = θ̄.  Both groups tie and pick cluster 0 (common preference);
    # the starved w_1 is exactly ‖θ̄_α − θ_g‖ = 2 from θ_g, so it is not in the (strict)
    # basin; w_0 = θ̄ = θ̄_α never moves and w_1 is never updated: persistent collapse
    # and R_T = 2 ≥ Δ/4.  No basin sample: P(persistent | basin) is NaN.
    summary = run_fig1(Fig1Config(rhos=(0.0,), pairs=16, rounds=5))
    row = summary.iloc[0]
    assert (row["common"], row["basin"], row["persistent"], row["nonrecovery"]) == (1.0, 0.0, 1.0, 1.0)
    assert np.isnan(row["persistent_given_basin"])
    assert row["mean_recovery_error"] == 2.0
    claims = fig1_claims(summary)
    theorem = claims[2]
    assert theorem["holds"] is False and theorem["measured"]["rhos_without_basin_samples"] == [0.0]


def test_quick_run_theorem_2_and_orderings(quick_summary):
    summary = quick_summary
    assert list(summary.columns) == list(RUNS_COLUMNS)
    assert list(summary.columns[: len(SUMMARY_COLUMNS)]) == list(SUMMARY_COLUMNS)
    np.testing.assert_array_equal(summary["rho"], Fig1Config.quick().rhos)
    assert (summary["n_inits"] == 2_000).all()
    for column in FREQUENCIES:
        assert summary[column].between(0.0, 1.0).all()
    # Theorem 2: every sampled start in the basin stays collapsed, exactly.
    assert (summary["n_basin"] > 0).all()
    assert (summary["persistent_given_basin"] == 1.0).all()
    assert (summary["n_basin_persistent"] == summary["n_basin"]).all()
    assert (summary["common"] >= summary["basin"]).all()
    # Only a common first choice can starve a cluster; a starved cluster never recovers.
    assert (summary["n_persistent"] <= summary["n_common"]).all()
    assert (summary["n_nonrecovery"] == summary["n_persistent"] + summary["n_nonrecovery_not_persistent"]).all()
    assert all(claim["holds"] for claim in fig1_claims(summary))


def test_quick_outputs_are_the_run_of_its_config(reproduced, quick_summary):
    out = reproduced("fig1")
    pd.testing.assert_frame_equal(pd.read_parquet(out / "summary.parquet"), quick_summary[list(SUMMARY_COLUMNS)])
    pd.testing.assert_frame_equal(pd.read_parquet(out / "runs.parquet"), quick_summary)
