"""Routing losses on a fixed subsample of a client's rows: ``DataLoss(max_rows=...)`` and ``routing-loss-rows``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F

from fedroute.client.batched_losses import LOSS_ATOL, LOSS_RTOL, DataLoss, loss_rows
from fedroute.client.torch_adapter import TorchClient
from fedroute.core.randomness import Purpose, generator
from fedroute.data.models import SmallCNN
from fedroute.tasks.registry import task_from_config
from support.dataset_files import digit_images, write_parquet

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # small tensors: one torch thread


def _digits(count: int = 150) -> tuple[torch.Tensor, torch.Tensor]:
    images, labels = digit_images()
    return torch.from_numpy(images[:count, None] / np.float32(255)), torch.from_numpy(labels[:count])


def _vectors(count: int) -> np.ndarray:
    vectors = []
    for k in range(count):
        torch.manual_seed(k)
        vectors.append(torch.cat([v.detach().reshape(-1) for v in SmallCNN((1, 8, 8), 10).state_dict().values()]))
    return torch.stack(vectors).numpy()


def test_the_rows_are_drawn_once_per_client_from_the_documented_coordinates() -> None:
    rows = loss_rows(150, 40, seed=3, client_id=5)
    expected = np.sort(generator(3, 5, 0, Purpose.LOSS_ROWS).choice(150, 40, replace=False))
    np.testing.assert_array_equal(rows, expected)
    assert len(np.unique(rows)) == 40 and np.all(np.diff(rows) > 0)
    np.testing.assert_array_equal(loss_rows(150, 40, seed=3, client_id=5), rows)  # the same in every round
    assert not np.array_equal(loss_rows(150, 40, seed=3, client_id=6), rows)  # another client, other rows
    assert loss_rows(150, None) is None and loss_rows(150, 150) is None and loss_rows(150, 500) is None


@pytest.mark.parametrize("value", [0, -3, True, 2.5, "64"])
def test_a_bad_max_rows_is_refused_naming_the_setting(value) -> None:
    inputs, targets = _digits(20)
    with pytest.raises(ValueError, match=r"DataLoss max_rows = .* is invalid; allowed: None \(every row\) or an "
                                         r"integer ≥ 1"):
        DataLoss(inputs, targets, max_rows=value)


@pytest.mark.parametrize("batched", [False, True], ids=["looped", "batched"])
def test_a_subsampled_loss_is_the_full_loss_on_the_chosen_rows(batched: bool) -> None:
    inputs, targets = _digits()
    vectors = _vectors(4)
    sub = DataLoss(inputs, targets, batch_size=16, max_rows=40, seed=1, client_id=2)
    assert sub.rows is not None and len(sub.inputs) == len(sub.targets) == 40
    chosen = DataLoss(inputs[sub.rows], targets[sub.rows], batch_size=16)
    values = TorchClient(SmallCNN((1, 8, 8), 10), sub, num_examples=150, batched=batched).losses(vectors)
    expected = TorchClient(SmallCNN((1, 8, 8), 10), chosen, num_examples=150, batched=False).losses(vectors)
    np.testing.assert_allclose(values, expected, rtol=LOSS_RTOL, atol=LOSS_ATOL)  # float32, another order
    torch.manual_seed(0)
    module = SmallCNN((1, 8, 8), 10).eval()  # vectors[0]
    with torch.no_grad():
        plain = float(F.cross_entropy(module(inputs[sub.rows]), targets[sub.rows]))
    np.testing.assert_allclose(values[0, 0], plain, rtol=LOSS_RTOL, atol=LOSS_ATOL)
    full = TorchClient(SmallCNN((1, 8, 8), 10), DataLoss(inputs, targets), num_examples=150,
                       batched=False).losses(vectors)
    assert np.abs(values - full).max() > 1e-4  # other rows, another loss: the subsample is really used
    everything = DataLoss(inputs, targets, max_rows=150)
    assert everything.rows is None and everything(module) == pytest.approx(DataLoss(inputs, targets)(module),
                                                                           rel=1e-12)


def _separable(group: int, rows: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two classes along ``x_0``; group 1 has the labels the other way round."""
    generator_ = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, 2, generator=generator_)
    y = (x[:, 0] > 0).long()
    return x, (1 - y) if group == 1 else y


def test_on_a_clearly_separable_case_the_subsample_routes_as_the_full_loss() -> None:
    models = np.array([[-4.0, 0.0, 4.0, 0.0, 0.0, 0.0],   # nn.Linear(2, 2): logits (−4 x_0, 4 x_0), group 0's
                       [4.0, 0.0, -4.0, 0.0, 0.0, 0.0]],   # the opposite: group 1's
                      dtype=np.float32)
    for client in range(8):
        group = client % 2
        x, y = _separable(group, 200, client)
        choices = []
        for max_rows in (None, 32, 8):
            loss = DataLoss(x, y, max_rows=max_rows, client_id=client)
            losses = TorchClient(nn.Linear(2, 2), loss, num_examples=200, client_id=client).losses(models)
            choices.append(int(np.argmin(losses)))
        assert choices == [group] * 3, (client, choices)


def test_the_dataset_task_scores_routing_on_routing_loss_rows_and_evaluates_on_every_row(tmp_path: Path) -> None:
    path = write_parquet(tmp_path / "digits.parquet", limit=400)
    base = {"task": "dataset", "dataset": str(path), "num-clients": 4, "client-device": "cpu"}
    assert task_from_config(base).routing_loss_rows == 0
    with pytest.raises(ValueError, match=r"dataset task setting 'routing-loss-rows' = -1 is invalid"):
        task_from_config({**base, "routing-loss-rows": -1})
    full = task_from_config({**base, "routing-loss-rows": "auto"}).clients(np.array([1]))
    sub = task_from_config({**base, "routing-loss-rows": 16}).clients(np.array([1]))
    assert full.loss_fn.rows is None and len(full.loss_fn.inputs) == full.data.num_examples > 16
    np.testing.assert_array_equal(sub.loss_fn.rows, loss_rows(full.data.num_examples, 16, 0, 1))
    assert len(sub.test_loss_fn.inputs) == len(full.test_loss_fn.inputs)  # the held-out loss: every row
    models = task_from_config(base).initial_models(3)
    assert full.losses(models).shape == sub.losses(models).shape == (1, 3)
    np.testing.assert_allclose(sub.losses(models, "test"), full.losses(models, "test"), rtol=LOSS_RTOL,
                               atol=LOSS_ATOL)


def test_the_dataset_task_scores_routing_with_early_stop_on_the_looped_pass(tmp_path: Path) -> None:
    """``routing-early-stop = auto`` (the default) gives a CPU client — the looped pass — a
    ``DataLoss(early_stop=True)``, and a client whose losses run batched every row; ``true``/``false`` force it.
    Early stop keeps the row set, in the client's fixed random order, and picks the same best model as every
    row; a bad value is named."""
    path = write_parquet(tmp_path / "digits.parquet", limit=400)
    base = {"task": "dataset", "dataset": str(path), "num-clients": 4, "client-device": "cpu"}
    assert task_from_config(base).routing_early_stop == "auto"
    with pytest.raises(ValueError, match=r"dataset task setting 'routing-early-stop' = 'maybe' is invalid"):
        task_from_config({**base, "routing-early-stop": "maybe"})
    cpu = torch.device("cpu")
    assert task_from_config(base).early_stop(cpu)                              # looped on the CPU: early stop
    assert not task_from_config({**base, "batched-losses": "true"}).early_stop(cpu)    # batched: every row
    assert not task_from_config({**base, "routing-early-stop": "auto"}).early_stop(torch.device("cuda"))
    assert task_from_config({**base, "routing-early-stop": "true", "batched-losses": "true"}).early_stop(cpu)
    full = task_from_config({**base, "routing-early-stop": False}).clients(np.array([1]))
    early = task_from_config(base).clients(np.array([1]))
    assert early.loss_fn.early_stop and not full.loss_fn.early_stop
    assert len(early.loss_fn.inputs) == len(full.loss_fn.inputs)
    models = task_from_config(base).initial_models(3)
    assert int(np.argmin(early.losses(models))) == int(np.argmin(full.losses(models)))
    assert early.loss_fn.last_rows_scored <= full.loss_fn.last_rows_scored == 3 * len(full.loss_fn.inputs)
