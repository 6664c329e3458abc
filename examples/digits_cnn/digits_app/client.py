"""The ClientApp: the user's own handlers, each returning one fedroute call.

Without fedroute these handlers would load the received model, train it and
reply.  With clustered routing the server sends ``K`` models; fedroute
evaluates ``loss_fn`` on each, lets the client's EXP3 controller choose the
route, trains the routed model with ``train_fn`` and builds the reply.  The
client's controller state lives in ``context.state``.
"""

from __future__ import annotations

import torch
from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from fedroute import routing_evaluate, routing_query, routing_train
from digits_app.task import DigitsCNN, client_data, mean_loss, train

torch.set_num_threads(1)  # one simulated client per CPU: no oversubscription

app = ClientApp()


def _data(context: Context):
    partition_id = int(context.node_config["partition-id"])
    return client_data(partition_id, int(context.run_config["samples-per-client"]))


@app.train()
def train_handler(msg: Message, context: Context) -> Message:
    """Train the model chosen by this client's routing controller."""
    data = _data(context)
    config = context.run_config
    server_round = int(msg.content["config"]["server-round"])
    shuffle_seed = int(config["seed"]) * 1_000_003 + int(context.node_config["partition-id"]) * 1_009 + server_round

    def train_fn(model: torch.nn.Module) -> None:
        train(model, data.train, epochs=int(config["local-epochs"]), batch_size=int(config["batch-size"]),
              learning_rate=float(config["learning-rate"]), seed=shuffle_seed)

    # signature_data: read only when the server runs the signature start (signature-hold-rounds > 0).
    return routing_train(msg, context, DigitsCNN(), train_fn, lambda model: mean_loss(model, data.train),
                         num_examples=len(data.train), signature_data=[(data.train.images, data.train.labels)],
                         num_classes=10)


@app.evaluate()
def evaluate_handler(msg: Message, context: Context) -> Message:
    """Loss of every cluster model on this client's training and held-out data."""
    data = _data(context)
    return routing_evaluate(msg, context, DigitsCNN(), lambda model: mean_loss(model, data.train),
                            num_examples=len(data.train), test_loss_fn=lambda model: mean_loss(model, data.test),
                            group=data.group)


@app.query()
def query_handler(msg: Message, context: Context) -> Message:
    """Synchronized entry's provisional report (only with method = "sync-entry")."""
    data = _data(context)
    return routing_query(msg, context, DigitsCNN(), lambda model: mean_loss(model, data.train),
                         num_examples=len(data.train))
