"""Paper experiments; importing this package registers their ``fedroute reproduce`` commands."""

from fedroute.simulation.experiments import fig1  # noqa: F401  (E1, registers ``reproduce fig1``)
from fedroute.simulation.experiments import linear  # noqa: F401  (E2/E3, registers ``reproduce linear``)
from fedroute.simulation.experiments import gmm  # noqa: F401  (E5, registers ``reproduce gmm``)
from fedroute.simulation.experiments import housing  # noqa: F401  (E6, registers ``reproduce housing``)
from fedroute.simulation.experiments import characters  # noqa: F401  (E4, registers ``reproduce characters``)
from fedroute.simulation.experiments import scenarios  # noqa: F401  (issue 10, registers ``reproduce scenarios``)
