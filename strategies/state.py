"""The mutable server state of one strategy run, in one object.

:class:`RunState` is everything a :class:`~fedroute.strategies.adapter.RoutingAdapter` changes while
it runs: the ``K`` cluster models (with their Flower encodings, made once per model version), the
masses, the server step's state (:mod:`fedroute.core.server_step`), the run's records (history,
routes, evaluations, rejections, identity bindings), the recorder, the grid the run uses, and the
algorithm's own parts (FedCAM's global part, Local's per-client models).  The strategy's
constructor arguments stay on the strategy (they never change during a run); the algorithms
(:mod:`fedroute.strategies.algorithms`) and the checkpoint (:mod:`fedroute.strategies.checkpoint`)
read and write this object only.
"""

from __future__ import annotations

from typing import Any, Generic, Optional, Sequence, TypeVar

import numpy as np
from flwr.app import ArrayRecord, MetricRecord
from flwr.serverapp import Grid
from numpy.typing import NDArray

from fedroute.core.federation import FederationState
from fedroute.core.participation import Participation
from fedroute.core.server_step import ServerState, server_init
from fedroute.core.settings import RoutingSettings
from fedroute.monitoring.recorder import RunRecorder
from fedroute.strategies.identity import ClientBindings
from fedroute.strategies.records import array_record, kept_records, pack_cluster_records, unpack_cluster_models
from fedroute.strategies.rejections import RejectionLog
from fedroute.strategies.results import ClientRoutes, RoundRecord
from fedroute.strategies.validation import EvaluateReply

__all__ = ["RunState", "StateField", "Models"]

Models = list[dict[str, NDArray]]
"""``K`` models, one ``{array name: ndarray}`` each."""


class RunState:
    """The server state of one run (see the module docstring); made by :meth:`new`."""

    def __init__(self, num_clusters: int, server: ServerState) -> None:
        self.num_clusters = num_clusters
        self.server = server
        """Every client's latest report and the health evidence: :mod:`fedroute.core.server_step`."""
        self._cluster_models: Models = []
        self._records: Optional[list[Optional[ArrayRecord]]] = None
        """The encoded :attr:`cluster_models` (``None`` where a model is not encoded yet)."""
        self._packed: Optional[ArrayRecord] = None
        self.routing_masses: Optional[NDArray[np.float64]] = None
        """``μ̂``: the masses the clients receive (the federation estimate, :mod:`fedroute.core.federation`)."""
        self.preferred_masses: Optional[NDArray[np.float64]] = None
        """``p̂``: the share of the counted clients whose Greedy choice is each cluster."""
        self.provisional_masses: Optional[NDArray[np.float64]] = None
        """The synchronized entry's provisional masses (``None`` without it)."""
        self.history: list[RoundRecord] = []
        self.client_routes: ClientRoutes = {}
        self.final_evaluation: list[EvaluateReply] = []
        self.evaluation: dict[int, dict[str, float]] = {}
        self.cluster_train_metrics: dict[int, dict[int, MetricRecord]] = {}
        self.server_evaluation: dict[int, dict[int, MetricRecord]] = {}
        self.rejections = RejectionLog()
        self.bindings = ClientBindings()
        self.recorder: Optional[RunRecorder] = None
        self.grid: Optional[Grid] = None
        """The grid of the run (set by ``start``, or by ``configure_*`` called directly): the identity check
        asks it which nodes are connected."""
        self.num_rounds = 0
        self.reply_timeout: Optional[float] = None
        """The run's reply timeout per exchange (``start``'s ``timeout``; ``None``: the strategy's ``round_timeout``)."""
        self.nodes_ready = False
        """``min_available_nodes`` were connected once (later rounds need ``min_train_nodes`` only)."""
        self.round_started: Optional[float] = None
        self.resumed_from_round = 0
        self.global_model: Optional[dict[str, NDArray]] = None
        """FedCAM's global part ``Θ_glob`` (:mod:`fedroute.strategies.fedcam`); ``None`` otherwise or before use."""
        self.client_records: dict[int, ArrayRecord] = {}
        """Local training's model of each client (:mod:`fedroute.strategies.local`)."""
        self.initial_record: Optional[ArrayRecord] = None
        """Local training's initial model, sent to a client before its first valid reply."""
        self.start_models: Optional[NDArray] = None
        """The run's initial cluster models, flat ``(K, P)`` (``restart_idle_spares``: where an idle spare
        returns; taken from the initial arrays the strategy starts with, on a resumed run too)."""

    @classmethod
    def new(cls, routing: RoutingSettings, participation: Participation) -> "RunState":
        """The state before any round: no client reported yet."""
        federation = FederationState.of_clients(np.zeros(0, dtype=np.int64), routing.num_clusters)
        return cls(routing.num_clusters, server_init(federation, 1, routing.num_clusters, routing, participation))

    @property
    def cluster_models(self) -> Models:
        """The ``K`` cluster models ``W^t``, one ``{array name: ndarray}`` per cluster."""
        return self._cluster_models

    @cluster_models.setter
    def cluster_models(self, models: Sequence[dict[str, NDArray]]) -> None:
        models = list(models)
        kept = kept_records(self._records, models)
        self._cluster_models = models
        if kept is None or any(record is None for record in kept):  # encoded again (once) when next sent
            self._records, self._packed = kept, None
        # else: every record still encodes its model: they and the packed record stay

    def model_records(self) -> list[ArrayRecord]:
        """The ``K`` cluster models as ArrayRecords: encoded once per model version, shared by every
        message that carries them (Flower serialises each message's content when it delivers it).

        A model that a new assignment leaves byte for byte unchanged (a cluster no client trained this
        round) keeps its record: only the changed ones are encoded again."""
        records = self._records
        if records is None or any(record is None for record in records):
            records = [array_record(model) if records is None or records[k] is None else records[k]
                       for k, model in enumerate(self._cluster_models)]
            self._records = records
        return records

    def packed_models(self) -> ArrayRecord:
        """The ``K`` models packed in one ArrayRecord (what ``start`` carries between rounds), built from
        :meth:`model_records` without encoding anything again."""
        if self._packed is None:
            self._packed = pack_cluster_records(self.model_records())
        return self._packed

    def adopt(self, arrays: ArrayRecord) -> None:
        """Take the models of a packed record, unless it is the state's own current one."""
        if arrays is not self._packed:
            self.cluster_models = unpack_cluster_models(arrays, self.num_clusters)


T = TypeVar("T")


class StateField(Generic[T]):
    """A strategy attribute that is a field of its :class:`RunState` (``strategy.history`` is
    ``strategy.state.history``), so the strategy's documented attributes stay where users read them."""

    def __init__(self, name: str, doc: str = "") -> None:
        self.name = name
        self.__doc__ = doc

    def __get__(self, strategy: Any, owner: Any = None) -> Any:
        return self if strategy is None else getattr(strategy.state, self.name)

    def __set__(self, strategy: Any, value: Any) -> None:
        setattr(strategy.state, self.name, value)
