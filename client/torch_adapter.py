"""A user's torch model, data and training loop as a :class:`~fedroute.core.task.ClientBatch` of one client.

The routing core works on flat float64 parameter vectors (``(P,)``; ``K``
models are ``(K, P)``).  :class:`TorchClient` converts between such a vector
and the module's ``state_dict`` (every parameter *and* buffer, in
``state_dict`` order, names, shapes and dtypes kept — the same layout as
``ArrayRecord.from_torch_state_dict``), and calls the user's functions:

* ``loss_fn(model) -> float`` — mean loss of the module on the client's
  training data (called once per cluster model per round);
* ``train_fn(model) -> None | float | dict`` — the user's local training, in place
  (optionally returning metrics of the routed model's training);
* ``test_loss_fn(model) -> float`` — optional, the held-out loss for the
  final evaluation.

With a :class:`~fedroute.client.batched_losses.DataLoss` as ``loss_fn`` the ``K``
losses can run as one batched ``torch.func`` pass (``batched``).  torch is imported
only by the modules that need it (this one, the batched losses, the dataset task's
client and models).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, Mapping, Optional

import numpy as np
import torch
from numpy.typing import NDArray

from fedroute.core.signatures import labelled_signature
from fedroute.core.validation import invalid

__all__ = ["TorchClient", "LossFunction", "TrainFunction", "cluster_models_from_torch", "cluster_models_to_torch",
           "module_arrays", "train_metrics_of", "layout_difference", "TRAIN_LOSS_METRIC", "MetricsFunction",
           "metrics_of"]

logger = logging.getLogger(__name__)
_SAID: set[str] = set()


def _say_once(say: Callable[[str], None], message: str) -> None:
    """``say(message)`` the first time this process says it."""
    if message not in _SAID:
        _SAID.add(message)
        say(message)


LossFunction = Callable[[torch.nn.Module], float]
"""``loss_fn(model) -> float``: mean loss of ``model`` on this client's data."""
TrainFunction = Callable[[torch.nn.Module], Any]
MetricsFunction = Callable[[torch.nn.Module], Mapping[str, float]]
"""``metrics_fn(model) -> {name: number}``: the user's evaluation metrics of one model (e.g. accuracy)."""
"""``train_fn(model) -> None | float | dict``: local training of ``model`` in place; it may return metrics
(a dict or ``MetricRecord`` of numbers or lists of numbers, e.g. ``{"train_loss": 0.31}``; a number is its
loss, ``{"train_loss": number}``), which the strategy averages per cluster as ``FedAvg`` does."""


def _as_numpy(value: Any) -> NDArray:
    """A tensor (any device) or array-like as a numpy array."""
    return value.detach().cpu().numpy() if isinstance(value, torch.Tensor) else np.asarray(value)


def module_arrays(module: torch.nn.Module) -> dict[str, NDArray]:
    """The module's ``state_dict`` as named numpy arrays (copies, CPU), in order.

    Raises
    ------
    TypeError
        If a tensor has a dtype numpy cannot hold (e.g. ``bfloat16``).
    """
    arrays = {}
    for name, tensor in module.state_dict().items():
        try:
            arrays[name] = tensor.detach().cpu().numpy().copy()
        except TypeError as error:
            raise TypeError(f"state_dict entry '{name}' has dtype {tensor.dtype}, which numpy cannot hold; "
                            "convert the module (e.g. model.float()) before using it with fedroute") from error
    return arrays


def cluster_models_from_torch(modules: Sequence[torch.nn.Module]) -> list:
    """Initial cluster models for :meth:`ClusteredRouting.start`, one ArrayRecord per module.

    Parameters
    ----------
    modules : sequence of torch.nn.Module
        ``K`` modules of the same architecture (e.g. the same class built
        with ``K`` different seeds).  Each module's ``state_dict`` (parameters
        and buffers) becomes one ``ArrayRecord``, names, shapes and dtypes kept.

    Returns
    -------
    list of flwr.app.ArrayRecord
        Pass it as ``initial_arrays`` to ``ClusteredRouting.start``.

    Raises
    ------
    ValueError
        If the modules are fewer than one or their ``state_dict`` layouts differ.
    """
    from fedroute.strategies.records import array_record

    modules = list(modules)
    if not modules:
        raise ValueError("cluster_models_from_torch needs at least one module")
    models = [module_arrays(module) for module in modules]
    reference = _layout(models[0])
    for index, model in enumerate(models[1:], start=1):
        if _layout(model) != reference:
            raise ValueError(f"module {index} has state_dict layout {_layout(model)}; module 0 has {reference}: "
                             "all cluster models must share one architecture")
    return [array_record(model) for model in models]


def cluster_models_to_torch(models: Any, num_clusters: Optional[int] = None) -> list[dict[str, torch.Tensor]]:
    """The ``K`` cluster models as torch ``state_dict``s, ready for ``module.load_state_dict``.

    Parameters
    ----------
    models : ArrayRecord or sequence of mappings
        The packed final models (``Result.arrays`` of ``ClusteredRouting.start``,
        keys ``cluster-<k>/<name>``), or ``strategy.cluster_models`` (one dict
        of numpy arrays per cluster).
    num_clusters : int, optional
        ``K``; inferred from the packed keys when omitted.

    Returns
    -------
    list of dict
        One ``{name: torch.Tensor}`` per cluster, in ``state_dict`` order
        (dtypes and shapes kept; CPU tensors).

    Examples
    --------
    >>> result = strategy.start(grid, cluster_models_from_torch(modules), num_rounds=20)  # doctest: +SKIP
    >>> for module, state in zip(modules, cluster_models_to_torch(result.arrays)):  # doctest: +SKIP
    ...     module.load_state_dict(state)
    """
    from fedroute.strategies.records import unpack_cluster_models

    if hasattr(models, "items") and not isinstance(models, dict):  # an ArrayRecord
        models = unpack_cluster_models(models, num_clusters)
    return [{name: torch.from_numpy(np.array(value, copy=True)) for name, value in model.items()}
            for model in models]


TRAIN_LOSS_METRIC = "train_loss"
"""The metric name of a number ``train_fn`` returns (the name Flower's quickstart gives its training loss)."""


def _is_number(value: Any) -> bool:
    """A Python/numpy real number or a one-element tensor, not a bool."""
    if isinstance(value, torch.Tensor):
        return value.numel() == 1 and value.dtype != torch.bool
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))


def train_metrics_of(value: Any) -> Optional[dict[str, Any]]:
    """What ``train_fn`` returned, as metrics: ``None``, or a dict of floats / lists of floats.

    A number (Python, numpy or a one-element tensor: a training loop that returns
    its loss) becomes ``{"train_loss": value}``.

    Raises
    ------
    TypeError
        Naming the offending key, unless ``value`` is ``None``, a number, or a
        mapping of string keys to numbers (Python or 0-d tensors) or lists of numbers.
    """
    if value is None:
        return None
    if _is_number(value):  # a training loop that returns its loss (Flower's quickstart does)
        value = {TRAIN_LOSS_METRIC: value}
    if not hasattr(value, "items"):
        raise TypeError(f"train_fn returned {type(value).__name__}; return None, a number (its loss, reported as "
                        f"'{TRAIN_LOSS_METRIC}'), or a dict of metrics such as {{'train_loss': 0.31}} (numbers or "
                        "lists of numbers)")
    metrics: dict[str, Any] = {}
    for key, item in value.items():
        if not isinstance(key, str):
            raise TypeError(f"train_fn metrics need string keys, got {key!r}")
        items = item if isinstance(item, (list, tuple)) else [item]
        numbers = []
        for number in items:
            if isinstance(number, torch.Tensor) and number.numel() == 1:
                number = number.item()
            if isinstance(number, np.generic):
                number = number.item()
            if isinstance(number, bool) or not isinstance(number, (int, float)):
                raise TypeError(f"train_fn metric '{key}' = {item!r}: allowed are numbers or lists of numbers")
            numbers.append(float(number))
        metrics[key] = numbers if isinstance(item, (list, tuple)) else numbers[0]
    return metrics


def metrics_of(value: Any) -> dict[str, float]:
    """What ``metrics_fn`` returned, checked: a non-empty mapping of string names to finite numbers.

    Raises
    ------
    TypeError
        Naming the offending key and what is allowed.
    """
    if not hasattr(value, "items"):
        raise TypeError(f"metrics_fn returned {type(value).__name__}; return a dict of numbers such as "
                        "{'accuracy': 0.93}")
    metrics: dict[str, float] = {}
    for key, item in value.items():
        if not isinstance(key, str) or not key:
            raise TypeError(f"metrics_fn metrics need non-empty string keys, got {key!r}")
        if not _is_number(item):
            raise TypeError(f"metrics_fn metric '{key}' = {item!r}: allowed is one number (e.g. an accuracy)")
        number = float(item.item() if isinstance(item, torch.Tensor) else item)
        if not np.isfinite(number):
            raise TypeError(f"metrics_fn metric '{key}' = {number}: allowed is a finite number")
        metrics[key] = number
    if not metrics:
        raise TypeError("metrics_fn returned an empty dict; return at least one metric, e.g. {'accuracy': 0.93}")
    return metrics


def layout_difference(received: Sequence[tuple[str, tuple[int, ...]]],
                      expected: Sequence[tuple[str, tuple[int, ...]]], limit: int = 3) -> str:
    """Only what differs between two ``(name, shape)`` layouts, in bounded words (at most ``limit`` per kind).

    >>> layout_difference([("w", (2, 16)), ("b", (2,))], [("w", (3, 16)), ("b", (2,))])
    "1 of 2 entries differ (shapes: 'w' server (2, 16) vs module (3, 16))"
    """
    server, module = dict(received), dict(expected)
    shapes = [f"{name[:80]!r} server {server[name]} vs module {module[name]}"
              for name in server if name in module and server[name] != module[name]]
    only_server = [repr(name[:80]) for name in server if name not in module]
    only_module = [repr(name[:80]) for name in module if name not in server]
    parts = [_listed(shapes, limit, "shapes: "), _listed(only_server, limit, "only in the server's models: "),
             _listed(only_module, limit, "only in the module: ")]
    parts = [part for part in parts if part]
    if not parts:
        return f"the same {len(module)} entries in another order"
    differing = len(shapes) + len(set(server) ^ set(module))
    return f"{differing} of {len(set(server) | set(module))} entries differ (" + "; ".join(parts) + ")"


def _listed(items: Sequence[str], limit: int, label: str = "") -> str:
    if not items:
        return ""
    more = f" and {len(items) - limit} more" if len(items) > limit else ""
    return label + ", ".join(items[:limit]) + more


def _layout(arrays: dict[str, NDArray]) -> list[tuple[str, tuple[int, ...], str]]:
    return [(name, tuple(value.shape), str(value.dtype)) for name, value in arrays.items()]


class TorchClient:
    """One client (a batch of one) backed by a torch module and the user's loss and training.

    Implements the :class:`~fedroute.core.task.ClientBatch` protocol, so
    :func:`fedroute.core.client_step.client_round` runs the whole routing round on
    it.  The module is a working buffer: every loss evaluation and local update
    first loads the model in question into it.  After :meth:`local_update`
    the module holds the last trained model.

    Parameters
    ----------
    model : torch.nn.Module
        The user's module (on any device; its ``state_dict`` layout defines
        the parameter vector).
    loss_fn : callable
        ``loss_fn(model) -> float``, the mean training loss.  Called with the
        module in ``eval()`` mode under ``torch.no_grad()``.
    train_fn : callable, optional
        ``train_fn(model) -> None | float | dict``, local training in place.  Called with the
        module in ``train()`` mode.  Needed only for :meth:`local_update`; what
        the last call returned is in :attr:`train_metrics`.
    num_examples : int
        Training examples ``n_i`` (> 0): the client's aggregation weight.
    client_id : int
        Global client id (≥ 0), the coordinate of the client's random draws.
    group : int, default -1
        Latent group label for evaluation metrics only (``-1`` = unknown).
    test_loss_fn : callable, optional
        ``test_loss_fn(model) -> float`` on held-out data; ``losses(..., "test")``
        falls back to ``loss_fn`` without it.
    batched : bool or "auto", default "auto"
        Score the ``K`` models in one ``torch.func.vmap`` pass when the loss function
        offers it (a :class:`~fedroute.client.batched_losses.DataLoss`) and the module
        allows it; otherwise (and with ``False``) one pass per model.  ``"auto"``: batched
        when the loss function's data are on a GPU; on the CPU the loop, which measured
        as fast or faster there (``vmap`` turns convolutions into grouped ones;
        docs/performance.md, "Batched K-model losses").  The one-pass-per-model path of a
        ``DataLoss`` is its :meth:`~fedroute.client.batched_losses.DataLoss.each` (the models
        as ``functional_call`` states, not loaded; the loop on a module it cannot run).
    metrics_fn : callable, optional
        ``metrics_fn(model) -> {name: number}`` (e.g. ``{"accuracy": 0.93}``), the user's
        evaluation metrics of one model; :meth:`metrics` calls it on each model.
    signature_data : iterable or callable, optional
        For the signature start (run-config ``signature-hold-rounds > 0``): the client's labelled
        training data as ``(inputs, labels)`` batches (e.g. its ``DataLoader`` of tuples), or a
        function returning them (e.g. ``lambda: ((b["img"], b["label"]) for b in loader)`` for
        dict batches).  Read once per request, on the CPU (:meth:`signature`).
    num_classes : int, optional
        The task's number of classes (labels in ``[0, num_classes)``), with ``signature_data``.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        loss_fn: LossFunction,
        train_fn: Optional[TrainFunction] = None,
        *,
        num_examples: int,
        client_id: int = 0,
        group: int = -1,
        test_loss_fn: Optional[LossFunction] = None,
        batched: bool | str = "auto",
        metrics_fn: Optional[MetricsFunction] = None,
        signature_data: Any = None,
        num_classes: Optional[int] = None,
    ) -> None:
        if isinstance(num_examples, bool) or not float(num_examples) > 0:
            raise invalid("num_examples", num_examples, "a number > 0")
        if int(client_id) != client_id or client_id < 0:
            raise invalid("client_id", client_id, "an integer ≥ 0")
        self.model = model
        self.loss_fn = loss_fn
        self.train_fn = train_fn
        self.test_loss_fn = test_loss_fn
        if batched not in (True, False, "auto"):
            raise invalid("batched", batched, "True, False or 'auto'")
        self.batched = batched
        self.metrics_fn = metrics_fn
        if signature_data is not None and (isinstance(num_classes, bool) or not isinstance(num_classes, int)
                                           or num_classes < 1):
            raise invalid("num_classes", num_classes, "an integer ≥ 1 with signature_data (the task's classes)")
        self.signature_data, self.num_classes = signature_data, num_classes
        self.client_ids = np.array([int(client_id)], dtype=np.int64)
        self.groups = np.array([int(group)], dtype=np.int64)
        self.num_examples = np.array([num_examples])
        state = model.state_dict()
        self._names = list(state)
        self._shapes = [tuple(tensor.shape) for tensor in state.values()]
        self._sizes = [int(tensor.numel()) for tensor in state.values()]
        self.num_parameters = int(sum(self._sizes))
        self.train_metrics: Optional[dict[str, Any]] = None
        """What the latest ``train_fn`` call returned (:func:`train_metrics_of`).  In a routing round the
        routed model is trained last (entry-test probes come first), so after the round it is the routed
        model's."""

    def signature(self, dim: int, seed: int) -> Optional[tuple[NDArray[np.float64], NDArray[np.float64]]]:
        """The client's sketched signature ``(C, d)`` and class counts ``(C,)`` from ``signature_data``
        (:func:`fedroute.core.signatures.labelled_signature`); None without ``signature_data`` (the client
        then sends none and is not held; said once per process at INFO)."""
        if self.signature_data is None or self.num_classes is None:
            _say_once(logger.info, "the server asked for this client's class signature (the signature start, "
                      "signature-hold-rounds > 0, on by default: it parts copy starts and label-skewed clients). "
                      "This client has no signature_data, so it sends none and routes freely; pass signature_data "
                      "and num_classes to routing_train to take part, or set signature-hold-rounds = 0 on the server")
            return None
        data = self.signature_data() if callable(self.signature_data) else self.signature_data
        batches = ((_as_numpy(inputs), _as_numpy(labels)) for inputs, labels in data)
        means, counts = labelled_signature(batches, self.num_classes, dim, seed)
        return means[0], counts[0]

    # ------------------------------------------------------------ conversions
    @property
    def layout(self) -> list[tuple[str, tuple[int, ...]]]:
        """``(name, shape)`` of every ``state_dict`` entry, in order."""
        return list(zip(self._names, self._shapes))

    def check_template(self, template: dict[str, NDArray]) -> None:
        """Raise ``ValueError`` unless ``template`` (a received model) fits the module's ``state_dict``."""
        received = [(name, tuple(value.shape)) for name, value in template.items()]
        if received != self.layout:
            # The difference first: the server keeps the start of an error reply's reason (after Flower's prefix).
            raise ValueError(f"architecture mismatch: {layout_difference(received, self.layout)} between the "
                             "server's cluster models and the module's state_dict; give routing_* a module of the "
                             "architecture the server's initial models were made from (fedroute."
                             "cluster_models_from_torch of the same class)")

    def to_vector(self) -> NDArray[np.float64]:
        """The module's current ``state_dict`` as one flat float64 vector."""
        state = self.model.state_dict()
        return np.concatenate([state[name].detach().cpu().reshape(-1).double().numpy() for name in self._names]) \
            if self._names else np.zeros(0)

    def load_vector(self, vector: NDArray[np.floating]) -> None:
        """Copy a flat vector into the module's parameters and buffers (dtypes and devices kept)."""
        vector = np.asarray(vector)
        if vector.shape != (self.num_parameters,):
            raise ValueError(f"vector has shape {vector.shape}; the module needs ({self.num_parameters},)")
        state = self.model.state_dict()
        targets = [state[name] for name in self._names]
        source = torch.from_numpy(np.ascontiguousarray(vector))
        dtypes = {target.dtype for target in targets}
        if len(dtypes) == 1:  # the usual case: one conversion for the whole vector
            source = source.to(dtype=dtypes.pop())
        offset = 0
        with torch.no_grad():
            for target, shape, size in zip(targets, self._shapes, self._sizes):
                target.copy_(source[offset:offset + size].view(shape))
                offset += size

    # ------------------------------------------------------ ClientBatch protocol
    def _mean_loss(self, loss_fn: LossFunction) -> float:
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                value = loss_fn(self.model)
        finally:
            self.model.train(was_training)
        return float(value.item() if isinstance(value, torch.Tensor) else value)

    def losses(self, cluster_models: NDArray[np.floating], split: str = "train") -> NDArray[np.float64]:
        """Mean loss of each of the ``K`` models: ``(K, P)`` or ``(1, K, P)`` → ``(1, K)``.

        ``split = "test"`` uses ``test_loss_fn`` (``loss_fn`` if none was given).
        """
        if split not in ("train", "test"):
            raise invalid("split", split, "'train', 'test'")
        models = np.asarray(cluster_models)
        if models.ndim == 3:
            if models.shape[0] != 1:
                raise ValueError(f"a TorchClient is one client; got {models.shape[0]} model sets")
            models = models[0]
        loss_fn = self.test_loss_fn if split == "test" and self.test_loss_fn is not None else self.loss_fn
        if len(models) > 1:  # one batched pass where the loss_fn offers it (client/batched_losses.py)
            batched = self._batched_losses(loss_fn, models)
            if batched is not None:
                return batched.reshape(1, -1)
        each = self._each_losses(loss_fn, models)  # one pass per model, without loading them
        if each is not None:
            return each.reshape(1, -1)
        values = np.empty((1, len(models)))
        for k, vector in enumerate(models):
            self.load_vector(vector)
            values[0, k] = self._mean_loss(loss_fn)
        return values

    def _batched_losses(self, loss_fn: LossFunction, models: NDArray[np.floating]) -> Optional[NDArray[np.float64]]:
        """The ``K`` losses in one ``torch.func`` pass if ``loss_fn`` is a :class:`~fedroute.client.batched_losses.
        DataLoss` (or offers ``batched``) and the module allows it, else ``None`` (the loop runs)."""
        if not self.batched or not callable(getattr(loss_fn, "batched", None)):
            return None
        if self.batched == "auto":
            inputs = getattr(loss_fn, "inputs", None)
            if not isinstance(inputs, torch.Tensor) or inputs.device.type != "cuda":
                return None
        from fedroute.client.batched_losses import batched_or_none

        return self._in_eval(batched_or_none, loss_fn, models)

    def _each_losses(self, loss_fn: LossFunction, models: NDArray[np.floating]) -> Optional[NDArray[np.float64]]:
        """The ``K`` losses by ``loss_fn.each`` (a :class:`~fedroute.client.batched_losses.DataLoss`: one
        ``functional_call`` per model and batch, no ``load_state_dict``), else ``None`` (the loop runs)."""
        if not callable(getattr(loss_fn, "each", None)):
            return None
        from fedroute.client.batched_losses import each_or_none

        return self._in_eval(each_or_none, loss_fn, models)

    def _in_eval(self, scorer: Callable[..., Optional[NDArray[np.float64]]], loss_fn: LossFunction,
                 models: NDArray[np.floating]) -> Optional[NDArray[np.float64]]:
        """``scorer(loss_fn, module, models, layout)`` with the module in ``eval()`` mode."""
        state = self.model.state_dict()
        layout = [(name, shape, state[name].dtype) for name, shape in zip(self._names, self._shapes)]
        was_training = self.model.training
        self.model.eval()
        try:
            return scorer(loss_fn, self.model, models, layout)
        finally:
            self.model.train(was_training)

    def metrics(self, cluster_models: NDArray[np.floating], split: str = "test") -> dict[str, NDArray[np.float64]]:
        """``metrics_fn`` of each of the ``K`` models, ``{name: (1, K)}`` (none without ``metrics_fn``).

        Called with the module in ``eval()`` mode under ``torch.no_grad()``; ``split`` is not
        used (``metrics_fn`` reads the data it chooses, normally the held-out data).

        Raises
        ------
        TypeError
            If ``metrics_fn`` returns something other than a mapping of names to numbers, or
            other names for another model.
        """
        if self.metrics_fn is None:
            return {}
        models = np.asarray(cluster_models)
        models = models[0] if models.ndim == 3 else models
        rows = []
        for vector in models:
            self.load_vector(vector)
            rows.append(self._evaluated(self.metrics_fn))
        names = list(rows[0])
        if any(list(row) != names for row in rows):
            raise TypeError(f"metrics_fn returned other names for another model ({[list(row) for row in rows]}); "
                            "return the same names for every model")
        return {name: np.array([[row[name] for row in rows]]) for name in names}

    def _evaluated(self, metrics_fn: MetricsFunction) -> dict[str, float]:
        """``metrics_fn`` on the loaded model, in ``eval()`` mode without gradients, checked."""
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                value = metrics_fn(self.model)
        finally:
            self.model.train(was_training)
        return metrics_of(value)

    def local_update(
        self, models: NDArray[np.floating], client_index: NDArray[np.int64], round_index: int
    ) -> NDArray[np.float64]:
        """``train_fn`` applied to each row of ``models`` (all rows belong to this one client).

        Several rows occur when an entry test probes candidate clusters
        (those probe updates are discarded by the routing core).
        """
        if self.train_fn is None:
            raise ValueError("this TorchClient has no train_fn; pass train_fn to train")
        models = np.asarray(models)
        if np.any(np.asarray(client_index) != 0):
            raise ValueError(f"a TorchClient is one client (index 0); got indices {np.asarray(client_index)}")
        trained = np.empty((len(models), self.num_parameters))
        for row, vector in enumerate(models):
            self.load_vector(vector)
            was_training = self.model.training
            self.model.train()
            try:
                returned = self.train_fn(self.model)
            finally:
                self.model.train(was_training)
            self.train_metrics = train_metrics_of(returned)
            trained[row] = self.to_vector()
        return trained
