"""The test of homogeneity that tells the signature start whether the clients' label mixes differ."""

from __future__ import annotations

import numpy as np
import pytest

from fedroute.core.label_skew import SKEW_EFFECT, SKEW_SIGNIFICANCE, label_skew


def _counts(rng: np.random.Generator, mixes: np.ndarray, samples: np.ndarray) -> np.ndarray:
    return np.stack([rng.multinomial(n, mix) for n, mix in zip(samples, mixes)]).astype(float)


def test_clients_drawn_from_one_label_distribution_are_not_skewed_even_small_ones() -> None:
    rng = np.random.default_rng(0)
    uniform = np.full(10, 0.1)
    skewed = []
    for _ in range(200):                                 # 24 clients of 5 to 75 samples: small expected counts
        table = _counts(rng, np.tile(uniform, (24, 1)), rng.integers(5, 76, size=24))
        skewed.append(label_skew(table).skewed)
    assert sum(skewed) == 0


def test_dirichlet_label_mixes_are_skewed_and_their_effect_is_near_its_expectation() -> None:
    rng = np.random.default_rng(1)
    for alpha, classes in ((0.5, 10), (0.5, 2), (1.0, 10)):
        effects = []
        for _ in range(20):
            table = _counts(rng, rng.dirichlet(np.full(classes, alpha), size=24), np.full(24, 30))
            result = label_skew(table)
            assert result.skewed and result.p_value < SKEW_SIGNIFICANCE, (alpha, classes)
            effects.append(result.effect)
        expected = np.sqrt((classes - 1) / (classes * alpha + 1))          # E[w²] of a Dirichlet label mix
        assert abs(np.mean(effects) - expected) < 0.2 * expected, (alpha, classes, np.mean(effects), expected)


def test_a_slight_difference_among_large_clients_is_significant_but_not_skew() -> None:
    rng = np.random.default_rng(2)
    mixes = rng.dirichlet(np.full(10, 200.0), size=24)                  # w ≈ 0.07: a slight difference
    result = label_skew(_counts(rng, mixes, np.full(24, 20_000)))
    assert result.p_value < 1e-6 and result.effect < SKEW_EFFECT and not result.skewed


def test_two_clients_holding_disjoint_classes_have_effect_one() -> None:
    result = label_skew(np.array([[500.0, 0.0], [0.0, 500.0]]))
    assert result.effect == pytest.approx(np.sqrt(999 / 1000)) and result.p_value < 1e-12


@pytest.mark.parametrize("quantile, dof", [(23.209, 10), (135.807, 100), (1106.97, 1000)])
def test_the_p_value_matches_the_chi_square_tail(quantile: float, dof: int) -> None:
    from fedroute.core.label_skew import _chi2_survival
    assert _chi2_survival(quantile, dof) == pytest.approx(0.01, abs=0.0015)   # 99th percentiles of χ²(dof)


def test_tables_without_two_clients_and_two_classes_are_not_skewed_and_bad_tables_are_refused() -> None:
    for table in (np.zeros((0, 3)), np.array([[3.0, 4.0]]), np.array([[3.0, 0.0], [5.0, 0.0]]), np.zeros((4, 3))):
        result = label_skew(table)
        assert (result.effect, result.p_value, result.skewed) == (0.0, 1.0, False)
    for bad in (np.array([[1.0, -1.0], [2.0, 2.0]]), np.array([[np.nan, 1.0], [1.0, 1.0]]), np.ones(3)):
        with pytest.raises(ValueError, match="class counts"):
            label_skew(bad)
