"""What differs between the server algorithms: the models sent, the server step, what is checkpointed.

An :class:`Algorithm` is a small object the strategy (:class:`~fedroute.strategies.adapter.RoutingAdapter`)
calls at fixed points; it reads and writes the run's :class:`~fedroute.strategies.state.RunState` only.
:class:`HardRouting` is the paper's algorithm (``K`` models, the hard update, the routing masses);
:class:`~fedroute.strategies.fedcam.FedCAMAlgorithm` adds a global part and
:class:`~fedroute.strategies.local.LocalAlgorithm` keeps one model per client.  The shared pieces are the
free functions below, which each algorithm composes.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from typing import Any, Mapping, Optional, Protocol, Sequence

import numpy as np
from flwr.app import ArrayRecord
from numpy.typing import NDArray

from fedroute import protocol
from fedroute.core.aggregation import routing_masses
from fedroute.core.influence import InfluenceBounds, RoundAggregate, capped_weights
from fedroute.core.participation import Participation
from fedroute.core.server_step import RoundReplies, server_step
from fedroute.core.settings import RoutingSettings
from fedroute.core.signature_start import Signatures, parting_report, regroup_report
from fedroute.core.signature_twins import twin_report
from fedroute.strategies.reply_fields import signature_metrics
from fedroute.strategies.state import Models, RunState
from fedroute.strategies.validation import ProvisionalReply, TrainReply, validate_train_reply

logger = logging.getLogger("fedroute")

__all__ = ["Algorithm", "HardRouting", "StepRules", "cluster_records", "routing_step", "cluster_arrays",
           "restore_cluster_arrays", "provisional_masses"]


@dataclass(frozen=True)
class StepRules:
    """The fixed rules of the server step: routing, participation, influence bounds."""

    routing: RoutingSettings
    participation: Participation
    influence: InfluenceBounds


class Algorithm(Protocol):
    """The server algorithm of a strategy (see the module docstring)."""

    config: Mapping[str, Any]
    """Entries every message's ConfigRecord carries besides the routing (e.g. ``algorithm = fedcam``)."""

    def begin(self, state: RunState, routing: RoutingSettings) -> None:
        """A run starts (before the initial models are read): refuse unfit settings, reset own parts."""

    def records(self, state: RunState, message_type: str) -> dict[str, ArrayRecord]:
        """The ArrayRecords every message of this type carries (``cluster-<k>`` and any extra)."""

    def node_records(self, state: RunState, node_id: int, records: dict[str, ArrayRecord]) -> dict[str, ArrayRecord]:
        """The records of the message to ``node_id`` (``records`` unless the algorithm sends per-node models)."""

    def validate_train(self, state: RunState, content: Mapping[str, Any], routing: RoutingSettings) -> TrainReply:
        """One training reply, checked (:mod:`fedroute.strategies.validation`)."""

    def server_step(self, state: RunState, round_index: int, valid: Sequence[TrainReply],
                    rules: StepRules) -> RoundAggregate:
        """The round's server step on its valid replies (client-id order); updates ``state``."""

    def checkpoint_arrays(self, state: RunState) -> dict[str, NDArray]:
        """The arrays a checkpoint stores."""

    def restore_arrays(self, state: RunState, arrays: Mapping[str, NDArray]) -> None:
        """Inverse of :meth:`checkpoint_arrays`."""

    def reported_models(self, state: RunState, output_sum: bool) -> Models:
        """The final models a run reports (``output_sum``: the task combines a global part by output sum)."""

    def extra_models(self, state: RunState, output_sum: bool) -> dict[str, dict[str, NDArray]]:
        """Further models the results directory stores, by name (none, a global part, per-client models)."""


def cluster_records(state: RunState) -> dict[str, ArrayRecord]:
    """``cluster-<k>`` → the shared ArrayRecord of cluster model ``k``."""
    return {protocol.cluster_key(k): record for k, record in enumerate(state.model_records())}


def routing_step(state: RunState, round_index: int, valid: Sequence[TrainReply], rules: StepRules) -> RoundAggregate:
    """The server step (:func:`~fedroute.core.server_step.server_step`) on the round's valid replies:
    the models (hard update), ``μ̂``, ``p̂``, the health view, written into ``state``."""
    template, num_clusters = state.cluster_models[0], state.num_clusters
    federation, rows = state.server.federation.positions(np.array([r.client_id for r in valid], dtype=np.int64))
    replies = RoundReplies(
        rows=rows, routes=np.array([r.cluster for r in valid], dtype=np.int64),
        preferred=np.array([r.preferred for r in valid], dtype=np.int64),
        num_examples=np.array([r.num_examples for r in valid], dtype=np.float64),
        losses=np.array([r.metrics[protocol.LOSSES] for r in valid], dtype=np.float64).reshape(
            len(valid), num_clusters),
        trained_models=protocol.stack_flat([r.model for r in valid], protocol.flat_dtype(template))
        if valid else np.zeros((0, protocol.stack_flat(state.cluster_models[:1]).shape[1])),
        signatures=reply_signatures(valid))
    if rules.routing.restart_idle_spares and state.start_models is None:   # driven without start(): its first models
        state.start_models = protocol.stack_flat(state.cluster_models)
    before = state.server.signatures
    outcome, state.server = server_step(protocol.stack_flat(state.cluster_models),
                                        replace(state.server, federation=federation), replies, round_index,
                                        rules.routing, rules.participation, rules.influence,
                                        start_models=state.start_models)
    for report in (parting_report(before, state.server.signatures, rules.routing, rules.participation, round_index),
                   regroup_report(before, state.server.signatures, rules.routing, rules.participation, round_index),
                   twin_report(before, state.server.signatures, rules.routing.collapse_patience,
                               state.server.federation)):
        if report:
            logger.info(report)
    if outcome.restarted is not None:
        for cluster in np.flatnonzero(outcome.restarted):
            logger.info(f"spare restarted: after round {round_index} every client that trained cluster {int(cluster)} "
                        "has moved to another cluster; it is spare and returns to its start model "
                        "(restart-idle-spares), a clean start for a group that needs a cluster")
    if valid:
        state.cluster_models = [protocol.unflatten_arrays(vector, template) for vector in outcome.models]
    if state.server.estimate.reporting[0] > 0:
        state.routing_masses = state.server.estimate.masses[0]
        state.preferred_masses = state.server.estimate.preferred_masses[0]
    return outcome


def reply_signatures(valid: Sequence[TrainReply]) -> Optional[Signatures]:
    """The signatures the round's valid replies carried (the signature start), or None.

    Before any signature is recorded the number of classes ``C`` is not known: the round's most common one is
    kept (ties to the smaller ``C``) and the others are left out (those clients are asked again and then checked
    against it), so one node cannot impose its ``C`` on the others by replying first.
    """
    signed = [(position, reply.signature) for position, reply in enumerate(valid) if reply.signature is not None]
    if not signed:
        return None
    shapes = [means.shape for _, (means, _) in signed]
    common = max(sorted(set(shapes)), key=shapes.count)
    kept = [(position, signature) for position, signature in signed if signature[0].shape == common]
    return Signatures(index=np.array([position for position, _ in kept], dtype=np.int64),
                      means=np.stack([means for _, (means, _) in kept]),
                      counts=np.stack([counts for _, (_, counts) in kept]))


def provisional_masses(reports: Sequence[ProvisionalReply], num_clusters: int,
                       influence: InfluenceBounds) -> NDArray[np.float64]:
    """Synchronized entry, step 2: the masses of the Greedy reports at ``W^0`` (capped sample weights)."""
    weights = capped_weights(np.array([r.num_examples for r in reports]), influence.max_weight_ratio)
    return routing_masses(np.array([r.cluster for r in reports]), weights, num_clusters)


def cluster_arrays(state: RunState) -> dict[str, NDArray]:
    """The cluster models as checkpoint arrays ``cluster-<k>/<name>``."""
    return {f"{protocol.cluster_key(k)}/{name}": value
            for k, model in enumerate(state.cluster_models) for name, value in model.items()}


def restore_cluster_arrays(state: RunState, arrays: Mapping[str, NDArray]) -> None:
    """Inverse of :func:`cluster_arrays` (the names of the current models)."""
    state.cluster_models = [{name: arrays[f"{protocol.cluster_key(k)}/{name}"] for name in state.cluster_models[k]}
                            for k in range(state.num_clusters)]


class HardRouting:
    """The paper's algorithm: every message carries the ``K`` models; each cluster averages its clients."""

    config: Mapping[str, Any] = {}

    def begin(self, state: RunState, routing: RoutingSettings) -> None:
        """Nothing to reset."""

    def records(self, state: RunState, message_type: str) -> dict[str, ArrayRecord]:
        """The ``K`` cluster models."""
        return cluster_records(state)

    def node_records(self, state: RunState, node_id: int, records: dict[str, ArrayRecord]) -> dict[str, ArrayRecord]:
        """The same records for every node."""
        return records

    def validate_train(self, state: RunState, content: Mapping[str, Any], routing: RoutingSettings) -> TrainReply:
        """A trained model of the cluster models' shape, and the routing metrics (with the signature start, the
        optional signature: ``C`` classes as the recorded ones, ``signature_dim`` numbers each)."""
        reply = validate_train_reply(content, state.num_clusters, state.cluster_models[0], routing.num_arms)
        if routing.signature_hold_rounds <= 0:
            return reply
        recorded = state.server.signatures
        num_classes = None if recorded is None or recorded.shape == (0, 0) else recorded.shape[0]
        return replace(reply, signature=signature_metrics(reply.metrics, routing.signature_dim, num_classes))

    def server_step(self, state: RunState, round_index: int, valid: Sequence[TrainReply],
                    rules: StepRules) -> RoundAggregate:
        """:func:`routing_step`."""
        return routing_step(state, round_index, valid, rules)

    def checkpoint_arrays(self, state: RunState) -> dict[str, NDArray]:
        """:func:`cluster_arrays`."""
        return cluster_arrays(state)

    def restore_arrays(self, state: RunState, arrays: Mapping[str, NDArray]) -> None:
        """:func:`restore_cluster_arrays`."""
        restore_cluster_arrays(state, arrays)

    def reported_models(self, state: RunState, output_sum: bool) -> Models:
        """The cluster models."""
        return state.cluster_models

    def extra_models(self, state: RunState, output_sum: bool) -> dict[str, dict[str, NDArray]]:
        """None."""
        return {}
