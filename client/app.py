"""The fedroute ClientApp (thin): one client's routing round on Flower messages.

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

from typing import Any

import numpy as np
from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fedroute import protocol
from fedroute.app_identity import app_files, app_fingerprint
from fedroute.client.handlers import evaluation_losses, evaluation_reply, evaluation_task_metrics, fedcam_reply, \
    identity_reply, is_identification, reply, routing_reply
from fedroute.core.client_step import provisional_greedy_routes
from fedroute.core.settings import RoutingSettings
from fedroute.strategies.records import decode_array
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


def _client(context: Context, config: dict[str, Any]) -> ClientBatch:
    """This node's data (a batch of one client)."""
    if "partition-id" not in context.node_config:
        raise ValueError("node config needs 'partition-id' (and 'num-partitions'); "
                         "pass --node-config 'partition-id=<i> num-partitions=<n>'")
    partition_id = int(context.node_config["partition-id"])
    return task_from_config(task_config(context, config)).clients(np.array([partition_id]))


def _cluster_models(message: Message, num_clusters: int) -> tuple[np.ndarray, dict[str, np.ndarray]]:
    """The broadcast models as a (K, P) float array, and cluster 0's arrays as the template."""
    arrays = [
        {name: decode_array(array) for name, array in message.content[protocol.cluster_key(k)].items()}
        for k in range(num_clusters)
    ]
    return protocol.stack_flat(arrays), arrays[0]


def _settings(config: dict[str, Any]) -> RoutingSettings:
    return RoutingSettings.from_dict(protocol.routing_settings_from_config(config))


def _received(
    message: Message, context: Context
) -> tuple[dict[str, Any], RoutingSettings, np.ndarray, dict[str, np.ndarray], ClientBatch]:
    """What every message handler needs: config, routing settings, the K models (flat and
    cluster 0's arrays as the template) and this node's data."""
    config = dict(message.content[protocol.CONFIG].items())
    settings = _settings(config)
    models, template = _cluster_models(message, settings.num_clusters)
    return config, settings, models, template, _client(context, config)


@app.train()
def train(message: Message, context: Context) -> Message:
    """One routing round: losses → agent step → local training of the routed model."""
    config, settings, models, template, clients = _received(message, context)
    if config.get(protocol.ALGORITHM) == protocol.ALGORITHM_FEDCAM:
        return _train_fedcam(message, config, models, template, clients)
    return routing_reply(message, context, config, settings, clients, models, template)


def _global_part(message: Message) -> np.ndarray:
    """FedCAM's ``Θ_glob`` (the ``global-model`` record) as a flat vector."""
    return protocol.flatten_arrays(
        {name: decode_array(array) for name, array in message.content[protocol.GLOBAL_MODEL].items()})


def _train_fedcam(message: Message, config: dict[str, Any], models: np.ndarray, template: dict[str, np.ndarray],
                  clients: ClientBatch) -> Message:
    """FedCAM: assignment by the combined predictor, local update of both parts."""
    return fedcam_reply(message, config, clients, models, template, _global_part(message))


@app.query()
def provisional(message: Message, context: Context) -> Message:
    """Synchronized entry, step 1: the Greedy choice at ``W^0`` (nothing trained); the node-config query; or,
    under partial participation, the identification (client id and sample count, no models)."""
    if message.content[protocol.CONFIG].get(protocol.PHASE) == protocol.PHASE_NODE_CONFIG:
        return node_config_report(message, context.node_config)
    if is_identification(message):
        clients = _client(context, dict(message.content[protocol.CONFIG].items()))
        return identity_reply(message, int(clients.client_ids[0]), float(clients.num_examples[0]))
    config, settings, models, _, clients = _received(message, context)
    return reply(message, {
        protocol.CLUSTER: int(provisional_greedy_routes(clients, models, settings, int(config[protocol.SEED]))[0]),
        protocol.NUM_EXAMPLES: int(clients.num_examples[0]),
        protocol.CLIENT_ID: int(clients.client_ids[0]),
    })


@app.evaluate()
def evaluate(message: Message, context: Context) -> Message:
    """Controller-free evaluation: every model's loss on both splits (and the group label).

    Under FedCAM the models are the combined predictors of the cluster parts and ``Θ_glob``."""
    config, _, models, _, clients = _received(message, context)
    fedcam = config.get(protocol.ALGORITHM) == protocol.ALGORITHM_FEDCAM
    global_model = _global_part(message) if fedcam else None
    return evaluation_reply(message, int(clients.client_ids[0]), int(clients.num_examples[0]),
                            evaluation_losses(clients, models, global_model, "train")[0],
                            evaluation_losses(clients, models, global_model, "test")[0], int(clients.groups[0]),
                            evaluation_task_metrics(clients, models, global_model))
