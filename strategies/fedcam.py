"""``FedCAM``: Clustered Additive Modeling as a Flower strategy (the FedCAM baseline).

The server holds a global part ``Θ_glob`` besides the ``K`` cluster parts.
Training and evaluation messages carry both (the ``K`` cluster parts, the
``global-model`` record, ``algorithm = fedcam``); a client replies to training
with its trained cluster part (``model``) and global part (``global-model``),
and to evaluation with the losses of its combined predictors
``h(x; Θ_glob) + f(x; Θ_k)``.  ``Θ_k`` is averaged over the clients assigned to
``k`` (the hard update), ``Θ_glob`` over all valid replies.  The client decides
the form (output sum of two networks, or the additive parameter sum for models
linear in their parameters): :mod:`fedroute.core.fedcam`.

:class:`FedCAMAlgorithm` is the server algorithm (an :class:`~fedroute.strategies.algorithms.Algorithm`:
the records sent, the reply check, the server step, the checkpoint); :class:`FedCAM` is
:class:`~fedroute.strategies.clustered.ClusteredRouting` constructed with it.  ``Θ_glob`` lives in the
run's state (``state.global_model``).
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any, Mapping, Optional, Sequence

import numpy as np
from flwr.app import ArrayRecord, MessageType
from numpy.typing import NDArray

from fedroute import protocol
from fedroute.core.fedcam import fedcam_global_update
from fedroute.core.influence import InfluenceBounds, RoundAggregate
from fedroute.core.settings import RoutingSettings
from fedroute.strategies.algorithms import (StepRules, cluster_arrays, cluster_records, restore_cluster_arrays,
                                            routing_step)
from fedroute.strategies.clustered import ClusteredRouting
from fedroute.strategies.records import array_record
from fedroute.strategies.state import Models, RunState, StateField
from fedroute.strategies.validation import TrainReply, validate_model_record, validate_train_reply

__all__ = ["FedCAM", "FedCAMAlgorithm", "global_update", "combined_models"]

logger = logging.getLogger("fedroute")


def global_update(global_model: Mapping[str, NDArray], valid: Sequence[TrainReply],
                  influence: InfluenceBounds) -> dict[str, NDArray]:
    """``Θ_glob`` averaged over the kept replies' global parts, within the same influence bounds as the cluster
    parts; a non-finite average keeps ``Θ_glob``."""
    template = dict(global_model)
    parts = protocol.stack_flat([reply.extras[protocol.GLOBAL_MODEL] for reply in valid], protocol.flat_dtype(template))
    weights = np.array([reply.num_examples for reply in valid])
    updated, non_finite = fedcam_global_update(protocol.flatten_arrays(template), parts, np.ones(len(valid), dtype=bool),
                                               weights, influence)
    if non_finite:
        logger.warning("the aggregate of %s is not finite; it keeps its value", protocol.GLOBAL_MODEL)
    return protocol.unflatten_arrays(updated, template)


def combined_models(global_model: Mapping[str, NDArray], cluster_models: Models) -> Models:
    """``Θ_glob + Θ_k`` per cluster (the additive form's combined predictors)."""
    return [{name: value + global_model[name] for name, value in model.items()} for model in cluster_models]


class FedCAMAlgorithm:
    """FedCAM's server algorithm: messages carry ``Θ_glob``; replies bring a global part, averaged over all.

    Parameters
    ----------
    initial_global : dict of arrays, optional
        ``Θ_glob^0`` (zeros, the additive form's start, when ``None``).
    """

    config: Mapping[str, Any] = {protocol.ALGORITHM: protocol.ALGORITHM_FEDCAM}

    def __init__(self, initial_global: Optional[Mapping[str, NDArray]] = None) -> None:
        self.initial_global = initial_global

    def begin(self, state: RunState, routing: RoutingSettings) -> None:
        """FedCAM has no synchronized entry; ``Θ_glob`` starts again (at zero output)."""
        if routing.synchronized_entry:
            raise ValueError("FedCAM has no synchronized entry; use routing with synchronized_entry=False")
        state.global_model = None

    def global_part(self, state: RunState) -> dict[str, NDArray]:
        """``Θ_glob``, made from ``initial_global`` (checked against the cluster models) on first use."""
        if state.global_model is None:
            template = state.cluster_models[0]
            if self.initial_global is None:
                state.global_model = {name: np.zeros_like(value) for name, value in template.items()}
            else:
                start = {name: np.asarray(value) for name, value in self.initial_global.items()}
                if [(n, v.shape, v.dtype) for n, v in start.items()] != [(n, v.shape, v.dtype)
                                                                          for n, v in template.items()]:
                    raise ValueError("FedCAM initial_global_arrays must have the cluster models' names, shapes and "
                                     f"dtypes {[(n, v.shape, str(v.dtype)) for n, v in template.items()]}")
                state.global_model = {name: value.copy() for name, value in start.items()}
        return state.global_model

    def records(self, state: RunState, message_type: str) -> dict[str, ArrayRecord]:
        """The ``K`` cluster parts, and ``Θ_glob`` in training and evaluation messages."""
        records = cluster_records(state)
        if message_type in (MessageType.TRAIN, MessageType.EVALUATE):
            records[protocol.GLOBAL_MODEL] = array_record(self.global_part(state))
        return records

    def node_records(self, state: RunState, node_id: int, records: dict[str, ArrayRecord]) -> dict[str, ArrayRecord]:
        """The same records for every node."""
        return records

    def validate_train(self, state: RunState, content: Mapping[str, Any], routing: RoutingSettings) -> TrainReply:
        """A trained cluster part and a trained global part, both of the cluster models' shape."""
        template = state.cluster_models[0]
        reply = validate_train_reply(content, state.num_clusters, template, routing.num_arms)
        global_part = validate_model_record(content, protocol.GLOBAL_MODEL, template)
        return replace(reply, extras={protocol.GLOBAL_MODEL: global_part})

    def server_step(self, state: RunState, round_index: int, valid: Sequence[TrainReply],
                    rules: StepRules) -> RoundAggregate:
        """The hard update of the cluster parts, then ``Θ_glob`` over the kept replies (:func:`global_update`)."""
        outcome = routing_step(state, round_index, valid, rules)
        if kept := [reply for reply, keep in zip(valid, outcome.kept) if keep]:
            state.global_model = global_update(self.global_part(state), kept, rules.influence)
        return outcome

    def checkpoint_arrays(self, state: RunState) -> dict[str, NDArray]:
        """The cluster parts and ``Θ_glob`` (``global-model/<name>``)."""
        return {**cluster_arrays(state),
                **{f"{protocol.GLOBAL_MODEL}/{name}": value for name, value in self.global_part(state).items()}}

    def restore_arrays(self, state: RunState, arrays: Mapping[str, NDArray]) -> None:
        """Inverse of :meth:`checkpoint_arrays`."""
        restore_cluster_arrays(state, arrays)
        state.global_model = {name: arrays[f"{protocol.GLOBAL_MODEL}/{name}"] for name in state.cluster_models[0]}

    def reported_models(self, state: RunState, output_sum: bool) -> Models:
        """The cluster parts (output-sum form, stored beside ``Θ_glob``), else the combined predictors."""
        return state.cluster_models if output_sum else combined_models(self.global_part(state), state.cluster_models)

    def extra_models(self, state: RunState, output_sum: bool) -> dict[str, dict[str, NDArray]]:
        """``Θ_glob`` in the output-sum form (the additive form reports it inside the combined models)."""
        return {protocol.GLOBAL_MODEL: self.global_part(state)} if output_sum else {}


class FedCAM(ClusteredRouting):
    """FedCAM: a global part plus ``K`` cluster parts; clients assign by the combined loss.

    Parameters are those of :class:`ClusteredRouting` (``routing`` only sets
    ``K``: FedCAM's assignment is Greedy on the combined predictor), plus:

    initial_global_arrays : ArrayRecord or dict of arrays, optional
        ``Θ_glob^0``, with the cluster models' names, shapes and dtypes.  It must
        have zero output (e.g. a network whose last layer is zero: the output-sum
        form).  Default: zeros (the additive form's start, ``Θ_glob + Θ_k = Θ_k``).
    """

    algorithm: FedCAMAlgorithm
    global_model = StateField[Optional[dict]]("global_model", "``Θ_glob`` (``None`` before the run uses it).")

    def __init__(self, *args: Any, initial_global_arrays: Optional[Mapping[str, Any]] = None,
                 **kwargs: Any) -> None:
        initial = None if initial_global_arrays is None else {
            name: np.array(value.numpy() if hasattr(value, "numpy") else value, copy=True)
            for name, value in initial_global_arrays.items()}
        super().__init__(*args, **kwargs, algorithm=FedCAMAlgorithm(initial))

    @property
    def initial_global(self) -> Optional[Mapping[str, NDArray]]:
        """``Θ_glob^0`` as given (``None``: zeros)."""
        return self.algorithm.initial_global

    def combined_models(self) -> Models:
        """``Θ_glob + Θ_k`` per cluster: the combined predictors' parameters in the additive form
        (models linear in their parameters); in the output-sum form the predictor is the pair."""
        return combined_models(self.algorithm.global_part(self.state), self.state.cluster_models)
