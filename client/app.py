"""The fedroute ClientApp (thin): our tasks' clients on the shared message handling.

Each handler builds this node's client of the task — a
:class:`~fedroute.core.task.ClientBatch` of one client — and hands it to
:mod:`fedroute.client.handlers`, the implementation behind the public plugin
handlers :func:`~fedroute.client.plugin.routing_train`, ``routing_evaluate`` and
``routing_query`` as well: the same decoding, algorithm dispatch, controller
state and replies.  (It calls that torch-free level, not the plugin functions,
because those take a torch module and every message starts a fresh ClientApp
process, which would pay for importing torch.)

``TRAIN``: compute the losses of all ``K`` broadcast models, run the agent
step (controller choice, route, episode), train the routed model, reply with
one ArrayRecord (the trained model) and one MetricRecord.  ``QUERY``
(synchronized entry, step 1): report the Greedy choice only.  ``EVALUATE``:
report every model's loss on the train and held-out split.

The client's data come from ``node_config["partition-id"]`` and the run config
(task settings) with the number of clients the ServerApp chose
(:data:`~fedroute.protocol.TASK_NUM_CLIENTS` in every message) and, where the
node config names one, the node's own ``data-file``; its controller state lives
in ``Context.state``.  A ``QUERY`` of phase
:data:`~fedroute.protocol.PHASE_NODE_CONFIG` is answered with the node's
``partition-id`` and ``num-partitions`` (:mod:`fedroute.server.federation`).
"""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedroute import protocol
from fedroute.app_identity import app_files, app_fingerprint
from fedroute.client.handlers import handle_evaluate, handle_query, handle_train
from fedroute.client.received import message_config
from fedroute.core.task import ClientBatch
from fedroute.tasks.registry import task_from_config

__all__ = ["app"]

app = ClientApp()


NODE_DATA_FILE = "data-file"
"""Node-config key: this node's local copy of the task's data (overrides run-config ``data-file``)."""


def task_config(context: Context, config: dict[str, Any]) -> dict[str, Any]:
    """The task settings of this node: the run config, the server's number of clients, the node's data file."""
    settings = dict(context.run_config)
    if protocol.TASK_NUM_CLIENTS in config:
        settings["num-clients"] = int(config[protocol.TASK_NUM_CLIENTS])
    if context.node_config.get(NODE_DATA_FILE):
        settings["data-file"] = str(context.node_config[NODE_DATA_FILE])
    return settings


def node_config_report(message: Message, node_config: Any) -> Message:
    """The answer to the node-config query: ``partition-id`` and ``num-partitions``
    (:data:`~fedroute.protocol.UNKNOWN` for a key the node config lacks or holds as a non-integer), and which
    fedroute files this ClientApp runs (:mod:`fedroute.app_identity`)."""

    def integer(key: str) -> int:
        value = node_config.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else protocol.UNKNOWN

    partition = {key: integer(key) for key in (protocol.PARTITION_ID, protocol.NUM_PARTITIONS)}
    identity = {protocol.APP_FILES: str(app_files()), protocol.APP_FINGERPRINT: app_fingerprint()}
    content = RecordDict({protocol.METRICS: MetricRecord(partition), protocol.CONFIG: ConfigRecord(identity)})
    return Message(content=content, reply_to=message)


def task_client(context: Context, config: dict[str, Any]) -> ClientBatch:
    """This node's data (a batch of one client): the task's client of ``node_config["partition-id"]``."""
    if "partition-id" not in context.node_config:
        raise ValueError("node config needs 'partition-id' (and 'num-partitions'); "
                         "pass --node-config 'partition-id=<i> num-partitions=<n>'")
    partition_id = int(context.node_config["partition-id"])
    return task_from_config(task_config(context, config)).clients(np.array([partition_id]))


@app.train()
def train(message: Message, context: Context) -> Message:
    """One round of the algorithm the message names (routing: losses → agent step → local training)."""
    return handle_train(message, context, partial(task_client, context))


@app.query()
def provisional(message: Message, context: Context) -> Message:
    """Synchronized entry, step 1: the Greedy choice at ``W^0`` (nothing trained); the node-config query; or,
    under partial participation, the identification (client id and sample count, no models)."""
    if message_config(message).get(protocol.PHASE) == protocol.PHASE_NODE_CONFIG:
        return node_config_report(message, context.node_config)
    return handle_query(message, partial(task_client, context))


@app.evaluate()
def evaluate(message: Message, context: Context) -> Message:
    """Controller-free evaluation: every model's loss on both splits (and the group label).

    Under FedCAM the models are the combined predictors of the cluster parts and ``Θ_glob``."""
    return handle_evaluate(message, partial(task_client, context))
