"""The benchmark's ClientApp: one user ClientApp that serves both Flower's FedAvg and ClusteredRouting.

A FedAvg message (ArrayRecord ``arrays``) gets the usual handler (load the
model, train, reply); a ClusteredRouting message gets :func:`fedroute.routing_train`
with the same model, data and training.  It imports only what a user's
ClientApp would (Flower's client API at import; torch, the example's task code
and, for routing messages only, fedroute's plugin inside the handler), so that
in deployment — where every message starts a fresh ClientApp process — the
import cost it shows is the real one.

Two diagnostic configurations: under ``strategy = "routing-no-loss"`` its
``loss_fn`` runs no forward pass (it returns 0.0): what routing costs apart
from the ``K`` loss passes; under ``strategy = "fedavg-losses"`` the FedAvg
handler also runs ``loss_fn`` ``num-clusters`` times on the received model
before training, as routing does on the ``K`` models: the floor of routing's
cost, with nothing of fedroute.

Every reply carries ``bench-*`` metrics: the handler's CPU time and that of
``loss_fn`` and ``train_fn`` (with call counts), and wall-clock instants
(seconds since the epoch) of the ClientApp process's start, the handler's
start, the end of its imports and its end, plus the ``created_at`` of the
message it answers, so that a deployment round can be split into its phases,
and the process's CPU time at the end (in deployment: everything one message
cost its ClientApp process, start-up and imports included).
"""

from __future__ import annotations

import time
from typing import Any, Callable

from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

__all__ = ["client_app", "client_train", "client_evaluate", "process_start_time", "NO_LOSS", "FLOOR"]

NO_LOSS = "routing-no-loss"
"""Diagnostic strategy: ClusteredRouting whose ``loss_fn`` runs no forward pass (it returns 0.0, so every
client's K losses tie): the cost of routing apart from the K loss passes."""
FLOOR = "fedavg-losses"
"""Diagnostic strategy: FedAvg whose handler also runs the user's ``loss_fn`` K times on the received model
before training (as routing does on the K models), nothing of fedroute: the floor of routing's cost at K."""

client_app = ClientApp()


def process_start_time() -> float:
    """When this process started (seconds since the epoch; Linux ``/proc``, 10 ms resolution; NaN elsewhere)."""
    import os

    try:
        with open("/proc/self/stat") as stream:
            ticks = int(stream.read().rsplit(")", 1)[1].split()[19])
        with open("/proc/stat") as stream:
            boot = next(int(line.split()[1]) for line in stream if line.startswith("btime"))
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return float("nan")


def _client_data(context: Context) -> Any:
    from digits_app.task import client_data

    return client_data(int(context.node_config["partition-id"]), int(context.run_config["samples-per-client"]))


def _timed(function: Callable[..., Any], spent: dict[str, float], key: str) -> Callable[..., Any]:
    """``function`` that adds its CPU time to ``spent[key]`` and counts its calls."""
    def timed(*args: Any) -> Any:
        begin = time.thread_time()
        try:
            return function(*args)
        finally:
            spent[key] += time.thread_time() - begin
            spent[f"{key}-calls"] += 1
    return timed


@client_app.train()
def client_train(message: Message, context: Context) -> Message:
    """The same local training under both strategies; timings travel back as ``bench-*`` metrics."""
    wall_start, started = time.time(), time.thread_time()
    import torch

    from digits_app.task import DigitsCNN, mean_loss, train

    routing = "arrays" not in message.content.array_records
    if routing:
        from fedroute import routing_train
    wall_imported = time.time()
    torch.set_num_threads(1)
    data, config = _client_data(context), context.run_config
    server_round = int(message.content["config"]["server-round"])
    shuffle_seed = int(config["seed"]) * 1_000_003 + int(context.node_config["partition-id"]) * 1_009 + server_round
    spent = {"loss": 0.0, "train": 0.0, "loss-calls": 0.0, "train-calls": 0.0}

    def train_fn(model: torch.nn.Module) -> None:
        train(model, data.train, epochs=int(config["local-epochs"]), batch_size=int(config["batch-size"]),
              learning_rate=float(config["learning-rate"]), seed=shuffle_seed)

    train_fn = _timed(train_fn, spent, "train")
    if config["strategy"] == NO_LOSS:  # the benchmark's diagnostic: no forward pass, all losses tie
        loss_fn = _timed(lambda model: 0.0, spent, "loss")
    else:
        loss_fn = _timed(lambda model: mean_loss(model, data.train), spent, "loss")
    if not routing:  # FedAvg: the usual Flower handler
        model = DigitsCNN()
        model.load_state_dict(message.content["arrays"].to_torch_state_dict())
        if config["strategy"] == FLOOR:  # the floor diagnostic: the K loss passes routing makes
            model.eval()
            with torch.no_grad():
                for _ in range(int(config["num-clusters"])):
                    loss_fn(model)
            model.train()
        train_fn(model)
        reply = Message(content=RecordDict({"arrays": ArrayRecord(model.state_dict()),
                                            "metrics": MetricRecord({"num-examples": len(data.train)})}),
                        reply_to=message)
    else:  # clustered routing: one call
        reply = routing_train(message, context, DigitsCNN(), train_fn, loss_fn, num_examples=len(data.train))
    metrics = reply.content["metrics"]
    for key, value in spent.items():
        metrics[f"bench-{key}"] = value
    metrics["bench-handler"] = time.thread_time() - started
    metrics["bench-process-start"] = process_start_time()
    metrics["bench-handler-start"] = wall_start
    metrics["bench-imported"] = wall_imported
    metrics["bench-received-created"] = float(message.metadata.created_at)
    metrics["bench-handler-end"] = time.time()
    metrics["bench-process-cpu"] = time.process_time()  # deployment: this process's whole CPU time so far
    return reply


@client_app.evaluate()
def client_evaluate(message: Message, context: Context) -> Message:
    """FedAvg's per-round federated evaluation (Flower's default ``fraction_evaluate = 1``): held-out loss."""
    from digits_app.task import DigitsCNN, mean_loss

    data = _client_data(context)
    model = DigitsCNN()
    model.load_state_dict(message.content["arrays"].to_torch_state_dict())
    return Message(content=RecordDict({"metrics": MetricRecord({"num-examples": len(data.test),
                                                                "eval-loss": mean_loss(model, data.test)})}),
                   reply_to=message)
