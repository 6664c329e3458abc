"""The run loop of :meth:`RoutingAdapter.start <fedroute.strategies.adapter.RoutingAdapter.start>`, over Flower's grid.

:func:`run` is the whole run: synchronized entry (docs/algorithm.md, rules §6) when enabled, the
training rounds (checkpoint, telemetry and the dead-federation check after each), the evaluations
during training and the final controller-free evaluation.  Each step drives the strategy through
Flower's hooks (``configure_train`` / ``aggregate_train``, ``configure_evaluate`` /
``aggregate_evaluate``) and the adapter's message, sampling and reply helpers; what the run changes
is the strategy's :class:`~fedroute.strategies.state.RunState`.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Optional, Sequence

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result

from fedroute import protocol
from fedroute.monitoring.alarms import DeadFederation, evaluation_failure, log_events, query_failure
from fedroute.monitoring.progress import ensure_console_handler
from fedroute.strategies.algorithms import provisional_masses
from fedroute.strategies.evaluation import EvaluateFn, evaluate_on_server
from fedroute.strategies.records import initial_models
from fedroute.strategies.validation import validate_provisional_reply
from fedroute.core.validation import invalid

if TYPE_CHECKING:
    from fedroute.strategies.adapter import RoutingAdapter

__all__ = ["run", "begin_run", "train_round", "finish_run", "provisional_greedy", "evaluate_clients"]

logger = logging.getLogger("fedroute")


def run(strategy: "RoutingAdapter", grid: Grid, initial_arrays: ArrayRecord | Sequence[ArrayRecord], num_rounds: int,
        timeout: Optional[float], train_config: Optional[ConfigRecord], evaluate_config: Optional[ConfigRecord],
        evaluate_fn: Optional[EvaluateFn]) -> Result:
    """Synchronized entry (if enabled), ``num_rounds`` rounds and the final evaluation (see ``start``)."""
    state = strategy.state
    result, first_round = Result(), begin_run(strategy, grid, initial_arrays, num_rounds, timeout)
    if first_round == 1:
        evaluate_on_server(state, 0, evaluate_fn, result)
        if strategy.routing.synchronized_entry:
            provisional_greedy(strategy, grid)
        state.routing_masses = state.provisional_masses
    for server_round in range(first_round, num_rounds + 1):
        train_round(strategy, grid, server_round, train_config or ConfigRecord(), result)
        evaluate_on_server(state, server_round, evaluate_fn, result)
        if server_round < num_rounds:
            evaluate_clients(strategy, server_round, grid, evaluate_config, result)
    return finish_run(strategy, grid, num_rounds, evaluate_config, result)


def begin_run(strategy: "RoutingAdapter", grid: Grid, initial_arrays: ArrayRecord | Sequence[ArrayRecord],
              num_rounds: int, timeout: Optional[float]) -> int:
    """Take the run's settings and initial models, resume a checkpoint; return the first round to run."""
    state = strategy.state
    strategy.algorithm.begin(state, strategy.routing)
    if num_rounds < 1:
        raise invalid("num_rounds", num_rounds, "an integer ≥ 1")
    state.cluster_models = initial_models(initial_arrays, strategy.num_clusters)
    state.start_models = (protocol.stack_flat(state.cluster_models) if strategy.routing.restart_idle_spares
                          else None)
    state.reply_timeout = timeout or strategy.round_timeout
    state.num_rounds, state.grid = num_rounds, grid
    ensure_console_handler(logger)
    strategy.summary()
    state.recorder = None
    first_round = strategy._restore() + 1
    strategy._recorder().start(first_round, state.history)
    return first_round


def train_round(strategy: "RoutingAdapter", grid: Grid, server_round: int, config: ConfigRecord,
                result: Result) -> None:
    """One training round, its checkpoint and telemetry; a dead federation stops the run."""
    messages = strategy.configure_train(server_round, strategy.state.packed_models(), config, grid)
    replies = grid.send_and_receive(messages, timeout=strategy.reply_timeout)
    _, metrics = strategy.aggregate_train(server_round, replies)
    if metrics is not None:
        result.train_metrics_clientapp[server_round] = metrics
    strategy._save(server_round)
    recorder = strategy._recorder()
    recorder.commit()
    if (dead := recorder.alarms.dead) is not None:
        recorder.close()
        raise DeadFederation(dead.message)


def finish_run(strategy: "RoutingAdapter", grid: Grid, num_rounds: int, evaluate_config: Optional[ConfigRecord],
               result: Result) -> Result:
    """The final evaluation; a run that never got an answer, or whose evaluation got none, stops."""
    state, recorder = strategy.state, strategy._recorder()
    if (silent := recorder.alarms.unanswered_run(num_rounds)) is not None:  # a run shorter than N
        log_events(logger, strategy.label, [silent])
        recorder.close()
        raise DeadFederation(silent.message)
    packed = state.packed_models()
    evaluation = evaluate_clients(strategy, num_rounds, grid, evaluate_config, result)
    strategy._recorder().close()
    if evaluation and strategy.evaluate_at_end and not state.final_evaluation:
        asked, reasons = len(list(evaluation)), state.rejections.reasons(num_rounds, "evaluate")
        raise DeadFederation(evaluation_failure(asked, reasons))
    result.arrays = packed
    return result


def provisional_greedy(strategy: "RoutingAdapter", grid: Grid) -> None:
    """Synchronized entry, steps 1–2: Greedy reports at ``W^0`` → provisional masses."""
    state, num_clusters = strategy.state, strategy.num_clusters
    messages = strategy._messages(strategy._sample_nodes(grid, 0), MessageType.QUERY, {
        protocol.PHASE: protocol.PHASE_PROVISIONAL, protocol.SERVER_ROUND: 0, protocol.ROUND_INDEX: 0,
        protocol.NUM_ROUNDS: state.num_rounds})
    reports = strategy._valid(grid.send_and_receive(messages, timeout=strategy.reply_timeout),
                              lambda content: validate_provisional_reply(content, num_clusters), 0, "provisional")
    if not reports:
        raise DeadFederation(query_failure(state.rejections.reasons(0, "provisional")))
    state.provisional_masses = provisional_masses(reports, num_clusters, strategy.influence)
    logger.info("synchronized entry: provisional masses %s", np.round(state.provisional_masses, 3).tolist())


def evaluate_clients(strategy: "RoutingAdapter", server_round: int, grid: Grid, config: Optional[ConfigRecord],
                     result: Result) -> list[Message]:
    """The round's client evaluation, if it has one (``configure_evaluate``); return the messages sent."""
    messages = list(strategy.configure_evaluate(server_round, strategy.state.packed_models(),
                                                config or ConfigRecord(), grid))
    if messages:
        replies = grid.send_and_receive(messages, timeout=strategy.reply_timeout)
        if (metrics := strategy.aggregate_evaluate(server_round, replies)) is not None:
            result.evaluate_metrics_clientapp[server_round] = metrics
    return messages
