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
from fedroute.core.influence import aggregate_round
from fedroute.strategies.records import array_record
from fedroute.strategies.validation import TrainReply, validate_model_record

__all__ = ["FedCAM"]

logger = logging.getLogger("fedroute")


class FedCAM(ClusteredRouting):
    """FedCAM: a global part plus ``K`` cluster parts; clients assign by the combined loss.

    Parameters are those of :class:`ClusteredRouting` (``routing`` only sets
    ``K``: FedCAM's assignment is Greedy on the combined predictor), plus:

    initial_global_arrays : ArrayRecord or dict of arrays, optional
        ``Θ_glob^0``, with the cluster models' names, shapes and dtypes.  It must
        have zero output (e.g. a network whose last layer is zero: the output-sum
        form).  Default: zeros (the additive form's start, ``Θ_glob + Θ_k = Θ_k``).
    """

    def __init__(self, *args: Any, initial_global_arrays: Optional[Mapping[str, Any]] = None,
                 **kwargs: Any) -> None:
        kwargs.setdefault("client_config", {})
        kwargs["client_config"] = {**kwargs["client_config"], protocol.ALGORITHM: protocol.ALGORITHM_FEDCAM}
        super().__init__(*args, **kwargs)
        self.initial_global = None if initial_global_arrays is None else {
            name: np.array(value.numpy() if hasattr(value, "numpy") else value, copy=True)
            for name, value in initial_global_arrays.items()}
        self.global_model: Optional[dict[str, NDArray]] = None

    def start(self, grid: Any, initial_arrays: ArrayRecord | Sequence[ArrayRecord], *args: Any, **kwargs: Any):
        """As :meth:`ClusteredRouting.start`; ``Θ_glob`` starts at zero (zero output)."""
        if self.routing.synchronized_entry:
            raise ValueError("FedCAM has no synchronized entry; use routing with synchronized_entry=False")
        self.global_model = None
        return super().start(grid, initial_arrays, *args, **kwargs)

    def _global(self) -> dict[str, NDArray]:
        if self.global_model is None:
            template = self.cluster_models[0]
            if self.initial_global is None:
                self.global_model = {name: np.zeros_like(value) for name, value in template.items()}
            else:
                start = {name: np.asarray(value) for name, value in self.initial_global.items()}
                if [(n, v.shape, v.dtype) for n, v in start.items()] != [(n, v.shape, v.dtype)
                                                                          for n, v in template.items()]:
                    raise ValueError("FedCAM initial_global_arrays must have the cluster models' names, shapes and "
                                     f"dtypes {[(n, v.shape, str(v.dtype)) for n, v in template.items()]}")
                self.global_model = {name: value.copy() for name, value in start.items()}
        return self.global_model

    def _extra_records(self, message_type: str) -> dict[str, ArrayRecord]:
        if message_type not in (MessageType.TRAIN, MessageType.EVALUATE):
            return {}
        return {protocol.GLOBAL_MODEL: array_record(self._global())}

    def _validate_train(self, content: Mapping[str, Any]) -> TrainReply:
        template = self.cluster_models[0]
        reply = super()._validate_train(content)
        global_part = validate_model_record(content, protocol.GLOBAL_MODEL, template)
        return replace(reply, extras={protocol.GLOBAL_MODEL: global_part})

    def _after_hard_update(self, valid: list[TrainReply]) -> None:
        template = self.cluster_models[0]
        parts = protocol.stack_flat([reply.extras[protocol.GLOBAL_MODEL] for reply in valid], protocol.flat_dtype(template))
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
        """``Θ_glob + Θ_k`` per cluster: the combined predictors' parameters in the additive form
        (models linear in their parameters); in the output-sum form the predictor is the pair."""
        global_model = self._global()
        return [{name: value + global_model[name] for name, value in model.items()} for model in self.cluster_models]
