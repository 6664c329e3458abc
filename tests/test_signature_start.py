"""The signature start in both runtimes: collect, part, hold, join late; Flower ≡ simulator; bad signatures."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest
from flwr.app import ConfigRecord, MessageType, MetricRecord

from fedroute import protocol
from fedroute.client.received import routing_config
from fedroute.core.agent import AgentState, agent_step
from fedroute.core.federation import FederationState
from fedroute.core.methods import method_settings
from fedroute.core.participation import Participation
from fedroute.core.server_step import ServerState, server_init
from fedroute.core.settings import RoutingSettings
from fedroute.core.signature_start import (Signatures, SignatureState, active_runs, collect_rounds, held_routes,
                                           hold_rounds, parting_report, signature_orders, signature_step,
                                           wants_signature)
from fedroute.core.signatures import (batch_class_means, labelled_signature, refined_parts, sketch_matrix,
                                      sketched_signatures)
from fedroute.server.run_config import parse_run_config
from fedroute.simulation.simulator import simulate
from fedroute.strategies.clustered import ClusteredRouting
from fedroute.strategies.reply_fields import signature_metrics
from fedroute.strategies.reply_text import ReplyRejected
from support.app_config import app_run_config
from support.builtin_runs import builtin_nodes, builtin_run
from support.grid import InProcessGrid

pytestmark = pytest.mark.usefixtures("task_identity")


def _group_signatures(groups: np.ndarray, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Signatures of clients whose classes look alike within a group, each client holding its own label mix."""
    rng = np.random.default_rng(seed)
    num_classes, dim = 4, 8
    looks = rng.normal(size=(groups.max() + 1, num_classes, dim))
    means = looks[groups] + 0.05 * rng.normal(size=(len(groups), num_classes, dim))
    counts = rng.integers(0, 30, size=(len(groups), num_classes)).astype(float)
    counts[:, 0] = 10                                                   # every client holds class 0
    return means, counts


def _federation(client_ids: np.ndarray, routes: np.ndarray) -> FederationState:
    state = FederationState.of_clients(client_ids, 2)
    return state.record(np.arange(len(client_ids)), 0, routes, routes, np.ones(len(client_ids)))


SETTINGS = RoutingSettings(num_clusters=2, controllers=("gr",), signature_hold_rounds=3)
COPIES = np.zeros((2, 3))
"""``W^0``: two copies of one model (the signature start acts, ``signature_start_on = "copies"``)."""


def test_the_parts_follow_the_groups_and_each_goes_to_the_cluster_its_clients_routed_to() -> None:
    groups = np.array([0, 1, 0, 1, 0, 1, 0, 1])
    means, counts = _group_signatures(groups)
    routes = np.where(groups == 0, 1, 0)                                # group 0 routed to cluster 1
    federation = _federation(np.arange(8), routes)
    state = signature_step(SignatureState.initial(8, 1), federation, np.arange(8),
                           Signatures(np.arange(8), means, counts), 0, COPIES, 1, SETTINGS, Participation())
    assert state.parted_round.tolist() == [0]
    assert state.held.tolist() == routes.tolist()
    # Held in rounds 1..3 (h = 3 with every client every round), free from round 4.
    for t, expected in ((0, None), (1, routes), (3, routes), (4, None)):
        held = held_routes(state, np.arange(8), np.zeros(8, np.int64), t, SETTINGS, Participation())
        assert (held is None) if expected is None else held.tolist() == expected.tolist(), t
    assert not wants_signature(state, np.arange(8), np.zeros(8, np.int64), 1, SETTINGS, Participation()).any()


def test_under_partial_participation_it_waits_for_the_first_rounds_and_a_late_client_joins_its_group() -> None:
    participation = Participation(0.25, 2)
    assert collect_rounds(participation) == 4 and hold_rounds(SETTINGS, participation) == 12
    groups = np.array([0, 1, 0, 1, 0, 1, 0, 1, 0, 1])
    means, counts = _group_signatures(groups, seed=1)
    federation = _federation(np.arange(10), np.where(groups == 0, 0, 1))
    state = SignatureState.initial(10, 1)
    for t, rows in enumerate(([0, 1], [2, 3], [4], [5, 6])):            # 7 clients in the first 4 rounds
        rows = np.array(rows)
        state = signature_step(state, federation, rows, Signatures(np.arange(len(rows)), means[rows], counts[rows]),
                               t, COPIES, 1, SETTINGS, participation)
        assert state.parted_round[0] == (3 if t == 3 else -1)
    assert state.held[:7].tolist() == groups[:7].tolist() and state.held[7:].tolist() == [-1] * 3
    late = np.array([9, 8])
    state = signature_step(state, federation, late, Signatures(np.arange(2), means[late], counts[late]), 5, COPIES, 1,
                           SETTINGS, participation)
    assert state.held.tolist()[:10] == groups.tolist()[:7] + [-1, 0, 1]
    # Held through round 3 + 12 = 15; client 7 (no signature yet) is free and asked for it.
    held = held_routes(state, np.arange(10), np.zeros(10, np.int64), 15, SETTINGS, participation)
    assert held.tolist() == groups[:7].tolist() + [-1, 0, 1]
    assert held_routes(state, np.arange(10), np.zeros(10, np.int64), 16, SETTINGS, participation) is None
    asked = wants_signature(state, np.arange(10), np.zeros(10, np.int64), 6, SETTINGS, participation)
    assert asked.tolist() == [False] * 7 + [True, False, False]


def test_refinement_moves_a_misplaced_client_to_its_most_similar_part_and_never_empties_a_part() -> None:
    groups = np.array([0, 0, 0, 1, 1, 1])
    similarity = np.where(groups[:, None] == groups[None, :], 0.9, -0.2)
    assert refined_parts(similarity, np.array([0, 0, 1, 1, 1, 1])).tolist() == groups.tolist()
    assert refined_parts(similarity, groups).tolist() == groups.tolist()          # a fixed point stays
    lone = np.array([0, 1, 1, 1, 1, 1])                                            # moving client 0 empties part 0
    assert refined_parts(np.where(np.eye(6, dtype=bool), 1.0, 0.5), lone).tolist() == lone.tolist()


def test_no_parting_before_k_clients_have_sent_a_signature() -> None:
    means, counts = _group_signatures(np.array([0]))
    state = signature_step(SignatureState.initial(1, 1), _federation(np.arange(1), np.zeros(1, np.int64)),
                           np.arange(1), Signatures(np.arange(1), means, counts), 5, COPIES, 1, SETTINGS,
                           Participation())
    assert state.parted_round.tolist() == [-1]


def test_a_held_client_trains_its_held_cluster_without_an_exp3_update_and_reports_its_greedy_choice() -> None:
    settings = method_settings("exp3", num_clusters=3)
    state = AgentState.initial(3, settings)
    losses = np.array([[0.1, 0.5, 0.9], [0.1, 0.5, 0.9], [0.9, 0.5, 0.1]])
    held = np.array([2, -1, 1])
    new, decision = agent_step(state, settings, losses, None, 0, np.arange(3), 5, held_routes=held)
    free, alone = agent_step(state.select(np.array([1])), settings, losses[[1]], None, 0, np.array([1]), 5)
    assert decision.routes[[0, 2]].tolist() == [2, 1]
    assert decision.routes[1] == alone.routes[0]                       # the free client's round is its own
    assert decision.preferred.tolist() == [0, 0, 2]
    assert not decision.exp3_updated[[0, 2]].any()
    np.testing.assert_array_equal(new.exp3_log_weights[[0, 2]], state.exp3_log_weights[[0, 2]])
    np.testing.assert_array_equal(new.exp3_log_weights[1], free.exp3_log_weights[0])
    with pytest.raises(ValueError, match="held_routes"):
        agent_step(state, settings, losses, None, 0, np.arange(3), 5, held_routes=np.array([3, -1, -1]))


def test_a_clients_signature_from_its_batches_is_the_sketched_class_means() -> None:
    rng = np.random.default_rng(0)
    inputs, labels = rng.normal(size=(30, 2, 3)), rng.integers(0, 3, size=30)
    means, counts = labelled_signature([(inputs[:10], labels[:10]), (inputs[10:], labels[10:])], 4, 5, seed=9)
    expected = np.stack([inputs.reshape(30, -1)[labels == c].mean(axis=0) if np.any(labels == c) else np.zeros(6)
                         for c in range(4)])
    np.testing.assert_allclose(means[0], expected @ sketch_matrix(6, 5, 9), rtol=1e-12, atol=1e-12)
    assert counts[0].tolist() == np.bincount(labels, minlength=4).tolist()
    assert not np.allclose(sketch_matrix(6, 5, 9), sketch_matrix(6, 5, 10))
    with pytest.raises(ValueError, match="signature labels"):
        labelled_signature([(inputs[:2], np.array([0, 7]))], 4, 5, seed=9)


@pytest.mark.parametrize("metrics, message", [
    ({protocol.SIGNATURE_MEANS: [0.0] * 8}, "come together"),
    ({protocol.SIGNATURE_MEANS: [0.0] * 7, protocol.SIGNATURE_COUNTS: [1.0, 2.0]}, "list of 8 numbers"),
    ({protocol.SIGNATURE_MEANS: [0.0] * 8, protocol.SIGNATURE_COUNTS: [1.0, -2.0]}, "negative"),
    ({protocol.SIGNATURE_MEANS: [float("nan")] * 8, protocol.SIGNATURE_COUNTS: [1.0, 2.0]}, "non-finite"),
    ({protocol.SIGNATURE_MEANS: [0.0] * 12, protocol.SIGNATURE_COUNTS: [1.0, 2.0, 3.0]}, "list of 2 numbers"),
])
def test_a_bad_signature_is_refused_naming_the_metric(metrics: dict[str, Any], message: str) -> None:
    with pytest.raises(ReplyRejected, match=message):
        signature_metrics(metrics, 4, num_classes=2 if len(metrics.get(protocol.SIGNATURE_COUNTS, [])) == 3 else None)
    assert signature_metrics({}, 4) is None


def test_one_node_cannot_impose_its_number_of_classes_by_replying_first() -> None:
    from fedroute.strategies.algorithms import reply_signatures
    from fedroute.strategies.validation import TrainReply

    def reply(client: int, num_classes: int) -> TrainReply:
        return TrainReply(client_id=client, cluster=0, num_examples=1.0, model={}, metrics={},
                          signature=(np.zeros((num_classes, 4)), np.ones(num_classes)))

    signatures = reply_signatures([reply(0, 7), reply(1, 3), reply(2, 3), reply(3, 3)])
    assert signatures.index.tolist() == [1, 2, 3] and signatures.means.shape == (3, 3, 4)
    assert reply_signatures([reply(0, 5), reply(1, 3)]).index.tolist() == [1]          # a tie: the smaller C


def test_the_state_survives_a_checkpoint() -> None:
    settings = replace(SETTINGS, explore_on="collapse", controllers=("gr", "rh"))
    state = server_init(FederationState.of_clients(np.arange(4), 2), 1, 2, settings)
    assert ServerState.from_json(state.to_json()).signatures.shape == (0, 0)
    means, counts = _group_signatures(np.array([0, 1, 0, 1]))
    signatures = signature_step(state.signatures, _federation(np.arange(4), np.array([0, 1, 0, 1])), np.arange(4),
                                Signatures(np.arange(4), means, counts), 0, COPIES, 1, settings, Participation())
    restored = ServerState.from_json(replace(state, signatures=signatures).to_json()).signatures
    for name in ("means", "counts", "known", "held", "parted_round"):
        np.testing.assert_array_equal(getattr(restored, name), getattr(signatures, name))
        assert getattr(restored, name).dtype == getattr(signatures, name).dtype


def test_clients_without_class_samples_send_no_signature_and_the_run_is_the_run_without_the_start() -> None:
    task = parse_run_config(app_run_config({"task": "linear", "num-clients": 6})).task
    without = simulate(task, method_settings("exp3", num_clusters=2, signature_hold_rounds=0), 6, 0)
    asked = simulate(task, method_settings("exp3", num_clusters=2, signature_hold_rounds=2,
                                           signature_start_on="always"), 6, 0)
    np.testing.assert_array_equal(asked.routes, without.routes)
    np.testing.assert_array_equal(asked.cluster_models, without.cluster_models)
    with pytest.raises(ValueError, match="clients.*without train_inputs.*has_class_samples"):
        batch_class_means(task.clients(np.arange(2)))                   # asked directly, it names what is missing


def test_with_copies_the_start_acts_only_in_runs_whose_start_models_are_copies() -> None:
    settings = method_settings("exp3", num_clusters=3, signature_start_on="copies")
    assert method_settings("exp3", num_clusters=3, preset="gmm").signature_hold_rounds == 0   # presets: off
    warm, other = np.ones((3, 5)), np.arange(15.0).reshape(3, 5)
    partly = np.stack([warm[0], warm[0], other[2]])                                 # two copies and one other
    assert active_runs(np.stack([warm, other, partly]), settings, 3).tolist() == [True, False, False]
    assert active_runs(other, replace(settings, signature_start_on="always"), 1).tolist() == [True]
    federation = _federation(np.arange(4), np.zeros(4, np.int64))
    asked = [signature_orders(SignatureState.initial(4, 1), np.arange(4), np.zeros(4, np.int64), 0, settings,
                              Participation(), models).wanted.tolist() for models in (warm, other)]
    assert asked == [[True] * 4, [False] * 4]
    means, counts = _group_signatures(np.array([0, 1, 2, 0]))
    for models, parted in ((warm, 0), (other, -1)):
        state = signature_step(SignatureState.initial(4, 1), federation, np.arange(4),
                               Signatures(np.arange(4), means, counts), 0, models, 1, settings, Participation())
        assert state.parted_round.tolist() == [parted] and state.active.tolist() == [parted == 0]
    with pytest.raises(ValueError, match="cluster_models"):
        signature_orders(SignatureState.initial(4, 1), np.arange(4), np.zeros(4, np.int64), 0, settings,
                         Participation(), None)
    with pytest.raises(ValueError, match="signature_start_on.*copies-or-skew"):
        method_settings("exp3", signature_start_on="never")


SKEWED_COUNTS = np.array([[40.0, 2, 2], [2, 40, 2], [2, 2, 40], [40, 2, 2], [2, 40, 2], [2, 2, 40]])
"""Class counts of six clients, each holding mostly one class (label skew: ``w ≈ 1.2``, ``p ≈ 1e-40``)."""
EVEN_COUNTS = np.array([[14.0, 15, 15], [15, 14, 15], [15, 15, 14], [15, 15, 15], [14, 14, 15], [15, 14, 14]])
"""Class counts of six clients holding the classes alike (no label skew)."""


@pytest.mark.parametrize("copies, counts, signed, parted", [
    (False, SKEWED_COUNTS, 6, True),            # other start models, label skew: parted
    (False, EVEN_COUNTS, 6, False),             # other start models, no label skew: declined
    (False, SKEWED_COUNTS, 2, False),           # other start models, fewer than K signatures: declined
    (True, EVEN_COUNTS, 6, True),               # copies: parted whatever the counts
])
def test_the_default_parts_copy_starts_and_other_starts_under_label_skew_and_declines_the_rest(
        copies: bool, counts: np.ndarray, signed: int, parted: bool) -> None:
    settings = method_settings("exp3", num_clusters=3)                  # the generic default: h = 10
    assert settings.signature_hold_rounds == 10 and settings.signature_start_on == "copies-or-skew"
    models = np.ones((3, 5)) if copies else np.arange(15.0).reshape(3, 5)
    rows, runs = np.arange(6), np.zeros(6, np.int64)
    start = SignatureState.initial(6, 1)
    assert signature_orders(start, rows, runs, 0, settings, Participation(), models).wanted.all()   # all asked
    means = _group_signatures(np.array([0, 1, 2, 0, 1, 2]))[0][:, :3]             # the counts' three classes
    state = signature_step(start, _federation(rows, np.zeros(6, np.int64)), rows,
                           Signatures(np.arange(signed), means[:signed], counts[:signed]), 0, models, 1, settings,
                           Participation())
    assert state.parted_round.tolist() == [0 if parted else -1] and state.active.tolist() == [parted]
    assert state.copy_start.tolist() == [copies]
    after = signature_orders(state, rows, runs, 1, settings, Participation(), None)
    assert (after.held is not None) == parted                           # the parts are held from round 1
    assert after.wanted.tolist() == [parted and i >= signed for i in range(6)]   # a declined run asks nobody
    report = parting_report(start, state, settings, Participation(), 0)
    assert ("parted on the classes" in report) if parted else ("not used after round 0" in report and (
        "no label skew" in report if signed == 6 else "fewer than K = 3" in report))


def test_a_checkpoint_from_before_the_active_runs_loads_with_every_run_active_as_a_copy_start() -> None:
    settings = replace(SETTINGS, signature_start_on="always")
    state = server_init(FederationState.of_clients(np.arange(4), 2), 1, 2, settings)
    stored = state.to_json()
    del stored["signatures"]["active"], stored["signatures"]["copy_start"]
    restored = ServerState.from_json(stored).signatures
    assert restored.active.tolist() == [True] and restored.copy_start.tolist() == [True]
    stored = replace(state, signatures=replace(state.signatures, active=np.array([False]))).to_json()
    del stored["signatures"]["copy_start"]                              # written between the two fields
    restored = ServerState.from_json(stored).signatures
    assert restored.active.tolist() == [False] and restored.copy_start.tolist() == [False]


def test_the_run_config_refuses_the_signature_start_on_a_task_without_classes_before_flower_starts() -> None:
    with pytest.raises(ValueError, match=r"run-config 'signature-hold-rounds'.*0 for task 'linear'"):
        parse_run_config(app_run_config({"task": "linear", "signature-hold-rounds": 5}))
    with pytest.raises(ValueError, match=r"run-config 'signature-hold-rounds'.*\[0, 10000\]"):
        parse_run_config(app_run_config({"task": "boundaries", "signature-hold-rounds": -1}))
    from fedroute.server.run_config import SIGNATURE_TASKS
    for name in SIGNATURE_TASKS[:3]:                                   # femnist needs its data files
        task = parse_run_config(app_run_config({"task": name, "signature-hold-rounds": 5, "num-clients": 4})).task
        clients = task.clients(np.arange(2))
        assert batch_class_means(clients)[0].shape[:2] == (2, clients.num_classes), name


# --------------------------------------------------------------------------- Flower ≡ simulator
NUM_CLIENTS, NUM_ROUNDS, SEED = 15, 12, 4


def _flower_run(run_config: dict[str, Any], method: str, fraction: float) -> tuple[ClusteredRouting, InProcessGrid]:
    grid = builtin_nodes(run_config, NUM_CLIENTS, node_seed=3)
    return builtin_run(run_config, method, grid, fraction, num_models=3), grid


@pytest.mark.parametrize("method, fraction, start_on", [("exp3", 1.0, "always"), ("greedy", 0.5, "always"),
                                                        ("exp3", 0.5, "copies"), ("exp3", 0.5, "copies-or-skew")])
def test_flower_equals_the_simulator_with_the_signature_start(method: str, fraction: float, start_on: str) -> None:
    run_config = app_run_config({"task": "boundaries", "num-clients": NUM_CLIENTS, "num-server-rounds": NUM_ROUNDS,
                                 "seed": SEED, "fraction-train": fraction, "preset": "generic", "init": "warm",
                                 "num-clusters": 3, "method": method, "signature-hold-rounds": 3,
                                 "signature-start-on": start_on})
    settings = parse_run_config(run_config)
    assert settings.routing[method].signature_hold_rounds == 3
    strategy, grid = _flower_run(run_config, method, fraction)
    participation = Participation(fraction, 2)
    history = simulate(settings.task, settings.routing[method], NUM_ROUNDS, SEED, participation=participation)
    for t in range(NUM_ROUNDS):
        played = np.flatnonzero(history.played[t])
        assert [strategy.client_routes[t][c] for c in played] == history.routes[t, played].tolist(), t
    np.testing.assert_allclose(np.stack([m["weights"] for m in strategy.cluster_models]),
                               history.cluster_models[-1], rtol=0, atol=1e-9)
    signatures = strategy.state.server.signatures
    if start_on == "copies":  # this task's three start models differ: nobody is asked, parted or held
        assert signatures.active.tolist() == [False] and signatures.parted_round.tolist() == [-1]
        assert not any(m.content.config_records[protocol.SIGNATURE_ORDERS][protocol.SEND_SIGNATURE]
                       for m in grid.sent if m.metadata.message_type == MessageType.TRAIN)
        assert not signatures.known.any() and (signatures.held < 0).all()
        return
    if start_on == "copies-or-skew":  # other start models, no label skew: asked in the collect rounds, then declined
        collect = collect_rounds(participation)
        assert signatures.active.tolist() == [False] and signatures.parted_round.tolist() == [-1]
        asked = {int(routing_config(m)[protocol.ROUND_INDEX]) for m in grid.sent
                 if m.metadata.message_type == MessageType.TRAIN
                 and m.content.config_records[protocol.SIGNATURE_ORDERS][protocol.SEND_SIGNATURE]}
        assert asked == set(range(collect)) and signatures.known.any() and (signatures.held < 0).all()
        without = simulate(settings.task, replace(settings.routing[method], signature_hold_rounds=0), NUM_ROUNDS,
                           SEED, participation=participation)   # declined: the run is the run without the start
        np.testing.assert_array_equal(history.routes, without.routes)
        np.testing.assert_array_equal(history.cluster_models, without.cluster_models)
        return
    assert signatures.parted_round.tolist() == [collect_rounds(participation) - 1]
    # Every held client trained its part's cluster in the hold rounds.
    start, end = signatures.parted_round[0] + 1, signatures.parted_round[0] + hold_rounds(
        settings.routing[method], participation)
    held = dict(zip(strategy.state.server.federation.client_ids.tolist(), signatures.held.tolist()))
    for t in range(start, end + 1):
        for client, route in strategy.client_routes[t].items():
            assert held[client] < 0 or route == held[client], (t, client)
    assert any(strategy.client_routes[t] for t in range(start, end + 1))
    # A signature travels once per client: the orders stop asking after it arrived.
    sent = [m for m in grid.sent if m.metadata.message_type == MessageType.TRAIN
            and m.content.config_records[protocol.SIGNATURE_ORDERS][protocol.SEND_SIGNATURE]]
    asked = {}
    for message in sent:
        asked[message.metadata.dst_node_id] = asked.get(message.metadata.dst_node_id, 0) + 1
    assert max(asked.values()) == 1 and (fraction < 1 or len(asked) == NUM_CLIENTS)


def test_sketched_signatures_keep_the_counts() -> None:
    means, counts = sketched_signatures(np.ones((2, 3, 4)), np.array([[1, 0, 2], [3, 3, 0]]), 2, 0)
    assert means.shape == (2, 3, 2) and counts.dtype == np.float64 and counts.tolist() == [[1, 0, 2], [3, 3, 0]]
    assert MetricRecord({protocol.SIGNATURE_MEANS: means[0].ravel().tolist()})


# --------------------------------------------------------------------------- a user's torch client
def _torch_user_app(with_signature: bool) -> dict[str, Any]:
    """A user's ClientApp: a linear classifier of 4 features into 3 classes, its data as (x, y) batches."""
    import torch

    from fedroute import routing_train

    def data(context: Any) -> tuple[Any, Any]:
        rng = np.random.default_rng(int(context.node_config["partition-id"]))
        x = torch.tensor(rng.normal(size=(24, 4)), dtype=torch.float32)
        return x, torch.tensor(rng.integers(0, 3, size=24))

    def train(message: Any, context: Any) -> Any:
        x, y = data(context)
        model = torch.nn.Linear(4, 3)

        def train_fn(module: torch.nn.Module) -> None:
            optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(module(x), y).backward()
            optimizer.step()

        batches = [(x[:12], y[:12]), (x[12:], y[12:])]
        return routing_train(message, context, model, train_fn,
                             lambda module: float(torch.nn.functional.cross_entropy(module(x), y)), len(y),
                             **({"signature_data": batches, "num_classes": 3} if with_signature else {}))

    return {MessageType.TRAIN: train}


def test_a_torch_client_sends_its_signature_once_and_trains_its_held_cluster(caplog: Any) -> None:
    import logging

    import torch

    from fedroute import cluster_models_from_torch

    torch.manual_seed(0)
    settings = replace(method_settings("greedy", num_clusters=2), signature_hold_rounds=2, signature_dim=4)
    strategy = ClusteredRouting(settings, min_available_nodes=6, seed=11, progress_interval=None,
                                evaluate_at_end=False)
    grid = InProcessGrid(_torch_user_app(True), 6)
    warm = torch.nn.Linear(4, 3)
    with caplog.at_level(logging.INFO, logger="fedroute"):
        strategy.start(grid, cluster_models_from_torch([warm, warm]), num_rounds=4)
    parted = [r.getMessage() for r in caplog.records if r.getMessage().startswith("signature start:")]
    assert len(parted) == 1 and "6 clients parted" in parted[0] and "after round 0" in parted[0], parted
    signatures = strategy.state.server.signatures
    assert signatures.known.all() and signatures.shape == (3, 4) and signatures.parted_round.tolist() == [0]
    client = 2
    node = next(n for n, c in strategy.state.bindings.client_of_node.items() if c == client)
    x, y = (lambda rng: (rng.normal(size=(24, 4)), rng.integers(0, 3, size=24)))(np.random.default_rng(client))
    means, counts = labelled_signature([(x.astype(np.float32), y)], 3, 4, 11)
    row = strategy.state.server.federation.client_ids.tolist().index(client)
    np.testing.assert_allclose(signatures.means[row], means[0], rtol=1e-6, atol=1e-6)
    held = dict(zip(strategy.state.server.federation.client_ids.tolist(), signatures.held.tolist()))
    assert all(strategy.client_routes[t][c] == held[c] for t in (1, 2) for c in held)
    asked = [m for m in grid.sent if m.metadata.dst_node_id == node and m.metadata.message_type == MessageType.TRAIN
             and m.content.config_records[protocol.SIGNATURE_ORDERS][protocol.SEND_SIGNATURE]]
    assert len(asked) == 1


def test_a_torch_client_without_signature_data_sends_none_is_told_once_and_routes_freely(caplog: Any) -> None:
    import logging

    import torch

    from fedroute import cluster_models_from_torch
    from fedroute.client import torch_adapter

    torch_adapter._SAID.clear()                                          # said once per process: from here
    settings = method_settings("exp3", num_clusters=2)                  # the generic default: on from copies
    strategy = ClusteredRouting(settings, min_available_nodes=3, seed=1, progress_interval=None,
                                evaluate_at_end=False)
    grid = InProcessGrid(_torch_user_app(False), 3)
    warm = torch.nn.Linear(4, 3)
    with caplog.at_level(logging.INFO, logger="fedroute"):
        strategy.start(grid, cluster_models_from_torch([warm, warm]), num_rounds=3)
    told = [r for r in caplog.records if "no signature_data" in r.getMessage()]
    assert len(told) == 1 and "pass signature_data and num_classes to routing_train" in told[0].getMessage()
    asked = [m for m in grid.sent if m.metadata.message_type == MessageType.TRAIN
             and m.content.config_records[protocol.SIGNATURE_ORDERS][protocol.SEND_SIGNATURE]]
    assert len(asked) == 9                                              # asked every round: it never sent one
    signatures = strategy.state.server.signatures
    assert not signatures.known.any() and signatures.parted_round.tolist() == [-1]
    assert all(len(strategy.client_routes[t]) == 3 for t in range(3))  # every reply accepted, every round
    waits = [r.getMessage() for r in caplog.records if r.getMessage().startswith("signature start:")]
    assert waits == ["signature start: after round 0 only 0 clients sent a class signature, fewer than K = 2; it "
                     "parts once K have (a torch client sends one when routing_train has signature_data and "
                     "num_classes); the routing goes on meanwhile"]


def test_the_signature_rule_configuration_and_a_short_suite_of_it() -> None:
    from fedroute.simulation.experiments import scenarios as S
    from fedroute.simulation.experiments.kit import Sweep

    config = S.signature_rule_config(S.ScenarioConfig())
    assert config.methods == ("greedy", "signature") and "collinear" not in config.scenarios
    assert len(config.scenarios) == 17 and config.first_seed == 0
    assert config.settings("signature", S.SCENARIOS["digits-skew"]).signature_hold_rounds == 10
    # boundaries-skew, development seeds, the quick horizon, warm start: every run of the rule separates.
    short = replace(config, scenarios=("boundaries-skew",), seeds=2, first_seed=100, short=True)
    runs = S._run(short, Sweep()).runs
    rule = runs[runs["method"] == "signature"]
    assert len(rule) == 2 and rule["separated"].all(), rule[["seed", "separated", "worst_ratio"]]
