"""``LocalTraining``: every client trains its own model alone (the ``local`` reference method).

The same messages, ClientApp and evaluation as :class:`~fedroute.strategies.clustered.ClusteredRouting`
with ``K = 1``: each ``TRAIN`` and ``EVALUATE`` message carries, as ``cluster-0``, the model of the
client its node serves (the initial model until the client's first valid reply), and the client's
trained model is kept for it, never averaged with anyone's.  So a ClientApp written for fedroute
(the built-in one, or a user's with :func:`fedroute.routing_train`) runs Local training unchanged, and
its evaluation reads every client at its own model.  ``cluster_models[0]`` holds the mean of the local
models (for the telemetry only); :attr:`client_models` the models themselves.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Optional, Sequence

from flwr.app import ArrayRecord, Message, RecordDict
from numpy.typing import NDArray

from fedroute import protocol
from fedroute.core.influence import RoundAggregate
from fedroute.core.settings import RoutingSettings
from fedroute.strategies.clustered import ClusteredRouting
from fedroute.strategies.records import array_record, arrays_of
from fedroute.strategies.validation import TrainReply

__all__ = ["LocalTraining"]


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
                             "method_settings('local')")
        if kwargs.get("checkpoint_dir"):
            raise ValueError("LocalTraining does not checkpoint its per-client models; pass checkpoint_dir=None")
        super().__init__(routing, **kwargs)
        self._client_records: dict[int, ArrayRecord] = {}
        self._initial: Optional[ArrayRecord] = None

    @property
    def client_models(self) -> dict[int, dict[str, NDArray]]:
        """Client id → its own model (the clients that replied validly at least once)."""
        return {client: arrays_of(record) for client, record in sorted(self._client_records.items())}

    def start(self, grid: Any, initial_arrays: ArrayRecord | Sequence[ArrayRecord], *args: Any, **kwargs: Any):
        """As :meth:`ClusteredRouting.start`; every client starts from the one initial model."""
        self._client_records, self._initial = {}, None
        return super().start(grid, initial_arrays, *args, **kwargs)

    def _messages(self, node_ids: Iterable[int], message_type: str, config: Mapping[str, Any]) -> list[Message]:
        """The shared messages, each with its node's client's own model as ``cluster-0``."""
        if self._initial is None:
            self._initial = array_record(self.cluster_models[0])
        messages = super()._messages(node_ids, message_type, config)
        own = []
        for message in messages:
            node = message.metadata.dst_node_id
            client = self.bindings.client_of_node.get(node)
            records = dict(message.content.items())
            records[protocol.cluster_key(0)] = self._client_records.get(client, self._initial)
            own.append(Message(content=RecordDict(records), message_type=message_type, dst_node_id=node))
        return own

    def _server_step(self, round_index: int, valid: Sequence[TrainReply], template: Mapping[str, NDArray]
                     ) -> RoundAggregate:
        """Keep every valid reply's trained model for its client (``cluster-0``: their mean, for telemetry)."""
        outcome = super()._server_step(round_index, valid, template)
        for reply, kept in zip(valid, outcome.kept):
            if kept:
                self._client_records[reply.client_id] = array_record(reply.model)
        return outcome
