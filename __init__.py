"""fedroute: clustered federated learning on Flower that recovers from cluster collapse.

Each client learns online, with EXP3, which routing controller to use (Greedy,
Rank Hedge, Reversal, Commitment, Selective hysteresis); a synchronized entry
round reveals underused cluster models.  The routing rules are pure, vectorised
functions (:mod:`fedroute.core`, which imports neither Flower nor torch) shared by
the Flower runtime (:mod:`fedroute.client`, :mod:`fedroute.strategies`) and the
batched simulator (:mod:`fedroute.simulation`).

The public API (``docs/plugin.md``) adds clustered routing to an existing
Flower app:

* server side: :class:`ClusteredRouting` (or the :class:`FedCAM` baseline) with
  :class:`RoutingSettings` from :func:`method_settings` (and collapse alarms
  tuned by :class:`AlarmSettings`), started with initial models from
  :func:`cluster_models_from_torch`; the final packed models back with
  :func:`unpack_cluster_models` or :func:`cluster_models_to_torch`;
* client side: :func:`routing_train`, :func:`routing_evaluate` and
  :func:`routing_query`, one call per handler of the user's ClientApp.

Importing :mod:`fedroute` is cheap: it imports neither Flower nor torch.  The
names above are resolved on first access (module ``__getattr__``).
"""

import importlib as _importlib
from typing import TYPE_CHECKING as _TYPE_CHECKING

__all__ = [
    "ClusteredRouting",
    "FedCAM",
    "RoutingSettings",
    "method_settings",
    "cluster_models_from_torch",
    "cluster_models_to_torch",
    "unpack_cluster_models",
    "AlarmSettings",
    "routing_train",
    "routing_evaluate",
    "routing_query",
    "__version__",
]
__version__ = "0.1.0"

_EXPORTS = {
    "ClusteredRouting": "fedroute.strategies.clustered",
    "FedCAM": "fedroute.strategies.fedcam",
    "RoutingSettings": "fedroute.core.settings",
    "method_settings": "fedroute.core.methods",
    "cluster_models_from_torch": "fedroute.client.torch_adapter",
    "cluster_models_to_torch": "fedroute.client.torch_adapter",
    "unpack_cluster_models": "fedroute.strategies.records",
    "AlarmSettings": "fedroute.monitoring.alarms",
    "routing_train": "fedroute.client.plugin",
    "routing_evaluate": "fedroute.client.plugin",
    "routing_query": "fedroute.client.plugin",
}

if _TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs only
    from fedroute.client.plugin import routing_evaluate, routing_query, routing_train
    from fedroute.core.settings import RoutingSettings
    from fedroute.client.torch_adapter import cluster_models_from_torch, cluster_models_to_torch
    from fedroute.monitoring.alarms import AlarmSettings
    from fedroute.strategies.records import unpack_cluster_models
    from fedroute.strategies.clustered import ClusteredRouting
    from fedroute.strategies.fedcam import FedCAM
    from fedroute.core.methods import method_settings


def __getattr__(name: str) -> object:
    """Import a public name's module on first access (keeps ``import fedroute`` cheap)."""
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'fedroute' has no attribute {name!r}")
    value = getattr(_importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(__all__) | {name for name in globals() if name.startswith("__")})
