"""``DataLoss(early_stop=True)``: the ``K`` losses scored in growing prefixes, each model stopped once it is worse than
the leader beyond doubt (:func:`open_models`); the decision is the full pass's, close models get every row."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F

from fedroute.client.batched_losses import (EARLY_STOP_ROWS, EARLY_STOP_Z, LOSS_ATOL, LOSS_RTOL, DataLoss,
                                            open_models)

pytestmark = pytest.mark.usefixtures("one_torch_thread")

ROWS, FEATURES, CLASSES = 300, 8, 3


def _data(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    teacher = torch.randn(FEATURES, CLASSES, generator=generator)
    inputs = torch.randn(ROWS, FEATURES, generator=generator)
    return inputs, (inputs @ teacher).argmax(dim=1), teacher


def _vector(weight: torch.Tensor, bias: torch.Tensor) -> np.ndarray:
    return torch.cat([weight.reshape(-1), bias]).double().numpy()


LAYOUT = [("weight", (CLASSES, FEATURES), torch.float32), ("bias", (CLASSES,), torch.float32)]


class _Counting:
    """A per-row criterion that counts the rows it scored."""

    def __init__(self) -> None:
        self.rows = 0

    def __call__(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        self.rows += len(targets)
        return F.cross_entropy(outputs, targets, reduction="none")


def _models(teacher: torch.Tensor, scales: list[float]) -> np.ndarray:
    """Models along the teacher's direction: a larger scale fits the labels better; 0 knows nothing."""
    return np.stack([_vector(scale * teacher.T, torch.zeros(CLASSES)) for scale in scales])


def test_open_models_keeps_the_leader_and_close_models_and_drops_the_clearly_worse() -> None:
    rng = np.random.default_rng(0)
    leader = rng.gamma(2.0, 0.1, size=64)
    close = leader + rng.normal(0.0, 0.05, size=64)                     # mean excess ≈ 0: not decided
    worse = leader + 1.0 + rng.normal(0.0, 0.05, size=64)               # 1.0 above on every row
    assert open_models(np.stack([worse, leader, close]), [7, 8, 9]) == [8, 9]
    assert open_models(np.stack([leader, leader]), [0, 1]) == [0, 1]   # equal on every row: both stay open
    slightly = leader + 0.01 + rng.normal(0.0, 0.5, size=64)            # worse on average, not beyond doubt
    assert open_models(np.stack([leader, slightly]), [0, 1]) == [0, 1]
    assert EARLY_STOP_Z == 3.0


def test_separated_models_stop_after_the_first_prefix_with_the_full_passes_decision() -> None:
    inputs, targets, teacher = _data()
    vectors = _models(teacher, [3.0, 0.0, -3.0, 0.3])                   # model 0 fits; the others are far worse
    counting = _Counting()
    early = DataLoss(inputs, targets, early_stop=True, row_criterion=counting, batch_bytes=None)
    full = DataLoss(inputs, targets, batch_bytes=None)
    model = nn.Linear(FEATURES, CLASSES).eval()
    fast, exact = early.each(model, vectors, LAYOUT), full.each(model, vectors, LAYOUT)
    assert int(np.argmin(fast)) == int(np.argmin(exact)) == 0
    assert counting.rows == 4 * EARLY_STOP_ROWS                          # every model on the first prefix only
    assert (early.last_rows_scored, full.last_rows_scored) == (4 * EARLY_STOP_ROWS, 4 * ROWS)   # what it reports
    np.testing.assert_allclose(fast, exact, rtol=0.5)                    # estimates from 32 random rows
    assert fast[2] > 2 * fast[0] and exact[2] > 2 * exact[0]             # the ratios the server reads survive


def test_models_the_rows_cannot_tell_apart_are_scored_on_every_row_and_agree_with_the_full_pass() -> None:
    """Two different models with the same output on every row (they differ only in the weight of a feature
    that is 0 everywhere): never decided, so both are scored on all rows, as the full pass scores them."""
    inputs, targets, teacher = _data(1)
    inputs[:, 0] = 0.0
    vectors = _models(teacher, [1.0, 1.0])
    vectors[1, 0] += 5.0                                                 # weight[0, 0]: multiplies feature 0
    counting = _Counting()
    early = DataLoss(inputs, targets, early_stop=True, row_criterion=counting, batch_bytes=None)
    model = nn.Linear(FEATURES, CLASSES).eval()
    np.testing.assert_allclose(early.each(model, vectors, LAYOUT),
                               DataLoss(inputs, targets, batch_bytes=None).each(model, vectors, LAYOUT),
                               rtol=LOSS_RTOL, atol=LOSS_ATOL)
    assert counting.rows == 2 * ROWS == early.last_rows_scored


def test_identical_models_are_scored_once_and_get_the_same_loss() -> None:
    inputs, targets, teacher = _data(2)
    vectors = _models(teacher, [1.0, 1.0, 1.0, 1.0])                      # K copies of a warm start
    counting = _Counting()
    losses = DataLoss(inputs, targets, early_stop=True, row_criterion=counting).each(
        nn.Linear(FEATURES, CLASSES).eval(), vectors, LAYOUT)
    assert len(set(losses.tolist())) == 1
    assert counting.rows == EARLY_STOP_ROWS                              # one model open: the first prefix


def test_the_rows_are_scored_in_a_fixed_random_order_per_client() -> None:
    inputs, targets, _ = _data(3)
    first = DataLoss(inputs, targets, early_stop=True, seed=5, client_id=2)
    again = DataLoss(inputs, targets, early_stop=True, seed=5, client_id=2)
    other = DataLoss(inputs, targets, early_stop=True, seed=5, client_id=3)
    assert torch.equal(first.inputs, again.inputs) and not torch.equal(first.inputs, other.inputs)
    assert not torch.equal(first.inputs, inputs)
    assert torch.equal(torch.sort(first.inputs[:, 0]).values, torch.sort(inputs[:, 0]).values)   # a permutation


def test_early_stop_with_another_criterion_needs_per_row_losses() -> None:
    inputs, targets, _ = _data()
    with pytest.raises(ValueError, match="row_criterion"):
        DataLoss(inputs, targets, criterion=F.nll_loss, early_stop=True)
    with pytest.raises(ValueError, match="early_stop"):
        DataLoss(inputs, targets, early_stop="yes")
