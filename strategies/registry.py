"""The Flower strategy of each server algorithm of :mod:`fedroute.core.methods`.

``STRATEGIES[method_spec(method).algorithm]`` is the strategy class a method runs with (the ServerApp
dispatches through it; a method's name is never compared here).
"""

from __future__ import annotations

from fedroute.core.methods import ALGORITHM_FEDCAM, ALGORITHM_LOCAL, ALGORITHM_ROUTING
from fedroute.strategies.clustered import ClusteredRouting
from fedroute.strategies.fedcam import FedCAM
from fedroute.strategies.local import LocalTraining

__all__ = ["STRATEGIES"]

STRATEGIES: dict[str, type[ClusteredRouting]] = {
    ALGORITHM_ROUTING: ClusteredRouting,
    ALGORITHM_FEDCAM: FedCAM,
    ALGORITHM_LOCAL: LocalTraining,
}
"""Algorithm (:data:`fedroute.core.methods.ALGORITHMS`) → its strategy class."""
