"""The Flower ``Strategy`` adapter of fedroute's server algorithms, over one :class:`~fedroute.strategies.state.RunState`.

:class:`RoutingAdapter` implements Flower's Message-API hooks (``configure_train``, ``aggregate_train``,
``configure_evaluate``, ``aggregate_evaluate``) and ``start``, whose loop over Flower's grid
(synchronized entry, the training rounds, evaluations, the final evaluation) is
:func:`~fedroute.strategies.run_loop.run`.  Each hook is short: the maths is in free functions
(:mod:`~fedroute.strategies.algorithms`, :mod:`~fedroute.strategies.evaluation`,
:mod:`~fedroute.strategies.history`, :mod:`~fedroute.strategies.messages`, :mod:`~fedroute.strategies.nodes`,
:mod:`~fedroute.strategies.replies`, :mod:`~fedroute.strategies.checkpoint`) and what differs between
algorithms in the strategy's :class:`~fedroute.strategies.algorithms.Algorithm`.  The constructor is the
subclass's (:class:`~fedroute.strategies.clustered.ClusteredRouting`): it stores the parameters annotated
below, the algorithm and a fresh state.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, Mapping, Optional

from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy

from fedroute import protocol
from fedroute.core.influence import InfluenceBounds
from fedroute.core.participation import Participation, sample_size
from fedroute.core.server_step import ServerState
from fedroute.core.settings import RoutingSettings
from fedroute.monitoring.alarms import Alarm, AlarmSettings
from fedroute.monitoring.recorder import RunRecorder
from fedroute.strategies.algorithms import Algorithm, StepRules
from fedroute.strategies.checkpoint import (CHECKPOINT_FILE, checkpoint_meta, load_checkpoint, restore_run,
                                            run_identity, save_checkpoint)
from fedroute.strategies.evaluation import EvaluateFn, evaluation_aggregate, evaluation_record
from fedroute.strategies.history import models_changed, record_round
from fedroute.strategies.messages import common_config, masses_config, node_messages
from fedroute.strategies.nodes import (connected_nodes, evaluation_nodes, identification_messages, sampled_nodes,
                                       unidentified_error)
from fedroute.strategies.orders import node_orders
from fedroute.strategies.replies import accepted_replies
from fedroute.strategies.results import MetricsAggregation, RejectedReply
from fedroute.strategies.run_loop import run
from fedroute.strategies.state import RunState, StateField
from fedroute.strategies.validation import TrainReply, validate_evaluate_reply, validate_identity_reply

__all__ = ["RoutingAdapter", "EvaluateFn"]

logger = logging.getLogger("fedroute")

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
    def reply_timeout(self) -> float:
        """Seconds to wait for the replies of one exchange: ``start``'s ``timeout``, else ``round_timeout``."""
        return self.state.reply_timeout or self.round_timeout

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
        orders = node_orders(state.server, state.bindings.client_of_node, node_ids, server_round - 1, self.routing,
                             self.participation, state.cluster_models)
        return self._messages(node_ids, MessageType.TRAIN, orders=orders, config={
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
        return run(self, grid, initial_arrays, num_rounds, timeout, train_config, evaluate_config, evaluate_fn)

    # ------------------------------------------------------------- messages
    def _packed_models(self) -> ArrayRecord:
        """``state.packed_models()`` (what ``bench/bench_fedavg.py`` passes to :meth:`configure_train`)."""
        return self.state.packed_models()

    def _common_config(self) -> dict[str, Any]:
        """:func:`~fedroute.strategies.messages.common_config` of this strategy."""
        return common_config(self.client_config, self.algorithm.config, self.routing, self.seed, self.run_key)

    def _messages(self, node_ids: Iterable[int], message_type: str, config: Mapping[str, Any],
                  orders: Optional[Mapping[int, ConfigRecord]] = None) -> list[Message]:
        """One message per node with the algorithm's records and the common config plus ``config``
        (:func:`~fedroute.strategies.messages.node_messages`: records built once, shared), and the node's
        signature-start ``orders`` where given (:mod:`~fedroute.strategies.orders`)."""
        def records_of(node_id: int, records: dict[str, Any]) -> dict[str, Any]:
            own = self.algorithm.node_records(self.state, node_id, records)
            return own if orders is None else {**own, protocol.SIGNATURE_ORDERS: orders[node_id]}
        return node_messages(node_ids, message_type, self.algorithm.records(self.state, message_type), records_of,
                             {**self._common_config(), **config})

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
            self._valid(grid.send_and_receive(messages, timeout=self.reply_timeout), validate_identity_reply,
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
        """What a checkpoint must match to be resumed (:func:`~fedroute.strategies.checkpoint.run_identity`)."""
        return run_identity(type(self).__name__, self.routing, self.seed, self.run_key, self.influence,
                            self.participation, self.state.cluster_models[0])

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
