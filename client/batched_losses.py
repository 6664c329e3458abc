"""The ``K`` loss passes of a routing round as one batched pass (``torch.func``), with the loop as fallback.

Every routing round a client scores all ``K`` broadcast models on its training
data.  The loop (:meth:`~fedroute.client.torch_adapter.TorchClient.losses`)
loads each model into the module and runs ``loss_fn`` ``K`` times.  A
:class:`DataLoss` — a ``loss_fn`` that knows its data — can instead score the
``K`` models in one pass: the ``(K, P)`` vectors become one stacked state
(each ``state_dict`` entry with a leading ``K`` axis: what
``torch.func.stack_module_state`` makes from ``K`` modules, built here straight
from the vectors, without ``K`` module copies), and
``torch.func.vmap(torch.func.functional_call)`` runs the module once per data
batch for all ``K`` states.  The same arithmetic in float32, so the losses
agree with the loop to rounding (``rtol = 1e-5``, ``atol = 1e-6``: the tests'
tolerance).

Where a module does not allow it (data-dependent control flow, ``.item()`` in
``forward``, in-place updates of buffers, …) the batched pass raises; the
client then falls back to the loop, for good (:data:`FALLBACK_ERRORS`).

On the CPU (``batched`` ``False`` or ``"auto"``) the client scores a
:class:`DataLoss` one model at a time with :meth:`DataLoss.each` instead of
``K`` ``load_state_dict`` + ``loss_fn`` calls: the ``(K, P)`` vectors are
converted once into one tensor, each model's state is a set of views into it
(:func:`model_states`), and ``torch.func.functional_call(model, state_k, (x,))``
runs each model on each batch under ``torch.no_grad()`` — no module loads, no
copies but the convolutions' 4-D weights, which it lays out channels-last.  That
matters for 1-channel images: an ``(n, 1, H, W)`` batch already *counts* as
channels-last (its strides are ambiguous), so ``contiguous(channels_last)`` left
it as it was and, with the module's NCHW weights, the network ran NCHW, where
``max_pool2d`` on the second convolution's output took ≈ 0.9–1.35 ms instead of
≈ 0.1 ms (digits CNN, 96 rows); with channels-last weights the whole network
runs channels-last (one digits forward pass ≈ 2.1 → 1.1 ms).  The losses agree
with the loop to ``LOSS_RTOL``, ``LOSS_ATOL`` (``tests/test_each_losses.py``).
A module that rejects channels-last activations (``x.view(...)``) is rerun
contiguous, for good; one ``functional_call`` cannot run falls back to the loop
(:func:`each_or_none`, logged once at INFO).

On the CPU the rows of one forward pass are also capped by bytes (``batch_bytes``, default
:data:`BATCH_BYTES` = 2 MiB for the largest intermediate tensor of one pass, measured once on a
probe pass of a few rows: :func:`row_bytes`).  Larger activations are freshly allocated memory
every pass: glibc ``malloc`` serves such blocks by ``mmap`` or returns them to the system when they
are freed, so the next pass page-faults them in again (zeroed by the kernel) — on the cifar-like
benchmark (3×32×32 images, ``SmallCNN``; 64 KiB of ``conv1`` output per row) 128-row passes cost
≈ 17 k page faults per client and round at ``K = 4`` and took ≈ 1.4× as long as without them (232
against 170 ms per round of 2 clients).  32-row passes (2 MiB) faulted ≈ 20× less and took the 170 ms;
small activations (the digits CNN: 8 KiB per row) keep ``batch_size`` rows per pass.  The losses are
the same sums in other batches (float32 rounding, ``rtol = 1e-5``).

``max_rows`` scores the models on a fixed subsample of the rows instead
(:func:`loss_rows`): at most ``max_rows`` of them, drawn once per client from
``(seed, client_id, 0, Purpose.LOSS_ROWS)`` (:mod:`fedroute.core.randomness`),
the same rows for all ``K`` models and every round, kept in their order.  The
``K`` passes then cost ``max_rows / n`` of the full ones.

``early_stop=True`` scores the models in growing prefixes of the rows instead (a fixed random order per
client; :data:`EARLY_STOP_ROWS` = 32, then 64, 128, … rows) and stops scoring a model once the paired
per-row differences show it worse than the leader (the lowest mean so far) beyond doubt: the mean
difference above :data:`EARLY_STOP_Z` = 3 standard errors.  The leader is scored on every row until it is
the only model left open; a model stopped early reports its mean over the rows it was scored on (an
unbiased estimate: the rows are a random prefix).  Identical models are scored once.  Where the ``K``
models are separated — each client's own model far better than the others — the passes stop after the
first 32 rows; models the rows scored so far cannot tell apart are scored on more rows, up to all of them
(identical outputs: every row, as without it).  The routing decision (the lowest loss) is the full pass's
unless a model ``3σ`` worse on the prefix is better on all rows; the
losses of the models stopped early are estimates, which the server's rules read as ratios
(``within_reach``, duplicates: factors of 2, far above a prefix's error).  It needs per-row losses: the
default criterion (cross-entropy) gives them, any other needs ``row_criterion``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import Any, Optional, Union

import numpy as np
import torch
from numpy.typing import NDArray
from torch.nn import functional as F
from torch.overrides import TorchFunctionMode

from fedroute.core.randomness import Purpose, generator
from fedroute.core.validation import invalid

__all__ = ["DataLoss", "loss_rows", "stacked_state", "stacked_outputs", "model_states", "each_or_none",
           "batched_or_none", "row_bytes", "open_models", "FALLBACK_ERRORS", "LOSS_RTOL", "LOSS_ATOL", "BATCH_BYTES",
           "EARLY_STOP_ROWS", "EARLY_STOP_Z"]

logger = logging.getLogger("fedroute")

LOSS_RTOL, LOSS_ATOL = 1e-5, 1e-6
"""Agreement of the batched (and the :meth:`DataLoss.each`) and the looped losses (float32 arithmetic in another
order)."""

FALLBACK_ERRORS = (RuntimeError, TypeError, ValueError, NotImplementedError, IndexError)
"""What a batched (or :meth:`DataLoss.each`) pass may raise on a module it cannot run; the client then uses the
loop."""

Layout = Sequence[tuple[str, tuple[int, ...], torch.dtype]]
"""``(name, shape, dtype)`` of every ``state_dict`` entry, in order."""

EARLY_STOP_ROWS = 32
"""``DataLoss(early_stop=True)``: the rows of the first prefix; each next prefix doubles it."""

EARLY_STOP_Z = 3.0
"""``DataLoss(early_stop=True)``: a model is stopped once its mean per-row excess over the leader's loss exceeds
this many standard errors (one-sided ≈ 0.13 % per comparison of two models equal on all rows)."""

BATCH_BYTES = 2 * 2 ** 20
"""``DataLoss(batch_bytes="auto")`` on the CPU: the largest intermediate tensor of one forward pass at most
2 MiB (cifar-like ``SmallCNN``: 32 rows; the digits CNN: every row up to ``batch_size``).  Measured on the
2-CPU reference machine: the cifar-like ``K = 4`` passes in 32-row batches took ≈ 0.73× the time of 128-row
ones, with ≈ 1.5 k instead of ≈ 34 k page faults per round (docs/performance.md, "Rows per pass capped by
bytes")."""

PROBE_ROWS = 7
"""Rows of the probe pass of :func:`row_bytes` (odd and small: few weights have a first dimension of 7)."""

_ROW_BYTES: dict[Any, int] = {}
""":func:`row_bytes` per architecture and row shape (a performance hint, so shared by the process's
``DataLoss`` objects: one built per message measures nothing again)."""


def stacked_state(vectors: NDArray[np.floating], layout: Layout, device: Any) -> dict[str, torch.Tensor]:
    """``K`` flat vectors as one stacked state: ``{name: tensor (K, *shape)}`` on ``device`` (one transfer)."""
    flat = torch.from_numpy(np.ascontiguousarray(vectors, dtype=np.float32)).to(device)
    state, offset = {}, 0
    for name, shape, dtype in layout:
        size = math.prod(shape)
        state[name] = flat[:, offset:offset + size].reshape(len(flat), *shape).to(dtype)
        offset += size
    if offset != flat.shape[1]:
        raise ValueError(f"vectors have {flat.shape[1]} entries; the module's state_dict has {offset}")
    return state


def _conv_weights(module: torch.nn.Module) -> frozenset[str]:
    """``state_dict`` names of the 2-D convolutions' (4-D) weights: what the channels-last path lays out so."""
    return frozenset(f"{name}.weight" if name else "weight" for name, child in module.named_modules()
                     if isinstance(child, (torch.nn.Conv2d, torch.nn.ConvTranspose2d)))


def model_states(vectors: NDArray[np.floating], layout: Layout, device: Any,
                 channels_last: Sequence[str] | frozenset[str] = ()) -> list[dict[str, torch.Tensor]]:
    """``K`` flat vectors as ``K`` states ``{name: tensor}``, views into one tensor (one conversion, one transfer).

    Parameters
    ----------
    vectors : ndarray, shape (K, P)
        The models, entries in ``layout`` order.
    layout : sequence of (name, shape, dtype)
        The module's ``state_dict`` entries.
    device : torch.device
        Where the states go.
    channels_last : collection of str, optional
        Names of 4-D entries to lay out channels-last (a copy of just those, small: convolution
        weights); every other entry is a view.

    Returns
    -------
    list of dict
        One state per row of ``vectors``, for :func:`torch.func.functional_call`.

    Raises
    ------
    ValueError
        If the vectors' length is not the layout's.
    """
    source = torch.from_numpy(np.ascontiguousarray(vectors))
    if source.dim() != 2:
        raise ValueError(f"vectors must be (K, P), got shape {tuple(source.shape)}")
    sizes = [math.prod(shape) for _, shape, _ in layout]
    if sum(sizes) != source.shape[1]:
        raise ValueError(f"vectors have {source.shape[1]} entries; the module's state_dict has {sum(sizes)}")
    weight: dict[torch.dtype, int] = {}
    for (_, _, dtype), size in zip(layout, sizes):
        weight[dtype] = weight.get(dtype, 0) + size
    common = max(weight, key=weight.get) if weight else torch.float32  # type: ignore[arg-type]
    flat = source.to(device=device, dtype=common, copy=True)  # never views of the caller's array
    other = source.to(device) if len(weight) > 1 else flat  # the few entries of another dtype: from the source
    states: list[dict[str, torch.Tensor]] = [{} for _ in range(len(source))]
    offset = 0
    for (name, shape, dtype), size in zip(layout, sizes):
        for k, state in enumerate(states):
            if dtype == common:
                value = flat[k, offset:offset + size].view(shape)
            else:
                value = other[k, offset:offset + size].view(shape).to(dtype)
            if name in channels_last and value.dim() == 4:
                value = value.contiguous(memory_format=torch.channels_last)
            state[name] = value
        offset += size
    return states


def stacked_outputs(module: torch.nn.Module, state: dict[str, torch.Tensor], inputs: torch.Tensor) -> torch.Tensor:
    """``module``'s outputs under each of the ``K`` stacked states: ``(K, batch, …)``."""
    def one(single: dict[str, torch.Tensor], batch: torch.Tensor) -> torch.Tensor:
        return torch.func.functional_call(module, single, (batch,))

    return torch.func.vmap(one, in_dims=(0, None))(state, inputs)


class _LargestRowTensor(TorchFunctionMode):
    """Records the largest tensor with ``rows`` rows (first dimension) that a torch function returns."""

    def __init__(self, rows: int) -> None:
        super().__init__()
        self.rows, self.largest = rows, 0

    def __torch_function__(self, func: Any, types: Any, args: Sequence[Any] = (), kwargs: Any = None) -> Any:
        result = func(*args, **(kwargs or {}))
        for value in result if isinstance(result, (tuple, list)) else (result,):
            if isinstance(value, torch.Tensor) and value.dim() and value.shape[0] == self.rows:
                self.largest = max(self.largest, value.nelement() * value.element_size())
        return result


def row_bytes(forward: Callable[[torch.Tensor], Any], inputs: torch.Tensor, rows: int = PROBE_ROWS) -> int:
    """Bytes per row of the largest intermediate tensor of ``forward`` (a module's forward pass), measured.

    ``forward`` runs once, under ``torch.no_grad()``, on the first ``rows`` rows of ``inputs``, with a
    :class:`torch.overrides.TorchFunctionMode` recording every tensor a torch function returns whose first
    dimension is that row count (activations; the weights have other shapes).

    Parameters
    ----------
    forward : callable
        ``forward(x) -> outputs``, e.g. the module (put it in ``eval()`` mode first: batch norm in training
        mode would update its running statistics on the probe rows).
    inputs : torch.Tensor
        Rows along the first dimension.
    rows : int, default PROBE_ROWS
        The probe's rows (fewer if ``inputs`` has fewer).

    Returns
    -------
    int
        The largest such tensor's bytes divided by the probe's rows, rounded up (at least the bytes of one
        input row).

    Raises
    ------
    Exception
        Whatever ``forward`` raises on the probe rows (:class:`DataLoss` then keeps ``batch_size`` rows).
    """
    probe = inputs[:max(1, min(int(rows), len(inputs)))]
    recorder = _LargestRowTensor(len(probe))
    with torch.no_grad(), recorder:
        forward(probe)
    per_row = -(-recorder.largest // len(probe))
    return max(per_row, probe[:1].nelement() * probe.element_size())


def loss_rows(num_rows: int, max_rows: Optional[int], seed: int = 0, client_id: int = 0) -> Optional[NDArray[np.int64]]:
    """The rows a subsampled :class:`DataLoss` scores: at most ``max_rows`` of ``num_rows``, sorted.

    Parameters
    ----------
    num_rows : int
        The client's rows.
    max_rows : int or None
        The subsample's size; ``None`` or ``max_rows ≥ num_rows``: every row (returns ``None``).
    seed, client_id : int
        Coordinates of the draw: ``generator(seed, client_id, 0, Purpose.LOSS_ROWS)`` chooses the rows
        without replacement, so a client draws the same rows in every round and every process.

    Returns
    -------
    ndarray of int64 or None
        Increasing row indices, or ``None`` for all rows.
    """
    if max_rows is not None and (isinstance(max_rows, bool) or not isinstance(max_rows, (int, np.integer))
                                 or max_rows < 1):
        raise invalid("DataLoss max_rows", max_rows, "None (every row) or an integer ≥ 1",
                      "e.g. max_rows=64 scores the models on 64 rows of each client")
    if max_rows is None or max_rows >= num_rows:
        return None
    chosen = generator(seed, client_id, 0, Purpose.LOSS_ROWS).choice(num_rows, int(max_rows), replace=False)
    return np.sort(chosen).astype(np.int64)


class DataLoss:
    """``loss_fn(model)`` over in-memory tensors, which can also score ``K`` models in one batched pass.

    Parameters
    ----------
    inputs, targets : torch.Tensor
        The client's training rows and labels (moved to ``device`` once, here).
    criterion : callable, default ``torch.nn.functional.cross_entropy``
        ``criterion(outputs, targets) -> mean loss`` of a batch.
    batch_size : int, default 128
        Rows per forward pass at most (the batched pass holds ``K ×`` a batch's activations).  On the
        CPU batches of 64–128 images measured ≈ 2× faster than one pass over 250 (cache).
    device : torch.device, optional
        Where the rows go (default: where they are).
    channels_last : bool or "auto", default "auto"
        Give the module image batches ``(n, C, H, W)`` in the channels-last memory layout, which
        oneDNN's CPU convolutions run ≈ 1.8× faster (the values are the same; a float32 sum in
        another order).  ``"auto"``: for 4-D inputs on the CPU.  A module that cannot take them
        (``x.view(...)`` on a non-contiguous activation) is retried with contiguous inputs, for good.
    max_rows : int, optional
        Score the models on at most this many rows (:func:`loss_rows`); ``None``: every row.
    seed, client_id : int, default 0
        The subsample's draw coordinates (:func:`loss_rows`; unused without ``max_rows``).
    batch_bytes : int, None or "auto", default "auto"
        Also cap the rows per forward pass so that the largest intermediate tensor of one pass (of one
        model; ``K`` models in the batched pass) stays within this many bytes: ``rows = batch_bytes //``
        :func:`row_bytes` (measured once per architecture, on a probe pass of :data:`PROBE_ROWS` rows),
        at least 1 and at most ``batch_size``.  ``"auto"``: :data:`BATCH_BYTES` (2 MiB) for data on the
        CPU, no cap on other devices; ``None``: ``batch_size`` rows always.  Large activations are
        page-faulted in again on every pass on the CPU (module docstring); the losses are the same sums in
        other batches (float32 rounding).
    early_stop : bool, default False
        In :meth:`each`, stop scoring a model once it is worse than the leader beyond doubt (module
        docstring): the ``K`` passes cost about ``32 / n`` of the full ones where the models are separated.
        The rows are then scored in a fixed random order (``generator(seed, client_id, 1,
        Purpose.LOSS_ROWS)``).
    row_criterion : callable, optional
        ``row_criterion(outputs, targets) -> per-row losses`` for ``early_stop`` (default: cross-entropy
        without reduction when ``criterion`` is the default; required with another ``criterion``).

    Attributes
    ----------
    inputs, targets : torch.Tensor
        The rows scored (the subsample under ``max_rows``).
    rows : ndarray of int64 or None
        Which of the given rows they are (``None``: all).
    batch_bytes : int or None
        The byte cap in force (``"auto"`` resolved).
    last_rows_scored : int
        Rows times models the last :meth:`each` scored (``K × n`` without ``early_stop``; identical models
        count once with it); ``0`` before the first call.

    Notes
    -----
    The mean is over the scored rows: each batch's mean loss weighted by its size.
    """

    def __init__(self, inputs: torch.Tensor, targets: torch.Tensor,
                 criterion: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = F.cross_entropy,
                 batch_size: int = 128, device: Optional[Any] = None, channels_last: bool | str = "auto",
                 max_rows: Optional[int] = None, seed: int = 0, client_id: int = 0,
                 batch_bytes: Union[int, str, None] = "auto", early_stop: bool = False,
                 row_criterion: Optional[Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = None) -> None:
        if len(inputs) != len(targets) or len(inputs) == 0:
            raise ValueError(f"DataLoss needs as many targets as inputs (> 0), got {len(inputs)} and {len(targets)}")
        if isinstance(batch_size, bool) or int(batch_size) < 1:
            raise invalid("DataLoss batch_size", batch_size, "an integer ≥ 1")
        if channels_last not in (True, False, "auto"):
            raise invalid("DataLoss channels_last", channels_last, "True, False or 'auto'")
        if not (batch_bytes is None or batch_bytes == "auto" or (isinstance(batch_bytes, (int, np.integer))
                                                                and not isinstance(batch_bytes, bool)
                                                                and batch_bytes >= 1)):
            raise invalid("DataLoss batch_bytes", batch_bytes, "None (batch_size rows), 'auto' or an integer ≥ 1",
                          "e.g. batch_bytes=2**21 keeps the largest activation of a pass within 2 MiB")
        if early_stop not in (True, False):
            raise invalid("DataLoss early_stop", early_stop, "True or False")
        if early_stop and row_criterion is None and criterion is not F.cross_entropy:
            raise invalid("DataLoss row_criterion", row_criterion,
                          "a function of (outputs, targets) giving one loss per row, with early_stop=True and a "
                          "criterion other than the default",
                          "e.g. row_criterion=lambda out, y: F.mse_loss(out, y, reduction='none').mean(dim=1)")
        self.early_stop = bool(early_stop)
        self.last_rows_scored = 0
        self.row_criterion = row_criterion if row_criterion is not None else _cross_entropy_rows
        self.rows = loss_rows(len(inputs), max_rows, seed, client_id)
        order = self.rows
        if self.early_stop:
            shuffle = generator(seed, client_id, 1, Purpose.LOSS_ROWS).permutation(
                len(inputs) if order is None else len(order))
            order = shuffle if order is None else order[shuffle]
        if order is not None:
            index = torch.from_numpy(np.asarray(order, dtype=np.int64))
            inputs, targets = inputs[index.to(inputs.device)], targets[index.to(targets.device)]
        self.inputs = inputs if device is None else inputs.to(device)
        self.targets = targets if device is None else targets.to(device)
        self.criterion, self.batch_size = criterion, int(batch_size)
        if channels_last == "auto":
            channels_last = self.inputs.dim() == 4 and self.inputs.device.type == "cpu"
        self._loop_inputs = self.inputs.contiguous(memory_format=torch.channels_last) \
            if channels_last and self.inputs.dim() == 4 else self.inputs
        self._each_channels_last = bool(channels_last) and self.inputs.dim() == 4
        if batch_bytes == "auto":
            batch_bytes = BATCH_BYTES if self.inputs.device.type == "cpu" else None
        self.batch_bytes: Optional[int] = None if batch_bytes is None else int(batch_bytes)

    def _pass_rows(self, key: Any, forward: Callable[[torch.Tensor], Any], models: int = 1) -> int:
        """Rows per forward pass: ``batch_size``, capped by ``batch_bytes`` over ``models ×`` :func:`row_bytes`.

        ``key`` names the architecture (with the rows' shape and dtype) in the process-wide cache.  A probe
        that raises leaves ``batch_size`` (and is not cached): the pass itself shows whether the module runs.
        """
        if self.batch_bytes is None:
            return self.batch_size
        key = (key, tuple(self.inputs.shape[1:]), self.inputs.dtype, self.inputs.device.type)
        per_row = _ROW_BYTES.get(key)
        if per_row is None:
            try:
                per_row = row_bytes(forward, self.inputs)
            except Exception:  # e.g. x.view(...) on a channels-last activation: the pass will tell
                return self.batch_size
            if len(_ROW_BYTES) >= 256:
                _ROW_BYTES.clear()
            _ROW_BYTES[key] = per_row
        return max(1, min(self.batch_size, self.batch_bytes // (per_row * max(1, models))))

    def _module_rows(self, model: torch.nn.Module) -> int:
        """Rows per pass for ``model`` itself (the loop): probed in ``eval()`` mode, the mode restored."""
        if self.batch_bytes is None:
            return self.batch_size
        key = (type(model), tuple(tuple(value.shape) for value in model.state_dict().values()))
        was_training = model.training
        model.eval()
        try:
            return self._pass_rows(key, model)
        finally:
            model.train(was_training)

    def _batches(self, inputs: Optional[torch.Tensor] = None, rows: Optional[int] = None) -> Any:
        inputs = self.inputs if inputs is None else inputs
        rows = self.batch_size if rows is None else rows
        for start in range(0, len(inputs), rows):
            yield inputs[start:start + rows], self.targets[start:start + rows]

    def _loop_total(self, model: torch.nn.Module, inputs: torch.Tensor) -> float:
        rows = self._module_rows(model)
        with torch.no_grad():
            return sum(float(self.criterion(model(x), y)) * len(y) for x, y in self._batches(inputs, rows))

    def __call__(self, model: torch.nn.Module) -> float:
        """The mean loss of ``model`` (the loop path: one model)."""
        if self._loop_inputs is not self.inputs:
            try:
                return self._loop_total(model, self._loop_inputs) / len(self.inputs)
            except RuntimeError:  # e.g. x.view(...) on a channels-last activation: contiguous from now on
                self._loop_inputs = self.inputs
        return self._loop_total(model, self.inputs) / len(self.inputs)

    def each(self, model: torch.nn.Module, vectors: NDArray[np.floating], layout: Layout) -> NDArray[np.float64]:
        """The mean loss of each of the ``K`` models ``vectors`` (rows in ``layout``), one pass per model.

        The looped losses without loading the models: the ``(K, P)`` vectors become one tensor
        (:func:`model_states`: each model's state views into it) and
        ``torch.func.functional_call(model, state_k, (x,))`` runs each model on each batch, under
        ``torch.no_grad()``.  With channels-last inputs (images on the CPU) the convolutions' 4-D weights
        are laid out channels-last too, so the whole network runs channels-last — for 1-channel images
        a contiguous batch already counts as channels-last, and with the module's own (NCHW) weights the
        network ran NCHW, where ``max_pool2d`` on the convolution's output is slow (docs/performance.md,
        "Batched K-model losses").  The losses agree with :meth:`__call__` after loading each vector to
        ``rtol = LOSS_RTOL = 1e-5``, ``atol = LOSS_ATOL = 1e-6`` (float32 sums in another order).

        ``model`` only supplies the architecture (its own parameters and buffers are not used or changed;
        it should be in ``eval()`` mode, as the loop's).  A module that rejects channels-last activations
        (``x.view(...)`` on one: ``RuntimeError``) is retried with contiguous inputs and weights, for good.

        Raises
        ------
        FALLBACK_ERRORS
            What ``functional_call`` raises on a module it cannot run (:func:`each_or_none` then falls
            back to the loop).
        """
        device = self.inputs.device
        if self._each_channels_last:
            try:
                return self._each_totals(model, model_states(vectors, layout, device, _conv_weights(model)),
                                         self._loop_inputs, layout)
            except RuntimeError:  # e.g. x.view(...) on a channels-last activation: contiguous from now on
                self._each_channels_last = False
        return self._each_totals(model, model_states(vectors, layout, device), self.inputs, layout)

    def _each_totals(self, model: torch.nn.Module, states: list[dict[str, torch.Tensor]],
                     inputs: torch.Tensor, layout: Layout) -> NDArray[np.float64]:
        totals = [0.0] * len(states)
        call = torch.func.functional_call
        rows = self._pass_rows(_architecture(model, layout),
                               lambda x: call(model, states[0], (x,))) if states else self.batch_size
        if self.early_stop and len(states) > 1:
            return self._each_early(model, states, inputs, rows)
        self.last_rows_scored = len(states) * len(inputs)
        with torch.no_grad():
            for x, y in self._batches(inputs, rows):
                for k, state in enumerate(states):
                    totals[k] += float(self.criterion(call(model, state, (x,)), y)) * len(y)
        return np.asarray(totals, dtype=np.float64) / len(self.inputs)

    def _each_early(self, model: torch.nn.Module, states: list[dict[str, torch.Tensor]], inputs: torch.Tensor,
                    rows: int) -> NDArray[np.float64]:
        """:meth:`each` with ``early_stop``: growing prefixes, each model scored until it is decided worse."""
        call = torch.func.functional_call
        per_row: list[list[torch.Tensor]] = [[] for _ in states]
        same: list[int] = []                                              # identical states are scored once
        for k, state in enumerate(states):
            same.append(next((j for j in range(k) if same[j] == j and _same_state(states[j], state)), k))
        open_ = [k for k in range(len(states)) if same[k] == k]
        start, end = 0, min(EARLY_STOP_ROWS, len(inputs))
        with torch.no_grad():
            while True:
                for offset in range(start, end, rows):
                    stop = min(offset + rows, end)
                    x, y = inputs[offset:stop], self.targets[offset:stop]
                    for k in open_:
                        per_row[k].append(self.row_criterion(call(model, states[k], (x,)), y).double().reshape(-1))
                if end >= len(inputs):
                    break
                open_ = open_models(torch.stack([torch.cat(per_row[k]) for k in open_]).cpu().numpy(), open_)
                if len(open_) == 1:
                    break
                start, end = end, min(2 * end, len(inputs))
        self.last_rows_scored = sum(sum(len(losses) for losses in per_row[k]) for k in range(len(states)))
        return np.asarray([float(torch.cat(per_row[same[k]]).mean()) for k in range(len(states))], dtype=np.float64)

    def batched(self, model: torch.nn.Module, vectors: NDArray[np.floating], layout: Layout) -> NDArray[np.float64]:
        """The mean loss of each of the ``K`` models ``vectors`` (rows in ``layout``), in one pass per batch.

        ``model`` only supplies the architecture (its own parameters are not used or changed).
        """
        device = self.inputs.device
        state = stacked_state(vectors, layout, device)
        criterion = torch.func.vmap(self.criterion, in_dims=(0, None))
        totals = torch.zeros(len(vectors), dtype=torch.float64, device=device)
        rows = self.batch_size if self.batch_bytes is None else self._pass_rows(
            _architecture(model, layout),
            lambda x: torch.func.functional_call(model, {name: value[0] for name, value in state.items()}, (x,)),
            models=len(vectors))
        with torch.no_grad():
            for x, y in self._batches(rows=rows):
                totals += criterion(stacked_outputs(model, state, x), y).double() * len(y)
        return (totals / len(self.inputs)).cpu().numpy()


def _architecture(model: torch.nn.Module, layout: Layout) -> tuple[Any, ...]:
    """The key of ``model``'s architecture in the :func:`row_bytes` cache: its type and its entries' shapes."""
    return type(model), tuple(shape for _, shape, _ in layout)


def _cross_entropy_rows(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(outputs, targets, reduction="none")


def _same_state(one: dict[str, torch.Tensor], other: dict[str, torch.Tensor]) -> bool:
    return all(torch.equal(value, other[name]) for name, value in one.items())


def open_models(losses: NDArray[np.float64], models: Sequence[int], z: float = EARLY_STOP_Z) -> list[int]:
    """The models still open after a prefix: the leader and those not yet worse than it beyond doubt.

    Parameters
    ----------
    losses : ndarray, shape (m, n)
        Per-row losses of the ``m`` open models on the same ``n`` rows.
    models : sequence of int
        Their indices.
    z : float
        Standard errors: a model is decided worse when the mean of its per-row excess over the leader's
        (the lowest mean) is above ``z`` times that mean's standard error (and above 0).

    Returns
    -------
    list of int
        The open models, in the order given.
    """
    losses = np.asarray(losses, dtype=np.float64)
    leader = int(np.argmin(losses.mean(axis=1)))
    excess = losses - losses[leader]
    rows = losses.shape[1]
    mean = excess.mean(axis=1)
    error = excess.std(axis=1, ddof=1) / np.sqrt(rows) if rows > 1 else np.full(len(mean), np.inf)
    decided = (mean > 0) & (mean > z * error)
    decided[leader] = False
    return [model for model, done in zip(models, decided) if not done]


def each_or_none(loss_fn: Any, model: torch.nn.Module, vectors: NDArray[np.floating],
                 layout: Layout) -> Optional[NDArray[np.float64]]:
    """``loss_fn.each(...)`` if ``loss_fn`` offers it and the module allows it; ``None`` = use the loop.

    A module ``functional_call`` cannot run (:data:`FALLBACK_ERRORS`) is logged once (INFO) and marked
    (``loss_fn.each_failed``), so the loop is used from then on.  A :class:`DataLoss` subclass that
    overrides ``__call__`` but not ``each`` keeps its own ``__call__`` (the loop).
    """
    if isinstance(loss_fn, DataLoss) and type(loss_fn).__call__ is not DataLoss.__call__ \
            and type(loss_fn).each is DataLoss.each:
        return None
    return _pass_or_none(loss_fn, "each", model, vectors, layout,
                         "K-model losses without loading unavailable", "loading each model")


def batched_or_none(loss_fn: Any, model: torch.nn.Module, vectors: NDArray[np.floating],
                    layout: Layout) -> Optional[NDArray[np.float64]]:
    """``loss_fn.batched(...)`` if ``loss_fn`` offers it and the module allows it; ``None`` = use the loop.

    A module ``vmap`` cannot run is logged once and marked (``loss_fn.batched_failed``), so the loop is
    used from then on.
    """
    return _pass_or_none(loss_fn, "batched", model, vectors, layout,
                         "batched K-model losses unavailable", "using one pass per model")


def _pass_or_none(loss_fn: Any, name: str, model: torch.nn.Module, vectors: NDArray[np.floating], layout: Layout,
                  unavailable: str, instead: str) -> Optional[NDArray[np.float64]]:
    """``loss_fn.<name>(model, vectors, layout)``, or ``None`` once it raised :data:`FALLBACK_ERRORS`
    (then ``loss_fn.<name>_failed`` is set and the failure logged once at INFO)."""
    scorer, failed = getattr(loss_fn, name, None), f"{name}_failed"
    if not callable(scorer) or getattr(loss_fn, failed, False):
        return None
    try:
        return np.asarray(scorer(model, vectors, layout), dtype=np.float64)
    except FALLBACK_ERRORS as error:
        try:
            setattr(loss_fn, failed, True)
        except AttributeError:  # pragma: no cover - a loss_fn with __slots__
            pass
        logger.info("%s for %s (%s: %s); %s", unavailable, type(model).__name__, type(error).__name__,
                    str(error).splitlines()[0][:200], instead)
        return None
