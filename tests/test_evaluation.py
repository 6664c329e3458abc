"""Metrics of the user's choosing and evaluation during training (issue 22, deliverables 1–2).

The aggregation (:func:`fedroute.core.evaluation.evaluation_metrics`) is checked on numbers
worked out by hand; the tasks' accuracy against a direct forward pass; the strategy's
evaluation rounds, ``fraction_evaluate`` and the FedAvg-named aggregation hooks on the
in-process grid with the plugin's linear app (a ``metrics_fn`` of its own).
"""

from __future__ import annotations

import csv

import numpy as np
import pytest
import torch
from flwr.app import Context, Message, MessageType, MetricRecord, RecordDict

from fedroute import ClusteredRouting, method_settings, routing_evaluate
from fedroute import protocol
from fedroute.client.torch_adapter import TorchClient
from fedroute.core.evaluation import evaluation_metrics, metric_table, task_metrics
from fedroute.server.results import summary_table
from fedroute.server.run_config import parse_run_config
from fedroute.tasks.characters import mlp_forward
from fedroute.tasks.digit_rotations import DigitRotationsTask
from fedroute.tasks.gmm import GMMTask
from support.grid import InProcessGrid
from support.linear_app import TASK, LinearModel, linear_initial_models, linear_user_app

pytestmark = pytest.mark.usefixtures("task_identity")


# ----------------------------------------------------------------------------- aggregation
def test_evaluation_metrics_read_each_client_at_its_chosen_model() -> None:
    train = np.array([[0.1, 0.9], [0.2, 0.1], [0.5, 0.6], [0.9, 0.3]])  # choices 0, 1, 0, 1
    accuracy = np.array([[0.9, 0.0], [0.0, 0.5], [0.7, 1.0], [1.0, 0.3]])
    test_loss = np.array([[1.0, 9.0], [9.0, 2.0], [3.0, 9.0], [9.0, 4.0]])
    result = evaluation_metrics({"accuracy": accuracy, "test_loss": test_loss}, train, np.array([0, 0, 1, -1]))
    assert result["num_clients"] == 4
    assert result["accuracy"] == pytest.approx((0.9 + 0.5 + 0.7 + 0.3) / 4)
    assert result["accuracy_worst_decile"] == pytest.approx(0.3)  # the lowest accuracy: higher is better
    assert result["test_loss_worst_decile"] == pytest.approx(4.0)  # the highest loss: lower is better
    assert result["accuracy_cluster_0"] == pytest.approx(0.8) and result["accuracy_cluster_1"] == pytest.approx(0.4)
    assert result["accuracy_group_0"] == pytest.approx(0.7) and result["accuracy_group_1"] == pytest.approx(0.7)
    assert "accuracy_group_-1" not in result  # an unknown group has no entry
    rows = metric_table("greedy", 5, result)
    assert {(row["metric"], row["scope"]) for row in rows} >= {("accuracy", "mean"), ("accuracy", "worst_decile"),
                                                               ("test_loss", "cluster_1"), ("num_clients", "all")}
    with pytest.raises(ValueError, match="groups must have shape"):
        evaluation_metrics({"accuracy": accuracy}, train, np.zeros(3))


def test_builtin_classifiers_report_accuracy() -> None:
    task = DigitRotationsTask(num_clients=4, hidden_units=4)
    clients = task.clients(np.arange(4))
    models = task.initial_models(2)
    accuracy = task_metrics(clients, models)["accuracy"]
    for i in range(4):
        real = clients.test_weights[i] > 0
        x = torch.from_numpy(clients.test_inputs[i][real])
        for k in range(2):
            predicted = mlp_forward(torch.from_numpy(models[k]), x, task.hidden_units, 10).argmax(1).numpy()
            assert accuracy[i, k] == pytest.approx(np.mean(predicted == clients.test_labels[i][real]), abs=1e-6)
    per_client = np.broadcast_to(models, (4,) + models.shape)
    np.testing.assert_allclose(task_metrics(clients, per_client)["accuracy"], accuracy)
    gmm_task = GMMTask()
    gmm = gmm_task.clients(np.arange(gmm_task.num_clients))
    gmm_models = gmm_task.initial_models(2)
    gmm_accuracy = task_metrics(gmm, gmm_models)["accuracy"]
    logits = np.einsum("kcd,isd->ikcs", gmm_models.reshape(2, gmm.num_classes, -1),
                       np.concatenate([gmm.test_inputs, np.ones(gmm.test_inputs.shape[:2] + (1,))], axis=-1))
    np.testing.assert_allclose(gmm_accuracy, (logits.argmax(2) == gmm.test_labels[:, None]).mean(-1))


def test_summary_table_prints_accuracy_or_a_dash() -> None:
    base = {"usable_models_train": 2, "usable_models_test": 2, "assignment_accuracy_test": 1.0, "rounds": 10,
            "wall_seconds": 1.0}
    table = summary_table({"greedy": {**base, "evaluation_metrics": {"accuracy": 0.8125,
                                                                     "accuracy_worst_decile": 0.5}},
                           "fedavg": {**base, "evaluation_metrics": {"test_loss": 1.0}}})
    assert "accuracy" in table.splitlines()[0]
    greedy, fedavg = table.splitlines()[2:]
    assert "0.812" in greedy and "0.500" in greedy and " - " in fedavg


# ---------------------------------------------------------------------------- plugin + strategy
def _accuracy_app(task=TASK) -> dict:
    """The plugin's linear app whose evaluate handler also reports a ``metrics_fn`` (``within`` = share of
    held-out predictions within 1 of the target)."""
    handlers = linear_user_app(task)
    samples = task.samples(np.arange(task.num_clients))

    def evaluate(message: Message, context: Context) -> Message:
        i = int(context.node_config["partition-id"])
        x, y, x_test, y_test = (torch.from_numpy(np.ascontiguousarray(a[i])) for a in (
            samples.train_inputs, samples.train_targets, samples.test_inputs, samples.test_targets))
        return routing_evaluate(
            message, context, LinearModel(task.dimension), lambda m: float(0.5 * torch.mean((m(x) - y) ** 2)),
            num_examples=len(y), metrics_fn=lambda m: {"within": float(torch.mean(
                (torch.abs(m(x_test) - y_test) < 1.0).float()))}, group=int(samples.groups[i]))

    return {**handlers, MessageType.EVALUATE: evaluate}


def test_evaluation_during_training_with_fedavg_names(tmp_path) -> None:
    seen: dict[str, list] = {"train": [], "evaluate": []}

    def train_aggr(records: list[RecordDict], key: str) -> MetricRecord:
        seen["train"].append(key)
        return MetricRecord({"replies": len(records)})

    def evaluate_aggr(records: list[RecordDict], key: str) -> MetricRecord:
        seen["evaluate"].append(len(records))
        assert all({"within", "test_loss", protocol.CLUSTER, key} <= set(r[protocol.METRICS]) for r in records)
        return MetricRecord({"mean-within": float(np.mean([r[protocol.METRICS]["within"] for r in records]))})

    strategy = ClusteredRouting(method_settings("greedy"), min_available_nodes=TASK.num_clients, seed=3,
                                progress_interval=None, evaluate_every=2, fraction_evaluate=0.5,
                                min_evaluate_nodes=1, telemetry_dir=tmp_path, train_metrics_aggr_fn=train_aggr,
                                evaluate_metrics_aggr_fn=evaluate_aggr)
    grid = InProcessGrid(_accuracy_app(), TASK.num_clients)
    result = strategy.start(grid, linear_initial_models(TASK, 2), num_rounds=5)
    assert sorted(strategy.evaluation) == [2, 4, 5]  # every 2nd round, and the final evaluation
    assert [strategy.evaluation[t]["num_clients"] for t in (2, 4, 5)] == [4, 4, TASK.num_clients]
    assert seen["evaluate"] == [4, 4, TASK.num_clients]
    assert len(strategy.final_evaluation) == TASK.num_clients
    final = strategy.evaluation[5]
    assert 0.0 <= final["within_worst_decile"] <= final["within"] <= 1.0
    assert {"within_group_0", "within_group_1", "test_loss_worst_decile"} <= set(final)
    assert result.evaluate_metrics_clientapp[2]["mean-within"] == pytest.approx(strategy.evaluation[2]["within"])
    assert seen["train"] == []  # the linear app's train_fn returns no metrics: nothing to aggregate
    with open(tmp_path / "evaluation.csv") as stream:
        rows = list(csv.DictReader(stream))
    assert {int(row["server_round"]) for row in rows} == {2, 4, 5}
    mean_within = {int(r["server_round"]): float(r["value"]) for r in rows
                   if r["metric"] == "within" and r["scope"] == "mean"}
    assert mean_within[4] == pytest.approx(strategy.evaluation[4]["within"])
    # the sample of an evaluation during training is drawn from (seed, round): rounds differ, reruns agree
    asked = [sorted(m.metadata.dst_node_id for m in grid.sent if m.metadata.message_type == MessageType.EVALUATE
                    and m.content[protocol.CONFIG][protocol.SERVER_ROUND] == t) for t in (2, 4)]
    assert len(asked[0]) == len(asked[1]) == 4
    assert asked[0] == strategy._evaluation_nodes(grid, 2)


def test_metrics_fn_and_evaluation_settings_are_checked() -> None:
    client = TorchClient(LinearModel(2), lambda m: 0.0, num_examples=1, metrics_fn=lambda m: 0.9)
    with pytest.raises(TypeError, match=r"metrics_fn returned float; return a dict"):
        client.metrics(np.zeros((2, 2)))
    client.metrics_fn = lambda m: {"accuracy": "high"}
    with pytest.raises(TypeError, match="metrics_fn metric 'accuracy'"):
        client.metrics(np.zeros((2, 2)))
    for kwargs, match in (({"evaluate_every": -1}, "evaluate_every = -1 is invalid"),
                          ({"fraction_evaluate": 1.5}, r"fraction_evaluate = 1.5 is invalid; allowed: a number in \[0, 1\]"),
                          ({"min_evaluate_nodes": 0.5}, "min_evaluate_nodes = 0.5")):
        with pytest.raises(ValueError, match=match):
            ClusteredRouting(method_settings("greedy"), **kwargs)
    with pytest.raises(ValueError, match=r"'evaluate-every' = 11 is invalid.*num-server-rounds = 10"):
        parse_run_config({"num-server-rounds": 10, "evaluate-every": 11})
    settings = parse_run_config({"num-server-rounds": 10, "evaluate-every": 5, "fraction-evaluate": 0.5})
    assert (settings.evaluate_every, settings.fraction_evaluate) == (5, 0.5)
    assert settings.run_digest == parse_run_config({"num-server-rounds": 10}).run_digest  # evaluation is no dynamics
