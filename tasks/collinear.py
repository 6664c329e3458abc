"""Linear regression with three collinear groups (a scenario of ``fedroute reproduce scenarios``).

The two-group task of :mod:`fedroute.tasks.linear` with a third group in the
middle: ``θ_g = (g − 1) · Δ · e_0`` for ``g = 0, 1, 2`` (``−Δ e_0``, ``0``,
``+Δ e_0``), client ``i`` in group ``i mod 3``.  The pooled parameter ``θ̄ = 0`` is
the middle group's own optimum, so a pooled start already serves one group
perfectly and the two outer groups pull it in opposite directions: the middle
group never has a reason to leave a collapsed model, and the outer groups must
find the unused ones.  Everything else — data (``x ~ N(0, I_d)``, ``y = xᵀθ_g +
ε``), squared loss, full-batch gradient steps, the ``spread`` and ``collapsed``
starts — is :class:`~fedroute.tasks.linear.LinearTask`'s (``collapsed``:
``w_0^0 = θ̄``, the others at distance ``ρ`` orthogonal to the groups' line).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from fedroute.tasks.linear import LinearTask

__all__ = ["CollinearTask"]


@dataclass(frozen=True)
class CollinearTask(LinearTask):
    """Three collinear linear-regression groups (see the module docstring); the fields are LinearTask's."""

    num_clients: int = 30
    name: str = "collinear"

    @property
    def num_groups(self) -> int:
        """``G = 3``."""
        return 3

    @property
    def group_parameters(self) -> NDArray[np.float64]:
        """``θ_g = (g − 1) Δ e_0``, shape (3, d)."""
        theta = np.zeros((3, self.dimension))
        theta[:, 0] = (np.arange(3) - 1.0) * self.group_distance
        return theta

    @property
    def group_proportions(self) -> NDArray[np.float64]:
        """Share of clients in each group."""
        return np.bincount(self.groups(np.arange(self.num_clients)), minlength=3) / self.num_clients

    def groups(self, client_ids: NDArray[np.int64]) -> NDArray[np.int64]:
        """Latent group of each client (evaluation only)."""
        return np.asarray(client_ids, dtype=np.int64) % 3
