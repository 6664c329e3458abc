"""Tests of the entry test (docs/algorithm.md, rules §5–§6) and of the agent step (§2–§6).

Every expected value below is worked out by hand from the losses; the EXP3
probabilities are made deterministic where needed with ``γ = 0`` and log-weights
``-1000`` (``exp(-1000) = 0`` exactly, so an arm has probability exactly 0 or 1).
"""

import math
from dataclasses import replace

import numpy as np
import pytest

from fedroute.core.agent import CONTROLLER_INDEX, AgentState, agent_step
from fedroute.core.entry import entry_benefits, entry_candidates, entry_decision
from fedroute.core.settings import RoutingSettings

GR, RH, HYS = CONTROLLER_INDEX["gr"], CONTROLLER_INDEX["rh"], CONTROLLER_INDEX["hys"]
OFF = -1000.0  # log-weight of an arm that must never be drawn


# ================================================================== entry ==
def test_entry_candidates_mass_below_threshold_and_not_greedy():
    masses = np.array([0.7, 0.15, 0.15])
    result = entry_candidates(masses, np.array([0, 1, 2]), 0.2)
    np.testing.assert_array_equal(result, [[False, True, True], [False, False, True], [False, True, False]])


def test_entry_candidates_threshold_is_strict():
    result = entry_candidates(np.array([0.6, 0.2, 0.2]), np.array([0, 0]), 0.2)
    assert not result.any()


# Toy task: K = 3 models in the plane, the "local update" adds a fixed direction per client.
MODELS = np.array([[0.0, 0.0], [2.0, 0.0], [0.0, 1.0]])
DIRECTIONS = np.array([[1.0, 0.0], [3.0, 4.0], [0.0, 0.0]])


def _toy_update(calls):
    def local_update(models, client_index, round_index):
        calls.append((models.copy(), np.asarray(client_index).copy(), round_index))
        models += DIRECTIONS[client_index]  # in place on purpose: must be a copy of the cluster models
        return models
    return local_update


def test_entry_benefits_cosine_by_hand():
    calls = []
    original = MODELS.copy()
    mask = np.array([[True, False, True], [False, True, True]])
    greedy = np.array([1, 0])
    benefits = entry_benefits(MODELS, mask, greedy, _toy_update(calls), 7)
    # client 0 (route 1 = (2,0)), direction (1,0):
    #   c=0: w_r - w_c = (2, 0)  -> cos = 1;   c=2: (2, -1) -> cos = 2/sqrt(5)
    # client 1 (route 0 = (0,0)), direction (3,4):
    #   c=1: (-2, 0) -> cos = -3/5;           c=2: (0, -1) -> cos = -4/5
    expected = np.array([[1.0, np.inf, 2 / math.sqrt(5)], [np.inf, -0.6, -0.8]])
    np.testing.assert_allclose(benefits, expected)
    np.testing.assert_array_equal(MODELS, original)  # probe updates are discarded
    assert len(calls) == 1 and calls[0][2] == 7
    np.testing.assert_array_equal(calls[0][1], [0, 0, 1, 1])  # one probe per (client, candidate)


def test_entry_benefits_zero_update_never_qualifies_and_no_candidates_is_all_inf():
    # A zero probe update has no direction: its benefit is +inf (issue 14), not a cosine of 0
    # that would pass any τ ≥ 0 without evidence.
    benefits = entry_benefits(MODELS, np.array([[False, False, False], [True, False, False]]),
                              np.array([0, 1]), lambda m, i, t: m + DIRECTIONS[2], 0)  # zero step
    np.testing.assert_array_equal(benefits, [[np.inf, np.inf, np.inf], [np.inf, np.inf, np.inf]])
    assert not entry_decision(benefits, 1.0)[0].any()
    # w_c = w_r (identical models): no reference direction either.
    same = entry_benefits(np.array([[1.0, 2.0], [1.0, 2.0]]), np.array([[False, True]]), np.array([0]),
                          lambda m, i, t: m + 1.0, 0)
    np.testing.assert_array_equal(same, [[np.inf, np.inf]])
    calls = []
    none = entry_benefits(MODELS, np.zeros((2, 3), dtype=bool), np.array([0, 1]), _toy_update(calls), 0)
    assert np.all(np.isinf(none)) and calls == []


def test_entry_decision_threshold_is_inclusive_and_ties_go_low():
    benefits = np.array([
        [0.3, np.inf, -0.2],    # min -0.2 <= -0.2 -> target 2
        [np.inf, np.inf, np.inf],  # no candidate
        [-0.5, -0.5, np.inf],   # tie -> target 0
        [0.1, np.inf, np.inf],  # 0.1 > -0.2
        [np.inf, -0.2001, -0.1999],  # just below -> target 1
    ])
    qualifies, targets = entry_decision(benefits, -0.2)
    np.testing.assert_array_equal(qualifies, [True, False, True, False, True])
    np.testing.assert_array_equal(targets, [2, -1, 0, -1, 1])


# ================================================================== agent ==
def _step(state, settings, losses, masses, t, benefit_fn=None, ids=None, seed=0):
    losses = np.asarray(losses, dtype=float)
    ids = np.arange(len(losses)) if ids is None else np.asarray(ids)
    return agent_step(state, settings, losses, None if masses is None else np.asarray(masses, float),
                      t, ids, seed, benefit_fn)


def _stub(table, expected_mask=None, expected_greedy=None):
    """benefit_fn returning the chosen benefits on the candidate mask (and checking its inputs)."""
    calls = []

    def benefit_fn(mask, greedy):
        calls.append(mask.copy())
        if expected_mask is not None:
            np.testing.assert_array_equal(mask, expected_mask)
        if expected_greedy is not None:
            np.testing.assert_array_equal(greedy, expected_greedy)
        return np.where(mask, np.asarray(table, float), np.inf)
    benefit_fn.calls = calls
    return benefit_fn


def _no_entry(mask, greedy):
    raise AssertionError("entry test must not run")


def test_greedy_only_routes_to_argmin_and_never_learns():
    settings = RoutingSettings(num_clusters=3, controllers=("gr",), block_length=2)
    state = AgentState.initial(3, settings)
    rounds = [
        [[1.0, 2.0, 3.0], [3.0, 1.0, 1.0], [2.0, 2.0, 0.5]],
        [[5.0, 4.0, 3.0], [1.0, 1.0, 1.0], [0.1, 0.2, 0.3]],
        [[2.0, 1.0, 3.0], [3.0, 3.0, 1.0], [9.0, 0.0, 0.0]],
        [[1.0, 1.0, 0.0], [0.0, 1.0, 2.0], [4.0, 3.0, 4.0]],
    ]
    expected = [[0, 1, 2], [2, 0, 0], [1, 2, 1], [2, 0, 1]]
    for t, (losses, routes) in enumerate(zip(rounds, expected)):
        state, decision = _step(state, settings, losses, [0.5, 0.5, 0.0], t)
        np.testing.assert_array_equal(decision.routes, routes)
        np.testing.assert_array_equal(decision.route_distributions, np.eye(3)[routes])
        np.testing.assert_array_equal(decision.controller, [GR] * 3)
        assert not decision.exp3_updated.any()
        np.testing.assert_array_equal(state.exp3_log_weights, np.zeros((3, 1)))
        np.testing.assert_array_equal(state.previous_route, routes)


def test_losses_with_wrong_number_of_columns_raise():
    settings = RoutingSettings(num_clusters=3, controllers=("gr",))
    with pytest.raises(ValueError, match="num_clusters"):
        _step(AgentState.initial(1, settings), settings, [[1.0, 2.0]], None, 0)


# ------------------------------------------------------------------ block mode --
def test_block_mode_arms_drawn_only_at_block_starts():
    settings = RoutingSettings(num_clusters=2, controllers=("gr", "rh"), block_length=3, exp3_exploration=0.0)
    state = AgentState.initial(2, settings)
    favour_rh_gr = np.array([[OFF, 0.0], [0.0, OFF]])  # client 0 -> rh, client 1 -> gr
    flipped = favour_rh_gr[:, ::-1].copy()
    state = replace(state, exp3_log_weights=favour_rh_gr)
    losses = [[1.0, 2.0], [2.0, 1.0]]
    state, decision = _step(state, settings, losses, None, 0)
    np.testing.assert_array_equal(decision.arm, [1, 0])
    np.testing.assert_array_equal(state.arm_probability, [1.0, 1.0])
    np.testing.assert_array_equal(decision.controller, [RH, GR])
    for t in (1, 2):  # even though the log-weights now favour the other arm, no redraw
        state = replace(state, exp3_log_weights=flipped)
        state, decision = _step(state, settings, losses, None, t)
        np.testing.assert_array_equal(decision.arm, [1, 0])
    state = replace(state, exp3_log_weights=flipped)
    state, decision = _step(state, settings, losses, None, 3)
    np.testing.assert_array_equal(decision.arm, [0, 1])


def test_block_mode_update_only_at_block_end_with_hand_value():
    # B = 3, arms {gr, rh}, rh uniform (β = 0), γ = 0, v = [0, ln 3] -> p = [1/4, 3/4], η = 2.
    settings = RoutingSettings(num_clusters=2, controllers=("gr", "rh"), block_length=3,
                               exp3_exploration=0.0, exp3_learning_rate=2.0)
    n = 24
    v0 = np.tile([0.0, math.log(3.0)], (n, 1))
    state = replace(AgentState.initial(n, settings), exp3_log_weights=v0.copy())
    rounds = [[2.0, 4.0], [6.0, 3.0], [1.0, 4.0]]
    # normalised: [0.5, 1], [1, 0.5], [0.25, 1]
    gr_feedback = [0.5, 0.5, 0.25]      # mean 5/12
    rh_feedback = [0.75, 0.75, 0.625]   # mean 17/24
    for t, row in enumerate(rounds):
        state, decision = _step(state, settings, np.tile(row, (n, 1)), None, t)
        arms = decision.arm
        assert set(arms.tolist()) == {0, 1}  # both branches are exercised
        np.testing.assert_allclose(decision.feedback, np.where(arms == 0, gr_feedback[t], rh_feedback[t]))
        np.testing.assert_allclose(state.arm_probability, np.where(arms == 0, 0.25, 0.75))
        if t < 2:
            assert not decision.exp3_updated.any()
            np.testing.assert_array_equal(state.exp3_log_weights, v0)
    assert decision.exp3_updated.all()
    expected = v0.copy()
    played_gr = arms == 0
    expected[played_gr, 0] = 0.0 - 2.0 * (5 / 12) / 0.25          # -10/3
    expected[~played_gr, 1] = math.log(3.0) - 2.0 * (17 / 24) / 0.75  # ln 3 - 17/9
    np.testing.assert_allclose(state.exp3_log_weights, expected)
    # Next block: fresh draw at t = 3, and no update at t = 3.
    state, decision = _step(state, settings, np.tile([1.0, 1.0], (n, 1)), None, 3)
    assert not decision.exp3_updated.any()
    np.testing.assert_allclose(state.exp3_log_weights, expected)


def test_block_mode_update_uses_probability_at_draw():
    # Mid-block state set by hand: arm rh drawn with p = 0.4, one round (τ = 0) of feedback 0.3 so far.
    settings = RoutingSettings(num_clusters=2, controllers=("gr", "rh"), block_length=2, exp3_learning_rate=2.0)
    state = replace(AgentState.initial(1, settings), arm=np.array([1]), arm_probability=np.array([0.4]),
                    feedback_sum=np.array([0.3]), feedback_rounds=np.array([1]), rounds_played=np.array([1]))
    state, decision = _step(state, settings, [[2.0, 4.0]], None, 1)
    # f = mean(0.5, 1) = 0.75; mean = (0.3 + 0.75) / 2 = 0.525; v[1] = -2 * 0.525 / 0.4 = -2.625
    np.testing.assert_allclose(decision.feedback, [0.75])
    np.testing.assert_allclose(state.exp3_log_weights, [[0.0, -2.625]])
    assert decision.exp3_updated.all()


# ------------------------------------------------------------------ action mode --
def _action_settings(**kw):
    values = dict(num_clusters=2, controllers=("gr", "hys"), exp3_mode="action", exp3_exploration=0.0,
                  exp3_learning_rate=2.0, reversal_mass_threshold=0.2, entry_threshold=0.0)
    values.update(kw)
    return RoutingSettings(**values)


def test_action_mode_greedy_action_completes_after_one_round():
    settings = _action_settings()
    state = replace(AgentState.initial(1, settings), exp3_log_weights=np.array([[0.0, OFF]]))
    state, decision = _step(state, settings, [[3.0, 6.0]], [0.5, 0.5], 5, _no_entry)
    np.testing.assert_array_equal(decision.arm, [0])
    np.testing.assert_array_equal(decision.controller, [GR])
    np.testing.assert_array_equal(decision.routes, [0])
    np.testing.assert_allclose(decision.feedback, [0.5])
    assert decision.exp3_updated.all()
    np.testing.assert_allclose(state.exp3_log_weights, [[-1.0, OFF]])  # 0 - 2 * 0.5 / 1
    np.testing.assert_array_equal(state.arm, [-1])
    state, decision = _step(state, settings, [[3.0, 6.0]], [0.5, 0.5], 6, _no_entry)
    np.testing.assert_array_equal(decision.arm, [0])  # a new action was drawn


@pytest.mark.parametrize("masses, benefit", [(None, None), ([0.5, 0.5], None), ([0.9, 0.1], 0.5)])
def test_action_mode_hys_arm_without_entry_is_one_round_greedy_credited_to_hys(masses, benefit):
    settings = _action_settings()
    state = replace(AgentState.initial(1, settings), exp3_log_weights=np.array([[OFF, 0.0]]))
    benefit_fn = _no_entry if benefit is None else _stub([[np.inf, benefit]])
    state, decision = _step(state, settings, [[3.0, 6.0]], masses, 4, benefit_fn)
    if benefit is not None:
        assert len(benefit_fn.calls) == 1  # the entry test ran and nobody qualified
    np.testing.assert_array_equal(decision.arm, [1])
    np.testing.assert_array_equal(decision.controller, [GR])
    np.testing.assert_array_equal(decision.routes, [0])
    assert not decision.entered.any()
    assert decision.exp3_updated.all()
    np.testing.assert_allclose(state.exp3_log_weights, [[OFF, -1.0]])
    np.testing.assert_array_equal(state.arm, [-1])
    np.testing.assert_array_equal(state.hysteresis_target, [-1])


def _enter_episode(settings):
    """Round t = 1: a hys arm is drawn, the client enters towards cluster 1 (losses [2, 4])."""
    state = replace(AgentState.initial(1, settings), exp3_log_weights=np.array([[OFF, 0.0]]))
    stub = _stub([[np.inf, -0.5]], expected_mask=[[False, True]], expected_greedy=[0])
    state, decision = _step(state, settings, [[2.0, 4.0]], [0.9, 0.1], 1, stub)
    assert decision.entered.all() and len(stub.calls) == 1
    np.testing.assert_array_equal(decision.routes, [1])
    np.testing.assert_array_equal(decision.controller, [HYS])
    np.testing.assert_array_equal(state.hysteresis_count, [1])
    np.testing.assert_array_equal(state.hysteresis_target, [1])
    np.testing.assert_array_equal(state.arm, [1])
    assert not decision.exp3_updated.any() and not state.forced_episode.any()
    np.testing.assert_allclose(decision.feedback, [1.0])
    return state


def test_hysteresis_episode_min_rounds_then_release_with_exp3_update():
    settings = _action_settings(hysteresis_min_rounds=2, hysteresis_exit_gap=0.25, hysteresis_max_rounds=10)
    state = _enter_episode(settings)
    # t = 2: gap 0 (target is best) but d = 1 < H_min -> stays on target; f = 2/4 = 0.5.
    state, d = _step(state, settings, [[4.0, 2.0]], [0.5, 0.5], 2, _no_entry)
    np.testing.assert_array_equal(d.routes, [1])
    np.testing.assert_array_equal(d.controller, [HYS])
    assert not d.released.any() and not d.exp3_updated.any()
    np.testing.assert_array_equal(state.hysteresis_count, [2])
    # t = 3: d = 2 >= H_min but gap 5.04/4 - 1 = 0.26 > 0.25 -> stays; f = 1.
    state, d = _step(state, settings, [[4.0, 5.04]], [0.5, 0.5], 3, _no_entry)
    np.testing.assert_array_equal(d.routes, [1])
    assert not d.released.any()
    np.testing.assert_array_equal(state.hysteresis_count, [3])
    np.testing.assert_allclose(state.exp3_log_weights, [[OFF, 0.0]])
    # t = 4: gap 5/4 - 1 = 0.25 <= 0.25 -> released, executes Greedy (route 0), f = 4/5.
    state, d = _step(state, settings, [[4.0, 5.0]], [0.5, 0.5], 4, _no_entry)
    assert d.released.all() and d.exp3_updated.all()
    np.testing.assert_array_equal(d.routes, [0])
    np.testing.assert_array_equal(d.controller, [GR])
    np.testing.assert_array_equal(d.arm, [1])
    np.testing.assert_array_equal(state.hysteresis_target, [-1])
    np.testing.assert_array_equal(state.hysteresis_count, [0])
    np.testing.assert_array_equal(state.arm, [-1])
    # mean feedback over the 4 rounds of the action: (1 + 0.5 + 1 + 0.8) / 4 = 0.825; v[1] = -2 * 0.825
    np.testing.assert_allclose(state.exp3_log_weights, [[OFF, -1.65]])


def test_hysteresis_release_at_max_rounds_even_with_large_gap():
    settings = _action_settings(hysteresis_min_rounds=2, hysteresis_exit_gap=0.005, hysteresis_max_rounds=3)
    state = _enter_episode(settings)
    for t, count in ((2, 2), (3, 3)):
        state, d = _step(state, settings, [[1.0, 4.0]], [0.5, 0.5], t, _no_entry)  # gap 3
        np.testing.assert_array_equal(d.routes, [1])
        assert not d.released.any()
        np.testing.assert_array_equal(state.hysteresis_count, [count])
    state, d = _step(state, settings, [[1.0, 4.0]], [0.5, 0.5], 4, _no_entry)
    assert d.released.all()
    np.testing.assert_array_equal(d.routes, [0])
    # feedback: entry 1, then 1, 1, and 0.25 at release -> mean 0.8125; v[1] = -1.625
    np.testing.assert_allclose(state.exp3_log_weights, [[OFF, -1.625]])


def test_hysteresis_gap_with_zero_best_loss_is_infinite():
    """docs/algorithm.md, rules §5: G = ℓ_target / min ℓ - 1 is +inf when min ℓ = 0 < ℓ_target (no release)."""
    settings = _action_settings(hysteresis_min_rounds=1, hysteresis_exit_gap=0.005, hysteresis_max_rounds=100)
    state = replace(AgentState.initial(1, settings), arm=np.array([1]), hysteresis_target=np.array([1]),
                    hysteresis_count=np.array([3]))
    state, d = _step(state, settings, [[0.0, 1.0]], [0.5, 0.5], 9, _no_entry)
    assert not d.released.any(), "target loss 1 vs best 0 is an infinite gap, yet the episode was released"
    np.testing.assert_array_equal(d.routes, [1])


# ------------------------------------------------------------ synchronized entry --
def test_synchronized_entry_three_clusters():
    settings = RoutingSettings(num_clusters=3, controllers=("gr", "hys"), exp3_mode="action",
                               synchronized_entry=True, entry_threshold=-0.1, reversal_mass_threshold=0.2,
                               hysteresis_min_rounds=1, hysteresis_max_rounds=800, exp3_exploration=0.0)
    state = AgentState.initial(4, settings)
    losses0 = [[1.0, 2.0, 3.0],   # greedy 0; b = [., -0.3, -0.6] -> enters towards 2
               [1.0, 3.0, 2.0],   # greedy 0; b = [., -0.1, 0.4]  -> -0.1 <= τ, enters towards 1
               [1.0, 2.0, 2.0],   # greedy 0; b = [., 0.2, 0.05]  -> no
               [3.0, 1.0, 2.0]]   # greedy 1; only candidate 2, b = 0.5 -> no
    table = [[9.0, -0.3, -0.6], [9.0, -0.1, 0.4], [9.0, 0.2, 0.05], [9.0, 9.0, 0.5]]
    stub = _stub(table, expected_mask=[[False, True, True]] * 3 + [[False, False, True]],
                 expected_greedy=[0, 0, 0, 1])
    state, d = _step(state, settings, losses0, [0.8, 0.1, 0.1], 0, stub)
    assert len(stub.calls) == 1
    np.testing.assert_array_equal(d.routes, [2, 1, 0, 1])
    np.testing.assert_array_equal(d.entered, [True, True, False, False])
    np.testing.assert_array_equal(d.controller, [HYS, HYS, GR, GR])
    np.testing.assert_array_equal(d.arm, [-1] * 4)
    assert not d.exp3_updated.any()
    np.testing.assert_array_equal(state.forced_episode, [True, True, False, False])
    np.testing.assert_array_equal(state.hysteresis_target, [2, 1, -1, -1])
    np.testing.assert_array_equal(state.hysteresis_count, [1, 1, 0, 0])
    np.testing.assert_array_equal(state.arm, [-1] * 4)
    np.testing.assert_array_equal(state.exp3_log_weights, np.zeros((4, 2)))

    # t = 1: client 0 has gap 0 and d = 1 >= H_min -> released (Greedy, tie 0 vs 2 -> 0), no EXP3
    # update; client 1 has gap 4 -> stays; clients 2, 3 draw their first arm (no candidates: masses >= 0.2).
    losses1 = [[1.0, 2.0, 1.0], [1.0, 5.0, 2.0], [1.0, 2.0, 3.0], [2.0, 1.0, 3.0]]
    state, d = _step(state, settings, losses1, [0.25, 0.5, 0.25], 1, _no_entry)
    np.testing.assert_array_equal(d.released, [True, False, False, False])
    np.testing.assert_array_equal(d.routes[:2], [0, 1])
    np.testing.assert_array_equal(d.routes[2:], [0, 1])  # gr, or hys without entry = Greedy
    np.testing.assert_array_equal(d.controller, [GR, HYS, GR, GR])
    np.testing.assert_array_equal(d.arm[:2], [-1, -1])
    assert np.all(d.arm[2:] >= 0)
    np.testing.assert_array_equal(d.exp3_updated, [False, False, True, True])
    np.testing.assert_array_equal(state.exp3_log_weights[:2], np.zeros((2, 2)))
    np.testing.assert_array_equal(state.forced_episode, [False, True, False, False])
    np.testing.assert_array_equal(state.arm[0], -1)
    np.testing.assert_array_equal(state.hysteresis_target, [-1, 1, -1, -1])
    np.testing.assert_array_equal(state.hysteresis_count, [0, 2, 0, 0])

    # t = 2: the released client draws a new arm; the forced client still makes no draw.
    state, d = _step(state, settings, losses1, [0.25, 0.5, 0.25], 2, _no_entry)
    assert d.arm[0] >= 0 and d.arm[1] == -1
    np.testing.assert_array_equal(d.routes[1], 1)


def test_synchronized_entry_without_qualifier_is_greedy():
    settings = RoutingSettings(num_clusters=2, controllers=("gr", "hys"), exp3_mode="action",
                               synchronized_entry=True, entry_threshold=0.0)
    state, d = _step(AgentState.initial(2, settings), settings, [[1.0, 2.0], [2.0, 1.0]], [0.95, 0.05], 0,
                     _stub([[9.0, 0.2], [9.0, 9.0]], expected_mask=[[False, True], [False, False]]))
    np.testing.assert_array_equal(d.routes, [0, 1])
    assert not d.entered.any() and not state.forced_episode.any()
    np.testing.assert_array_equal(d.arm, [-1, -1])
