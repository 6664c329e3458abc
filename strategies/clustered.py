"""``ClusteredRouting``: a Flower Message-API strategy holding ``K`` cluster models.

Each round it broadcasts all ``K`` models and the previous routing masses,
validates the replies (a malformed reply is logged and dropped), aggregates
them per cluster with the hard update, and records the round.  With
``synchronized_entry`` it first runs the provisional-Greedy ``QUERY`` exchange
(ALGORITHM.md §6) and broadcasts the provisional masses with server round 1.
After the last round it asks every node for the controller-free evaluation.
Greedy IFCA is this strategy with ``RoutingSettings(controllers=("gr",))``.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Mapping, Optional

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy
from numpy.typing import NDArray

from fedroute import protocol
from fedroute.client.randomness import Purpose, generator
from fedroute.client.settings import RoutingSettings
from fedroute.strategies.aggregation import hard_update, routing_masses
from fedroute.strategies.checkpoint import load_checkpoint, save_checkpoint
from fedroute.strategies.records import array_record, arrays_of, pack_cluster_models, unpack_cluster_models
from fedroute.strategies.validation import (
    EvaluateReply,
    ReplyRejected,
    TrainReply,
    first_reply_per_client,
    validate_evaluate_reply,
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
        Fraction of connected nodes sampled per round, in ``(0, 1]``.
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
        several methods in turn on the same nodes.
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
    ) -> None:
        if not 0.0 < fraction_train <= 1.0:
            raise ValueError(f"fraction_train = {fraction_train} is invalid; allowed: (0, 1]")
        for name, value in (("min_train_nodes", min_train_nodes), ("min_available_nodes", min_available_nodes)):
            if int(value) != value or value < 1:
                raise ValueError(f"{name} = {value} is invalid; allowed: an integer ≥ 1")
        if round_timeout <= 0:
            raise ValueError(f"round_timeout = {round_timeout} is invalid; allowed: > 0")
        if seed < 0:
            raise ValueError(f"seed = {seed} is invalid; allowed: an integer ≥ 0")
        self.routing = routing
        self.fraction_train = fraction_train
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
        self.cluster_models: list[dict[str, NDArray]] = []
        self.routing_masses: Optional[NDArray[np.float64]] = None
        self.provisional_masses: Optional[NDArray[np.float64]] = None
        self.history: list[dict[str, Any]] = []
        self.client_routes: dict[int, dict[int, int]] = {}
        self.final_evaluation: list[EvaluateReply] = []
        self.rejected: list[dict[str, Any]] = []
        self._num_rounds = 0

    # ------------------------------------------------------------------ helpers
    def summary(self) -> None:
        """Log the configuration."""
        logger.info("ClusteredRouting: K=%d, controllers=%s, mode=%s, synchronized entry=%s, fraction=%.2f",
                    self.num_clusters, ",".join(self.routing.controllers), self.routing.exp3_mode,
                    self.routing.synchronized_entry, self.fraction_train)

    def _sample_nodes(self, grid: Grid, server_round: int) -> list[int]:
        """Wait for enough nodes, then sample deterministically from (seed, round).

        ``min_available_nodes`` is waited for once, before the first exchange;
        later rounds need only ``min_train_nodes``, so a lost node does not stop
        the run (it is left out until it reconnects).
        """
        needed = self.min_train_nodes if self._nodes_ready else max(self.min_available_nodes, self.min_train_nodes)
        deadline = time.monotonic() + self.node_wait_timeout
        while len(node_ids := sorted(grid.get_node_ids())) < needed:
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {len(node_ids)} nodes connected after {self.node_wait_timeout} s; "
                                   f"min_available_nodes/min_train_nodes require {needed}")
            time.sleep(0.5)
        self._nodes_ready = True
        sample_size = min(len(node_ids), max(self.min_train_nodes, int(len(node_ids) * self.fraction_train)))
        if sample_size == len(node_ids):
            return node_ids
        rng = generator(self.seed, 0, server_round, Purpose.NODE_SAMPLING)
        # Sample positions, not ids: numpy would turn 64-bit node ids into floats.
        return sorted(node_ids[int(index)] for index in rng.choice(len(node_ids), size=sample_size, replace=False))

    def _messages(
        self, node_ids: Iterable[int], message_type: str, config: Mapping[str, Any]
    ) -> list[Message]:
        """One fresh RecordDict per node: the K models (plus :meth:`_extra_records`) and a ConfigRecord."""
        models = [array_record(arrays) for arrays in self._broadcast_models(message_type)]
        extra = self._extra_records(message_type)
        full_config = {
            **self.client_config,
            **protocol.routing_config(self.routing.to_dict()),
            protocol.SEED: self.seed,
            protocol.RUN_KEY: self.run_key,
            **config,
        }
        messages = []
        for node_id in node_ids:
            content = RecordDict({protocol.cluster_key(k): ArrayRecord(dict(model.items()))
                                  for k, model in enumerate(models)})
            for key, record in extra.items():
                content[key] = ArrayRecord(dict(record.items()))
            content[protocol.CONFIG] = ConfigRecord(dict(full_config))
            messages.append(Message(content=content, message_type=message_type, dst_node_id=node_id))
        return messages

    def _broadcast_models(self, message_type: str) -> list[dict[str, NDArray]]:
        """The K models a message carries (subclasses may send e.g. combined predictors)."""
        return self.cluster_models

    def _extra_records(self, message_type: str) -> dict[str, ArrayRecord]:
        """Further ArrayRecords a message carries (none here)."""
        return {}

    def _validate_train(self, content: Mapping[str, Any]) -> TrainReply:
        """Validate one training reply (subclasses may check further records)."""
        return validate_train_reply(content, self.num_clusters, self.cluster_models[0])

    def _after_hard_update(self, valid: list[TrainReply]) -> None:
        """Hook after the per-cluster update of a round with valid replies."""

    def _masses_config(self, masses: Optional[NDArray[np.float64]]) -> dict[str, Any]:
        return {
            protocol.HAS_MASSES: masses is not None,
            protocol.MASSES: [float(m) for m in (masses if masses is not None else np.zeros(self.num_clusters))],
        }

    def _valid(self, replies: Iterable[Message], validate: Callable[[Mapping[str, Any]], Any],
               server_round: int, phase: str) -> list[Any]:
        """Validate replies; log and record every rejected one; drop duplicates per client."""
        accepted = []
        for message in replies:
            node_id = message.metadata.src_node_id
            if message.has_error():
                self._reject(server_round, phase, node_id, f"error reply: {message.error.reason}")
                continue
            try:
                accepted.append(validate(message.content))
            except ReplyRejected as error:
                self._reject(server_round, phase, node_id, str(error))
        kept, duplicates = first_reply_per_client(accepted)
        for duplicate in duplicates:
            self._reject(server_round, phase, -1, f"duplicate reply for client {duplicate.client_id}")
        return sorted(kept, key=lambda reply: reply.client_id)

    def _reject(self, server_round: int, phase: str, node_id: int, reason: str) -> None:
        logger.warning("round %d (%s): rejected reply from node %s: %s", server_round, phase, node_id, reason)
        self.rejected.append({"server_round": server_round, "phase": phase, "node_id": node_id, "reason": reason})

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
            Server-side evaluation of the packed models, as in Flower.

        Returns
        -------
        flwr.serverapp.strategy.Result
            ``arrays`` holds the ``K`` final models packed; see also
            :attr:`cluster_models`, :attr:`history` and :attr:`final_evaluation`.
        """
        if num_rounds < 1:
            raise ValueError(f"num_rounds = {num_rounds} is invalid; allowed: an integer ≥ 1")
        if isinstance(initial_arrays, ArrayRecord):
            packed = initial_arrays
            self.cluster_models = unpack_cluster_models(packed, self.num_clusters)
        else:
            if len(initial_arrays) != self.num_clusters:
                raise ValueError(f"initial_arrays holds {len(initial_arrays)} models; num_clusters = {self.num_clusters}")
            self.cluster_models = [arrays_of(record) for record in initial_arrays]
            packed = pack_cluster_models(self.cluster_models)
        self.round_timeout = timeout or self.round_timeout
        self._num_rounds = num_rounds
        self.summary()
        first_round = self._restore() + 1
        if first_round == 1:
            if self.routing.synchronized_entry:
                self._provisional_greedy(grid)
            self.routing_masses = self.provisional_masses
        result = Result()
        train_config = train_config or ConfigRecord()
        for server_round in range(first_round, num_rounds + 1):
            replies = grid.send_and_receive(
                self.configure_train(server_round, pack_cluster_models(self.cluster_models), train_config, grid),
                timeout=self.round_timeout,
            )
            arrays, metrics = self.aggregate_train(server_round, replies)
            if metrics is not None:
                result.train_metrics_clientapp[server_round] = metrics
            self._save(server_round)
            if evaluate_fn is not None and arrays is not None:
                evaluated = evaluate_fn(server_round, arrays)
                if evaluated is not None:
                    result.evaluate_metrics_serverapp[server_round] = evaluated
        packed = pack_cluster_models(self.cluster_models)
        evaluation = self.configure_evaluate(num_rounds, packed, evaluate_config or ConfigRecord(), grid)
        if evaluation:
            metrics = self.aggregate_evaluate(num_rounds, grid.send_and_receive(evaluation, timeout=self.round_timeout))
            if metrics is not None:
                result.evaluate_metrics_clientapp[num_rounds] = metrics
        result.arrays = packed
        return result

    # ------------------------------------------------------------ checkpoints
    def _identity(self) -> dict[str, Any]:
        """What a checkpoint must match to be resumed."""
        return {"class": type(self).__name__, "routing": self.routing.to_dict(), "seed": self.seed,
                "run_key": self.run_key, "template": {name: [list(value.shape), str(value.dtype)]
                                                       for name, value in self.cluster_models[0].items()}}

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
            "history": self.history,
            "client_routes": {str(t): {str(c): r for c, r in routes.items()} for t, routes in self.client_routes.items()},
            "rejected": self.rejected,
        }
        save_checkpoint(self.checkpoint_dir, self._checkpoint_arrays(), meta)

    def _restore(self) -> int:
        """Load the checkpoint if there is one; return the last completed round (0 if none)."""
        if self.checkpoint_dir is None or (stored := load_checkpoint(self.checkpoint_dir)) is None:
            return 0
        arrays, meta = stored
        if meta["identity"] != self._identity():
            raise ValueError(f"the checkpoint in {self.checkpoint_dir} was made with other settings "
                             f"({meta['identity']}); delete it or choose another checkpoint directory")
        self._restore_arrays(arrays)
        masses = meta["routing_masses"]
        self.routing_masses = None if masses is None else np.asarray(masses)
        provisional = meta["provisional_masses"]
        self.provisional_masses = None if provisional is None else np.asarray(provisional)
        self.history = list(meta["history"])
        self.client_routes = {int(t): {int(c): int(r) for c, r in routes.items()}
                              for t, routes in meta["client_routes"].items()}
        self.rejected = list(meta["rejected"])
        self.resumed_from_round = int(meta["server_round"])
        logger.warning("resuming from the checkpoint of round %d in %s", self.resumed_from_round, self.checkpoint_dir)
        return self.resumed_from_round

    def _provisional_greedy(self, grid: Grid) -> None:
        """Synchronized entry, steps 1–2: Greedy reports at ``W^0`` → provisional masses."""
        node_ids = self._sample_nodes(grid, 0)
        replies = grid.send_and_receive(
            self._messages(node_ids, MessageType.QUERY, {protocol.PHASE: protocol.PHASE_PROVISIONAL,
                                                       protocol.SERVER_ROUND: 0, protocol.ROUND_INDEX: 0}),
            timeout=self.round_timeout,
        )
        reports = self._valid(replies, lambda c: validate_provisional_reply(c, self.num_clusters), 0, "provisional")
        if not reports:
            raise RuntimeError("synchronized entry: no valid provisional report arrived")
        self.provisional_masses = routing_masses(
            np.array([r.cluster for r in reports]), np.array([r.num_examples for r in reports]), self.num_clusters)
        logger.info("synchronized entry: provisional masses %s", np.round(self.provisional_masses, 3).tolist())

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """Messages for round ``server_round`` (``t = server_round - 1``)."""
        self.cluster_models = unpack_cluster_models(arrays, self.num_clusters)
        self._round_started = time.monotonic()
        node_ids = self._sample_nodes(grid, server_round)
        round_config = {
            **dict(config.items()),
            protocol.PHASE: protocol.PHASE_TRAIN,
            protocol.SERVER_ROUND: server_round,
            protocol.ROUND_INDEX: server_round - 1,
            **self._masses_config(self.routing_masses),
        }
        return self._messages(node_ids, MessageType.TRAIN, round_config)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[Optional[ArrayRecord], Optional[MetricRecord]]:
        """Validate, hard-update per cluster, compute masses, record the round."""
        template = self.cluster_models[0]
        valid: list[TrainReply] = self._valid(replies, self._validate_train, server_round, "train")
        previous = [dict(model) for model in self.cluster_models]
        if valid:
            routes = np.array([reply.cluster for reply in valid], dtype=np.int64)
            weights = np.array([reply.num_examples for reply in valid])
            flat_models = np.stack([protocol.flatten_arrays(reply.model) for reply in valid])
            current = np.stack([protocol.flatten_arrays(model) for model in self.cluster_models])
            updated = hard_update(current, flat_models, routes, weights)
            self.cluster_models = [protocol.unflatten_arrays(vector, template) for vector in updated]
            self.routing_masses = routing_masses(routes, weights, self.num_clusters)
            self._after_hard_update(valid)
        else:
            logger.warning("round %d: no valid reply; cluster models and masses unchanged", server_round)
            routes, weights = np.zeros(0, dtype=np.int64), np.zeros(0)
        record = self._round_record(server_round, valid, routes, weights)
        for cluster, (before, after) in enumerate(zip(previous, self.cluster_models)):
            record[f"changed_{cluster}"] = any(not np.array_equal(before[name], after[name]) for name in before)
        self.history.append(record)
        self.client_routes[server_round - 1] = {reply.client_id: reply.cluster for reply in valid}
        played = [reply.metrics.get(protocol.ROUNDS_PLAYED, -1) for reply in valid]
        record["min_rounds_played"] = int(min(played, default=-1))
        record["max_rounds_played"] = int(max(played, default=-1))
        record["exp3_weight_spread"] = float(max(
            (np.ptp(reply.metrics.get(protocol.EXP3_LOG_WEIGHTS, [0.0])) for reply in valid), default=0.0))
        metrics = MetricRecord({
            "num-valid-replies": len(valid),
            "masses": [float(m) for m in (self.routing_masses if self.routing_masses is not None
                                          else np.zeros(self.num_clusters))],
            "routed-train-loss": float(record["routed_train_loss"]),
        })
        return pack_cluster_models(self.cluster_models), metrics

    def _round_record(self, server_round: int, valid: list[TrainReply], routes: NDArray[np.int64],
                      weights: NDArray[np.float64]) -> dict[str, Any]:
        """One row of the per-round history."""
        masses = self.routing_masses if self.routing_masses is not None else np.zeros(self.num_clusters)
        routed = [reply.metrics[protocol.LOSSES][reply.cluster] for reply in valid]
        record: dict[str, Any] = {
            "server_round": server_round,
            "round_index": server_round - 1,
            "num_replies": len(valid),
            "routed_train_loss": float(np.average(routed, weights=weights)) if valid else float("nan"),
            "mean_feedback": float(np.mean([r.metrics.get(protocol.FEEDBACK, np.nan) for r in valid]))
            if valid else float("nan"),
            "entered": int(sum(bool(r.metrics.get(protocol.ENTERED, 0)) for r in valid)),
            "released": int(sum(bool(r.metrics.get(protocol.RELEASED, 0)) for r in valid)),
            "rejected": sum(1 for r in self.rejected if r["server_round"] == server_round and r["phase"] == "train"),
            "seconds": time.monotonic() - getattr(self, "_round_started", time.monotonic()),
        }
        counts = np.bincount(routes, minlength=self.num_clusters)
        for cluster in range(self.num_clusters):
            record[f"mass_{cluster}"] = float(masses[cluster])
            record[f"routed_{cluster}"] = int(counts[cluster])
        return record

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        """After the last round only: ask every node for the losses of all ``K`` models."""
        if not self.evaluate_at_end or server_round != self._num_rounds:
            return []
        self.cluster_models = unpack_cluster_models(arrays, self.num_clusters)
        node_ids = sorted(grid.get_node_ids())
        return self._messages(node_ids, MessageType.EVALUATE, {
            **dict(config.items()), protocol.PHASE: protocol.PHASE_EVALUATE,
            protocol.SERVER_ROUND: server_round, protocol.ROUND_INDEX: server_round,
        })

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> Optional[MetricRecord]:
        """Keep the validated per-client losses; report how many models are usable."""
        replies = list(replies)
        if not replies:
            return None
        self.final_evaluation = self._valid(
            replies, lambda c: validate_evaluate_reply(c, self.num_clusters), server_round, "evaluate")
        if not self.final_evaluation:
            return None
        train_choice = np.array([np.argmin(r.train_losses) for r in self.final_evaluation])
        test_choice = np.array([np.argmin(r.test_losses) for r in self.final_evaluation])
        return MetricRecord({
            "usable-models-train": int(len(np.unique(train_choice))),
            "usable-models-test": int(len(np.unique(test_choice))),
            "num-clients": len(self.final_evaluation),
        })
