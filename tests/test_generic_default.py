"""The generic default (issue 10): its settings, the paper presets, and each new routing rule.

New rules, each a RoutingSettings field whose preset value keeps the paper's behaviour:
random tie-breaking, a mass threshold in fair shares with an inclusive boundary, a bound on
entry probes, and a final exploitation phase.
"""

import warnings
from dataclasses import replace

import numpy as np
import pytest

from fedroute.core import controllers as ctl
from fedroute.core.agent import CONTROLLER_INDEX, AgentState, agent_step
from fedroute.core.entry import entry_benefits, entry_candidates
from fedroute.core.randomness import Purpose, uniform
from fedroute.core.client_step import client_round, provisional_greedy_routes
from fedroute.core.settings import RoutingSettings
from fedroute.core.methods import GENERIC_DEFAULTS, PRESETS, method_settings
from support.app_config import app_run_config

GR, RH = CONTROLLER_INDEX["gr"], CONTROLLER_INDEX["rh"]


# ---------------------------------------------------------------- methods --
def test_generic_default_is_not_a_paper_preset():
    exp3 = method_settings("exp3", num_clusters=4)
    assert exp3.num_clusters == 4 and exp3.controllers == ("gr", "rh") and exp3.exp3_mode == "block"
    assert exp3.tie_breaking == "random" and exp3.exploitation_fraction == 0.0 and exp3.explore_on == "collapse"
    assert not exp3.explore_at_start and exp3.consolidate_duplicates and exp3.reseed_empty
    assert exp3.split_copies and exp3.reseed_by_structure and exp3.split_silhouette == 0.25
    assert exp3.crowded_by_clients and exp3.reseed_by_signature
    assert exp3.mass_threshold_unit == "fair-share" and exp3.mass_threshold_inclusive
    assert exp3.entry_max_candidates == GENERIC_DEFAULTS["entry_max_candidates"] > 0
    assert exp3.consolidation_loss_ratio == 2.0
    sync = method_settings("sync-entry", num_clusters=4)
    assert sync.synchronized_entry and sync.controllers == exp3.controllers
    greedy = method_settings("greedy", num_clusters=4)
    assert greedy.controllers == ("gr",) and greedy.tie_breaking == "lowest"  # Greedy IFCA stays the baseline


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("method", ["greedy", "exp3", "sync-entry", "fedcam"])
def test_presets_keep_every_paper_behaviour(method, preset):
    settings = method_settings(method, num_clusters=3, preset=preset)
    paper = RoutingSettings()
    for name in ("tie_breaking", "mass_threshold_unit", "mass_threshold_inclusive", "entry_max_candidates",
                 "exploitation_fraction", "exploitation_consolidates", "reversal_mass_threshold", "block_length",
                 "exp3_learning_rate", "exp3_exploration"):
        assert getattr(settings, name) == getattr(paper, name), name
    assert settings.num_clusters == 3


def test_presets_are_named_and_a_positional_task_is_refused():
    with pytest.raises(TypeError):
        method_settings("exp3", "gmm", num_clusters=3)
    with pytest.raises(ValueError, match="preset"):
        method_settings("exp3", preset="mnist")
    with pytest.raises(ValueError, match=r"method = 'ifca' is invalid; allowed"):
        method_settings("ifca")


def test_the_registry_names_every_method_once_and_derives_the_lists():
    from fedroute.core.methods import ALL_METHODS, METHODS, REFERENCE_METHODS, REGISTRY, method_spec
    assert METHODS == ("greedy", "exp3", "sync-entry", "fedcam")
    assert REFERENCE_METHODS == ("fedavg", "local")
    assert set(ALL_METHODS) == set(REGISTRY)
    assert method_spec("local").single_model and not method_spec("local").shared_models
    assert method_spec("sync-entry").synchronized_entry and method_settings("sync-entry").synchronized_entry
    assert not method_settings("exp3").synchronized_entry
    assert method_settings("fedavg", num_clusters=4).num_clusters == 1


# ---------------------------------------------------------------- settings --
def test_new_fields_are_validated_naming_the_field():
    for changes, field in [(dict(tie_breaking="first"), "tie_breaking"),
                           (dict(exploitation_fraction=1.0), "exploitation_fraction"),
                           (dict(exploitation_fraction=-0.1), "exploitation_fraction"),
                           (dict(mass_threshold_unit="share"), "mass_threshold_unit"),
                           (dict(mass_threshold_inclusive=1), "mass_threshold_inclusive"),
                           (dict(exploitation_consolidates="yes"), "exploitation_consolidates"),
                           (dict(consolidation_loss_ratio=0.5), "consolidation_loss_ratio"),
                           (dict(consolidation_loss_ratio=float("nan")), "consolidation_loss_ratio"),
                           (dict(consolidation_loss_ratio="2"), "consolidation_loss_ratio"),
                           (dict(entry_max_candidates=-1), "entry_max_candidates"),
                           (dict(entry_max_candidates=1.5), "entry_max_candidates"),
                           (dict(mass_threshold_unit="fair-share", num_clusters=3, reversal_mass_threshold=3.5),
                            "reversal_mass_threshold")]:
        with pytest.raises(ValueError, match=f"'{field}'"):
            RoutingSettings(**changes)
    assert RoutingSettings(mass_threshold_unit="fair-share", num_clusters=3, reversal_mass_threshold=3.0)


def test_underused_mass_scales_with_the_fair_share_and_round_trips():
    settings = RoutingSettings(num_clusters=8, mass_threshold_unit="fair-share", reversal_mass_threshold=0.4,
                               mass_threshold_inclusive=True, tie_breaking="random", exploitation_fraction=0.25,
                               entry_max_candidates=2, exploitation_consolidates=True)
    assert settings.underused_mass == pytest.approx(0.05)
    assert RoutingSettings(reversal_mass_threshold=0.2).underused_mass == 0.2
    assert RoutingSettings.from_dict(settings.to_dict()) == settings
    assert [settings.exploitation_start(t) for t in (1, 4, 10, 100)] == [1, 3, 7, 75]


# ---------------------------------------------------------------- ties --
def test_random_ties_split_exactly_tied_clients_uniformly():
    losses = np.array([[1.0, 1.0, 1.0, 2.0], [3.0, 1.0, 1.0, 1.0], [2.0, 0.5, 1.0, 3.0]])
    u = np.array([0.9, 0.0, 0.99])
    np.testing.assert_array_equal(ctl.greedy_routes(losses, u), [2, 1, 1])  # ⌊0.9·3⌋ = 2nd tied; no tie: argmin
    np.testing.assert_array_equal(ctl.greedy_routes(losses), [0, 1, 1])
    many = np.ones((3000, 3))
    counts = np.bincount(ctl.greedy_routes(many, uniform(5, np.arange(3000), 0, Purpose.TIE)), minlength=3)
    assert counts.min() > 900  # about a third each


def test_identical_models_split_the_clients_in_the_agent_and_the_provisional_report():
    class Clients:  # every model has the same loss for every client
        client_ids = np.arange(40)
        groups = np.zeros(40, dtype=np.int64)
        num_examples = np.ones(40)

        def losses(self, models, split="train"):
            return np.ones((40, len(models)))

        def local_update(self, models, index, t):
            return models + 1.0

    settings = replace(method_settings("exp3", num_clusters=3), controllers=("gr",))
    models = np.zeros((3, 2))
    result = client_round(Clients(), AgentState.initial(40, settings), settings, models, None, 0, 7, num_rounds=10)
    assert set(result.decision.routes.tolist()) == {0, 1, 2}
    provisional = provisional_greedy_routes(Clients(), models, settings, 7)
    np.testing.assert_array_equal(provisional, result.decision.routes)  # the same round-0 draw
    paper = client_round(Clients(), AgentState.initial(40, settings), RoutingSettings(num_clusters=3,
                         controllers=("gr",)), models, None, 0, 7)
    assert set(paper.decision.routes.tolist()) == {0}  # the paper's ties: lowest index, for everyone


# ---------------------------------------------------------------- entry --
def test_inclusive_fair_share_threshold_counts_a_cluster_at_exactly_the_threshold():
    masses = np.array([3 / 5, 1 / 5, 1 / 5])  # the stuck plugin case, 15 clients
    greedy = np.array([0, 0])
    settings = RoutingSettings(num_clusters=3, mass_threshold_unit="fair-share", reversal_mass_threshold=0.6)
    assert settings.underused_mass == 0.6 / 3 != 0.2  # 0.19999999999999998: the slack matters
    inclusive = entry_candidates(masses, greedy, settings.underused_mass, inclusive=True)
    np.testing.assert_array_equal(inclusive, [[False, True, True]] * 2)
    assert not entry_candidates(masses, greedy, 0.2).any()  # the paper's strict μ < 0.2


def test_entry_probes_are_bounded_lightest_first_then_lowest_loss():
    masses = np.array([0.9, 0.0, 0.05, 0.0, 0.05, 0.0, 0.0, 0.0])
    losses = np.array([[1.0, 5.0, 1.0, 4.0, 0.5, 3.0, 3.0, 2.0]])
    kept = entry_candidates(masses, np.array([0]), 0.1, max_candidates=3, losses=losses)
    np.testing.assert_array_equal(np.flatnonzero(kept[0]), [5, 6, 7])  # mass 0 first; loss 2 < 3 = 3 (index)
    assert entry_candidates(masses, np.array([0]), 0.1).sum() == 7
    calls = []

    def probe(models, index, t):
        calls.append(len(index))
        return models + 1.0

    entry_benefits(np.zeros((8, 2)), kept, np.array([0]), probe, 0)
    assert calls == [3]  # one probe update per kept candidate, K = 8 notwithstanding


def test_agent_entry_uses_the_bounded_candidates():
    settings = RoutingSettings(num_clusters=8, controllers=("gr", "hys"), exp3_mode="action", exp3_exploration=0.0,
                               mass_threshold_unit="fair-share", reversal_mass_threshold=1.0,
                               mass_threshold_inclusive=True, entry_max_candidates=2)
    state = replace(AgentState.initial(1, settings), exp3_log_weights=np.array([[-1000.0, 0.0]]))
    seen = []

    def benefit_fn(mask, greedy):
        seen.append(mask.copy())
        return np.where(mask, 0.5, np.inf)

    agent_step(state, settings, np.arange(8.0)[None] + 1, np.full(8, 1 / 8), 3, np.array([0]), 0, benefit_fn)
    assert seen and seen[0].sum() == 2 and not seen[0][0, 0]


# ---------------------------------------------------------------- exploitation --
def test_exploitation_phase_is_greedy_without_arms_updates_or_episodes():
    settings = RoutingSettings(num_clusters=3, controllers=("gr", "rh"), exp3_exploration=0.0, block_length=4,
                               exploitation_fraction=0.5)
    state = replace(AgentState.initial(2, settings), exp3_log_weights=np.array([[-1000.0, 0.0]] * 2),
                    hysteresis_target=np.array([2, -1]), hysteresis_count=np.array([3, 0]),
                    arm=np.array([1, 1]), feedback_sum=np.array([0.5, 0.5]), feedback_rounds=np.array([1, 1]))
    losses = np.array([[3.0, 1.0, 2.0], [1.0, 2.0, 3.0]])
    explored, decision = agent_step(state, settings, losses, None, 4, np.arange(2), 0, num_rounds=10)
    assert (decision.controller == RH).all()  # t = 4 < 5: still exploring (Rank Hedge drawn)
    new_state, decision = agent_step(state, settings, losses, None, 5, np.arange(2), 0, num_rounds=10)
    np.testing.assert_array_equal(decision.routes, [1, 0])
    assert (decision.controller == GR).all() and (decision.arm == -1).all() and not decision.exp3_updated.any()
    np.testing.assert_array_equal(decision.released, [True, False])
    np.testing.assert_array_equal(new_state.exp3_log_weights, state.exp3_log_weights)
    assert (new_state.arm == -1).all() and (new_state.hysteresis_target == -1).all()
    with pytest.raises(ValueError, match="num_rounds"):
        agent_step(state, settings, losses, None, 5, np.arange(2), 0)


def test_merged_clusters_are_left_for_a_twin_that_is_close_relative_to_the_third_cluster():
    """``relative`` (the merged duplicates): the halves of a split group memorise their few clients, so a client's
    twin is several times its own loss (above ρ = 2) yet close against another group's model; it then follows
    the merge.  A twin as far as the third cluster, or a third cluster itself close, keeps the client where it is."""
    losses = np.array([[0.02, 0.09, 3.0, 5.0],      # twin 4.5x, third 150x: the same group's other half -> leave
                       [0.02, 0.50, 0.6, 5.0],      # twin 25x, third 30x: not its group's half -> stay
                       [0.02, 0.03, 3.0, 5.0],      # twin within ρ: leaves either way
                       [0.02, 0.09, 0.035, 5.0]])   # a third cluster within ρ: ambiguous -> Greedy without 0
    merged = np.array([True, False, False, False])
    absolute = ctl.consolidating_greedy_routes(losses, merged, loss_ratio=2.0)
    np.testing.assert_array_equal(absolute, [0, 0, 1, 2])
    np.testing.assert_array_equal(ctl.consolidating_greedy_routes(losses, merged, loss_ratio=2.0, relative=True),
                                  [1, 0, 1, 2])
    # no third cluster to measure against (K = 2): the absolute guard alone
    np.testing.assert_array_equal(ctl.consolidating_greedy_routes(losses[:, :2], merged[:2], loss_ratio=2.0,
                                                                  relative=True), [0, 0, 1, 0])


def test_consolidating_greedy_skips_spare_clusters_unless_every_cluster_is_spare():
    losses = np.array([[1.0, 2.0, 3.0], [1.0, 2.0, 3.0], [3.0, 1.0, 1.0], [2.0, 1.0, 3.0]])
    spare = np.array([[True, False, False], [False, False, False], [False, True, False], [True, True, True]])
    # row 0: its best (0) is spare -> next best 1; row 1: nothing spare -> Greedy; row 2: the tie 1/2 is
    # resolved among the non-spare only; row 3: every cluster spare -> plain Greedy.
    np.testing.assert_array_equal(ctl.consolidating_greedy_routes(losses, spare), [1, 0, 2, 1])
    uniforms = np.array([0.9, 0.9, 0.0, 0.9])
    np.testing.assert_array_equal(ctl.consolidating_greedy_routes(losses, spare, uniforms), [1, 0, 2, 1])
    # the guard: row 0's next best (2.0) is 2x its best (1.0) -> skipped at ratio 2, kept at ratio 1.5;
    # row 2's alternatives are tied with its best -> skipped either way
    np.testing.assert_array_equal(ctl.consolidating_greedy_routes(losses, spare, loss_ratio=2.0), [1, 0, 2, 1])
    np.testing.assert_array_equal(ctl.consolidating_greedy_routes(losses, spare, loss_ratio=1.5), [0, 0, 2, 1])
    # a (K,) mask applies to every client
    np.testing.assert_array_equal(ctl.consolidating_greedy_routes(losses, np.array([True, False, False])),
                                  [1, 1, 1, 1])  # row 2: tie 1/2 after skipping 0, lowest index


@pytest.mark.parametrize("consolidates", [True, False])
def test_exploitation_phase_consolidates_the_clients_left_on_an_underused_cluster(consolidates):
    settings = RoutingSettings(num_clusters=3, controllers=("gr", "rh"), exploitation_fraction=0.5,
                               mass_threshold_unit="fair-share", reversal_mass_threshold=0.4,
                               mass_threshold_inclusive=True, exploitation_consolidates=consolidates)
    state = AgentState.initial(3, settings)
    losses = np.array([[1.0, 1.1, 5.0], [2.0, 1.0, 5.0], [5.0, 5.0, 1.0]])
    masses = np.array([0.1, 0.6, 0.3])  # cluster 0 at 0.1 ≤ 0.4/3: underused
    _, decision = agent_step(state, settings, losses, masses, 5, np.arange(3), 0, num_rounds=10)
    np.testing.assert_array_equal(decision.routes, [1, 1, 2] if consolidates else [0, 1, 2])
    # the guard: client 0's alternative (1.1) is above 1.05 x its best (1.0): it stays on cluster 0
    _, guarded = agent_step(state, replace(settings, consolidation_loss_ratio=1.05), losses, masses, 5,
                            np.arange(3), 0, num_rounds=10)
    np.testing.assert_array_equal(guarded.routes, [0, 1, 2])
    # no masses yet (t = 0 of a run that starts in the phase): plain Greedy
    _, first = agent_step(state, settings, losses, None, 5, np.arange(3), 0, num_rounds=10)
    np.testing.assert_array_equal(first.routes, [0, 1, 2])


def test_sync_entry_in_block_mode_starts_its_first_block_at_round_one():
    settings = replace(method_settings("sync-entry", num_clusters=2, explore_at_start=True), exp3_exploration=0.0,
                       block_length=5)
    state = replace(AgentState.initial(1, settings), exp3_log_weights=np.array([[-1000.0, 0.0]]))
    losses = np.array([[1.0, 2.0]])

    def no_entry(mask, greedy):
        return np.full(mask.shape, np.inf)

    state, decision = agent_step(state, settings, losses, np.array([0.5, 0.5]), 0, np.array([0]), 0, no_entry, 100)
    assert decision.arm[0] == -1  # the entry round: the provisional Greedy route
    state, decision = agent_step(state, settings, losses, np.array([0.5, 0.5]), 1, np.array([0]), 0, no_entry, 100)
    assert decision.arm[0] == 1 and decision.controller[0] == RH  # not a Greedy wait until t = 5


# ---------------------------------------------------------------- run config --
def test_run_config_preset_auto_keeps_the_paper_tasks_on_their_presets():
    from fedroute.server.run_config import parse_run_config

    paper = parse_run_config(app_run_config(task="linear"))
    assert paper.routing["exp3"] == method_settings("exp3", num_clusters=2, preset="linear")
    assert paper.routing["sync-entry"] == method_settings("sync-entry", num_clusters=2, preset="linear")
    own = parse_run_config(app_run_config(task="boundaries", **{"num-clusters": 3}))
    assert own.routing["exp3"] == method_settings("exp3", num_clusters=3)  # not a paper task: generic
    generic = parse_run_config(app_run_config(task="linear", preset="generic"))
    assert generic.routing["exp3"] == method_settings("exp3", num_clusters=2)
    chosen = parse_run_config(app_run_config(task="boundaries", preset="characters"))
    assert chosen.routing["exp3"] == method_settings("exp3", preset="characters")


def test_run_config_new_routing_keys_are_validated_naming_the_key():
    from fedroute.server.run_config import parse_run_config

    settings = parse_run_config(app_run_config(preset="generic", **{
        "tie-breaking": "lowest", "exploitation-fraction": 0.25, "mass-threshold-inclusive": False,
        "mass-threshold-unit": "mass", "reversal-mass-threshold": 0.3, "entry-max-candidates": 0,
        "exploitation-consolidates": False, "consolidation-loss-ratio": 3.0}))
    exp3 = settings.routing["exp3"]
    assert (exp3.tie_breaking, exp3.exploitation_fraction, exp3.mass_threshold_inclusive, exp3.underused_mass,
            exp3.entry_max_candidates, exp3.exploitation_consolidates, exp3.consolidation_loss_ratio
            ) == ("lowest", 0.25, False, 0.3, 0, False, 3.0)
    assert parse_run_config(app_run_config(preset="generic")).routing["exp3"].consolidate_duplicates
    for key, value in [("preset", "mnist"), ("exploitation-fraction", 1.0), ("mass-threshold-inclusive", "yes"),
                       ("exploitation-consolidates", "yes"), ("exploitation-consolidates", 1),
                       ("consolidation-loss-ratio", 0.5),
                       ("tie-breaking", "first"), ("entry-max-candidates", -1)]:
        with pytest.raises(ValueError, match=f"'{key}'"):
            parse_run_config(app_run_config(**{key: value}))


# ---------------------------------------------------------------- strategy --
def test_strategy_refuses_an_exploitation_phase_without_the_number_of_rounds():
    """The phase needs T; ``start(num_rounds=T)`` broadcasts it (``num-rounds``, covered by the Flower runs)."""
    from flwr.app import ConfigRecord

    from fedroute.strategies.clustered import ClusteredRouting
    from fedroute.strategies.records import pack_cluster_models

    class Grid:
        def get_node_ids(self):
            return [1, 2]

    models = [{"weights": np.zeros(3)} for _ in range(2)]
    strategy = ClusteredRouting(method_settings("exp3", num_clusters=2, exploitation_fraction=0.25),
                                min_available_nodes=2)
    with pytest.raises(ValueError, match="num_rounds=T"):
        strategy.configure_train(1, pack_cluster_models(models), ConfigRecord(), Grid())
