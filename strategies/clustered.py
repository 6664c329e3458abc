"""``ClusteredRouting``: a Flower Message-API strategy holding ``K`` cluster models.

Each round it broadcasts all ``K`` models and the previous routing masses,
validates the replies (a malformed reply is logged and dropped), aggregates
them per cluster with the hard update, and records the round.  With
``synchronized_entry`` it first runs the provisional-Greedy ``QUERY`` exchange
(docs/algorithm.md, rules §6) and broadcasts the provisional masses with server round 1.
After the last round it asks every node for the controller-free evaluation.
Greedy IFCA is this strategy with ``RoutingSettings(controllers=("gr",))``.
"""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from pathlib import Path
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Mapping, Optional

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy
from numpy.typing import NDArray

from fedroute import protocol
from fedroute.core.evaluation import chosen_values, evaluation_metrics
from fedroute.core.federation import FederationState
from fedroute.core.randomness import Purpose, generator
from fedroute.core.server_step import RoundReplies, ServerState, server_init, server_step
from fedroute.core.participation import Participation, sample_size
from fedroute.core.settings import RoutingSettings
from fedroute.monitoring.alarms import (
    Alarm,
    AlarmSettings,
    DeadFederation,
    evaluation_failure,
    log_events,
    query_failure,
)
from fedroute.monitoring.progress import ensure_console_handler
from fedroute.monitoring.recorder import RunRecorder
from fedroute.monitoring.telemetry import ClientReplies, short_reason
from fedroute.core.aggregation import routing_masses
from fedroute.strategies.checkpoint import (
    CHECKPOINT_FILE,
    CheckpointError,
    check_arrays,
    load_checkpoint,
    save_checkpoint,
    stored_masses,
)
from fedroute.strategies.identity import ClientBindings, IdentityRejected
from fedroute.core.influence import InfluenceBounds, RoundAggregate, capped_weights
from fedroute.strategies.records import array_record, arrays_of, pack_cluster_records, unpack_cluster_models
from fedroute.strategies.rejections import RejectionLog
from fedroute.strategies.results import (
    ClientRoutes,
    RejectedReply,
    MetricsAggregation,
    RoundRecord,
    cluster_metric_record,
    aggregate_cluster_metrics,
)
from fedroute.strategies.validation import (
    EvaluateReply,
    ReplyRejected,
    TrainReply,
    first_reply_per_client,
    printable,
    validate_evaluate_reply,
    validate_identity_reply,
    validate_provisional_reply,
    validate_train_reply,
)

__all__ = ["ClusteredRouting"]

logger = logging.getLogger("fedroute")



class ClusteredRouting(Strategy):
    """Clustered FL with client-side routing control, as a Flower strategy.

    Parameters
    ----------
    routing : RoutingSettings
        Routing rules sent to the clients each round (``K`` = ``routing.num_clusters``).
    fraction_train : float, default 1.0
        Fraction of the connected clients sampled per round, in ``(0, 1]``.  Below 1 the
        strategy samples *clients*, not Flower node ids (:mod:`fedroute.core.participation`:
        the same seed gives the same clients in every run and in the simulator): it asks a
        node once which client it serves (an identification ``QUERY``, answered by
        :func:`fedroute.routing_query`), and the masses the clients receive are estimated
        from every client's latest report (:mod:`fedroute.core.federation`).
    min_train_nodes : int, default 2
        Minimum nodes per round (≥ 1); also the number waited for before a round.
    min_available_nodes : int, default 2
        Nodes that must be connected before the first round (≥ 1).
    round_timeout : float, default 600.0
        Seconds to wait for replies (> 0); late nodes are left out of that round.
    seed : int, default 0
        Run seed: broadcast to clients (routing randomness) and used for node sampling.
    run_key : str, default "default"
        Namespaces the clients' controller state, so one ServerApp can run
        several methods in turn on the same nodes; it names a directory of
        the clients' state files, so it must match ``[A-Za-z0-9._-]+``.
    evaluate_at_end : bool, default True
        Ask every node for the losses of all ``K`` models after the last round.
    client_config : mapping, optional
        Extra ConfigRecord entries sent with every message (e.g. task settings).
    node_wait_timeout : float, default 120.0
        Seconds to wait for ``min_available_nodes`` before failing.
    checkpoint_dir : path, optional
        Write an atomic checkpoint (models, masses, history, round) here after
        every round, and resume from it when :meth:`start` finds one made with
        the same settings.
    label : str, optional
        The run's name in logs, telemetry (``method`` column) and TensorBoard;
        ``run_key`` by default.
    telemetry_dir : path, optional
        Append the per-round and per-client tables (``rounds.csv``,
        ``clients.csv``, Parquet copies at the end) and the alarm events
        (``alarms.jsonl``) here as each round ends (``docs/telemetry.md``).
    tensorboard_dir : path, optional
        Write TensorBoard scalars (masses, routed loss, arm mix, alarms) here;
        needs ``fedroute[tensorboard]``.
    alarm_settings : AlarmSettings, optional
        Thresholds of the collapse alarms (starvation rounds ``S``,
        duplication tolerance, dead-federation rounds ``N``).
    starvation_basin : bool, optional
        Whether the initial models lie in the certified starvation basin, if
        the task can tell (:func:`fedroute.monitoring.alarms.starvation_basin`).
    progress_interval : float or None, default 5.0
        Seconds between progress lines (round, ETA, masses) at INFO; ``None`` for none.
    influence : InfluenceBounds, optional
        How much one reply may move a cluster model and the masses (sample-weight
        cap, update-norm bound, robust rule; :mod:`fedroute.core.influence`).
        Default: ``InfluenceBounds()`` (weights capped at 4 × the round's median).
    report_memory : int, optional
        Rounds a client's latest report counts in the masses (≥ 1); default: 1 with full
        participation, else the rounds within which a client is sampled at least once
        with probability 0.99 (:func:`fedroute.core.participation.report_memory`).
    evaluate_every : int, default 0
        Evaluate the clients during training after every ``evaluate_every``-th round (≥ 0;
        0 = only the final evaluation).  An evaluation is controller-free: the nodes report
        every model's losses and metrics and change no state.
    fraction_evaluate : float, default 1.0
        As in Flower's ``FedAvg``: fraction of the connected nodes asked in an evaluation during
        training, in ``[0, 1]`` (at least ``min_evaluate_nodes``; drawn from the seed and the
        round).  The final evaluation (``evaluate_at_end``) always asks every node.
    min_evaluate_nodes : int, default 2
        As in ``FedAvg``: the fewest nodes an evaluation during training asks (≥ 0).
    train_metrics_aggr_fn : callable, optional
        As in ``FedAvg``: ``(list[RecordDict], "num-examples") -> MetricRecord``, applied to each
        cluster's ``train-metrics`` replies (default: Flower's ``aggregate_metricrecords``).
    evaluate_metrics_aggr_fn : callable, optional
        As in ``FedAvg``: ``(list[RecordDict], "num-examples") -> MetricRecord``, applied to the
        evaluated clients, one RecordDict each with MetricRecord ``metrics`` holding its values at its
        chosen model (``test_loss``, every metric, ``cluster``, ``num-examples``); the result goes to
        ``Result.evaluate_metrics_clientapp``.  Default: :func:`fedroute.core.evaluation.evaluation_metrics`
        (mean, worst decile, per cluster and per group), which :attr:`evaluation` always keeps.

    Replies are checked (:mod:`~fedroute.strategies.validation`), and a client id
    is bound to the node that first sent a valid reply for it
    (:mod:`~fedroute.strategies.identity`); rejected replies are logged and kept,
    bounded, in :attr:`rejected` (:mod:`~fedroute.strategies.rejections`).
    """

    def __init__(
        self,
        routing: RoutingSettings,
        *,
        fraction_train: float = 1.0,
        min_train_nodes: int = 2,
        min_available_nodes: int = 2,
        round_timeout: float = 600.0,
        seed: int = 0,
        run_key: str = "default",
        evaluate_at_end: bool = True,
        client_config: Optional[Mapping[str, Any]] = None,
        node_wait_timeout: float = 120.0,
        checkpoint_dir: Optional[str | Path] = None,
        label: Optional[str] = None,
        telemetry_dir: Optional[str | Path] = None,
        tensorboard_dir: Optional[str | Path] = None,
        alarm_settings: AlarmSettings = AlarmSettings(),
        starvation_basin: Optional[bool] = None,
        progress_interval: Optional[float] = 5.0,
        influence: Optional[InfluenceBounds] = None,
        report_memory: Optional[int] = None,
        evaluate_every: int = 0,
        fraction_evaluate: float = 1.0,
        min_evaluate_nodes: int = 2,
        train_metrics_aggr_fn: Optional[MetricsAggregation] = None,
        evaluate_metrics_aggr_fn: Optional[MetricsAggregation] = None,
    ) -> None:
        if not 0.0 < fraction_train <= 1.0:
            raise ValueError(f"fraction_train = {fraction_train} is invalid; allowed: (0, 1]")
        _check_evaluation(evaluate_every, fraction_evaluate, min_evaluate_nodes)
        self.evaluate_every = int(evaluate_every)
        self.fraction_evaluate = float(fraction_evaluate)
        self.min_evaluate_nodes = int(min_evaluate_nodes)
        self.train_metrics_aggr_fn = train_metrics_aggr_fn
        self.evaluate_metrics_aggr_fn = evaluate_metrics_aggr_fn
        for name, value in (("min_train_nodes", min_train_nodes), ("min_available_nodes", min_available_nodes)):
            if int(value) != value or value < 1:
                raise ValueError(f"{name} = {value} is invalid; allowed: an integer ≥ 1")
        if round_timeout <= 0:
            raise ValueError(f"round_timeout = {round_timeout} is invalid; allowed: > 0")
        if seed < 0:
            raise ValueError(f"seed = {seed} is invalid; allowed: an integer ≥ 0")
        protocol.check_path_name(run_key, "run_key")
        self.routing = routing
        self.fraction_train = fraction_train
        self.participation = Participation(fraction_train, int(min_train_nodes), report_memory)
        self.min_train_nodes = int(min_train_nodes)
        self.min_available_nodes = int(min_available_nodes)
        self.round_timeout = round_timeout
        self.seed = int(seed)
        self.run_key = run_key
        self.evaluate_at_end = evaluate_at_end
        self.client_config = dict(client_config or {})
        self.node_wait_timeout = node_wait_timeout
        self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir else None
        self._nodes_ready = False
        self.resumed_from_round = 0
        self.num_clusters = routing.num_clusters
        self._cluster_models: list[dict[str, NDArray]] = []
        self._cluster_records: Optional[list[ArrayRecord]] = None
        self._packed: Optional[ArrayRecord] = None
        self.routing_masses: Optional[NDArray[np.float64]] = None
        """``μ̂``: the masses the clients receive (the federation estimate, :mod:`fedroute.core.federation`)."""
        self.preferred_masses: Optional[NDArray[np.float64]] = None
        """``p̂``: the share of the counted clients whose Greedy choice is each cluster."""
        self.server = server_init(FederationState.of_clients(np.zeros(0, dtype=np.int64), routing.num_clusters),
                                  1, routing.num_clusters, routing, self.participation)
        """The server state besides the models (every client's latest report, the health evidence):
        :mod:`fedroute.core.server_step`."""
        self.provisional_masses: Optional[NDArray[np.float64]] = None
        self.label = label or run_key
        self.telemetry_dir = Path(telemetry_dir) if telemetry_dir is not None else None
        self.tensorboard_dir = Path(tensorboard_dir) if tensorboard_dir is not None else None
        self.alarm_settings = alarm_settings
        self.starvation_basin = starvation_basin
        self.progress_interval = progress_interval
        self.history: list[RoundRecord] = []
        """One :class:`~fedroute.strategies.results.RoundRecord` per training round."""
        self.client_routes: ClientRoutes = {}
        """Round ``t`` → client id → executed hard route."""
        self.final_evaluation: list[EvaluateReply] = []
        """The validated replies of the final controller-free evaluation."""
        self.evaluation: dict[int, dict[str, float]] = {}
        """Server round → the aggregated evaluation of the clients asked then
        (:func:`fedroute.core.evaluation.evaluation_metrics`: ``test_loss``, ``accuracy``, ... with
        ``_worst_decile``, ``_cluster_<k>``, ``_group_<g>``; ``num_clients``).  A row of ``evaluation.csv`` each."""
        self.cluster_train_metrics: dict[int, dict[int, MetricRecord]] = {}
        """Server round → cluster → the ``train_fn`` metrics of its clients, averaged by ``num-examples``."""
        self.server_evaluation: dict[int, dict[int, MetricRecord]] = {}
        """Server round (0 = initial models) → cluster → what ``evaluate_fn`` returned for that cluster's model."""
        self.recorder: Optional[RunRecorder] = None
        self.telemetry_width: Optional[int] = None
        """Per-cluster columns of ``rounds.csv``/``clients.csv`` when methods of several ``K`` share them
        (the ServerApp sets the run's largest ``K``); ``None``: this strategy's ``K``."""
        self.influence = influence if influence is not None else InfluenceBounds()
        self.rejections = RejectionLog()
        self.bindings = ClientBindings()
        self._grid: Optional[Grid] = None
        self._num_rounds = 0

    @property
    def rejected(self) -> list[RejectedReply]:
        """Rejected replies with their reasons (bounded: see :class:`~fedroute.strategies.rejections.RejectionLog`)."""
        return list(self.rejections.entries)

    # ------------------------------------------------------------------ helpers
    @property
    def cluster_models(self) -> list[dict[str, NDArray]]:
        """The ``K`` cluster models ``W^t``, one ``{array name: ndarray}`` per cluster."""
        return self._cluster_models

    @cluster_models.setter
    def cluster_models(self, models: Sequence[dict[str, NDArray]]) -> None:
        self._cluster_models = list(models)
        self._cluster_records = None  # encoded again (once) when next sent
        self._packed = None

    def _model_records(self) -> list[ArrayRecord]:
        """The ``K`` cluster models as ArrayRecords: encoded once per model version, shared by every
        message that carries them (Flower serialises each message's content when it delivers it)."""
        if self._cluster_records is None:
            self._cluster_records = [array_record(model) for model in self._cluster_models]
        return self._cluster_records

    def _packed_models(self) -> ArrayRecord:
        """The ``K`` models packed in one ArrayRecord (what ``start`` carries between rounds), built from
        :meth:`_model_records` without encoding anything again."""
        if self._packed is None:
            self._packed = pack_cluster_records(self._model_records())
        return self._packed

    def _adopt(self, arrays: ArrayRecord) -> None:
        """Take the models of a packed record, unless it is this strategy's own current one."""
        if arrays is not self._packed:
            self.cluster_models = unpack_cluster_models(arrays, self.num_clusters)

    @property
    def alarms(self) -> list[Alarm]:
        """Every collapse alarm raised so far (:class:`~fedroute.monitoring.alarms.Alarm`)."""
        return [] if self.recorder is None else list(self.recorder.alarms.alarms)

    def _recorder(self) -> RunRecorder:
        """The run's recorder (made on first use, also when :meth:`aggregate_train` is called directly)."""
        if self.recorder is None:
            self.recorder = RunRecorder(
                self.label, self.num_clusters, self.routing.controllers, self._num_rounds,
                alarm_settings=self.alarm_settings, starvation_basin=self.starvation_basin,
                telemetry_dir=self.telemetry_dir, tensorboard_dir=self.tensorboard_dir,
                progress_interval=self.progress_interval, logger=logger,
                random_ties=self.routing.tie_breaking == "random", table_width=self.telemetry_width)
        return self.recorder

    def summary(self) -> None:
        """Log the configuration."""
        logger.info("[%s] %s: K=%d, %d rounds, controllers=%s, mode=%s, synchronized entry=%s, fraction=%.2f",
                    self.label, type(self).__name__, self.num_clusters, self._num_rounds,
                    ",".join(self.routing.controllers), self.routing.exp3_mode, self.routing.synchronized_entry,
                    self.fraction_train)

    def _sample_nodes(self, grid: Grid, server_round: int) -> list[int]:
        """Wait for enough nodes, then sample the round's clients (:mod:`fedroute.core.participation`).

        ``min_available_nodes`` is waited for once, before the first exchange;
        later rounds need only ``min_train_nodes``, so a lost node does not stop
        the run (it is left out until it reconnects).  With ``fraction_train < 1``
        the sample is drawn over the *client ids* of the connected nodes (asked once
        per node, :meth:`_identify`) from ``(seed, client id, t)``, with ``t =
        server_round − 1`` (the provisional exchange, ``server_round = 0``, uses
        round 0's sample).
        """
        needed = self.min_train_nodes if self._nodes_ready else max(self.min_available_nodes, self.min_train_nodes)
        deadline = time.monotonic() + self.node_wait_timeout
        while len(node_ids := sorted(grid.get_node_ids())) < needed:
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {len(node_ids)} nodes connected after {self.node_wait_timeout} s; "
                                   f"min_available_nodes/min_train_nodes require {needed}")
            time.sleep(0.5)
        self._nodes_ready = True
        if sample_size(len(node_ids), self.fraction_train, self.min_train_nodes) == len(node_ids):
            return node_ids
        client_of_node = self._identify(grid, node_ids, server_round)
        sampled = set(self.participation.sample(np.array(list(client_of_node.values()), dtype=np.int64), self.seed,
                                                max(server_round - 1, 0)).tolist())
        return sorted(node for node, client in client_of_node.items() if client in sampled)

    def _identify(self, grid: Grid, node_ids: Sequence[int], server_round: int) -> dict[int, int]:
        """Node id → client id of the connected nodes, asking the nodes not bound yet (an identification ``QUERY``).

        A node that does not answer validly is left out of this round's sample and asked
        again the next round; if no node at all can be identified the run stops, naming the
        handler the ClientApp lacks.
        """
        unknown = [node for node in node_ids if node not in self.bindings.client_of_node]
        if unknown:
            config = ConfigRecord({**self.client_config, **protocol.routing_config(self.routing.to_dict()),
                                   protocol.SEED: self.seed, protocol.RUN_KEY: self.run_key,
                                   protocol.PHASE: protocol.PHASE_IDENTIFY, protocol.SERVER_ROUND: server_round})
            messages = [Message(content=RecordDict({protocol.CONFIG: config}), message_type=MessageType.QUERY,
                                dst_node_id=node) for node in unknown]
            self._grid = grid
            self._valid(grid.send_and_receive(messages, timeout=self.round_timeout), validate_identity_reply,
                        server_round, protocol.PHASE_IDENTIFY)
        identified = {node: self.bindings.client_of_node[node] for node in node_ids
                      if node in self.bindings.client_of_node}
        if not identified:
            raise RuntimeError(
                f"partial participation (fraction_train = {self.fraction_train}) samples clients, not nodes, so the "
                f"strategy asks every node once for its client id with a QUERY message; none of the {len(node_ids)} "
                "connected nodes answered validly (see the rejected replies). Register a query handler in the "
                "ClientApp: @app.query() returning fedroute.routing_query(msg, context, model, loss_fn, num_examples)")
        return identified

    def _messages(
        self, node_ids: Iterable[int], message_type: str, config: Mapping[str, Any]
    ) -> list[Message]:
        """One RecordDict per node holding the round's records: the K models (plus
        :meth:`_extra_records`) and one ConfigRecord, built once and shared by every message.

        Sharing is safe: Flower delivers a copy of each message's content (the
        simulation pickles it to the ClientApp's Ray actor, deployment serialises
        it to the SuperLink), and the strategy never changes a record it sent
        (a new round builds new ones); ``tests/test_shared_records.py`` checks
        that one ClientApp overwriting what it received changes nothing for the others.
        """
        models = self._broadcast_records(message_type)
        records = {protocol.cluster_key(k): model for k, model in enumerate(models)}
        records.update(self._extra_records(message_type))
        records[protocol.CONFIG] = ConfigRecord({
            **self.client_config,
            **protocol.routing_config(self.routing.to_dict()),
            protocol.SEED: self.seed,
            protocol.RUN_KEY: self.run_key,
            **config,
        })
        return [Message(content=RecordDict(records), message_type=message_type, dst_node_id=node_id)
                for node_id in node_ids]

    def _broadcast_records(self, message_type: str) -> list[ArrayRecord]:
        """:meth:`_broadcast_models` as ArrayRecords (the cluster models' shared ones when it returns them)."""
        models = self._broadcast_models(message_type)
        if models is self._cluster_models:
            return self._model_records()
        return [array_record(model) for model in models]

    def _broadcast_models(self, message_type: str) -> list[dict[str, NDArray]]:
        """The K models a message carries (subclasses may send e.g. combined predictors)."""
        return self.cluster_models

    def _extra_records(self, message_type: str) -> dict[str, ArrayRecord]:
        """Further ArrayRecords a message carries (none here)."""
        return {}

    def _validate_train(self, content: Mapping[str, Any]) -> TrainReply:
        """Validate one training reply (subclasses may check further records)."""
        return validate_train_reply(content, self.num_clusters, self.cluster_models[0], self.routing.num_arms)

    def _after_hard_update(self, valid: list[TrainReply]) -> None:
        """Hook after the per-cluster update of a round with valid replies."""

    def _masses_config(self, masses: Optional[NDArray[np.float64]]) -> dict[str, Any]:
        """The masses and, when the routing reads it, the server's health view (:mod:`fedroute.core.health`)."""
        config: dict[str, Any] = {
            protocol.HAS_MASSES: masses is not None,
            protocol.MASSES: [float(m) for m in (masses if masses is not None else np.zeros(self.num_clusters))],
        }
        if (view := self.server.view) is not None:
            config.update({protocol.EXPLORE: bool(view.explore[0]),
                           protocol.MERGED_INTO: [int(k) for k in view.merged_into[0]],
                           protocol.SPARE: [bool(flag) for flag in view.spare[0]]})
        return config

    def _valid(self, replies: Iterable[Message], validate: Callable[[Mapping[str, Any]], Any],
               server_round: int, phase: str) -> list[Any]:
        """Validate replies and their node's identity; log and record every rejected one; drop duplicates."""
        accepted = []
        online = None if self._grid is None else self._grid.get_node_ids
        for message in replies:
            node_id = message.metadata.src_node_id
            if message.has_error():
                self._reject(server_round, phase, node_id,
                             f"error reply: {printable(short_reason(message.error.reason))}")
                continue
            try:
                reply = validate(message.content)
                self.bindings.admit(reply.client_id, node_id, online)
            except (ReplyRejected, IdentityRejected) as error:
                self._reject(server_round, phase, node_id, str(error))
                continue
            accepted.append(replace(reply, node_id=node_id))
        kept, duplicates = first_reply_per_client(accepted)
        for duplicate in duplicates:
            self._reject(server_round, phase, duplicate.node_id, f"duplicate reply for client {duplicate.client_id}")
        return sorted(kept, key=lambda reply: reply.client_id)

    def _reject(self, server_round: int, phase: str, node_id: int, reason: str) -> None:
        entry = self.rejections.add(server_round, phase, node_id, reason)
        if entry is not None and phase != protocol.PHASE_TRAIN:
            self._recorder().rejected_outside_rounds([entry])

    # ------------------------------------------------------------------ the run
    def start(  # type: ignore[override]
        self,
        grid: Grid,
        initial_arrays: ArrayRecord | Sequence[ArrayRecord],
        num_rounds: int = 3,
        timeout: Optional[float] = None,
        train_config: Optional[ConfigRecord] = None,
        evaluate_config: Optional[ConfigRecord] = None,
        evaluate_fn: Optional[Callable[[int, ArrayRecord], Optional[MetricRecord]]] = None,
    ) -> Result:
        """Run synchronized entry (if enabled), ``num_rounds`` rounds and the final evaluation.

        Parameters
        ----------
        grid : Grid
            Flower grid.
        initial_arrays : ArrayRecord or sequence of ArrayRecord
            ``K`` initial cluster models (one ArrayRecord each), or all of
            them packed by :func:`~fedroute.strategies.records.pack_cluster_models`.
        num_rounds : int
            Training rounds ``T`` (≥ 1).
        timeout : float, optional
            Reply timeout per round; defaults to ``round_timeout``.
        train_config, evaluate_config : ConfigRecord, optional
            Extra entries for training / evaluation messages.
        evaluate_fn : callable, optional
            Server-side evaluation, as in Flower: ``evaluate_fn(server_round,
            arrays) -> MetricRecord | None``, called for each cluster model
            (``arrays`` = that model's ArrayRecord, so a ``FedAvg``
            ``evaluate_fn`` works unchanged) on the initial models
            (``server_round = 0``) and after every round.  The records are kept
            per cluster in :attr:`server_evaluation` and, with keys
            ``cluster-<k>/<name>``, in ``Result.evaluate_metrics_serverapp``.

        Returns
        -------
        flwr.serverapp.strategy.Result
            ``arrays`` holds the ``K`` final models packed (unpack them with
            :func:`fedroute.unpack_cluster_models` or
            :func:`fedroute.cluster_models_to_torch`); see also
            :attr:`cluster_models`, :attr:`history`, :attr:`final_evaluation` and :attr:`alarms`.

        Raises
        ------
        fedroute.monitoring.alarms.DeadFederation
            When no valid reply arrived for ``alarm_settings.dead_rounds`` rounds in a row, in any
            round of a shorter run, or in the final evaluation, or no valid report to synchronized entry.
        """
        if num_rounds < 1:
            raise ValueError(f"num_rounds = {num_rounds} is invalid; allowed: an integer ≥ 1")
        if isinstance(initial_arrays, ArrayRecord):
            self.cluster_models = unpack_cluster_models(initial_arrays, self.num_clusters)
        else:
            if len(initial_arrays) != self.num_clusters:
                raise ValueError(f"initial_arrays holds {len(initial_arrays)} models; num_clusters = {self.num_clusters}")
            self.cluster_models = [arrays_of(record) for record in initial_arrays]
        self.round_timeout = timeout or self.round_timeout
        self._num_rounds = num_rounds
        ensure_console_handler(logger)
        self.summary()
        self.recorder = None
        first_round = self._restore() + 1
        self._recorder().start(first_round, self.history)
        result = Result()
        if first_round == 1:
            self._evaluate_on_server(0, evaluate_fn, result)
            if self.routing.synchronized_entry:
                self._provisional_greedy(grid)
            self.routing_masses = self.provisional_masses
        train_config = train_config or ConfigRecord()
        for server_round in range(first_round, num_rounds + 1):
            replies = grid.send_and_receive(
                self.configure_train(server_round, self._packed_models(), train_config, grid),
                timeout=self.round_timeout,
            )
            arrays, metrics = self.aggregate_train(server_round, replies)
            if metrics is not None:
                result.train_metrics_clientapp[server_round] = metrics
            self._save(server_round)
            self._round_ended()
            self._evaluate_on_server(server_round, evaluate_fn, result)
            if server_round < num_rounds:
                self._evaluate_clients(server_round, grid, evaluate_config, result)
        if (silent := self._recorder().alarms.unanswered_run(num_rounds)) is not None:  # a run shorter than N
            log_events(logger, self.label, [silent])
            self._recorder().close()
            raise DeadFederation(silent.message)
        packed = self._packed_models()
        evaluation = self._evaluate_clients(num_rounds, grid, evaluate_config, result)
        self._recorder().close()
        if evaluation and self.evaluate_at_end and not self.final_evaluation:
            asked, reasons = len(list(evaluation)), self.rejections.reasons(num_rounds, "evaluate")
            raise DeadFederation(evaluation_failure(asked, reasons))
        result.arrays = packed
        return result

    def _evaluate_clients(self, server_round: int, grid: Grid, config: Optional[ConfigRecord],
                          result: Result) -> list[Message]:
        """The round's client evaluation, if it has one (:meth:`configure_evaluate`); return the messages sent."""
        messages = list(self.configure_evaluate(server_round, self._packed_models(), config or ConfigRecord(), grid))
        if messages:
            metrics = self.aggregate_evaluate(server_round, grid.send_and_receive(messages, timeout=self.round_timeout))
            if metrics is not None:
                result.evaluate_metrics_clientapp[server_round] = metrics
        return messages

    def _evaluation_nodes(self, grid: Grid, server_round: int) -> list[int]:
        """The nodes an evaluation during training asks: ``fraction_evaluate`` of the connected ones (at least
        ``min_evaluate_nodes``), drawn from ``(seed, server_round)``."""
        node_ids = sorted(grid.get_node_ids())
        count = sample_size(len(node_ids), self.fraction_evaluate, self.min_evaluate_nodes)
        if count >= len(node_ids):
            return node_ids
        chosen = generator(self.seed, 0, server_round, Purpose.EVALUATE_SAMPLING).choice(len(node_ids), count,
                                                                                        replace=False)
        return sorted(node_ids[i] for i in chosen)

    def _round_ended(self) -> None:
        """After a round's checkpoint: its telemetry goes to disk; a dead federation stops the run."""
        recorder = self._recorder()
        recorder.commit()
        if (dead := recorder.alarms.dead) is not None:
            recorder.close()
            raise DeadFederation(dead.message)

    def _evaluate_on_server(self, server_round: int, evaluate_fn: Optional[Callable[[int, ArrayRecord],
                            Optional[MetricRecord]]], result: Result) -> None:
        """``evaluate_fn`` on each cluster model (what evaluation uses: see :meth:`_broadcast_models`)."""
        if evaluate_fn is None:
            return
        records = {}
        for cluster, model in enumerate(self._broadcast_models(MessageType.EVALUATE)):
            record = evaluate_fn(server_round, array_record(model))
            if record is not None:
                records[cluster] = record
        if records:
            self.server_evaluation[server_round] = records
            result.evaluate_metrics_serverapp[server_round] = cluster_metric_record(records)

    # ------------------------------------------------------------ checkpoints
    def _identity(self) -> dict[str, Any]:
        """What a checkpoint must match to be resumed."""
        return {"class": type(self).__name__, "routing": self.routing.to_dict(), "seed": self.seed,
                "run_key": self.run_key, "influence": self.influence.to_dict(),
                "participation": {"fraction": float(self.fraction_train), "min_clients": self.min_train_nodes,
                                  "report_rounds": self.participation.report_rounds},
                "template": {name: [list(value.shape), str(value.dtype)] for name, value in self.cluster_models[0].items()}}

    def _checkpoint_arrays(self) -> dict[str, NDArray]:
        """Arrays to checkpoint (subclasses add theirs)."""
        return {f"{protocol.cluster_key(k)}/{name}": value
                for k, model in enumerate(self.cluster_models) for name, value in model.items()}

    def _restore_arrays(self, arrays: Mapping[str, NDArray]) -> None:
        """Inverse of :meth:`_checkpoint_arrays`."""
        self.cluster_models = [
            {name: arrays[f"{protocol.cluster_key(k)}/{name}"] for name in self.cluster_models[k]}
            for k in range(self.num_clusters)
        ]

    def _save(self, server_round: int) -> None:
        if self.checkpoint_dir is None:
            return
        meta = {
            "identity": self._identity(),
            "server_round": server_round,
            "routing_masses": None if self.routing_masses is None else self.routing_masses.tolist(),
            "provisional_masses": None if self.provisional_masses is None else self.provisional_masses.tolist(),
            "preferred_masses": None if self.preferred_masses is None else self.preferred_masses.tolist(),
            "server": self.server.to_json(),
            "history": self.history,
            "client_routes": {str(t): {str(c): r for c, r in routes.items()} for t, routes in self.client_routes.items()},
            "rejected": self.rejections.to_json(),
            "bindings": self.bindings.to_json(),
            "alarms": self._recorder().alarms.state_dict(),
        }
        save_checkpoint(self.checkpoint_dir, self._checkpoint_arrays(), meta)

    def _restore(self) -> int:
        """Load the checkpoint if there is one; return the last completed round (0 if none)."""
        if self.checkpoint_dir is None or (stored := load_checkpoint(self.checkpoint_dir)) is None:
            return 0
        arrays, meta = stored
        path = self.checkpoint_dir / CHECKPOINT_FILE
        if meta.get("identity") != self._identity():
            raise CheckpointError(f"the checkpoint {path} was made with other settings "
                                  f"({meta.get('identity')}); delete it or choose another checkpoint directory")
        check_arrays(path, arrays, self._checkpoint_arrays())
        try:
            self._restore_arrays(arrays)
            self.routing_masses = stored_masses(meta["routing_masses"], self.num_clusters)
            self.provisional_masses = stored_masses(meta["provisional_masses"], self.num_clusters)
            self.preferred_masses = stored_masses(meta["preferred_masses"], self.num_clusters)
            self.server = ServerState.from_json(meta["server"])
            self.history = list(meta["history"])
            self.client_routes = {int(t): {int(c): int(r) for c, r in routes.items()}
                                  for t, routes in meta["client_routes"].items()}
            self.rejections = RejectionLog.from_json(meta["rejected"])
            self.bindings = ClientBindings.from_json(meta.get("bindings", []))
            if "alarms" in meta:
                self._recorder().alarms.load_state_dict(meta["alarms"])
            self.resumed_from_round = int(meta["server_round"])
            if self.resumed_from_round < 1:
                raise ValueError(f"server_round = {self.resumed_from_round} < 1")
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise CheckpointError(f"checkpoint {path} is malformed ({type(error).__name__}: "
                                  f"{printable(error)}); delete it or choose another checkpoint directory") from None
        logger.warning("resuming from the checkpoint of round %d in %s", self.resumed_from_round, self.checkpoint_dir)
        return self.resumed_from_round

    def _provisional_greedy(self, grid: Grid) -> None:
        """Synchronized entry, steps 1–2: Greedy reports at ``W^0`` → provisional masses."""
        self._grid = grid
        node_ids = self._sample_nodes(grid, 0)
        replies = grid.send_and_receive(
            self._messages(node_ids, MessageType.QUERY, {protocol.PHASE: protocol.PHASE_PROVISIONAL,
                                                       protocol.SERVER_ROUND: 0, protocol.ROUND_INDEX: 0,
                                                       protocol.NUM_ROUNDS: self._num_rounds}),
            timeout=self.round_timeout,
        )
        reports = self._valid(replies, lambda c: validate_provisional_reply(c, self.num_clusters), 0, "provisional")
        if not reports:
            raise DeadFederation(query_failure(self.rejections.reasons(0, "provisional")))
        weights = capped_weights(np.array([r.num_examples for r in reports]), self.influence.max_weight_ratio)
        self.provisional_masses = routing_masses(np.array([r.cluster for r in reports]), weights, self.num_clusters)
        logger.info("synchronized entry: provisional masses %s", np.round(self.provisional_masses, 3).tolist())

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Messages for round ``server_round`` (``t = server_round - 1``)."""
        self._adopt(arrays)
        if self.routing.exploitation_fraction > 0 and self._num_rounds < 1:
            raise ValueError("routing with exploitation_fraction > 0 needs the run's number of rounds: "
                             "run the strategy with start(grid, initial_arrays, num_rounds=T)")
        self._round_started = time.monotonic()
        self._grid = grid
        node_ids = self._sample_nodes(grid, server_round)
        round_config = {
            **dict(config.items()),
            protocol.PHASE: protocol.PHASE_TRAIN,
            protocol.SERVER_ROUND: server_round,
            protocol.ROUND_INDEX: server_round - 1,
            protocol.NUM_ROUNDS: self._num_rounds,
            protocol.SAMPLED_FRACTION: float(self.fraction_train),
            **self._masses_config(self.routing_masses),
        }
        return self._messages(node_ids, MessageType.TRAIN, round_config)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[Optional[ArrayRecord], Optional[MetricRecord]]:
        """Validate, run the server step (:func:`~fedroute.core.server_step.server_step`), record the round."""
        template = self.cluster_models[0]
        valid: list[TrainReply] = self._valid(replies, self._validate_train, server_round, protocol.PHASE_TRAIN)
        previous = [dict(model) for model in self.cluster_models]
        if not valid:
            logger.warning("round %d: no valid reply; cluster models and masses unchanged", server_round)
        outcome = self._server_step(server_round - 1, valid, template)
        for reply in (reply for reply, kept in zip(valid, outcome.kept) if not kept):
            self._reject(server_round, protocol.PHASE_TRAIN, reply.node_id,
                         f"the aggregate of cluster {reply.cluster} is not finite; the cluster keeps its model")
        valid = [reply for reply, kept in zip(valid, outcome.kept) if kept]
        if valid:
            self._after_hard_update(valid)
        changed = [any(not np.array_equal(before[name], after[name]) for name in before)
                   for before, after in zip(previous, self.cluster_models)]
        replies_seen = ClientReplies.from_metrics(
            [reply.client_id for reply in valid], [reply.node_id for reply in valid],
            [reply.cluster for reply in valid], [reply.num_examples for reply in valid],
            [reply.metrics for reply in valid], self.num_clusters)
        record = self._recorder().round(
            server_round, replies_seen, self.routing_masses, changed,
            [entry for entry in self.rejections.entries
             if entry["server_round"] == server_round and entry["phase"] == protocol.PHASE_TRAIN],
            time.monotonic() - getattr(self, "_round_started", time.monotonic()),
            rejected_count=self.rejections.count(server_round, protocol.PHASE_TRAIN),
            spare=None if self.server.view is None else self.server.view.spare[0])
        self.history.append(record)  # type: ignore[arg-type]
        self.client_routes[server_round - 1] = {reply.client_id: reply.cluster for reply in valid}
        cluster_metrics = aggregate_cluster_metrics(
            [(reply.cluster, reply.num_examples, reply.train_metrics) for reply in valid], self.train_metrics_aggr_fn)
        if cluster_metrics:
            self.cluster_train_metrics[server_round] = cluster_metrics
        metrics = MetricRecord({
            "num-valid-replies": len(valid),
            "masses": [float(m) for m in (self.routing_masses if self.routing_masses is not None
                                          else np.zeros(self.num_clusters))],
            "routed-train-loss": float(record["routed_train_loss"]),
            **cluster_metric_record(cluster_metrics),
        })
        return self._packed_models(), metrics

    def _server_step(self, round_index: int, valid: Sequence[TrainReply], template: Mapping[str, NDArray]
                     ) -> RoundAggregate:
        """The server step on the round's valid replies (client-id order): models, ``μ̂``, ``p̂``, the health view."""
        federation, rows = self.server.federation.positions(np.array([r.client_id for r in valid], dtype=np.int64))
        replies = RoundReplies(
            rows=rows, routes=np.array([r.cluster for r in valid], dtype=np.int64),
            preferred=np.array([r.preferred for r in valid], dtype=np.int64),
            num_examples=np.array([r.num_examples for r in valid], dtype=np.float64),
            losses=np.array([r.metrics[protocol.LOSSES] for r in valid], dtype=np.float64).reshape(
                len(valid), self.num_clusters),
            trained_models=protocol.stack_flat([r.model for r in valid], protocol.flat_dtype(template))
            if valid else np.zeros((0, protocol.stack_flat(self.cluster_models[:1]).shape[1])))
        outcome, self.server = server_step(protocol.stack_flat(self.cluster_models), replace(self.server,
                                           federation=federation), replies, round_index, self.routing,
                                           self.participation, self.influence)
        if valid:
            self.cluster_models = [protocol.unflatten_arrays(vector, template) for vector in outcome.models]
        if self.server.estimate.reporting[0] > 0:
            self.routing_masses = self.server.estimate.masses[0]
            self.preferred_masses = self.server.estimate.preferred_masses[0]
        return outcome

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Evaluation messages: after the last round every node (``evaluate_at_end``); after every
        ``evaluate_every``-th round ``fraction_evaluate`` of them; none otherwise."""
        if self.evaluate_at_end and server_round == self._num_rounds:
            node_ids = sorted(grid.get_node_ids())
        elif self.evaluate_every and server_round % self.evaluate_every == 0:
            node_ids = self._evaluation_nodes(grid, server_round)
        else:
            return []
        self._adopt(arrays)
        return self._messages(node_ids, MessageType.EVALUATE, {
            **dict(config.items()), protocol.PHASE: protocol.PHASE_EVALUATE,
            protocol.SERVER_ROUND: server_round, protocol.ROUND_INDEX: server_round,
        })

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> Optional[MetricRecord]:
        """Validate the per-client losses and metrics, aggregate them (:attr:`evaluation`, ``evaluation.csv``);
        keep the final evaluation's replies (:attr:`final_evaluation`); report how many models are usable."""
        replies = list(replies)
        if not replies:
            return None
        valid = self._valid(replies, lambda c: validate_evaluate_reply(c, self.num_clusters), server_round, "evaluate")
        if server_round >= self._num_rounds:
            self.final_evaluation = valid
        if not valid:
            return None
        values, train_losses = evaluation_values(valid)
        groups = np.array([r.group for r in valid], dtype=np.int64)
        self.evaluation[server_round] = evaluation_metrics(values, train_losses, groups)
        self._recorder().evaluation(server_round, self.evaluation[server_round])
        train_choice = np.array([np.argmin(r.train_losses) for r in valid])
        test_choice = np.array([np.argmin(r.test_losses) for r in valid])
        record = MetricRecord({
            "usable-models-train": int(len(np.unique(train_choice))),
            "usable-models-test": int(len(np.unique(test_choice))),
            "num-clients": len(valid),
        })
        if self.evaluate_metrics_aggr_fn is not None:
            record.update(self.evaluate_metrics_aggr_fn(client_records(valid, values, train_losses),
                                                        protocol.NUM_EXAMPLES))
        else:
            record.update({name: value for name, value in self.evaluation[server_round].items()
                           if name != "num_clients"})
        return record


def _check_evaluation(evaluate_every: Any, fraction_evaluate: Any, min_evaluate_nodes: Any) -> None:
    """The evaluation settings of :class:`ClusteredRouting`, each error naming the argument and its range."""
    if isinstance(evaluate_every, bool) or int(evaluate_every) != evaluate_every or evaluate_every < 0:
        raise ValueError(f"evaluate_every = {evaluate_every!r} is invalid; allowed: an integer ≥ 0 "
                         "(0 = only the final evaluation)")
    if isinstance(fraction_evaluate, bool) or not 0.0 <= float(fraction_evaluate) <= 1.0:
        raise ValueError(f"fraction_evaluate = {fraction_evaluate!r} is invalid; allowed: a number in [0, 1]")
    if isinstance(min_evaluate_nodes, bool) or int(min_evaluate_nodes) != min_evaluate_nodes or min_evaluate_nodes < 0:
        raise ValueError(f"min_evaluate_nodes = {min_evaluate_nodes!r} is invalid; allowed: an integer ≥ 0")


def evaluation_values(replies: Sequence[EvaluateReply]) -> tuple[dict[str, NDArray[np.float64]], NDArray[np.float64]]:
    """The evaluation's tables, (n, K) each: ``test_loss`` and every metric all replies report; and the
    training losses (which choose each client's model)."""
    names = set(replies[0].model_metrics)
    for reply in replies[1:]:
        names &= set(reply.model_metrics)
    values = {"test_loss": np.stack([r.test_losses for r in replies])}
    values.update({name: np.stack([r.model_metrics[name] for r in replies]) for name in sorted(names)})
    return values, np.stack([r.train_losses for r in replies])


def client_records(replies: Sequence[EvaluateReply], values: Mapping[str, NDArray[np.float64]],
                   train_losses: NDArray[np.float64]) -> list[RecordDict]:
    """One RecordDict per evaluated client for ``evaluate_metrics_aggr_fn``: MetricRecord ``metrics`` with its
    values at its chosen model, its ``cluster`` (that model) and ``num-examples``."""
    chosen = np.argmin(train_losses, axis=1)
    picked = {name: chosen_values(table, train_losses) for name, table in values.items()}
    return [RecordDict({protocol.METRICS: MetricRecord({
        **{name: float(column[i]) for name, column in picked.items()},
        protocol.CLUSTER: int(chosen[i]), protocol.NUM_EXAMPLES: float(reply.num_examples)})})
        for i, reply in enumerate(replies)]
