"""``LocalTraining``: every client trains its own model alone (the ``local`` reference method).

The same messages, ClientApp and evaluation as :class:`~fedroute.strategies.clustered.ClusteredRouting`
with ``K = 1``: each ``TRAIN`` and ``EVALUATE`` message carries, as ``cluster-0``, the model of the
client its node serves (the initial model until the client's first valid reply), and the client's
trained model is kept for it, never averaged with anyone's.  So a ClientApp written for fedroute
(the built-in one, or a user's with :func:`fedroute.routing_train`) runs Local training unchanged, and
its evaluation reads every client at its own model.  ``cluster_models[0]`` holds the mean of the local
models (for the telemetry only); :attr:`client_models` the models themselves.

:class:`LocalAlgorithm` is the server algorithm (an :class:`~fedroute.strategies.algorithms.Algorithm`);
:class:`LocalTraining` is :class:`~fedroute.strategies.clustered.ClusteredRouting` constructed with it.
The per-client models live in the run's state (``state.client_records``).
"""

from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

from flwr.app import ArrayRecord
from numpy.typing import NDArray

from fedroute import protocol
from fedroute.core.methods import LOCAL
from fedroute.core.influence import RoundAggregate
from fedroute.core.settings import RoutingSettings
from fedroute.strategies.algorithms import StepRules, cluster_records, routing_step
from fedroute.strategies.clustered import ClusteredRouting
from fedroute.strategies.records import array_record, arrays_of
from fedroute.strategies.state import Models, RunState
from fedroute.strategies.validation import TrainReply, validate_train_reply

__all__ = ["LocalTraining", "LocalAlgorithm"]


class LocalAlgorithm:
    """Local training's server algorithm: each node gets its client's own model; a reply's model is kept for it."""

    config: Mapping[str, Any] = {}

    def begin(self, state: RunState, routing: RoutingSettings) -> None:
        """Every client starts from the one initial model."""
        state.client_records, state.initial_record = {}, None

    def records(self, state: RunState, message_type: str) -> dict[str, ArrayRecord]:
        """``cluster-0`` (replaced per node by :meth:`node_records`); the initial model is kept on first use."""
        if state.initial_record is None:
            state.initial_record = array_record(state.cluster_models[0])
        return cluster_records(state)

    def node_records(self, state: RunState, node_id: int, records: dict[str, ArrayRecord]) -> dict[str, ArrayRecord]:
        """The records with the node's client's own model as ``cluster-0``."""
        client = state.bindings.client_of_node.get(node_id)
        return {**records, protocol.cluster_key(0): state.client_records.get(client, state.initial_record)}

    def validate_train(self, state: RunState, content: Mapping[str, Any], routing: RoutingSettings) -> TrainReply:
        """As the hard routing's (one model)."""
        return validate_train_reply(content, state.num_clusters, state.cluster_models[0], routing.num_arms)

    def server_step(self, state: RunState, round_index: int, valid: Sequence[TrainReply],
                    rules: StepRules) -> RoundAggregate:
        """Keep every kept reply's trained model for its client (``cluster-0``: their mean, for telemetry)."""
        outcome = routing_step(state, round_index, valid, rules)
        for reply, kept in zip(valid, outcome.kept):
            if kept:
                state.client_records[reply.client_id] = array_record(reply.model)
        return outcome

    def checkpoint_arrays(self, state: RunState) -> dict[str, NDArray]:
        """Nothing: :class:`LocalTraining` refuses a ``checkpoint_dir``."""
        return {}

    def restore_arrays(self, state: RunState, arrays: Mapping[str, NDArray]) -> None:
        """Nothing to restore."""

    def reported_models(self, state: RunState, output_sum: bool) -> Models:
        """``cluster-0``, the mean of the local models."""
        return state.cluster_models

    def extra_models(self, state: RunState, output_sum: bool) -> dict[str, dict[str, NDArray]]:
        """Every client's own model, as ``client-<id>``."""
        return {f"client-{client}": arrays_of(record) for client, record in sorted(state.client_records.items())}


class LocalTraining(ClusteredRouting):
    """Local training as a Flower strategy: one model per client, trained only on that client's data.

    Parameters are those of :class:`ClusteredRouting`; ``routing`` defaults to Greedy on one model
    (the only routing that fits) and ``checkpoint_dir`` is not supported (the per-client models are
    not checkpointed).
    """

    def __init__(self, routing: Optional[RoutingSettings] = None, **kwargs: Any) -> None:
        routing = routing if routing is not None else RoutingSettings(num_clusters=1, controllers=("gr",))
        if routing.num_clusters != 1 or routing.controllers != ("gr",) or routing.synchronized_entry:
            raise ValueError(f"LocalTraining routes every client to its own model: routing needs num_clusters = 1, "
                             f"controllers = ('gr',) and no synchronized entry, got num_clusters = "
                             f"{routing.num_clusters}, controllers = {routing.controllers}; pass "
                             f"method_settings({LOCAL!r})")
        if kwargs.get("checkpoint_dir"):
            raise ValueError("LocalTraining does not checkpoint its per-client models; pass checkpoint_dir=None")
        super().__init__(routing, **kwargs, algorithm=LocalAlgorithm())

    @property
    def client_models(self) -> dict[int, dict[str, NDArray]]:
        """Client id → its own model (the clients that replied validly at least once)."""
        return {client: arrays_of(record) for client, record in sorted(self.state.client_records.items())}
