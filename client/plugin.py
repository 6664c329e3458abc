"""Routing for a user's own Flower ClientApp: one call per message handler.

A user with a working Flower app (own torch model, data and training loop)
switches to clustered routing by swapping the strategy for
:class:`~fedroute.strategies.clustered.ClusteredRouting` and letting each
handler of their ClientApp return one of these calls::

    @app.train()
    def train(msg, context):
        return routing_train(msg, context, model, train_fn, loss_fn, num_examples)

    @app.evaluate()
    def evaluate(msg, context):
        return routing_evaluate(msg, context, model, loss_fn, num_examples, test_loss_fn=test_loss_fn)

    @app.query()
    def query(msg, context):
        return routing_query(msg, context, model, loss_fn, num_examples)

Each call reads the ``K`` cluster models and the routing configuration from the
message, evaluates ``loss_fn`` on every model, runs the client's controller
step (EXP3 arm choice, route sample, hysteresis episodes, entry test), trains
the routed model with ``train_fn``, keeps the controller state in
``Context.state`` and builds the reply in the schema of :mod:`fedroute.protocol`
(exactly what the built-in ClientApp :mod:`fedroute.client.app` sends).  The
routing rules are those of :func:`fedroute.core.client_step.client_round`.
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np
import torch
from flwr.app import Context, Message

from fedroute import protocol
from fedroute.client.handlers import evaluation_losses, evaluation_reply, evaluation_task_metrics, fedcam_reply, \
    identity_reply, is_identification, num_examples_metric, reply, routing_reply
from fedroute.core.client_step import provisional_greedy_routes
from fedroute.core.settings import RoutingSettings
from fedroute.client.torch_adapter import LossFunction, MetricsFunction, TorchClient, TrainFunction
from fedroute.strategies.records import decode_array

__all__ = ["routing_train", "routing_evaluate", "routing_query"]


# ----------------------------------------------------------------- received side
def _config(message: Message) -> dict[str, Any]:
    records = message.content.config_records
    config = dict(records[protocol.CONFIG].items()) if protocol.CONFIG in records else {}
    if protocol.RUN_KEY not in config:
        raise ValueError(f"this {message.metadata.message_type!r} message (records {list(message.content)}) was not "
                         "sent by fedroute's ClusteredRouting: its ConfigRecord 'config' has no routing keys. "
                         "Use ClusteredRouting (or FedCAM) as the ServerApp's strategy")
    return config


def _settings(config: dict[str, Any]) -> RoutingSettings:
    return RoutingSettings.from_dict(protocol.routing_settings_from_config(config))


def _cluster_models(message: Message, num_clusters: int, client: TorchClient) -> tuple[np.ndarray, dict]:
    """The ``K`` broadcast models as a (K, P) float64 array, and cluster 0's arrays (the reply template)."""
    records = message.content.array_records
    missing = [protocol.cluster_key(k) for k in range(num_clusters) if protocol.cluster_key(k) not in records]
    if missing:
        raise ValueError(f"the message lacks the cluster models {missing} (records: {list(message.content)})")
    decoded = []
    for k in range(num_clusters):
        arrays = {name: decode_array(array) for name, array in records[protocol.cluster_key(k)].items()}
        client.check_template(arrays)
        decoded.append(arrays)
    return protocol.stack_flat(decoded), decoded[0]


def _client_id(context: Context, client_id: Optional[int]) -> int:
    if client_id is not None:
        return int(client_id)
    if "partition-id" not in context.node_config:
        raise ValueError("no client id: pass client_id=..., or give the node a 'partition-id' "
                         "(--node-config 'partition-id=<i> num-partitions=<n>'; simulation sets it)")
    return int(context.node_config["partition-id"])


# -------------------------------------------------------------------- handlers
def routing_train(
    message: Message,
    context: Context,
    model: torch.nn.Module,
    train_fn: TrainFunction,
    loss_fn: LossFunction,
    num_examples: int,
    *,
    client_id: Optional[int] = None,
    batched: bool | str = "auto",
) -> Message:
    """One routing round of this client: the reply to a ``TRAIN`` message of ClusteredRouting.

    Losses of all ``K`` broadcast models (``loss_fn``) → controller step
    (EXP3 arm, route distribution, hard route, hysteresis episode, entry
    test) → ``train_fn`` on the routed model → reply.

    Parameters
    ----------
    message : flwr.app.Message
        The ``TRAIN`` message (``K`` ArrayRecords ``cluster-0 … cluster-{K-1}``
        and the ``config`` ConfigRecord).
    context : flwr.app.Context
        The ClientApp context; the controller state lives in ``context.state``
        (and, with node config ``state-dir``, in a file).
    model : torch.nn.Module
        The user's module (same architecture as the cluster models).  It is
        used as a working buffer and holds the trained routed model afterwards.
    train_fn : callable
        ``train_fn(model) -> None | float | dict``: the user's local training, in
        place, on their data.  Called with the module in ``train()`` mode, once
        for the routed model and once more per probed cluster when a hysteresis
        entry test runs (probe results are discarded).  What it returns for the
        routed model is sent as the MetricRecord ``train-metrics``: a dict of
        numbers, or a number (its loss, sent as ``train_loss``).
    loss_fn : callable
        ``loss_fn(model) -> float``: mean loss on the client's training data.
        Called once per cluster model, in ``eval()`` mode under ``torch.no_grad()``.
    num_examples : int
        Training examples (> 0), the aggregation weight.
    client_id : int, optional
        Global client id (≥ 0): the coordinate of the client's random draws and
        the key of its replies.  Defaults to ``context.node_config["partition-id"]``.
        Must be unique and stable per client.
    batched : bool or "auto", default "auto"
        With a :class:`~fedroute.client.batched_losses.DataLoss` as ``loss_fn``: score the
        ``K`` models in one ``torch.func.vmap`` pass (``True``), one pass each (``False``), or
        batched when its data are on a GPU (``"auto"``); a module ``vmap`` cannot run falls
        back to the loop.  A plain function ``loss_fn`` always runs once per model.

    Returns
    -------
    flwr.app.Message
        The reply: ArrayRecord ``model`` (the trained routed model, same names,
        shapes and dtypes as the broadcast ones) and MetricRecord ``metrics``
        (``cluster``, ``num-examples``, ``client-id``, ``losses``,
        ``route-distribution``, ``controller``, ``arm``, ``feedback``,
        ``entered``, ``released``, ``rounds-played``, ``exp3-log-weights``).
        For a :class:`~fedroute.strategies.fedcam.FedCAM` message the reply also
        holds the trained global part (``global-model``).

    Raises
    ------
    ValueError
        If the message is not a ClusteredRouting message, its models do not fit
        ``model``'s ``state_dict``, or no client id is known.
    """
    config = _config(message)
    settings = _settings(config)
    client = TorchClient(model, loss_fn, train_fn, num_examples=num_examples,
                         client_id=_client_id(context, client_id), batched=batched)
    models, template = _cluster_models(message, settings.num_clusters, client)
    if config.get(protocol.ALGORITHM) == protocol.ALGORITHM_FEDCAM:
        return _train_fedcam(message, config, client, models, template)
    return routing_reply(message, context, config, settings, client, models, template)


def _global_part(message: Message, client: TorchClient) -> np.ndarray:
    """FedCAM's ``Θ_glob`` (the ``global-model`` record), checked against the module, as a flat vector."""
    if protocol.GLOBAL_MODEL not in message.content.array_records:
        raise ValueError(f"a FedCAM message needs the ArrayRecord '{protocol.GLOBAL_MODEL}'")
    global_arrays = {name: decode_array(array)
                     for name, array in message.content.array_records[protocol.GLOBAL_MODEL].items()}
    client.check_template(global_arrays)
    return protocol.flatten_arrays(global_arrays)


def _train_fedcam(message: Message, config: dict[str, Any], client: TorchClient, models: np.ndarray,
                  template: dict[str, np.ndarray]) -> Message:
    """FedCAM on a user's module: the additive form (Greedy on ``Θ_glob + Θ_k``, the displacement split
    between the parts; :mod:`fedroute.core.fedcam`)."""
    return fedcam_reply(message, config, client, models, template, _global_part(message, client))


def routing_evaluate(
    message: Message,
    context: Context,
    model: torch.nn.Module,
    loss_fn: LossFunction,
    num_examples: int,
    *,
    test_loss_fn: Optional[LossFunction] = None,
    metrics_fn: Optional[MetricsFunction] = None,
    client_id: Optional[int] = None,
    group: int = -1,
) -> Message:
    """Controller-free evaluation: the reply to ClusteredRouting's ``EVALUATE`` messages.

    Parameters
    ----------
    message : flwr.app.Message
        The ``EVALUATE`` message (the ``K`` final cluster models).
    context : flwr.app.Context
        The ClientApp context.
    model : torch.nn.Module
        The user's module (a working buffer).
    loss_fn : callable
        ``loss_fn(model) -> float``: mean loss on the training data.
    num_examples : int
        Training examples (> 0).
    test_loss_fn : callable, optional
        ``test_loss_fn(model) -> float`` on held-out data.  Without it the
        reported test losses are the training losses.
    metrics_fn : callable, optional
        ``metrics_fn(model) -> {name: number}``, e.g. ``{"accuracy": 0.93}`` on held-out
        data; called once per cluster model, in ``eval()`` mode under ``torch.no_grad()``,
        and must return the same names each time.  The strategy reads every client at its
        lowest-training-loss model and aggregates each metric over clients (mean, worst
        decile), per cluster and per ``group`` (:func:`fedroute.core.evaluation.evaluation_metrics`).
    client_id : int, optional
        As in :func:`routing_train`.
    group : int, default -1
        The client's latent group if an experiment knows it (used only for
        metrics such as assignment accuracy); ``-1`` = unknown.

    Returns
    -------
    flwr.app.Message
        MetricRecord ``metrics``: ``client-id``, ``num-examples``,
        ``train-losses`` and ``test-losses`` (``K`` values each), ``group``;
        with ``metrics_fn``, MetricRecord ``evaluate-metrics``: each name → ``K`` values.
        The strategy keeps the final ones in ``ClusteredRouting.final_evaluation`` and the
        aggregates of every evaluation in ``ClusteredRouting.evaluation``.

    Raises
    ------
    TypeError
        If ``metrics_fn`` returns anything but a dict of numbers with the same names for every model.
    """
    config = _config(message)
    settings = _settings(config)
    client = TorchClient(model, loss_fn, num_examples=num_examples, client_id=_client_id(context, client_id),
                         group=group, test_loss_fn=test_loss_fn, metrics_fn=metrics_fn)
    models, _ = _cluster_models(message, settings.num_clusters, client)
    global_model = _global_part(message, client) if config.get(protocol.ALGORITHM) == protocol.ALGORITHM_FEDCAM \
        else None
    train_losses = evaluation_losses(client, models, global_model, "train")[0]
    test_losses = evaluation_losses(client, models, global_model, "test")[0] if test_loss_fn is not None \
        else train_losses
    return evaluation_reply(message, int(client.client_ids[0]), client.num_examples[0], train_losses, test_losses,
                            group, evaluation_task_metrics(client, models, global_model))


def routing_query(
    message: Message,
    context: Context,
    model: torch.nn.Module,
    loss_fn: LossFunction,
    num_examples: int,
    *,
    client_id: Optional[int] = None,
) -> Message:
    """The reply to ClusteredRouting's ``QUERY`` messages: synchronized entry's provisional report, or
    the identification of partial participation.

    Provisional report (routing settings with ``synchronized_entry=True``): the
    client's Greedy choice (lowest ``loss_fn``) among the ``K`` initial models;
    nothing is trained and no state changes.  Identification (``fraction_train <
    1``: the strategy samples *clients*, so it asks each node once who it is): the
    client id and ``num_examples``, without models and without calling ``loss_fn``.
    A ClientApp should always register it.

    Parameters
    ----------
    message, context, model, loss_fn, num_examples, client_id
        As in :func:`routing_train`.

    Returns
    -------
    flwr.app.Message
        MetricRecord ``metrics``: ``cluster`` (not in an identification), ``num-examples``, ``client-id``.
    """
    if is_identification(message):
        return identity_reply(message, _client_id(context, client_id), num_examples)
    config = _config(message)
    settings = _settings(config)
    client = TorchClient(model, loss_fn, num_examples=num_examples, client_id=_client_id(context, client_id))
    models, _ = _cluster_models(message, settings.num_clusters, client)
    return reply(message, {
        protocol.CLUSTER: int(provisional_greedy_routes(client, models, settings, int(config[protocol.SEED]))[0]),
        protocol.NUM_EXAMPLES: num_examples_metric(client.num_examples[0]),
        protocol.CLIENT_ID: int(client.client_ids[0]),
    })
