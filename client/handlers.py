"""Message handling of a routing client: the one implementation behind both ClientApps.

The public plugin handlers (:func:`~fedroute.client.plugin.routing_train`,
``routing_evaluate``, ``routing_query``: a user's torch model) and the built-in
ClientApp (:mod:`fedroute.client.app`: our tasks) differ only in the client they
hand over — a :class:`~fedroute.core.task.ClientBatch` of one client, built by a
``make_client(config)`` factory from the message's ``config`` record.  From there
:func:`handle_train`, :func:`handle_evaluate` and :func:`handle_query` are shared:
the message's config and routing settings, the ``K`` decoded models (and
FedCAM's global part; :mod:`fedroute.client.received`), the controller state in ``Context.state`` (and the state
directory), :func:`~fedroute.core.client_step.client_round` and the reply schema
of :mod:`fedroute.protocol`.  The server algorithm a message names
(:data:`~fedroute.protocol.ALGORITHM`, a value of :data:`fedroute.core.methods.ALGORITHMS`;
absent = routing) is dispatched in one place, :data:`ALGORITHM_HANDLING`.

``num-examples``: every reply (``TRAIN``, ``QUERY``, ``EVALUATE``, identification) sends the
client's ``num_examples[0]`` through :func:`num_examples_metric` — an ``int`` when it is a whole
number (sample counts: every built-in task, and a plugin user's ``n``), else the ``float`` weight
(a plugin user may pass any weight > 0).  The server weighs the client's model by it.

This module imports no torch (every fresh ClientApp process imports it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict

from fedroute import protocol
from fedroute.core.evaluation import task_metrics
from fedroute.core.fedcam import combined_models, fedcam_client_round, fedcam_losses, uses_output_sum
from fedroute.core.client_step import client_round, provisional_greedy_routes
from fedroute.core.methods import ALGORITHM_LOCAL
from fedroute.core.settings import RoutingSettings
from fedroute.core.signature_start import sent_signatures
from fedroute.client.state_store import load_agent_state, save_agent_state, state_directory
from fedroute.client.received import cluster_models, global_part, is_identification, message_config, \
    received_orders, received_view, routing_config
from fedroute.strategies.records import array_record
from fedroute.core.task import ClientBatch
from fedroute.core.validation import invalid

__all__ = ["handle_train", "handle_evaluate", "handle_query", "ClientFactory", "Received", "received",
           "AlgorithmHandling", "ALGORITHM_HANDLING", "algorithm_handling", "routing_reply", "fedcam_reply", "reply",
           "evaluation_losses", "evaluation_reply", "evaluation_task_metrics", "num_examples_metric", "identity_reply"]

ClientFactory = Callable[[dict[str, Any]], ClientBatch]
"""``make_client(config) -> ClientBatch``: this node's client (a batch of one) for a message's config."""


def num_examples_metric(value: float) -> int | float:
    """``num-examples`` as an int when it is a whole number (sample counts), else a float weight.

    The one rule of every reply's ``num-examples`` (module docstring): ``num_examples_metric(12.0) == 12``
    (an ``int``), ``num_examples_metric(2.5) == 2.5``; never truncated.
    """
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


def identity_reply(message: Message, client_id: int, num_examples: float) -> Message:
    """The answer to an identification ``QUERY``: the client's id and sample count (nothing is evaluated)."""
    return reply(message, {protocol.CLIENT_ID: int(client_id), protocol.NUM_EXAMPLES: num_examples_metric(num_examples)})


@dataclass(frozen=True)
class Received:
    """What a message with models gives a handler (:func:`received`)."""

    config: dict[str, Any]
    settings: RoutingSettings
    handling: "AlgorithmHandling"
    clients: ClientBatch
    models: np.ndarray
    """The ``K`` cluster models, (K, P)."""
    template: dict[str, np.ndarray]
    """Cluster 0's arrays: names, shapes and dtypes of the replies' models."""
    global_model: Optional[np.ndarray]
    """FedCAM's global part (flat), or None."""


def received(message: Message, make_client: ClientFactory, check_layout: bool = False,
             with_global_part: bool = True) -> Received:
    """Decode a message with models: config → settings → algorithm → client → models (→ global part).

    ``check_layout``: check every received model with the client's ``check_template`` (a user's module).
    """
    config = routing_config(message)
    settings = RoutingSettings.from_dict(protocol.routing_settings_from_config(config))
    handling = algorithm_handling(config)
    clients = make_client(config)
    models, template = cluster_models(message, settings.num_clusters, clients, check_layout)
    global_model = global_part(message, clients, check_layout) if handling.global_part and with_global_part \
        else None
    return Received(config, settings, handling, clients, models, template, global_model)


# ------------------------------------------------------------------- algorithms
def routing_reply(message: Message, context: Context, got: Received) -> Message:
    """One routing round of a one-client batch: state → agent step → training → reply."""
    config, settings, clients = got.config, got.settings, got.clients
    run_key = str(config[protocol.RUN_KEY])
    masses = np.asarray(config[protocol.MASSES], dtype=np.float64) if config[protocol.HAS_MASSES] else None
    round_index, client_id = int(config[protocol.ROUND_INDEX]), int(clients.client_ids[0])
    directory = state_directory(context)
    every_round = float(config.get(protocol.SAMPLED_FRACTION, 1.0)) >= 1.0
    state = load_agent_state(context, run_key, settings, round_index, client_id, directory, every_round)
    num_rounds = int(config[protocol.NUM_ROUNDS]) if protocol.NUM_ROUNDS in config else None
    held, send_signature = received_orders(message, settings.num_clusters)
    result = client_round(clients, state, settings, got.models, masses, round_index, int(config[protocol.SEED]),
                          num_rounds, received_view(config, settings.num_clusters), held)
    save_agent_state(context, run_key, result.state, round_index, client_id, directory)
    decision = result.decision
    trained = protocol.unflatten_arrays(result.trained_models[0], got.template)
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
        **(signature_reply(clients, settings.signature_dim, int(config[protocol.SEED])) if send_signature else {}),
    }, array_record(trained), getattr(clients, "train_metrics", None))


def signature_reply(clients: ClientBatch, dim: int, seed: int) -> dict[str, list[float]]:
    """The signature start's metrics of a one-client batch: its own ``signature(dim, seed)`` (a
    :class:`~fedroute.client.torch_adapter.TorchClient`), else the task's samples'
    (:func:`fedroute.core.signature_start.sent_signatures`, the simulator's function); none (``{}``) when the
    client has no class samples to sign with (it is then not held)."""
    own = getattr(clients, "signature", None)
    if callable(own):
        signed = own(dim, seed)
    else:
        sent = sent_signatures(clients, np.ones(1, dtype=bool), np.array([seed]), dim)
        signed = None if sent is None else (sent.means[0], sent.counts[0])
    if signed is None:
        return {}
    means, counts = signed
    return {protocol.SIGNATURE_MEANS: [float(v) for v in np.ravel(means)],
            protocol.SIGNATURE_COUNTS: [float(v) for v in np.ravel(counts)]}


def fedcam_reply(message: Message, context: Context, got: Received) -> Message:
    """FedCAM: assignment by the combined predictor, local update of both parts, both returned
    (no controller state; :mod:`fedroute.core.fedcam`)."""
    clients = got.clients
    result = fedcam_client_round(clients, got.global_model, got.models, int(got.config[protocol.ROUND_INDEX]))
    cluster = int(result.routes[0])
    answer = reply(message, {
        protocol.CLUSTER: cluster,
        protocol.NUM_EXAMPLES: num_examples_metric(clients.num_examples[0]),
        protocol.CLIENT_ID: int(clients.client_ids[0]),
        protocol.LOSSES: [float(v) for v in result.losses[0]],
        protocol.ROUTE_DISTRIBUTION: [float(k == cluster) for k in range(got.models.shape[0])],
    }, array_record(protocol.unflatten_arrays(result.cluster_models[0], got.template)),
        getattr(clients, "train_metrics", None))
    answer.content[protocol.GLOBAL_MODEL] = array_record(
        protocol.unflatten_arrays(result.global_models[0], got.template))
    return answer


@dataclass(frozen=True)
class AlgorithmHandling:
    """How a client handles the messages of one server algorithm."""

    train: Callable[[Message, Context, Received], Message]
    """The reply to a ``TRAIN`` message."""
    global_part: bool
    """Its messages carry FedCAM's global part: losses are of the combined predictors."""


ALGORITHM_HANDLING: dict[str, AlgorithmHandling] = {
    protocol.ALGORITHM_ROUTING: AlgorithmHandling(routing_reply, global_part=False),
    protocol.ALGORITHM_FEDCAM: AlgorithmHandling(fedcam_reply, global_part=True),
    ALGORITHM_LOCAL: AlgorithmHandling(routing_reply, global_part=False),
}
"""Per value of :data:`~fedroute.protocol.ALGORITHM` (every one of :data:`fedroute.core.methods.ALGORITHMS`):
the one place the client dispatches.  Local training sends the routing messages (``K = 1``, each client's
own model as ``cluster-0``; :mod:`fedroute.strategies.local`), so it is handled as routing."""


def algorithm_handling(config: dict[str, Any]) -> AlgorithmHandling:
    """The handling of the algorithm a message's config names (absent: routing)."""
    name = config.get(protocol.ALGORITHM, protocol.ALGORITHM_ROUTING)
    if name not in ALGORITHM_HANDLING:
        raise invalid(f"the message's '{protocol.ALGORITHM}'", name, f"one of {tuple(ALGORITHM_HANDLING)}")
    return ALGORITHM_HANDLING[name]


def evaluation_losses(clients: ClientBatch, models: np.ndarray, global_model: Optional[np.ndarray],
                      split: str) -> np.ndarray:
    """The losses a controller-free evaluation reports, (n, K): of the ``K`` models, or — FedCAM, with
    ``global_model`` — of the combined predictors (:func:`~fedroute.core.fedcam.fedcam_losses`)."""
    if global_model is None:
        return clients.losses(models, split)
    return fedcam_losses(clients, global_model, models, split)


# --------------------------------------------------------------------- handlers
def handle_train(message: Message, context: Context, make_client: ClientFactory,
                 check_layout: bool = False) -> Message:
    """The reply to a ``TRAIN`` message: the round of the algorithm the message names."""
    got = received(message, make_client, check_layout)
    return got.handling.train(message, context, got)


def handle_evaluate(message: Message, make_client: ClientFactory, check_layout: bool = False,
                    test_split: bool = True) -> Message:
    """The reply to an ``EVALUATE`` message: every model's loss on both splits (FedCAM: of the combined
    predictors), the group and the task's or user's metrics.  ``test_split = False``: the client has no
    held-out loss, so the test losses are the training losses (not computed twice)."""
    got = received(message, make_client, check_layout)
    clients, models, global_model = got.clients, got.models, got.global_model
    train_losses = evaluation_losses(clients, models, global_model, "train")[0]
    test_losses = evaluation_losses(clients, models, global_model, "test")[0] if test_split else train_losses
    return evaluation_reply(message, int(clients.client_ids[0]), clients.num_examples[0], train_losses, test_losses,
                            int(clients.groups[0]), evaluation_task_metrics(clients, models, global_model))


def handle_query(message: Message, make_client: ClientFactory, check_layout: bool = False) -> Message:
    """The reply to a ``QUERY`` message: the identification of partial participation (no models), or
    synchronized entry's provisional report (the Greedy choice at ``W^0``; nothing trained, no state change)."""
    if is_identification(message):
        clients = make_client(message_config(message))
        return identity_reply(message, int(clients.client_ids[0]), clients.num_examples[0])
    got = received(message, make_client, check_layout, with_global_part=False)
    clients = got.clients
    return reply(message, {
        protocol.CLUSTER: int(provisional_greedy_routes(clients, got.models, got.settings,
                                                        int(got.config[protocol.SEED]))[0]),
        protocol.NUM_EXAMPLES: num_examples_metric(clients.num_examples[0]),
        protocol.CLIENT_ID: int(clients.client_ids[0]),
    })
