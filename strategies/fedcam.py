"""``FedCAM``: Clustered Additive Modeling as a Flower strategy (the FedCAM baseline).

The server holds a global part ``Θ_glob`` besides the ``K`` cluster parts.
Training messages carry both (``global-model`` record, ``algorithm = fedcam``);
a client replies with its trained cluster part (``model``) and global part
(``global-model``).  ``Θ_k`` is averaged over the clients assigned to ``k``
(the hard update), ``Θ_glob`` over all valid replies.  Evaluation messages carry
the combined predictors ``Θ_glob + Θ_k`` as the ``K`` cluster models, so the
controller-free evaluation is that of the combined predictor.  See
:mod:`fedroute.client.fedcam` for the client side.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any, Mapping, Optional, Sequence

import numpy as np
from flwr.app import ArrayRecord, MessageType
from numpy.typing import NDArray

from fedroute import protocol
from fedroute.strategies.clustered import ClusteredRouting
from fedroute.strategies.influence import aggregate_round
from fedroute.strategies.records import array_record
from fedroute.strategies.validation import TrainReply, validate_model_record

__all__ = ["FedCAM"]

logger = logging.getLogger("fedroute")


class FedCAM(ClusteredRouting):
    """FedCAM: a global part plus ``K`` cluster parts; clients assign by the combined loss.

    Parameters are those of :class:`ClusteredRouting` (``routing`` only sets
    ``K``: FedCAM's assignment is Greedy on the combined predictor).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("client_config", {})
        kwargs["client_config"] = {**kwargs["client_config"], protocol.ALGORITHM: protocol.ALGORITHM_FEDCAM}
        super().__init__(*args, **kwargs)
        self.global_model: Optional[dict[str, NDArray]] = None

    def start(self, grid: Any, initial_arrays: ArrayRecord | Sequence[ArrayRecord], *args: Any, **kwargs: Any):
        """As :meth:`ClusteredRouting.start`; ``Θ_glob`` starts at zero (zero output)."""
        if self.routing.synchronized_entry:
            raise ValueError("FedCAM has no synchronized entry; use routing with synchronized_entry=False")
        self.global_model = None
        return super().start(grid, initial_arrays, *args, **kwargs)

    def _global(self) -> dict[str, NDArray]:
        if self.global_model is None:
            self.global_model = {name: np.zeros_like(value) for name, value in self.cluster_models[0].items()}
        return self.global_model

    def _broadcast_models(self, message_type: str) -> list[dict[str, NDArray]]:
        if message_type != MessageType.EVALUATE:
            return self.cluster_models
        global_model = self._global()
        return [{name: value + global_model[name] for name, value in model.items()} for model in self.cluster_models]

    def _extra_records(self, message_type: str) -> dict[str, ArrayRecord]:
        if message_type != MessageType.TRAIN:
            return {}
        return {protocol.GLOBAL_MODEL: array_record(self._global())}

    def _validate_train(self, content: Mapping[str, Any]) -> TrainReply:
        template = self.cluster_models[0]
        reply = super()._validate_train(content)
        global_part = validate_model_record(content, protocol.GLOBAL_MODEL, template)
        return replace(reply, extras={protocol.GLOBAL_MODEL: global_part})

    def _after_hard_update(self, valid: list[TrainReply]) -> None:
        template = self.cluster_models[0]
        parts = np.stack([protocol.flatten_arrays(reply.extras[protocol.GLOBAL_MODEL]) for reply in valid])
        current = protocol.flatten_arrays(self._global())[None, :]
        weights = np.array([reply.num_examples for reply in valid])
        # The same influence bounds as the cluster parts; a non-finite average keeps Θ_glob.
        outcome = aggregate_round(current, parts, np.zeros(len(valid), dtype=np.int64), weights, self.influence)
        if outcome.non_finite_clusters[0]:
            logger.warning("the aggregate of %s is not finite; it keeps its value", protocol.GLOBAL_MODEL)
        self.global_model = protocol.unflatten_arrays(outcome.models[0], template)

    def _checkpoint_arrays(self) -> dict[str, NDArray]:
        arrays = super()._checkpoint_arrays()
        arrays.update({f"{protocol.GLOBAL_MODEL}/{name}": value for name, value in self._global().items()})
        return arrays

    def _restore_arrays(self, arrays: Mapping[str, NDArray]) -> None:
        super()._restore_arrays(arrays)
        self.global_model = {name: arrays[f"{protocol.GLOBAL_MODEL}/{name}"] for name in self.cluster_models[0]}

    def combined_models(self) -> list[dict[str, NDArray]]:
        """The combined predictors ``Θ_glob + Θ_k`` (what evaluation uses)."""
        return self._broadcast_models(MessageType.EVALUATE)
