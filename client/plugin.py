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
``Context.state`` and builds the reply in the schema of :mod:`fedroute.protocol`.
Each call only wraps the user's module and functions as a
:class:`~fedroute.client.torch_adapter.TorchClient` and hands it to
:mod:`fedroute.client.handlers`, which the built-in ClientApp
(:mod:`fedroute.client.app`) hands its task's client to: the two send the same
replies by construction (``num-examples`` by the rule of
:func:`~fedroute.client.handlers.num_examples_metric`).  The routing rules are
those of :func:`fedroute.core.client_step.client_round`.
"""

from __future__ import annotations

from typing import Any, Optional

import torch
from flwr.app import Context, Message

from fedroute.client.handlers import handle_evaluate, handle_query, handle_train
from fedroute.client.torch_adapter import LossFunction, MetricsFunction, TorchClient, TrainFunction

__all__ = ["routing_train", "routing_evaluate", "routing_query"]


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
    signature_data: Any = None,
    num_classes: Optional[int] = None,
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
        Training examples (> 0), the aggregation weight (sent as an ``int`` when whole, else as the
        ``float``: :func:`~fedroute.client.handlers.num_examples_metric`).
    client_id : int, optional
        Global client id (≥ 0): the coordinate of the client's random draws and
        the key of its replies.  Defaults to ``context.node_config["partition-id"]``.
        Must be unique and stable per client.
    batched : bool or "auto", default "auto"
        With a :class:`~fedroute.client.batched_losses.DataLoss` as ``loss_fn``: score the
        ``K`` models in one ``torch.func.vmap`` pass (``True``), one pass each (``False``), or
        batched when its data are on a GPU (``"auto"``); a module ``vmap`` cannot run falls
        back to the loop.  One pass each is :meth:`~fedroute.client.batched_losses.DataLoss.each`
        (the models as ``functional_call`` states, not loaded into ``model``).  A plain function
        ``loss_fn`` always runs once per model, each model loaded.
    signature_data, num_classes : optional
        Needed when the server runs the signature start (``signature-hold-rounds > 0``): the client's
        labelled training batches ``(inputs, labels)`` (or a function returning them) and the number of
        classes (:class:`~fedroute.client.torch_adapter.TorchClient`).  Sent once, sketched.

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
    def make_client(config: dict) -> TorchClient:
        return TorchClient(model, loss_fn, train_fn, num_examples=num_examples,
                           client_id=_client_id(context, client_id), batched=batched,
                           signature_data=signature_data, num_classes=num_classes)

    return handle_train(message, context, make_client, check_layout=True)


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
    def make_client(config: dict) -> TorchClient:
        return TorchClient(model, loss_fn, num_examples=num_examples, client_id=_client_id(context, client_id),
                           group=group, test_loss_fn=test_loss_fn, metrics_fn=metrics_fn)

    return handle_evaluate(message, make_client, check_layout=True, test_split=test_loss_fn is not None)


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
    def make_client(config: dict) -> TorchClient:
        return TorchClient(model, loss_fn, num_examples=num_examples, client_id=_client_id(context, client_id))

    return handle_query(message, make_client, check_layout=True)
