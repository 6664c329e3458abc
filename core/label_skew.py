"""Whether the clients' label mixes differ: a chi-square test of homogeneity on their class counts.

Under label skew, every loss-based signal follows a client's label mix more than its group (``docs/algorithm.md``,
"The signature start"), so from *any* start the routing has little to part the groups on, and the signature start
is the evidence that does.  Without label skew, a client's losses on models that differ do carry its group.  The
server tells the two apart from what the clients measured and sent with their signatures — their class counts — by
the textbook test of homogeneity of a clients × classes table (Pearson's chi-square), and by its effect size
(Cohen's ``w``), corrected for the chi-square the sampling alone gives (small clients' counts vary by chance):

.. math::

    X^2 = \\sum_{i,c} \\frac{(n_{ic} - E_{ic})^2}{E_{ic}},\\quad E_{ic} = \\frac{n_{i\\cdot}\\, n_{\\cdot c}}{n},
    \\qquad w = \\sqrt{\\max(0,\\ X^2 - \\nu) / n},\\quad \\nu = (m - 1)(C - 1).

The label mixes differ when ``X^2`` is significant at :data:`SKEW_SIGNIFICANCE` *and* ``w`` reaches
:data:`SKEW_EFFECT`, Cohen's "medium" effect: a Dirichlet(α) label mix over ``C`` classes has ``w² ≈ (C − 1) /
(Cα + 1)`` — ``w ≈ 1.2`` for Dirichlet(0.5) over 10 classes, ``0.3`` for Dirichlet(10) — while clients drawn from
one label distribution give ``w ≈ 0``.  The significance guards few clients with few samples; the effect size guards
large clients, whose slightest difference is significant.  Pure numpy; no scipy.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

__all__ = ["SKEW_EFFECT", "SKEW_SIGNIFICANCE", "LabelSkew", "label_skew"]

SKEW_EFFECT = 0.3
"""Cohen's ``w`` from which the label mixes count as different: his "medium" effect (0.1 small, 0.5 large)."""

SKEW_SIGNIFICANCE = 0.01
"""Level of the chi-square test of homogeneity."""


@dataclass(frozen=True)
class LabelSkew:
    """The test of homogeneity of a clients × classes count table.

    Attributes
    ----------
    effect : float
        Cohen's ``w`` corrected for sampling (module docstring); 0 without skew.
    p_value : float
        Of Pearson's ``X^2`` with ``(m − 1)(C − 1)`` degrees of freedom (Wilson–Hilferty's normal approximation);
        1 when the table has fewer than two clients or classes.
    """

    effect: float
    p_value: float

    @property
    def skewed(self) -> bool:
        """Whether the label mixes differ: significant at :data:`SKEW_SIGNIFICANCE`, ``w ≥`` :data:`SKEW_EFFECT`."""
        return self.p_value < SKEW_SIGNIFICANCE and self.effect >= SKEW_EFFECT


def label_skew(counts: NDArray[np.floating]) -> LabelSkew:
    """The test of homogeneity of the clients' class counts (module docstring).

    Parameters
    ----------
    counts : ndarray, shape (m, C)
        Samples of each class per client (≥ 0).  Clients without samples and classes nobody holds are left out.

    Returns
    -------
    LabelSkew
    """
    table = np.asarray(counts, dtype=np.float64)
    if table.ndim != 2 or not np.all(np.isfinite(table)) or np.any(table < 0):
        raise ValueError(f"class counts must be a finite (clients, classes) table of counts ≥ 0, got shape "
                         f"{table.shape}")
    table = table[table.sum(axis=1) > 0][:, table.sum(axis=0) > 0]
    if min(table.shape, default=0) < 2:
        return LabelSkew(effect=0.0, p_value=1.0)
    total = table.sum()
    expected = np.outer(table.sum(axis=1), table.sum(axis=0)) / total
    statistic = float(np.sum((table - expected) ** 2 / expected))
    dof = (table.shape[0] - 1) * (table.shape[1] - 1)
    return LabelSkew(effect=math.sqrt(max(0.0, statistic - dof) / total), p_value=_chi2_survival(statistic, dof))


def _chi2_survival(statistic: float, dof: int) -> float:
    """``P(X > statistic)`` for ``X ~ χ²(dof)``: Wilson–Hilferty's cube-root normal approximation (within a few
    thousandths of the exact tail from ``dof ≈ 3``, which is enough for a test at 1 %)."""
    spread = 2.0 / (9.0 * dof)
    z = ((statistic / dof) ** (1.0 / 3.0) - (1.0 - spread)) / math.sqrt(spread)
    return 0.5 * math.erfc(z / math.sqrt(2.0))
