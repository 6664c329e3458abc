"""The replies of a routing client, shared by the built-in ClientApp and the plugin helpers.

Both :mod:`fedroute.client.app` (our tasks) and :mod:`fedroute.client.plugin` (a
user's torch model) decode a message into a :class:`~fedroute.core.task.ClientBatch`
of one client and the ``K`` flat models; from there the round is the same and
lives here: controller state from ``Context.state`` (and the state directory),
:func:`~fedroute.core.client_step.client_round`, and the reply schema of
:mod:`fedroute.protocol`.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict

from fedroute import protocol
from fedroute.core.evaluation import task_metrics
from fedroute.core.fedcam import combined_models, fedcam_client_round, fedcam_losses, uses_output_sum
from fedroute.core.client_step import client_round
from fedroute.core.health import RoutingView
from fedroute.core.settings import RoutingSettings
from fedroute.client.state_store import load_agent_state, save_agent_state, state_directory
from fedroute.strategies.records import array_record
from fedroute.core.task import ClientBatch

__all__ = ["reply", "routing_reply", "fedcam_reply", "evaluation_losses", "evaluation_reply", "num_examples_metric",
           "identity_reply", "is_identification", "evaluation_task_metrics"]


def num_examples_metric(value: float) -> int | float:
    """``num-examples`` as an int when it is a whole number (sample counts), else a float weight."""
    return int(value) if float(value).is_integer() else float(value)


def reply(message: Message, metrics: dict[str, Any], model: Optional[ArrayRecord] = None,
          train_metrics: Optional[dict[str, Any]] = None,
          evaluate_metrics: Optional[dict[str, list[float]]] = None) -> Message:
    """A reply with one MetricRecord and, when given, the trained model, the user's training metrics and
    the per-model evaluation metrics."""
    content = RecordDict({protocol.METRICS: MetricRecord(metrics)})
    if model is not None:
        content[protocol.MODEL] = model
    if train_metrics:
        content[protocol.TRAIN_METRICS] = MetricRecord(train_metrics)
    if evaluate_metrics:
        content[protocol.EVALUATE_METRICS] = MetricRecord(evaluate_metrics)
    return Message(content=content, reply_to=message)


def evaluation_reply(message: Message, client_id: int, num_examples: float, train_losses: np.ndarray,
                     test_losses: np.ndarray, group: int,
                     model_metrics: Optional[dict[str, np.ndarray]] = None) -> Message:
    """The reply to an ``EVALUATE`` message: the ``K`` losses on both splits, the group, and each metric's
    ``K`` values (``evaluate-metrics``)."""
    return reply(message, {
        protocol.CLIENT_ID: int(client_id),
        protocol.NUM_EXAMPLES: num_examples_metric(num_examples),
        protocol.TRAIN_LOSSES: [float(v) for v in train_losses],
        protocol.TEST_LOSSES: [float(v) for v in test_losses],
        protocol.GROUP: int(group),
    }, evaluate_metrics={name: [float(v) for v in values] for name, values in (model_metrics or {}).items()})


def evaluation_task_metrics(clients: ClientBatch, models: np.ndarray,
                            global_model: Optional[np.ndarray]) -> dict[str, np.ndarray]:
    """A task's held-out metrics of the evaluated models for one client, each (K,): of the ``K`` models, or,
    under FedCAM's additive form, of the combined predictors (none in the output-sum form)."""
    if global_model is not None:
        if uses_output_sum(clients):
            return {}
        models = combined_models(global_model, models)
    return {name: values[0] for name, values in task_metrics(clients, models, "test").items()}


def is_identification(message: Message) -> bool:
    """Whether a ``QUERY`` is the strategy's identification (partial participation: no models, answer who you are)."""
    records = message.content.config_records
    return protocol.CONFIG in records and records[protocol.CONFIG].get(protocol.PHASE) == protocol.PHASE_IDENTIFY


def identity_reply(message: Message, client_id: int, num_examples: float) -> Message:
    """The answer to an identification ``QUERY``: the client's id and sample count (nothing is evaluated)."""
    return reply(message, {protocol.CLIENT_ID: int(client_id), protocol.NUM_EXAMPLES: num_examples_metric(num_examples)})


def received_view(config: dict[str, Any], num_clusters: int) -> Optional[RoutingView]:
    """The server's health view in a message (one row), or None when it sent none."""
    if protocol.EXPLORE not in config:
        return None
    merged = np.asarray(config[protocol.MERGED_INTO], dtype=np.int64).reshape(1, -1)
    spare = np.asarray(config[protocol.SPARE], dtype=bool).reshape(1, -1)
    if merged.shape[1] != num_clusters or spare.shape[1] != num_clusters \
            or merged.min(initial=-1) < -1 or merged.max(initial=-1) >= num_clusters:
        raise ValueError(f"the message's '{protocol.MERGED_INTO}'/'{protocol.SPARE}' do not describe "
                         f"{num_clusters} clusters")
    return RoutingView(explore=np.array([bool(config[protocol.EXPLORE])]), merged_into=merged, spare=spare)


def routing_reply(message: Message, context: Context, config: dict[str, Any], settings: RoutingSettings,
                  clients: ClientBatch, models: np.ndarray, template: dict[str, np.ndarray]) -> Message:
    """One routing round of a one-client batch: state → agent step → training → reply."""
    run_key = str(config[protocol.RUN_KEY])
    masses = np.asarray(config[protocol.MASSES], dtype=np.float64) if config[protocol.HAS_MASSES] else None
    round_index, client_id = int(config[protocol.ROUND_INDEX]), int(clients.client_ids[0])
    directory = state_directory(context)
    every_round = float(config.get(protocol.SAMPLED_FRACTION, 1.0)) >= 1.0
    state = load_agent_state(context, run_key, settings, round_index, client_id, directory, every_round)
    num_rounds = int(config[protocol.NUM_ROUNDS]) if protocol.NUM_ROUNDS in config else None
    result = client_round(clients, state, settings, models, masses, round_index, int(config[protocol.SEED]),
                          num_rounds, received_view(config, settings.num_clusters))
    save_agent_state(context, run_key, result.state, round_index, client_id, directory)
    decision = result.decision
    trained = protocol.unflatten_arrays(result.trained_models[0], template)
    return reply(message, {
        protocol.CLUSTER: int(decision.routes[0]),
        protocol.NUM_EXAMPLES: num_examples_metric(clients.num_examples[0]),
        protocol.CLIENT_ID: client_id,
        protocol.LOSSES: [float(v) for v in result.losses[0]],
        protocol.ROUTE_DISTRIBUTION: [float(v) for v in decision.route_distributions[0]],
        protocol.CONTROLLER: int(decision.controller[0]),
        protocol.ARM: int(decision.arm[0]),
        protocol.FEEDBACK: float(decision.feedback[0]),
        protocol.ENTERED: int(decision.entered[0]),
        protocol.RELEASED: int(decision.released[0]),
        protocol.ROUNDS_PLAYED: int(result.state.rounds_played[0]),
        protocol.PREFERRED: int(decision.preferred[0]),
        protocol.EXP3_LOG_WEIGHTS: [float(v) for v in result.state.exp3_log_weights[0]],
    }, array_record(trained), getattr(clients, "train_metrics", None))


def fedcam_reply(message: Message, config: dict[str, Any], clients: ClientBatch, models: np.ndarray,
                 template: dict[str, np.ndarray], global_model: np.ndarray) -> Message:
    """FedCAM: assignment by the combined predictor, local update of both parts, both returned."""
    result = fedcam_client_round(clients, global_model, models, int(config[protocol.ROUND_INDEX]))
    cluster = int(result.routes[0])
    answer = reply(message, {
        protocol.CLUSTER: cluster,
        protocol.NUM_EXAMPLES: num_examples_metric(clients.num_examples[0]),
        protocol.CLIENT_ID: int(clients.client_ids[0]),
        protocol.LOSSES: [float(v) for v in result.losses[0]],
        protocol.ROUTE_DISTRIBUTION: [float(k == cluster) for k in range(models.shape[0])],
    }, array_record(protocol.unflatten_arrays(result.cluster_models[0], template)),
        getattr(clients, "train_metrics", None))
    answer.content[protocol.GLOBAL_MODEL] = array_record(protocol.unflatten_arrays(result.global_models[0], template))
    return answer


def evaluation_losses(clients: ClientBatch, models: np.ndarray, global_model: Optional[np.ndarray],
                      split: str) -> np.ndarray:
    """The losses a controller-free evaluation reports, (n, K): of the ``K`` models, or — FedCAM, with
    ``global_model`` — of the combined predictors (:func:`~fedroute.core.fedcam.fedcam_losses`)."""
    if global_model is None:
        return clients.losses(models, split)
    return fedcam_losses(clients, global_model, models, split)
