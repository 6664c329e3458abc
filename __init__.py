"""fedroute: clustered federated learning on Flower that recovers from cluster collapse.

Each client learns online, with EXP3, which routing controller to use (Greedy,
Rank Hedge, Reversal, Commitment, Selective hysteresis); a synchronized entry
round reveals underused cluster models.  The routing rules are pure, vectorised
functions (:mod:`fedroute.client`, :mod:`fedroute.strategies`) shared by the
Flower runtime and the batched simulator (:mod:`fedroute.simulation`).

Importing :mod:`fedroute` is cheap: it imports neither Flower nor torch.
"""

from fedroute.client.settings import RoutingSettings

__all__ = ["RoutingSettings", "__version__"]
__version__ = "0.1.0"
