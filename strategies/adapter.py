"""The Flower ``Strategy`` adapter of fedroute's server algorithms, over one :class:`~fedroute.strategies.state.RunState`.

:class:`RoutingAdapter` implements Flower's Message-API hooks (``configure_train``, ``aggregate_train``,
``configure_evaluate``, ``aggregate_evaluate``) and ``start``, the loop over Flower's grid: synchronized
entry (docs/algorithm.md, rules §6) when enabled, the training rounds (checkpoint, telemetry and the
dead-federation check after each), evaluations during training, the final controller-free evaluation.
Each hook is short: the maths is in free functions (:mod:`~fedroute.strategies.algorithms`,
:mod:`~fedroute.strategies.evaluation`, :mod:`~fedroute.strategies.history`,
:mod:`~fedroute.strategies.nodes`, :mod:`~fedroute.strategies.replies`, :mod:`~fedroute.strategies.checkpoint`)
and what differs between algorithms in the strategy's :class:`~fedroute.strategies.algorithms.Algorithm`.
The constructor is the subclass's (:class:`~fedroute.strategies.clustered.ClusteredRouting`): it stores the
parameters annotated below, the algorithm and a fresh state.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Mapping, Optional

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy
from numpy.typing import NDArray

from fedroute import protocol
from fedroute.core.influence import InfluenceBounds
from fedroute.core.participation import Participation, sample_size
from fedroute.core.server_step import ServerState
from fedroute.core.settings import RoutingSettings
from fedroute.monitoring.alarms import Alarm, AlarmSettings, DeadFederation, evaluation_failure, log_events, query_failure
from fedroute.monitoring.progress import ensure_console_handler
from fedroute.monitoring.recorder import RunRecorder
from fedroute.strategies.algorithms import Algorithm, StepRules, provisional_masses
from fedroute.strategies.checkpoint import CHECKPOINT_FILE, checkpoint_meta, load_checkpoint, restore_run, save_checkpoint
from fedroute.strategies.evaluation import evaluation_aggregate, evaluation_record
from fedroute.strategies.history import models_changed, record_round
from fedroute.strategies.nodes import (connected_nodes, evaluation_nodes, identification_messages, sampled_nodes,
                                       unidentified_error)
from fedroute.strategies.records import array_record, initial_models
from fedroute.strategies.replies import accepted_replies
from fedroute.strategies.results import MetricsAggregation, RejectedReply, cluster_metric_record
from fedroute.strategies.state import RunState, StateField
from fedroute.strategies.validation import (TrainReply, validate_evaluate_reply, validate_identity_reply,
                                            validate_provisional_reply)

__all__ = ["RoutingAdapter", "EvaluateFn"]

logger = logging.getLogger("fedroute")

EvaluateFn = Callable[[int, ArrayRecord], Optional[MetricRecord]]
"""Flower's server-side ``evaluate_fn(server_round, arrays) -> MetricRecord | None``."""


def masses_config(masses: Optional[NDArray[np.float64]], server: ServerState, num_clusters: int) -> dict[str, Any]:
    """The masses and, when the routing reads it, the server's health view (:mod:`fedroute.core.health`)."""
    config: dict[str, Any] = {
        protocol.HAS_MASSES: masses is not None,
        protocol.MASSES: [float(m) for m in (masses if masses is not None else np.zeros(num_clusters))],
    }
    if (view := server.view) is not None:
        config.update({protocol.EXPLORE: bool(view.explore[0]),
                       protocol.MERGED_INTO: [int(k) for k in view.merged_into[0]],
                       protocol.SPARE: [bool(flag) for flag in view.spare[0]]})
    return config


class RoutingAdapter(Strategy):
    """A Flower strategy running an :class:`~fedroute.strategies.algorithms.Algorithm` on a :class:`RunState`."""

    routing: RoutingSettings
    num_clusters: int
    fraction_train: float
    participation: Participation
    min_train_nodes: int
    min_available_nodes: int
    round_timeout: float
    seed: int
    run_key: str
    evaluate_at_end: bool
    client_config: dict[str, Any]
    node_wait_timeout: float
    checkpoint_dir: Optional[Path]
    label: str
    telemetry_dir: Optional[Path]
    tensorboard_dir: Optional[Path]
    alarm_settings: AlarmSettings
    starvation_basin: Optional[bool]
    progress_interval: Optional[float]
    influence: InfluenceBounds
    evaluate_every: int
    fraction_evaluate: float
    min_evaluate_nodes: int
    train_metrics_aggr_fn: Optional[MetricsAggregation]
    evaluate_metrics_aggr_fn: Optional[MetricsAggregation]
    telemetry_width: Optional[int]
    """Per-cluster columns of ``rounds.csv``/``clients.csv`` when methods of several ``K`` share them
    (the ServerApp sets the run's largest ``K``); ``None``: this strategy's ``K``."""
    algorithm: Algorithm
    state: RunState

    cluster_models = StateField[list]("cluster_models", "The ``K`` cluster models ``W^t``, one ``{name: ndarray}`` each.")
    routing_masses = StateField[Any]("routing_masses", "``μ̂``: the masses the clients receive.")
    preferred_masses = StateField[Any]("preferred_masses", "``p̂``: the share of clients whose Greedy choice is each cluster.")
    provisional_masses = StateField[Any]("provisional_masses", "The synchronized entry's provisional masses.")
    server = StateField[ServerState]("server", "The server state besides the models: :mod:`fedroute.core.server_step`.")
    history = StateField[list]("history", "One :class:`~fedroute.strategies.results.RoundRecord` per training round.")
    client_routes = StateField[dict]("client_routes", "Round ``t`` → client id → executed hard route.")
    final_evaluation = StateField[list]("final_evaluation", "The validated replies of the final evaluation.")
    evaluation = StateField[dict]("evaluation", "Server round → the aggregated evaluation of the clients asked then "
                                  "(:func:`fedroute.core.evaluation.evaluation_metrics`); a row of ``evaluation.csv`` each.")
    cluster_train_metrics = StateField[dict]("cluster_train_metrics", "Server round → cluster → its clients' "
                                             "``train_fn`` metrics, averaged by ``num-examples``.")
    server_evaluation = StateField[dict]("server_evaluation", "Server round (0 = initial models) → cluster → what "
                                         "``evaluate_fn`` returned for that cluster's model.")
    recorder = StateField[Optional[RunRecorder]]("recorder", "The run's telemetry recorder.")
    rejections = StateField[Any]("rejections", "The bounded log of rejected replies.")
    bindings = StateField[Any]("bindings", "Client id ↔ node id (:mod:`fedroute.strategies.identity`).")
    resumed_from_round = StateField[int]("resumed_from_round", "The checkpoint's round the run resumed from (0: none).")
    _num_rounds = StateField[int]("num_rounds", "``T`` (``start`` sets it; set it to call ``configure_train`` alone).")

    @property
    def rejected(self) -> list[RejectedReply]:
        """Rejected replies with their reasons (bounded: see :class:`~fedroute.strategies.rejections.RejectionLog`)."""
        return list(self.state.rejections.entries)

    @property
    def alarms(self) -> list[Alarm]:
        """Every collapse alarm raised so far (:class:`~fedroute.monitoring.alarms.Alarm`)."""
        return [] if self.state.recorder is None else list(self.state.recorder.alarms.alarms)

    def summary(self) -> None:
        """Log the configuration."""
        logger.info("[%s] %s: K=%d, %d rounds, controllers=%s, mode=%s, synchronized entry=%s, fraction=%.2f",
                    self.label, type(self).__name__, self.num_clusters, self.state.num_rounds,
                    ",".join(self.routing.controllers), self.routing.exp3_mode, self.routing.synchronized_entry,
                    self.fraction_train)

    # ------------------------------------------------------------ Flower's hooks
    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        """Messages for round ``server_round`` (``t = server_round - 1``)."""
        state = self.state
        state.adopt(arrays)
        if self.routing.exploitation_fraction > 0 and state.num_rounds < 1:
            raise ValueError("routing with exploitation_fraction > 0 needs the run's number of rounds: "
                             "run the strategy with start(grid, initial_arrays, num_rounds=T)")
        state.round_started = time.monotonic()
        state.grid = grid
        node_ids = self._sample_nodes(grid, server_round)
        return self._messages(node_ids, MessageType.TRAIN, {
            **dict(config.items()), protocol.PHASE: protocol.PHASE_TRAIN, protocol.SERVER_ROUND: server_round,
            protocol.ROUND_INDEX: server_round - 1, protocol.NUM_ROUNDS: state.num_rounds,
            protocol.SAMPLED_FRACTION: float(self.fraction_train),
            **masses_config(state.routing_masses, state.server, self.num_clusters),
        })

    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[Optional[ArrayRecord], Optional[MetricRecord]]:
        """Validate, run the algorithm's server step (:func:`~fedroute.strategies.algorithms.routing_step`),
        record the round."""
        state = self.state
        valid: list[TrainReply] = self._valid(
            replies, lambda content: self.algorithm.validate_train(state, content, self.routing),
            server_round, protocol.PHASE_TRAIN)
        previous = [dict(model) for model in state.cluster_models]
        if not valid:
            logger.warning("round %d: no valid reply; cluster models and masses unchanged", server_round)
        outcome = self.algorithm.server_step(state, server_round - 1, valid,
                                             StepRules(self.routing, self.participation, self.influence))
        for reply in (reply for reply, kept in zip(valid, outcome.kept) if not kept):
            self._reject(server_round, protocol.PHASE_TRAIN, reply.node_id,
                         f"the aggregate of cluster {reply.cluster} is not finite; the cluster keeps its model")
        valid = [reply for reply, kept in zip(valid, outcome.kept) if kept]
        now = time.monotonic()
        metrics = record_round(state, self._recorder(), server_round, valid,
                               models_changed(previous, state.cluster_models), now - (state.round_started or now),
                               self.train_metrics_aggr_fn)
        return state.packed_models(), metrics

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                           grid: Grid) -> Iterable[Message]:
        """Evaluation messages: after the last round every node (``evaluate_at_end``); after every
        ``evaluate_every``-th round ``fraction_evaluate`` of them; none otherwise."""
        if self.evaluate_at_end and server_round == self.state.num_rounds:
            node_ids = sorted(grid.get_node_ids())
        elif self.evaluate_every and server_round % self.evaluate_every == 0:
            node_ids = self._evaluation_nodes(grid, server_round)
        else:
            return []
        self.state.adopt(arrays)
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
        valid = self._valid(replies, lambda content: validate_evaluate_reply(content, self.num_clusters),
                            server_round, "evaluate")
        if server_round >= self.state.num_rounds:
            self.state.final_evaluation = valid
        if not valid:
            return None
        self.state.evaluation[server_round] = evaluation_aggregate(valid)
        self._recorder().evaluation(server_round, self.state.evaluation[server_round])
        return evaluation_record(valid, self.state.evaluation[server_round], self.evaluate_metrics_aggr_fn)

    # ------------------------------------------------------------------ the run
    def start(  # type: ignore[override]
        self,
        grid: Grid,
        initial_arrays: ArrayRecord | Sequence[ArrayRecord],
        num_rounds: int = 3,
        timeout: Optional[float] = None,
        train_config: Optional[ConfigRecord] = None,
        evaluate_config: Optional[ConfigRecord] = None,
        evaluate_fn: Optional[EvaluateFn] = None,
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
            Server-side evaluation, as in Flower: ``evaluate_fn(server_round, arrays) -> MetricRecord | None``,
            called for each cluster model (``arrays`` = that model's ArrayRecord, so a ``FedAvg``
            ``evaluate_fn`` works unchanged) on the initial models (``server_round = 0``) and after every
            round.  The records are kept per cluster in :attr:`server_evaluation` and, with keys
            ``cluster-<k>/<name>``, in ``Result.evaluate_metrics_serverapp``.

        Returns
        -------
        flwr.serverapp.strategy.Result
            ``arrays`` holds the ``K`` final models packed (unpack them with
            :func:`fedroute.unpack_cluster_models` or :func:`fedroute.cluster_models_to_torch`); see also
            :attr:`cluster_models`, :attr:`history`, :attr:`final_evaluation` and :attr:`alarms`.

        Raises
        ------
        fedroute.monitoring.alarms.DeadFederation
            When no valid reply arrived for ``alarm_settings.dead_rounds`` rounds in a row, in any
            round of a shorter run, or in the final evaluation, or no valid report to synchronized entry.
        """
        result, first_round = Result(), self._begin(grid, initial_arrays, num_rounds, timeout)
        if first_round == 1:
            self._evaluate_on_server(0, evaluate_fn, result)
            if self.routing.synchronized_entry:
                self._provisional_greedy(grid)
            self.state.routing_masses = self.state.provisional_masses
        for server_round in range(first_round, num_rounds + 1):
            self._train_round(grid, server_round, train_config or ConfigRecord(), result)
            self._evaluate_on_server(server_round, evaluate_fn, result)
            if server_round < num_rounds:
                self._evaluate_clients(server_round, grid, evaluate_config, result)
        return self._finish(grid, num_rounds, evaluate_config, result)

    def _begin(self, grid: Grid, initial_arrays: ArrayRecord | Sequence[ArrayRecord], num_rounds: int,
               timeout: Optional[float]) -> int:
        """Take the run's settings and initial models, resume a checkpoint; return the first round to run."""
        self.algorithm.begin(self.state, self.routing)
        if num_rounds < 1:
            raise ValueError(f"num_rounds = {num_rounds} is invalid; allowed: an integer ≥ 1")
        self.state.cluster_models = initial_models(initial_arrays, self.num_clusters)
        self.round_timeout = timeout or self.round_timeout
        self.state.num_rounds, self.state.grid = num_rounds, grid
        ensure_console_handler(logger)
        self.summary()
        self.state.recorder = None
        first_round = self._restore() + 1
        self._recorder().start(first_round, self.state.history)
        return first_round

    def _train_round(self, grid: Grid, server_round: int, config: ConfigRecord, result: Result) -> None:
        """One training round, its checkpoint and telemetry; a dead federation stops the run."""
        messages = self.configure_train(server_round, self.state.packed_models(), config, grid)
        _, metrics = self.aggregate_train(server_round, grid.send_and_receive(messages, timeout=self.round_timeout))
        if metrics is not None:
            result.train_metrics_clientapp[server_round] = metrics
        self._save(server_round)
        recorder = self._recorder()
        recorder.commit()
        if (dead := recorder.alarms.dead) is not None:
            recorder.close()
            raise DeadFederation(dead.message)

    def _finish(self, grid: Grid, num_rounds: int, evaluate_config: Optional[ConfigRecord], result: Result) -> Result:
        """The final evaluation; a run that never got an answer, or whose evaluation got none, stops."""
        recorder = self._recorder()
        if (silent := recorder.alarms.unanswered_run(num_rounds)) is not None:  # a run shorter than N
            log_events(logger, self.label, [silent])
            recorder.close()
            raise DeadFederation(silent.message)
        packed = self.state.packed_models()
        evaluation = self._evaluate_clients(num_rounds, grid, evaluate_config, result)
        self._recorder().close()
        if evaluation and self.evaluate_at_end and not self.state.final_evaluation:
            asked, reasons = len(list(evaluation)), self.state.rejections.reasons(num_rounds, "evaluate")
            raise DeadFederation(evaluation_failure(asked, reasons))
        result.arrays = packed
        return result

    def _provisional_greedy(self, grid: Grid) -> None:
        """Synchronized entry, steps 1–2: Greedy reports at ``W^0`` → provisional masses."""
        messages = self._messages(self._sample_nodes(grid, 0), MessageType.QUERY, {
            protocol.PHASE: protocol.PHASE_PROVISIONAL, protocol.SERVER_ROUND: 0, protocol.ROUND_INDEX: 0,
            protocol.NUM_ROUNDS: self.state.num_rounds})
        reports = self._valid(grid.send_and_receive(messages, timeout=self.round_timeout),
                              lambda content: validate_provisional_reply(content, self.num_clusters), 0, "provisional")
        if not reports:
            raise DeadFederation(query_failure(self.state.rejections.reasons(0, "provisional")))
        self.state.provisional_masses = provisional_masses(reports, self.num_clusters, self.influence)
        logger.info("synchronized entry: provisional masses %s", np.round(self.state.provisional_masses, 3).tolist())

    def _evaluate_clients(self, server_round: int, grid: Grid, config: Optional[ConfigRecord],
                          result: Result) -> list[Message]:
        """The round's client evaluation, if it has one (:meth:`configure_evaluate`); return the messages sent."""
        messages = list(self.configure_evaluate(server_round, self.state.packed_models(), config or ConfigRecord(),
                                                grid))
        if messages:
            metrics = self.aggregate_evaluate(server_round, grid.send_and_receive(messages, timeout=self.round_timeout))
            if metrics is not None:
                result.evaluate_metrics_clientapp[server_round] = metrics
        return messages

    def _evaluate_on_server(self, server_round: int, evaluate_fn: Optional[EvaluateFn], result: Result) -> None:
        """``evaluate_fn`` on each cluster model."""
        if evaluate_fn is None:
            return
        records = {}
        for cluster, model in enumerate(self.state.cluster_models):
            if (record := evaluate_fn(server_round, array_record(model))) is not None:
                records[cluster] = record
        if records:
            self.state.server_evaluation[server_round] = records
            result.evaluate_metrics_serverapp[server_round] = cluster_metric_record(records)

    # ------------------------------------------------------------- messages
    def _packed_models(self) -> ArrayRecord:
        """``state.packed_models()`` (what ``bench/bench_fedavg.py`` passes to :meth:`configure_train`)."""
        return self.state.packed_models()

    def _common_config(self) -> dict[str, Any]:
        """The ConfigRecord entries every message carries: extra client config, the algorithm's, the routing."""
        return {**self.client_config, **self.algorithm.config, **protocol.routing_config(self.routing.to_dict()),
                protocol.SEED: self.seed, protocol.RUN_KEY: self.run_key}

    def _messages(self, node_ids: Iterable[int], message_type: str, config: Mapping[str, Any]) -> list[Message]:
        """One RecordDict per node holding the round's records (the algorithm's: the K models, any extra)
        and one ConfigRecord, built once and shared by every message.

        Sharing is safe: Flower delivers a copy of each message's content (the simulation pickles it to the
        ClientApp's Ray actor, deployment serialises it to the SuperLink), and the strategy never changes a
        record it sent (a new round builds new ones); ``tests/test_shared_records.py`` checks that one
        ClientApp overwriting what it received changes nothing for the others.
        """
        records = self.algorithm.records(self.state, message_type)
        config_record = ConfigRecord({**self._common_config(), **config})
        return [Message(content=RecordDict({**self.algorithm.node_records(self.state, node_id, records),
                                            protocol.CONFIG: config_record}),
                        message_type=message_type, dst_node_id=node_id) for node_id in node_ids]

    def _sample_nodes(self, grid: Grid, server_round: int) -> list[int]:
        """Wait for enough nodes, then sample the round's clients (:mod:`~fedroute.strategies.nodes`).

        ``min_available_nodes`` is waited for once, before the first exchange; later rounds need only
        ``min_train_nodes``, so a lost node does not stop the run (it is left out until it reconnects).
        """
        state = self.state
        needed = self.min_train_nodes if state.nodes_ready else max(self.min_available_nodes, self.min_train_nodes)
        node_ids = connected_nodes(grid, needed, self.node_wait_timeout)
        state.nodes_ready = True
        if sample_size(len(node_ids), self.fraction_train, self.min_train_nodes) == len(node_ids):
            return node_ids
        return sampled_nodes(self._identify(grid, node_ids, server_round), self.participation, self.seed, server_round)

    def _identify(self, grid: Grid, node_ids: Sequence[int], server_round: int) -> dict[int, int]:
        """Node id → client id of the connected nodes, asking the nodes not bound yet (an identification ``QUERY``).

        A node that does not answer validly is left out of this round's sample and asked again the next
        round; if no node at all can be identified the run stops, naming the handler the ClientApp lacks.
        """
        if unknown := [node for node in node_ids if node not in self.state.bindings.client_of_node]:
            messages = identification_messages(unknown, self._common_config(), server_round)
            self._valid(grid.send_and_receive(messages, timeout=self.round_timeout), validate_identity_reply,
                        server_round, protocol.PHASE_IDENTIFY)
        bound = self.state.bindings.client_of_node
        if not (identified := {node: bound[node] for node in node_ids if node in bound}):
            raise unidentified_error(self.fraction_train, len(node_ids))
        return identified

    def _evaluation_nodes(self, grid: Grid, server_round: int) -> list[int]:
        """The nodes an evaluation during training asks: ``fraction_evaluate`` of the connected ones (at least
        ``min_evaluate_nodes``), drawn from ``(seed, server_round)``."""
        node_ids = sorted(grid.get_node_ids())
        count = sample_size(len(node_ids), self.fraction_evaluate, self.min_evaluate_nodes)
        return evaluation_nodes(node_ids, count, self.seed, server_round)

    # -------------------------------------------------------------- replies
    def _valid(self, replies: Iterable[Message], validate: Callable[[Mapping[str, Any]], Any],
               server_round: int, phase: str) -> list[Any]:
        """Validate replies and their node's identity; log and record every rejected one; drop duplicates."""
        online = None if self.state.grid is None else self.state.grid.get_node_ids
        return accepted_replies(replies, validate, self.state.bindings, online,
                                lambda node_id, reason: self._reject(server_round, phase, node_id, reason))

    def _reject(self, server_round: int, phase: str, node_id: int, reason: str) -> None:
        entry = self.state.rejections.add(server_round, phase, node_id, reason)
        if entry is not None and phase != protocol.PHASE_TRAIN:
            self._recorder().rejected_outside_rounds([entry])

    def _recorder(self) -> RunRecorder:
        """The run's recorder (made on first use, also when :meth:`aggregate_train` is called directly)."""
        if self.state.recorder is None:
            self.state.recorder = RunRecorder(
                self.label, self.num_clusters, self.routing.controllers, self.state.num_rounds,
                alarm_settings=self.alarm_settings, starvation_basin=self.starvation_basin,
                telemetry_dir=self.telemetry_dir, tensorboard_dir=self.tensorboard_dir,
                progress_interval=self.progress_interval, logger=logger,
                random_ties=self.routing.tie_breaking == "random", table_width=self.telemetry_width)
        return self.state.recorder

    # ---------------------------------------------------------- checkpoints
    def _identity(self) -> dict[str, Any]:
        """What a checkpoint must match to be resumed."""
        return {"class": type(self).__name__, "routing": self.routing.to_dict(), "seed": self.seed,
                "run_key": self.run_key, "influence": self.influence.to_dict(),
                "participation": {"fraction": float(self.fraction_train), "min_clients": self.min_train_nodes,
                                  "report_rounds": self.participation.report_rounds},
                "template": {name: [list(value.shape), str(value.dtype)]
                             for name, value in self.state.cluster_models[0].items()}}

    def _save(self, server_round: int) -> None:
        """Checkpoint the state after ``server_round`` (with a ``checkpoint_dir``)."""
        if self.checkpoint_dir is not None:
            meta = checkpoint_meta(self._identity(), server_round, self.state, self._recorder().alarms.state_dict())
            save_checkpoint(self.checkpoint_dir, self.algorithm.checkpoint_arrays(self.state), meta)

    def _restore(self) -> int:
        """Load the checkpoint if there is one; return the last completed round (0 if none)."""
        if self.checkpoint_dir is None or (stored := load_checkpoint(self.checkpoint_dir)) is None:
            return 0
        restored = restore_run(self.checkpoint_dir / CHECKPOINT_FILE, stored, self._identity(), self.state,
                               self.algorithm, lambda alarms: self._recorder().alarms.load_state_dict(alarms))
        logger.warning("resuming from the checkpoint of round %d in %s", restored, self.checkpoint_dir)
        return restored
