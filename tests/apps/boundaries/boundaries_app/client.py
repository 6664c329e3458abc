"""The ClientApp: each handler returns one fedroute call (public API only)."""

from __future__ import annotations

import torch
from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from fedroute import routing_evaluate, routing_query, routing_train
from boundaries_app.task import client_data, make_model, mean_loss, train

torch.set_num_threads(1)

app = ClientApp()


def _data(context: Context):
    return client_data(int(context.node_config["partition-id"]), int(context.run_config["seed"]))


@app.train()
def train_handler(msg: Message, context: Context) -> Message:
    data, config = _data(context), context.run_config
    return routing_train(
        msg, context, make_model(),
        train_fn=lambda model: train(model, data.train, int(config["local-steps"]), float(config["learning-rate"])),
        loss_fn=lambda model: mean_loss(model, data.train), num_examples=len(data.train[1]))


@app.evaluate()
def evaluate_handler(msg: Message, context: Context) -> Message:
    data = _data(context)
    return routing_evaluate(msg, context, make_model(), lambda model: mean_loss(model, data.train),
                            num_examples=len(data.train[1]), test_loss_fn=lambda model: mean_loss(model, data.test),
                            group=data.group)


@app.query()
def query_handler(msg: Message, context: Context) -> Message:
    data = _data(context)
    return routing_query(msg, context, make_model(), lambda model: mean_loss(model, data.train),
                         num_examples=len(data.train[1]))
