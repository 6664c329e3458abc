"""The fedroute ClientApp (thin): one client's routing round on Flower messages.

``TRAIN``: compute the losses of all ``K`` broadcast models, run the agent
step (controller choice, route, episode), train the routed model, reply with
one ArrayRecord (the trained model) and one MetricRecord.  ``QUERY``
(synchronized entry, step 1): report the Greedy choice only.  ``EVALUATE``:
report every model's loss on the train and held-out split.

The client's data come from ``node_config["partition-id"]`` and the run config
(task settings); its controller state lives in ``Context.state``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from fedroute import protocol
from fedroute.client.handlers import evaluation_losses, fedcam_reply, identity_reply, is_identification, reply, \
    routing_reply
from fedroute.core.client_step import provisional_greedy_routes
from fedroute.core.settings import RoutingSettings
from fedroute.strategies.records import decode_array
from fedroute.core.task import ClientBatch
from fedroute.tasks.registry import task_from_config

__all__ = ["app"]

app = ClientApp()


def _client(context: Context) -> ClientBatch:
    """This node's data (a batch of one client)."""
    if "partition-id" not in context.node_config:
        raise ValueError("node config needs 'partition-id' (and 'num-partitions'); "
                         "pass --node-config 'partition-id=<i> num-partitions=<n>'")
    partition_id = int(context.node_config["partition-id"])
    return task_from_config(context.run_config).clients(np.array([partition_id]))


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
    return config, settings, models, template, _client(context)


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
    """Synchronized entry, step 1: the Greedy choice at ``W^0`` (nothing trained); or, under partial
    participation, the identification (client id and sample count, no models)."""
    if is_identification(message):
        clients = _client(context)
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
    return reply(message, {
        protocol.CLIENT_ID: int(clients.client_ids[0]),
        protocol.NUM_EXAMPLES: int(clients.num_examples[0]),
        protocol.TRAIN_LOSSES: [float(v) for v in evaluation_losses(clients, models, global_model, "train")[0]],
        protocol.TEST_LOSSES: [float(v) for v in evaluation_losses(clients, models, global_model, "test")[0]],
        protocol.GROUP: int(clients.groups[0]),
    })
