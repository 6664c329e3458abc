"""Errors that name the fix (issue 22): the mistakes a plugin user makes, and what fedroute tells them.

The runs use a real Flower ``ClientApp`` in this process: :class:`FlowerClientGrid`
turns an exception of the app into the error reply Flower 1.42 sends (the reason
formats below were measured with ``flwr run``: a Ray simulation and a SuperNode).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, Context, Error, Message, MessageType
from flwr.clientapp import ClientApp

from fedroute import ClusteredRouting, method_settings, routing_evaluate, routing_train
from fedroute.client.torch_adapter import TorchClient, layout_difference
from fedroute.monitoring.alarms import DEAD_FEDERATION, DeadFederation, missing_handler_advice
from fedroute.strategies.rejections import RejectionLog
from support.flower_client import FlowerClientGrid, client_app, deployment_reason, simulation_reason
from support.grid import InProcessGrid
from support.linear_app import TASK, LinearModel, linear_initial_models, linear_user_app

pytestmark = pytest.mark.usefixtures("task_identity")  # Flower messages need a task identity


def _strategy(method: str = "exp3", **kwargs: Any) -> ClusteredRouting:
    return ClusteredRouting(method_settings(method, preset="linear"), min_available_nodes=TASK.num_clients,
                            progress_interval=None, **kwargs)


# ------------------------------------------------------------------- FedAvg's single ArrayRecord
def test_a_single_fedavg_arrayrecord_names_the_k_records_to_pass() -> None:
    """Before: ``packed cluster-model key 'weight' is not 'cluster-<k>/<name>'``, with no hint."""
    grid = InProcessGrid(linear_user_app(TASK), TASK.num_clients)
    with pytest.raises(ValueError, match=r"one model's ArrayRecord .* needs K = 2 models\. Pass a list of K "
                                         r"ArrayRecords.*cluster_models_from_torch\(\[Net\(\) for _ in range\(K\)\]\)"):
        _strategy().start(grid, ArrayRecord(LinearModel(TASK.dimension).state_dict()), num_rounds=2)
    assert not grid.sent  # refused before anything was sent


# ----------------------------------------------------------------------- a missing handler
@pytest.mark.parametrize("reason", [deployment_reason, simulation_reason], ids=["deployment", "simulation"])
@pytest.mark.parametrize(("missing", "method", "expected"), [
    ("query", "sync-entry", r"synchronized entry: no valid provisional report arrived\. .*@app\.query\(\) handler"
                            r".*fedroute\.routing_query\(msg, context, model, loss_fn, num_examples\)"),
    ("train", "exp3", r"no valid training reply in any of the run's 2 rounds .*@app\.train\(\) handler"
                      r".*fedroute\.routing_train\(msg, context, model, train_fn, loss_fn, num_examples\)"),
    ("evaluate", "exp3", r"final evaluation: none of the 8 nodes .*@app\.evaluate\(\) handler"
                         r".*fedroute\.routing_evaluate\("),
])
def test_a_missing_handler_is_named_with_the_call_to_register(missing: str, method: str, expected: str,
                                                              reason: Callable[[Exception], str]) -> None:
    """Before (query): ``synchronized entry: no valid provisional report arrived``, not naming the handler."""
    handlers = linear_user_app(TASK)
    app = client_app(handlers, tuple(kind for kind in ("train", "evaluate", "query") if kind != missing))
    strategy = _strategy(method)
    with pytest.raises(DeadFederation, match=expected):
        strategy.start(FlowerClientGrid(app, TASK.num_clients, reason), linear_initial_models(TASK, 2), num_rounds=2)
    assert len(strategy.history) == {"query": 0, "train": 2, "evaluate": 2}[missing]


def test_advice_only_when_flower_says_the_handler_is_missing() -> None:
    assert missing_handler_advice(["error reply: disk full", "metric 'losses' is missing"]) == ""
    both = missing_handler_advice([deployment_reason(ValueError("No train function registered with name 'default'")),
                                   "No query function registered with name 'default'"])
    assert "@app.train()" in both and "@app.query()" in both


def test_a_failing_query_handler_gets_its_reason_not_the_missing_handler_advice() -> None:
    def broken(message: Message, context: Context) -> Message:
        raise RuntimeError("out of memory")

    app = client_app({**linear_user_app(TASK), "query": broken}, ("train", "evaluate", "query"))
    with pytest.raises(DeadFederation, match=r"out of memory'> \(8 replies\)\. Check that the ClientApp") as caught:
        _strategy("sync-entry").start(FlowerClientGrid(app, TASK.num_clients), linear_initial_models(TASK, 2), 2)
    assert "@app.query()" not in str(caught.value)


# ------------------------------------------------------------------- the wrong architecture
def test_an_architecture_mismatch_names_only_the_differing_entries() -> None:
    """Before: every array of both models (names and shapes), however large the model."""
    def layers(last: int) -> torch.nn.Module:
        return torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(20)], torch.nn.Linear(8, last))

    server = {name: value.numpy() for name, value in layers(2).state_dict().items()}
    with pytest.raises(ValueError) as caught:
        TorchClient(layers(3), lambda model: 0.0, num_examples=1).check_template(server)
    text = str(caught.value)
    assert "2 of 42 entries differ (shapes: '20.weight' server (2, 8) vs module (3, 8), '20.bias' server (2,) vs " \
           "module (3,))" in text and "cluster_models_from_torch" in text
    assert "'19.weight'" not in text and len(text) < 400
    assert layout_difference([("w", (2,)), ("b", (1,))], [("w", (2,)), ("v", (1,))]) == \
        "2 of 3 entries differ (only in the server's models: 'b'; only in the module: 'v')"
    many = layout_difference([(f"x{i}", (1,)) for i in range(50)], [(f"x{i}", (2,)) for i in range(50)])
    assert many.endswith("'x2' server (1,) vs module (2,) and 47 more)")
    assert layout_difference([("a", (1,)), ("b", (1,))], [("b", (1,)), ("a", (1,))]) == \
        "the same 2 entries in another order"


def test_a_client_of_another_architecture_is_logged_once_and_the_others_train(
        caplog: pytest.LogCaptureFixture) -> None:
    """Before: its whole-model error text was logged for every message it got (240 times in one trial run)."""
    handlers = linear_user_app(TASK)
    wrong = TASK.num_clients - 1

    def train(message: Message, context: Context) -> Message:
        if context.node_config["partition-id"] == wrong:
            return routing_train(message, context, LinearModel(TASK.dimension + 1), lambda model: None,
                                 lambda model: 0.0, 10)
        return handlers["train"](message, context)

    def evaluate(message: Message, context: Context) -> Message:
        if context.node_config["partition-id"] == wrong:
            return routing_evaluate(message, context, LinearModel(TASK.dimension + 1), lambda model: 0.0, 10)
        return handlers["evaluate"](message, context)

    app = client_app({**handlers, "train": train, "evaluate": evaluate}, ("train", "evaluate", "query"))
    strategy = _strategy()
    with caplog.at_level(logging.WARNING, logger="fedroute"):
        strategy.start(FlowerClientGrid(app, TASK.num_clients), linear_initial_models(TASK, 2), num_rounds=4)
    logged = [record.getMessage() for record in caplog.records if "rejected reply" in record.getMessage()]
    assert len(logged) == 1 and f"node {1000 + wrong}" in logged[0]
    assert f"1 of 1 entries differ (shapes: 'weight' server ({TASK.dimension},) vs module " \
           f"({TASK.dimension + 1},))" in logged[0]
    assert strategy.rejections.total == 4 + 1 and len(strategy.rejected) == 5  # every one counted and kept
    assert [row["num_replies"] for row in strategy.history] == [TASK.num_clients - 1] * 4
    assert sorted(reply.client_id for reply in strategy.final_evaluation) == list(range(TASK.num_clients - 1))


def test_the_rejection_log_logs_a_reason_once_per_node(caplog: pytest.LogCaptureFixture) -> None:
    log = RejectionLog()
    with caplog.at_level(logging.WARNING, logger="fedroute"):
        for server_round in (1, 2, 3):
            log.add(server_round, "train", 7, "wrong architecture")
            log.add(server_round, "train", 8, "wrong architecture")
        log.add(3, "evaluate", 7, "wrong architecture")
        log.add(4, "train", 7, "timed out")
    assert [record.getMessage() for record in caplog.records] == [
        "round 1 (train): rejected reply from node 7: wrong architecture",
        "round 1 (train): rejected reply from node 8: wrong architecture",
        "round 4 (train): rejected reply from node 7: timed out"]
    assert log.total == 8 and len(log.entries) == 8 and log.count(2, "train") == 2
    assert log.reasons(3, "train") == ["wrong architecture"] * 2


# ------------------------------------------------------------- a run without any valid reply
def test_a_run_shorter_than_dead_rounds_without_valid_replies_raises_with_its_alarm() -> None:
    """Before: 2 failing rounds (< dead_rounds = 3) returned the initial models and an empty evaluation."""
    def crashing(message: Message, context: Context) -> Message:
        raise RuntimeError("CUDA out of memory")

    app = client_app({**linear_user_app(TASK), "train": crashing}, ("train", "evaluate", "query"))
    grid = FlowerClientGrid(app, TASK.num_clients)
    strategy = _strategy()
    with pytest.raises(DeadFederation, match=r"any of the run's 2 rounds \(t=0…1\); the run stops\. Reasons: .*"
                                             r"CUDA out of memory'> \(16 replies\)"):
        strategy.start(grid, linear_initial_models(TASK, 2), num_rounds=2)
    assert [alarm.kind for alarm in strategy.alarms] == [DEAD_FEDERATION]
    assert not any(message.metadata.message_type == MessageType.EVALUATE for message in grid.sent)


def test_a_run_with_one_valid_round_ends_normally() -> None:
    handlers = linear_user_app(TASK)

    def fails_in_round_2(message: Message, context: Context) -> Message:
        if message.content["config"]["server-round"] == 2:
            raise RuntimeError("node rebooted")
        return handlers["train"](message, context)

    app = client_app({**handlers, "train": fails_in_round_2}, ("train", "evaluate", "query"))
    strategy = _strategy()
    strategy.start(FlowerClientGrid(app, TASK.num_clients), linear_initial_models(TASK, 2), num_rounds=2)
    assert [row["num_replies"] for row in strategy.history] == [TASK.num_clients, 0]
    assert len(strategy.final_evaluation) == TASK.num_clients
    assert DEAD_FEDERATION not in [alarm.kind for alarm in strategy.alarms]


# ------------------------------------------------------------------ train_fn returning its loss
def test_a_train_fn_that_returns_its_loss_reports_it_as_train_loss() -> None:
    """Before: ``TypeError: train_fn returned float`` after local training, every client every round."""
    samples = TASK.samples(np.arange(TASK.num_clients))

    def train(message: Message, context: Context) -> Message:
        i = int(context.node_config["partition-id"])
        x, y = (torch.from_numpy(np.ascontiguousarray(a[i])) for a in (samples.train_inputs, samples.train_targets))

        def training_loop(model: torch.nn.Module) -> float:  # as Flower's quickstart: returns the mean loss
            optimizer = torch.optim.SGD(model.parameters(), lr=TASK.learning_rate)
            loss = 0.5 * torch.mean((model(x) - y) ** 2)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            return loss.item()

        return routing_train(message, context, LinearModel(TASK.dimension), training_loop,
                             lambda model: float(0.5 * torch.mean((model(x) - y) ** 2)), num_examples=len(y))

    strategy = _strategy()
    grid = InProcessGrid({**linear_user_app(TASK), MessageType.TRAIN: train}, TASK.num_clients)
    strategy.start(grid, linear_initial_models(TASK, 2), num_rounds=2)
    assert not strategy.rejected
    for server_round in (1, 2):
        routes = strategy.client_routes[server_round - 1]
        assert set(strategy.cluster_train_metrics[server_round]) == set(routes.values())
        records = strategy.cluster_train_metrics[server_round]
        assert all(list(record) == ["train_loss"] for record in records.values())
        # the loop's loss is taken before its step: the routed model's loss, which the round records as well
        members = {cluster: sum(routed == cluster for routed in routes.values()) for cluster in records}
        mean = sum(records[k]["train_loss"] * members[k] for k in records) / TASK.num_clients
        assert mean == pytest.approx(strategy.history[server_round - 1]["routed_train_loss"], rel=1e-9)
