"""Property tests of the influence bounds and the client–node bindings (issue 11, "Done when").

One adversarial node among ten (any ``num-examples`` in the accepted range,
any finite model values, any cluster), nine honest ones; for ``ClusteredRouting``
and ``FedCAM``:

1. every cluster model, FedCAM's global part and the masses stay finite;
2. under default settings the node's share of its cluster's weight and of the
   masses is at most the documented cap (measured from the outputs, by
   linearity, not recomputed with the implementation's formula);
3. with the robust rule (median, trimmed mean) its cluster stays within the
   coordinate-wise range of the honest replies in that cluster;
4. with an update-norm bound no cluster moves further than the bound;

and for the bindings: spoofed replies (another node claiming a bound client
id, in any order among the honest replies) are rejected with both node ids and
never change a model.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fedroute.core.settings import RoutingSettings
from fedroute.strategies.clustered import ClusteredRouting
from fedroute.strategies.fedcam import FedCAM
from fedroute.core.influence import (
    DEFAULT_MAX_WEIGHT_RATIO,
    InfluenceBounds,
    aggregate_round,
    capped_weights,
    clip_updates,
    robust_update,
)
from fedroute.strategies.validation import MAX_NUM_EXAMPLES, MIN_NUM_EXAMPLES
from support.replies import OnlineNodes, reply

CAP = DEFAULT_MAX_WEIGHT_RATIO
SIZE = 3
PROPERTIES = settings(max_examples=150, deadline=None, database=None,
                      suppress_health_check=[HealthCheck.too_slow])

_FINITE = st.floats(allow_nan=False, allow_infinity=False)
_CLAIMS = st.one_of(st.floats(MIN_NUM_EXAMPLES, MAX_NUM_EXAMPLES), st.integers(1, MAX_NUM_EXAMPLES),
                    st.sampled_from([MIN_NUM_EXAMPLES, MAX_NUM_EXAMPLES]))


@st.composite
def rounds(draw: st.DrawFn, extreme: bool) -> dict[str, Any]:
    """Nine honest replies (equal n, moderate values) and one adversary (any claim, any cluster)."""
    num_clusters = draw(st.integers(2, 4))
    honest_n = draw(st.integers(1, 10**6))
    honest_routes = draw(st.lists(st.integers(0, num_clusters - 1), min_size=9, max_size=9))
    honest_values = draw(st.lists(st.lists(st.floats(-10, 10), min_size=SIZE, max_size=SIZE), min_size=9, max_size=9))
    values = _FINITE if extreme else st.floats(-1e6, 1e6)
    return {
        "num_clusters": num_clusters,
        "honest_n": honest_n,
        "honest_routes": honest_routes,
        "honest_values": np.array(honest_values),
        "adversary_cluster": draw(st.integers(0, num_clusters - 1)),
        "adversary_n": draw(_CLAIMS),
        "adversary_values": np.array(draw(st.lists(values, min_size=SIZE, max_size=SIZE))),
        "position": draw(st.integers(0, 9)),
    }


def _strategy(kind: type, num_clusters: int, **kwargs: Any) -> ClusteredRouting:
    made = kind(RoutingSettings(num_clusters=num_clusters, controllers=("gr",)), **kwargs)
    made.cluster_models = [{"w": np.full(SIZE, float(k))} for k in range(num_clusters)]
    made._num_rounds = 5
    return made


def _run(case: dict[str, Any], kind: type, adversary_values: np.ndarray, **kwargs: Any) -> ClusteredRouting:
    from flwr.app import Array, ArrayRecord

    fedcam = kind is FedCAM
    messages = [reply(100 + i, i, route, case["honest_n"], 0.0,
                      model=ArrayRecord({"w": Array(case["honest_values"][i])}),
                      metrics=_metrics(i, route, case["honest_n"], case["num_clusters"]))
                for i, route in enumerate(case["honest_routes"])]
    adversary = reply(999, 9, case["adversary_cluster"], case["adversary_n"], 0.0,
                      model=ArrayRecord({"w": Array(adversary_values)}),
                      metrics=_metrics(9, case["adversary_cluster"], case["adversary_n"], case["num_clusters"]))
    messages.insert(case["position"], adversary)
    if fedcam:  # global parts: the same values as the cluster parts
        for message in messages:
            message.content["global-model"] = ArrayRecord({"w": Array(message.content["model"]["w"].numpy())})
    made = _strategy(kind, case["num_clusters"], **kwargs)
    made.aggregate_train(1, messages)
    assert made.history[-1]["num_replies"] == 10 and made.rejected == []
    return made


def _metrics(client_id: int, cluster: int, num_examples: Any, num_clusters: int) -> dict[str, Any]:
    from fedroute import protocol

    return {protocol.CLUSTER: cluster, protocol.CLIENT_ID: client_id, protocol.NUM_EXAMPLES: num_examples,
            protocol.LOSSES: [0.5] * num_clusters,
            protocol.ROUTE_DISTRIBUTION: [float(k == cluster) for k in range(num_clusters)]}


def _honest_in(case: dict[str, Any], cluster: int) -> np.ndarray:
    return case["honest_values"][np.array(case["honest_routes"]) == cluster]


# --------------------------------------------------------------------------- 1. finite, whatever the claim
@pytest.mark.parametrize("kind", [ClusteredRouting, FedCAM])
@pytest.mark.parametrize("rule", ["weighted-mean", "median", "trimmed-mean"])
def test_models_and_masses_stay_finite(kind: type, rule: str) -> None:
    @PROPERTIES
    @given(case=rounds(extreme=True))
    def run(case: dict[str, Any]) -> None:
        made = _run(case, kind, case["adversary_values"], influence=InfluenceBounds(aggregation=rule))
        assert all(np.all(np.isfinite(model["w"])) for model in made.cluster_models)
        assert np.all(np.isfinite(made.routing_masses)) and made.routing_masses.sum() == pytest.approx(1.0)
        if kind is FedCAM:
            assert np.all(np.isfinite(made.global_model["w"]))
        for cluster in set(range(case["num_clusters"])) - set(case["honest_routes"]) - {case["adversary_cluster"]}:
            np.testing.assert_array_equal(made.cluster_models[cluster]["w"], float(cluster))  # untouched

    run()


# --------------------------------------------------------------------------- 2. the share is capped
@pytest.mark.parametrize("kind", [ClusteredRouting, FedCAM])
def test_one_node_of_ten_holds_at_most_the_documented_share(kind: type) -> None:
    """Share of its cluster ≤ c/(c+h) (h honest replies there), of the masses and of Θ_glob ≤ c/(c+9)."""
    @PROPERTIES
    @given(case=rounds(extreme=False))
    def run(case: dict[str, Any]) -> None:
        shifted = case["adversary_values"] + 1.0
        base, moved = _run(case, kind, case["adversary_values"]), _run(case, kind, shifted)
        cluster = case["adversary_cluster"]
        honest_here = len(_honest_in(case, cluster))
        # The models are linear in the adversary's values: the shift moves them by share × 1.
        share = np.mean(moved.cluster_models[cluster]["w"] - base.cluster_models[cluster]["w"])
        assert share <= CAP / (CAP + honest_here) + 1e-6
        if kind is FedCAM:
            global_share = np.mean(moved.global_model["w"] - base.global_model["w"])
            assert global_share <= CAP / (CAP + 9) + 1e-6
        # Masses: a cluster j the adversary did not route to keeps H_j / (S + a) of H_j / S.
        honest_mass = np.bincount(case["honest_routes"], minlength=case["num_clusters"]) / 9
        others = [j for j in range(case["num_clusters"]) if j != cluster and honest_mass[j] > 0]
        if others:
            mass_share = 1.0 - base.routing_masses[others[0]] / honest_mass[others[0]]
            assert mass_share <= CAP / (CAP + 9) + 1e-9
        if case["adversary_n"] <= case["honest_n"]:  # an honest-sized claim is not capped
            expected = case["adversary_n"] / (case["adversary_n"] + honest_here * case["honest_n"])
            assert share == pytest.approx(expected, abs=1e-6)

    run()


# --------------------------------------------------------------------------- 3. the robust rules
@pytest.mark.parametrize("kind", [ClusteredRouting, FedCAM])
@pytest.mark.parametrize("rule", ["median", "trimmed-mean"])
def test_with_the_robust_rule_a_cluster_stays_within_its_honest_range(kind: type, rule: str) -> None:
    @PROPERTIES
    @given(case=rounds(extreme=True).filter(
        lambda case: np.sum(np.array(case["honest_routes"]) == case["adversary_cluster"]) >= 4))
    def run(case: dict[str, Any]) -> None:
        made = _run(case, kind, case["adversary_values"], influence=InfluenceBounds(aggregation=rule))
        cluster = case["adversary_cluster"]
        honest = _honest_in(case, cluster)  # ≥ 4: the cluster has ≥ 5 replies, so β = 0.2 trims one per end
        value = made.cluster_models[cluster]["w"]
        assert np.all(value >= honest.min(axis=0) - 1e-9) and np.all(value <= honest.max(axis=0) + 1e-9)
        if kind is FedCAM:  # Θ_glob over all ten replies
            glob = made.global_model["w"]
            everyone = case["honest_values"]
            assert np.all(glob >= everyone.min(axis=0) - 1e-9) and np.all(glob <= everyone.max(axis=0) + 1e-9)

    run()


def test_the_robust_rules_are_flowers() -> None:
    """Median = numpy's median (Flower's FedMedian); trimmed mean = Flower's ``trim_mean``, per cluster."""
    from flwr.serverapp.strategy.fedtrimmedavg import trim_mean

    rng = np.random.default_rng(0)
    clusters, replies = rng.normal(size=(2, 4)), rng.normal(size=(7, 4))
    routes = np.array([0, 0, 0, 1, 1, 1, 1])
    median, _ = robust_update(clusters, replies, routes, "median")
    trimmed, _ = robust_update(clusters, replies, routes, "trimmed-mean", 0.25)
    for cluster in (0, 1):
        np.testing.assert_array_equal(median[cluster], np.median(replies[routes == cluster], axis=0))  # numpy's own
        # fedroute's copy of Flower's operations (fedroute.core imports no Flower): equal to float64 rounding,
        # should either side come to add the kept values in another order.
        np.testing.assert_allclose(trimmed[cluster], trim_mean(replies[routes == cluster], 0.25), rtol=1e-14,
                                   atol=1e-15)


@pytest.mark.parametrize("rule", ["median", "trimmed-mean"])
def test_the_robust_rules_do_not_overflow(rule: str) -> None:
    """The mean of the middle values of two huge replies overflows; it is taken over scaled values."""
    huge = np.full((2, SIZE), 1.7e308)
    updated, non_finite = robust_update(np.zeros((1, SIZE)), huge, np.zeros(2, dtype=np.int64), rule)
    np.testing.assert_allclose(updated[0], 1.7e308, rtol=1e-15)
    assert not non_finite[0]


# --------------------------------------------------------------------------- 4. the update-norm bound
@given(models=st.lists(st.lists(_FINITE, min_size=SIZE, max_size=SIZE), min_size=1, max_size=6),
       reference=st.lists(st.floats(-1e3, 1e3), min_size=SIZE, max_size=SIZE),
       bound=st.floats(1e-3, 1e3))
@PROPERTIES
def test_clipped_updates_stay_within_the_norm_bound(models: list, reference: list, bound: float) -> None:
    models, reference = np.array(models), np.array(reference)
    references = np.tile(reference, (len(models), 1))
    clipped = clip_updates(models, references, bound)
    assert np.all(np.isfinite(clipped))
    distance = np.linalg.norm(clipped - references, axis=1)
    assert np.all(distance <= bound * (1 + 1e-9) + 1e-9)
    with np.errstate(over="ignore"):  # the test's own norm of far-away models may overflow (to inf: "far")
        near = np.linalg.norm(models / 2 - references / 2, axis=1) * 2 <= bound
    np.testing.assert_array_equal(clipped[near], models[near])  # within the bound: untouched
    outcome = aggregate_round(reference[None, :], models, np.zeros(len(models), dtype=np.int64),
                              np.ones(len(models)), InfluenceBounds(max_update_norm=bound))
    assert np.linalg.norm(outcome.models[0] - reference) <= bound * (1 + 1e-9) + 1e-9


# --------------------------------------------------------------------------- the cap itself
@given(claims=st.lists(_CLAIMS, min_size=1, max_size=30), ratio=st.floats(1.0, 100.0))
@PROPERTIES
def test_the_cap_binds_only_above_ratio_times_the_lower_median(claims: list, ratio: float) -> None:
    claims = np.array(claims, dtype=np.float64)
    weights = capped_weights(claims, ratio)
    lower_median = np.sort(claims)[(len(claims) - 1) // 2]
    assert np.all(weights <= ratio * lower_median) and np.all(weights <= claims)
    unaffected = claims <= ratio * lower_median
    np.testing.assert_array_equal(weights[unaffected], claims[unaffected])  # the same floats
    assert capped_weights(claims, math.inf) is not None and np.array_equal(capped_weights(claims, math.inf), claims)


@pytest.mark.parametrize(("field", "value"), [
    ("max_weight_ratio", 0.5), ("max_weight_ratio", math.nan), ("max_weight_ratio", True),
    ("max_update_norm", 0.0), ("max_update_norm", math.inf), ("aggregation", "mean"), ("trim_fraction", 0.5),
])
def test_bad_bounds_are_refused_naming_the_field(field: str, value: Any) -> None:
    with pytest.raises(ValueError, match=f"'{field}'"):
        InfluenceBounds(**{field: value})


# --------------------------------------------------------------------------- identity
@st.composite
def spoofing_rounds(draw: st.DrawFn) -> dict[str, Any]:
    """Round 1 binds clients 0–4 to nodes 100–104; later rounds mix honest replies with spoofs."""
    later = []
    for _ in range(draw(st.integers(1, 3))):
        honest = draw(st.lists(st.integers(0, 4), unique=True, max_size=5))
        spoofs = draw(st.lists(st.tuples(st.integers(200, 203), st.integers(0, 4)), max_size=6))
        order = draw(st.permutations(range(len(honest) + len(spoofs))))
        entries = [("honest", 100 + client, client) for client in honest] + [("spoof", node, c) for node, c in spoofs]
        later.append([entries[i] for i in order])
    return {"later": later}


@given(case=spoofing_rounds())
@PROPERTIES
def test_spoofed_replies_never_count(case: dict[str, Any]) -> None:
    made = _strategy(ClusteredRouting, 2)
    made.state.grid = OnlineNodes({100, 101, 102, 103, 104, 200, 201, 202, 203})
    made.aggregate_train(1, [reply(100 + c, c, 0, 10, 1.0) for c in range(5)])
    for offset, entries in enumerate(case["later"]):
        server_round = 2 + offset
        before = len(made.rejected)
        value = float(server_round)
        made.aggregate_train(server_round, [
            reply(node, client, 0, 10, value if kind == "honest" else -1e6, server_round=server_round)
            for kind, node, client in entries])
        honest = sorted(client for kind, _, client in entries if kind == "honest")
        spoofs = [(node, client) for kind, node, client in entries if kind == "spoof"]
        assert sorted(made.client_routes[server_round - 1]) == honest
        if honest:
            np.testing.assert_array_equal(made.cluster_models[0]["w"], value)
        new = made.rejected[before:]
        assert len(new) == len(spoofs)
        for entry, (node, client) in zip(new, spoofs):
            assert entry["node_id"] == node
            assert f"node {node}" in entry["reason"] and f"node {100 + client}" in entry["reason"]
    assert made.bindings.as_mapping() == {c: 100 + c for c in range(5)}
