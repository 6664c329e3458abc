"""``DataLoss.each``: the ``K`` looped losses as ``functional_call`` states (no ``load_state_dict``); its fallbacks;
the rows per forward pass capped by bytes (``batch_bytes``, :func:`row_bytes`) with the same losses."""

from __future__ import annotations

import functools
import importlib.util
import logging
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F

from fedroute.client import batched_losses
from fedroute.client.batched_losses import (BATCH_BYTES, LOSS_ATOL, LOSS_RTOL, PROBE_ROWS, DataLoss, each_or_none,
                                            model_states, row_bytes)
from fedroute.client.torch_adapter import TorchClient
from fedroute.data.models import SmallCNN, SmallMLP

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # small tensors: one torch thread

TASK = Path(__file__).resolve().parents[1] / "examples" / "digits_cnn" / "digits_app" / "task.py"


@functools.cache
def _digits_cnn() -> type[nn.Module]:
    """The example app's ``DigitsCNN`` (its ``task.py`` loaded by path under its own name: no ``sys.path`` change)."""
    name = "_each_losses_digits_task"
    spec = importlib.util.spec_from_file_location(name, TASK)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module.DigitsCNN


def _vectors(make, count: int) -> np.ndarray:
    rows = []
    for k in range(count):
        torch.manual_seed(100 + k)
        rows.append(torch.cat([v.detach().reshape(-1).double() for v in make().state_dict().values()]))
    return torch.stack(rows).numpy()


def _layout(model: nn.Module):
    return [(name, tuple(value.shape), value.dtype) for name, value in model.state_dict().items()]


def _looped(loss: DataLoss, model: nn.Module, vectors: np.ndarray) -> np.ndarray:
    """The reference: load each vector into the module, then ``DataLoss.__call__``."""
    client = TorchClient(model, loss, num_examples=1, batched=False)
    values = []
    for vector in vectors:
        client.load_vector(vector)
        model.eval()
        values.append(loss(model))
    return np.asarray(values)


def _data(shape: tuple[int, ...], rows: int = 150, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return torch.rand(rows, *shape, generator=generator), torch.randint(0, 10, (rows,), generator=generator)


CASES = {
    "digits-cnn": (lambda: _digits_cnn()(), (1, 8, 8)),
    "mlp": (lambda: SmallMLP((20,), 10), (20,)),
    "cifar-like-cnn": (lambda: SmallCNN((3, 16, 16), 10), (3, 16, 16)),
}


@pytest.mark.parametrize("max_rows", [None, 40], ids=["all-rows", "max-rows-40"])
@pytest.mark.parametrize("case", list(CASES))
def test_each_agrees_with_loading_each_model_and_leaves_the_module_alone(case, max_rows) -> None:
    make, shape = CASES[case]
    vectors = _vectors(make, 4)
    inputs, targets = _data(shape)
    torch.manual_seed(7)
    model = make().eval()
    before = {name: value.clone() for name, value in model.state_dict().items()}
    loss = DataLoss(inputs, targets, batch_size=64, max_rows=max_rows, client_id=3)
    each = loss.each(model, vectors, _layout(model))
    for name, value in model.state_dict().items():  # its own parameters: untouched
        torch.testing.assert_close(value, before[name], rtol=0, atol=0)
    expected = _looped(loss, make().eval(), vectors)
    assert each.shape == (4,) and each.dtype == np.float64
    np.testing.assert_allclose(each, expected, rtol=LOSS_RTOL, atol=LOSS_ATOL)
    assert len(np.unique(np.round(expected, 6))) == 4  # four different models: a mix-up would show
    if max_rows is not None:
        assert len(loss.inputs) == 40


def test_the_client_scores_through_each_with_batched_false_and_gets_the_loops_losses() -> None:
    make = lambda: _digits_cnn()()  # noqa: E731
    vectors = _vectors(make, 3)
    inputs, targets = _data((1, 8, 8), rows=96)
    loss = DataLoss(inputs, targets)
    calls = []
    original = loss.each
    loss.each = lambda *args: calls.append(1) or original(*args)  # type: ignore[method-assign]
    model = make()
    client = TorchClient(model, loss, num_examples=96, batched=False)
    values = client.losses(vectors)
    assert calls == [1] and model.training  # through each, once; the module's mode restored
    np.testing.assert_allclose(values[0], _looped(DataLoss(inputs, targets), make(), vectors),
                               rtol=LOSS_RTOL, atol=LOSS_ATOL)


def test_each_lays_the_convolution_weights_out_channels_last_and_everything_else_as_views() -> None:
    model = _digits_cnn()()
    vectors = _vectors(lambda: _digits_cnn()(), 2).astype(np.float32)
    states = model_states(vectors, _layout(model), "cpu", {"conv1.weight", "conv2.weight"})
    for state in states:
        assert state["conv2.weight"].is_contiguous(memory_format=torch.channels_last)
        assert not state["conv2.weight"].is_contiguous()
        assert state["fc1.weight"].is_contiguous()
    # views: the two models' fc1 weights share one storage (the converted vectors), no copies
    assert states[0]["fc1.weight"].untyped_storage().data_ptr() == states[1]["fc1.weight"].untyped_storage().data_ptr()
    np.testing.assert_array_equal(states[1]["fc2.bias"].numpy(), vectors[1, -10:])
    # ... but not of the caller's float32 array: a module writing to its state cannot change the vectors
    assert states[0]["fc1.weight"].untyped_storage().data_ptr() != vectors.ctypes.data
    with pytest.raises(ValueError, match="vectors have 5 entries"):
        model_states(vectors[:, :5], _layout(model), "cpu")


class _FlattensWithView(nn.Module):
    """A CNN whose ``forward`` flattens by ``x.view(x.size(0), -1)``: fails on a channels-last activation."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, kernel_size=3, padding=1)
        self.conv2 = nn.Conv2d(4, 4, kernel_size=3, padding=1)
        self.fc = nn.Linear(4 * 8 * 8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.conv2(torch.relu(self.conv1(x))))
        return self.fc(x.view(x.size(0), -1))


def test_a_module_rejecting_channels_last_activations_is_scored_contiguously() -> None:
    vectors = _vectors(_FlattensWithView, 3)
    inputs, targets = _data((1, 8, 8))
    model = _FlattensWithView().eval()
    loss = DataLoss(inputs, targets)
    # the premise: with channels-last weights its activation is channels-last, and view() refuses it
    with pytest.raises(RuntimeError):
        state = model_states(vectors[:1], _layout(model), "cpu", {"conv1.weight", "conv2.weight"})[0]
        torch.func.functional_call(model, state, (loss._loop_inputs[:4],))
    each = each_or_none(loss, model, vectors, _layout(model))
    assert each is not None and not getattr(loss, "each_failed", False)
    assert loss._each_channels_last is False  # contiguous from now on
    np.testing.assert_allclose(each, _looped(loss, _FlattensWithView().eval(), vectors),
                               rtol=LOSS_RTOL, atol=LOSS_ATOL)


class _NeedsItsOwnParameters(nn.Module):
    """An MLP whose ``forward`` refuses to run on anything but its own ``nn.Parameter`` (so not functionally)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(20, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not isinstance(self.fc.weight, nn.Parameter):
            raise TypeError("this module runs on its own parameters only")
        return self.fc(x)


def test_a_module_functional_call_cannot_run_falls_back_to_the_loop_for_good(caplog) -> None:
    vectors = _vectors(_NeedsItsOwnParameters, 3)
    inputs, targets = _data((20,))
    loss = DataLoss(inputs, targets)
    model = _NeedsItsOwnParameters()
    with pytest.raises(TypeError, match="own parameters"):
        loss.each(model.eval(), vectors, _layout(model))
    client = TorchClient(model, loss, num_examples=150, batched=False)
    with caplog.at_level(logging.INFO, logger="fedroute"):
        first = client.losses(vectors)
        second = client.losses(vectors)
    assert loss.each_failed is True
    messages = [record for record in caplog.records if "without loading unavailable" in record.getMessage()]
    assert len(messages) == 1 and messages[0].levelno == logging.INFO  # logged once
    expected = _looped(DataLoss(inputs, targets), _NeedsItsOwnParameters(), vectors)
    np.testing.assert_allclose(first[0], expected, rtol=LOSS_RTOL, atol=LOSS_ATOL)
    np.testing.assert_array_equal(second, first)
    assert each_or_none(loss, model, vectors, _layout(model)) is None


def test_a_subclass_with_its_own_call_keeps_the_loop() -> None:
    class Doubled(DataLoss):
        def __call__(self, model: nn.Module) -> float:
            return 2 * super().__call__(model)

    vectors = _vectors(lambda: SmallMLP((20,), 10), 2)
    inputs, targets = _data((20,))
    model = SmallMLP((20,), 10)
    loss = Doubled(inputs, targets)
    assert each_or_none(loss, model, vectors, _layout(model)) is None
    values = TorchClient(model, loss, num_examples=150, batched=False).losses(vectors)
    np.testing.assert_allclose(values[0], 2 * _looped(DataLoss(inputs, targets), SmallMLP((20,), 10), vectors),
                               rtol=LOSS_RTOL, atol=LOSS_ATOL)


def test_each_keeps_the_dtypes_of_a_mixed_state() -> None:
    def make() -> nn.Module:
        return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.Linear(4 * 6 * 6, 10))

    torch.manual_seed(0)
    trained = make()
    trained.train()
    trained(torch.randn(32, 3, 8, 8))  # running statistics away from their defaults
    vector = torch.cat([v.detach().reshape(-1).double() for v in trained.state_dict().values()]).numpy()
    vectors = np.stack([vector, vector * 0.9])
    inputs, targets = _data((3, 8, 8))
    model = make().eval()
    layout = _layout(model)
    assert {dtype for _, _, dtype in layout} == {torch.float32, torch.int64}
    state = model_states(vectors, layout, "cpu")[0]
    assert state["1.num_batches_tracked"].dtype == torch.int64 and int(state["1.num_batches_tracked"]) == 1
    loss = DataLoss(inputs, targets)
    np.testing.assert_allclose(loss.each(model, vectors, layout), _looped(loss, make().eval(), vectors),
                               rtol=LOSS_RTOL, atol=LOSS_ATOL)


# ------------------------------------------------------------------ rows per pass capped by bytes (batch_bytes)
def _pass_sizes(model: nn.Module) -> list[int]:
    """The rows of every forward pass of ``model`` from now on (a forward pre-hook; it fires under
    ``functional_call`` too)."""
    sizes: list[int] = []
    model.register_forward_pre_hook(lambda module, args: sizes.append(len(args[0])))
    return sizes


@pytest.mark.parametrize(("make", "shape", "expected"), [
    (lambda: _digits_cnn()(), (1, 8, 8), 32 * 8 * 8 * 4),  # conv2's output (and its ReLU's)
    (lambda: SmallCNN((3, 32, 32), 10), (3, 32, 32), 16 * 32 * 32 * 4),  # conv1's output
    (lambda: SmallMLP((20,), 10), (20,), 64 * 4),  # the hidden layer
], ids=["digits-cnn", "cifar-like-cnn", "mlp"])
def test_row_bytes_is_the_largest_activation_per_row(make, shape, expected) -> None:
    model = make().eval()
    inputs, _ = _data(shape, rows=20)
    sizes = _pass_sizes(model)
    assert row_bytes(model, inputs) == expected
    assert sizes == [PROBE_ROWS]  # one probe pass of PROBE_ROWS rows
    assert row_bytes(model, inputs[:3]) == expected  # fewer rows than PROBE_ROWS: all of them


@pytest.mark.parametrize(("batch_bytes", "rows"), [("auto", BATCH_BYTES // (16 * 16 * 16 * 4)),
                                                   (2 ** 16, 4), (1, 1), (None, 150), (2 ** 40, 150)],
                         ids=["auto", "64-KiB", "one-byte", "none", "huge"])
def test_batch_bytes_caps_the_rows_per_pass_and_the_losses_stay_the_same(batch_bytes, rows) -> None:
    make = lambda: SmallCNN((3, 16, 16), 10)  # noqa: E731 - 16 KiB of conv1 output per row
    vectors = _vectors(make, 3)
    inputs, targets = _data((3, 16, 16), rows=150)
    batched_losses._ROW_BYTES.clear()
    loss = DataLoss(inputs, targets, batch_size=256, batch_bytes=batch_bytes)
    assert loss.batch_bytes == (BATCH_BYTES if batch_bytes == "auto" else batch_bytes)
    model = make().eval()
    sizes = _pass_sizes(model)
    each = loss.each(model, vectors, _layout(model))
    passes = [size for size in sizes if size != PROBE_ROWS or rows == PROBE_ROWS]
    assert max(passes) == rows and sum(passes) == 3 * 150  # every row once per model, in passes of ≤ rows
    # the reference: one pass over all rows per model, each model loaded into the module
    reference = _looped(DataLoss(inputs, targets, batch_size=150, batch_bytes=None, channels_last=False), make().eval(),
                        vectors)
    np.testing.assert_allclose(each, reference, rtol=LOSS_RTOL, atol=LOSS_ATOL)
    np.testing.assert_allclose(_looped(loss, make().eval(), vectors), reference, rtol=LOSS_RTOL, atol=LOSS_ATOL)
    batched = loss.batched(make().eval(), vectors, _layout(model))  # the vmap pass: K x a pass's activations
    np.testing.assert_allclose(batched, reference, rtol=LOSS_RTOL, atol=LOSS_ATOL)


def test_small_activations_keep_batch_size_rows_and_the_probe_runs_once_per_architecture() -> None:
    make = lambda: _digits_cnn()()  # noqa: E731 - 8 KiB per row: 256 rows fit 2 MiB
    vectors = _vectors(make, 4)
    inputs, targets = _data((1, 8, 8), rows=96)
    batched_losses._ROW_BYTES.clear()
    model = make().eval()
    sizes = _pass_sizes(model)
    DataLoss(inputs, targets).each(model, vectors, _layout(model))
    assert sizes == [PROBE_ROWS, 96, 96, 96, 96]  # the probe, then one pass over every row per model
    sizes.clear()
    DataLoss(inputs, targets).each(model, vectors, _layout(model))  # a new DataLoss (one per message)
    DataLoss(inputs, targets)(model)  # and the loop: the same architecture, no probe again
    assert sizes == [96] * 5


def test_a_module_failing_the_probe_is_scored_with_batch_size_rows() -> None:
    class _NeedsEightRows(nn.Module):
        """An MLP that refuses batches of fewer than 8 rows (the probe has PROBE_ROWS = 7)."""

        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(20, 10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            if len(x) < 8:
                raise ValueError("at least 8 rows")
            return self.fc(x)

    vectors = _vectors(_NeedsEightRows, 3)
    inputs, targets = _data((20,), rows=64)
    batched_losses._ROW_BYTES.clear()
    loss = DataLoss(inputs, targets, batch_size=32)
    model = _NeedsEightRows()
    sizes = _pass_sizes(model)
    values = TorchClient(model, loss, num_examples=64, batched=False).losses(vectors)
    assert not getattr(loss, "each_failed", False)  # the probe is a hint: each ran, in passes of batch_size
    assert [size for size in sizes if size != PROBE_ROWS] == [32] * 6
    expected = []
    for vector in vectors:
        reference = _NeedsEightRows().eval()
        TorchClient(reference, loss, num_examples=64).load_vector(vector)
        with torch.no_grad():
            expected.append(float(F.cross_entropy(reference(inputs), targets)))
    np.testing.assert_allclose(values[0], expected, rtol=LOSS_RTOL, atol=LOSS_ATOL)
    assert loss(reference) == pytest.approx(expected[-1], rel=LOSS_RTOL)  # the loop too
    assert not batched_losses._ROW_BYTES  # a failed probe is not remembered


def test_the_loops_probe_leaves_a_module_in_training_mode_and_its_statistics_alone() -> None:
    def make() -> nn.Module:
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(20, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 10))

    inputs, targets = _data((20,), rows=40)
    batched_losses._ROW_BYTES.clear()
    probed, plain = make().train(), make().train()
    value = DataLoss(inputs, targets, batch_size=16)(probed)  # probe (in eval mode), then three passes
    expected = DataLoss(inputs, targets, batch_size=16, batch_bytes=None)(plain)  # three passes, no probe
    assert probed.training and value == pytest.approx(expected, rel=1e-12)
    for (name, mine), theirs in zip(probed.state_dict().items(), plain.state_dict().values()):
        torch.testing.assert_close(mine, theirs, rtol=0, atol=0, msg=name)  # the probe updated no statistics


@pytest.mark.parametrize("value", [0, -1, True, 2.5, "big"])
def test_a_bad_batch_bytes_is_refused_naming_the_setting(value) -> None:
    inputs, targets = _data((20,), rows=8)
    with pytest.raises(ValueError, match="DataLoss batch_bytes"):
        DataLoss(inputs, targets, batch_bytes=value)


def test_auto_caps_only_on_the_cpu() -> None:
    inputs = torch.empty(8, 3, 4, 4, device="meta")
    targets = torch.empty(8, dtype=torch.int64, device="meta")
    assert DataLoss(inputs, targets).batch_bytes is None  # another device: batch_size rows
    assert DataLoss(*_data((20,), rows=8)).batch_bytes == BATCH_BYTES == 2 * 2 ** 20
