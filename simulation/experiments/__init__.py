"""Paper experiments, declared with the kit (:mod:`.kit`); importing this package registers them."""

from fedroute.simulation.experiments.kit import EXPERIMENTS, PAPER
from fedroute.simulation.experiments import fig1, linear, gmm, housing, characters, scenarios, ifca  # noqa: F401,E402  (register)

__all__ = ["EXPERIMENTS", "PAPER"]
