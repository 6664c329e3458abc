"""Multiclass Gaussian-mixture task (paper Appendix B.4, EXPERIMENTS E5); pure numpy.

Fixed by the paper
------------------
``G = 3`` latent groups, ``C = 5`` classes, ``d = 10`` features, pure clients,
ten clients per group (``num_clients = 30``; client ``i`` is in group ``i mod 3``),
features ``x = μ_g + σ ξ`` with ``ξ ~ N(0, I_d)``.

Ours (the dataclass defaults of :class:`GMMTask`)
-------------------------------------------------
* Centres: ``μ_g = centre_norm · v_g`` with ``v_g`` a random unit vector
  (``Purpose.TASK``); ``centre_norm = 1`` and ``σ = 1`` keep feature scales
  moderate (EXPERIMENTS: scale 1 / lr 0.1 behaved, scale 3 / lr 0.5 diverged).
* Labels: a group-specific softmax teacher.  ``V_g ∈ R^{C×(d+1)}`` has i.i.d.
  ``N(0, teacher_scale² / (d+1))`` entries (``Purpose.TASK``) and
  ``y ~ softmax(V_g [x; 1] / label_temperature)``.  With ``teacher_scale = 3``,
  ``label_temperature = 1`` (seed 0) the teacher's mean top-class probability is
  0.75 and its held-out cross-entropy 0.62 nats (vs ``log 5 = 1.61``):
  informative, not deterministic.  The three teachers disagree, so one model
  cannot serve two groups: held-out loss of oracle ``h`` on group ``g`` (seed 0)
  is 0.61–0.70 for ``h = g`` and 3.3–6.9 for ``h ≠ g``.
* Data: ``samples_per_client = 50`` training and ``test_samples_per_client = 50``
  held-out samples per client, drawn from ``generator(seed, client_id, 0, Purpose.DATA)``
  (features, then labels), so a client's data depend only on ``(seed, client id)``.
* Model: multinomial logistic regression with bias.  The flat parameter vector
  (``P = C·(d+1) = 55``) is the ``(C, d+1)`` matrix ``[W | b]`` in row-major order:
  row ``c`` holds class ``c``'s weights followed by its bias.  Loss = mean
  cross-entropy (log-sum-exp, stable for any logit size), float64.
* Local update: ``E = local_steps = 5`` full-batch gradient steps with
  ``η_loc = learning_rate = 0.5``.
* Oracle parameters ``β*_g``: multinomial logistic regression fitted on group
  ``g``'s pooled training data (its ten clients) by plain full-batch gradient
  descent from zero, step ``1/L`` with ``L = ½ λ_max(X̃ᵀX̃/N)``, until the
  gradient norm is below ``1e-8`` (deterministic, vectorised over samples).
  The teacher itself is *not* used: ``β*_g`` is the empirical optimum, as in E6.
* Initialisation (as E6): fixed unit directions ``d_g ∈ R^P`` (``Purpose.INIT``,
  projected onto the subspace whose class rows sum to zero — softmax ignores the
  orthogonal component, so all of ``R`` moves the predictions), ``u_g(R) = β*_g + R d_g``
  (unscaled: ``R`` is a distance in parameter space; E6 multiplies by ``Δ_β``),
  ``ū(R) = (1/G) Σ_g u_g(R)`` and ``w_k^0 = ū(R) + init_jitter · e_k`` with
  ``e_k`` random unit vectors (same subspace, ``Purpose.INIT``), ``init_jitter = 0.1``:
  a pooled, collapsed-looking start.  ``init_radius = R`` (sweep includes
  ``R_far = 12``; default 12).  The jitter alone decides the round-zero routes
  (the models differ by ≈ 0.02–0.03 nats): measured over seeds 0–4 and
  ``R ∈ {0, 4, 8, 12}``, two groups usually share a majority cluster and a
  group's clients often split, but ``K^0_eval = 3`` in 18 of the 20 starts.
* Entrance (``entrance``): ``"any"`` takes that start as it falls.  ``"collapsed"``
  (the default, since E5 studies recovery from it) conditions it on a *collapsed entrance* (paper §4: several groups on one cluster,
  another unused): init draw ``j = 0, 1, …`` is the same construction with the jitter
  drawn from ``generator(seed, 0, j, Purpose.INIT)`` (draw 0 is the ``"any"`` start), and
  the first draw whose controller-free greedy choices on the clients' training losses at
  ``W^0`` leave a model unused (``K^0 < K``; with ``K = G`` clusters two groups then share
  a plurality cluster) is the start (:meth:`GMMTask.initial_draw`; at most
  ``max_init_draws``).  Measured on seeds 0–3 over 300 draws: 2–21 % of the draws are
  collapsed (fewer at small ``R``), the first one at draw 0–43.
* Rounds hint ``rounds = 200`` (``T``).
* Fitting ``β*`` takes ≈ 6,000 gradient steps per group, the three groups in one batch (≈ 0.4 s per data
  configuration; cached, so an ``R`` sweep fits once per seed).

Convergence check behind ``T`` and ``η_loc``: one model trained alone on one
group's ten clients (full participation, hard-update average, ``E = 5``,
``η = 0.5``); ``L_t - L*_g`` = its mean training loss minus the oracle's.

=================  =====  =====  ======  ======  =======  =======  ============
start (seed 0)     group  t = 0  t = 10  t = 25  t = 50   t = 100  first < 0.01
=================  =====  =====  ======  ======  =======  =======  ============
``ū(12)``          0      5.1    0.072   0.012   0.0022   0.00065  28
``ū(12)``          1      2.8    0.17    0.023   0.0048   0.0011   36
``ū(12)``          2      4.1    0.19    0.029   0.0074   0.0015   44
``u_g(12)``        0      5.6    0.32    0.041   0.012    0.0050   57
``u_g(12)``        1      3.7    0.40    0.073   0.016    0.0020   61
``u_g(12)``        2      4.3    0.32    0.040   0.0092   0.0021   48
=================  =====  =====  ======  ======  =======  =======  ============

Seeds 1 and 2 from ``ū(12)``: first ``< 0.01`` at rounds 21–36.  Local drift
leaves a floor of ≈ 3–6·10⁻⁴ nats.  So every start at the largest radius is
within 0.01 nats of its oracle by round ≈ 60, and ``T = 200`` leaves no
under-training confound.  Alternatives measured: ``E = 1, η = 0.5`` needs up to
206 rounds for 0.01, ``E = 1, η = 1`` up to 102, ``E = 5, η = 0.1`` up to 210.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property, lru_cache

import numpy as np
from numpy.typing import NDArray

from fedroute.core.randomness import Purpose, generator
from fedroute.core.task import checked_client_ids, validate_task_settings

__all__ = ["ENTRANCES", "GMMTask", "GMMClients", "cross_entropy", "fit_logistic_regression", "fit_logistic_regressions",
           "group_oracle_fit"]


def _augment(inputs: NDArray[np.float64]) -> NDArray[np.float64]:
    """``[x; 1]`` along the last axis."""
    return np.concatenate([inputs, np.ones(inputs.shape[:-1] + (1,))], axis=-1)


def _log_softmax(logits: NDArray[np.float64]) -> NDArray[np.float64]:
    """Stable ``log softmax`` over the last axis (log-sum-exp with the max subtracted)."""
    shifted = logits - np.max(logits, axis=-1, keepdims=True)
    return shifted - np.log(np.sum(np.exp(shifted), axis=-1, keepdims=True))


def cross_entropy(logits: NDArray[np.float64], labels: NDArray[np.int64]) -> NDArray[np.float64]:
    """Mean cross-entropy over the sample axis (second to last) of ``logits`` (..., s, C).

    ``labels`` (..., s) broadcast against ``logits[..., 0]``; stable for any finite logits.
    """
    log_p = _log_softmax(logits)
    labels = np.broadcast_to(labels, log_p.shape[:-1])
    picked = np.take_along_axis(log_p, labels[..., None], axis=-1)[..., 0]
    return -np.mean(picked, axis=-1)


def _class_max(values: NDArray[np.float64]) -> NDArray[np.float64]:
    """``values.max(axis=-1)`` for a short last axis, as a chain of ``np.maximum`` (exact, far fewer calls)."""
    result = values[..., 0]
    for column in range(1, values.shape[-1]):
        result = np.maximum(result, values[..., column])
    return result


def _class_sum(values: NDArray[np.float64]) -> NDArray[np.float64]:
    """``values.sum(axis=-1)``, bit for bit: for fewer than 8 entries numpy adds a contiguous last
    axis left to right, which a chain of column additions reproduces with fewer calls."""
    if values.shape[-1] >= 8:
        return values.sum(axis=-1)
    result = values[..., 0]
    for column in range(1, values.shape[-1]):
        result = result + values[..., column]
    return result


ORACLE_STEP_CAP = 100_000
"""Gradient steps the task allows its oracle fit (:attr:`GMMTask.oracle_parameters` raises beyond)."""


def fit_logistic_regressions(
    features: NDArray[np.float64], labels: NDArray[np.int64], num_classes: int,
    tolerance: float = 1e-8, max_steps: int = ORACLE_STEP_CAP,
) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
    """:func:`fit_logistic_regression` of ``G`` data sets of equal size at once.

    Every data set follows exactly the arithmetic of the single fit (the same
    products per slice, maxima and sums in the same order), so the result equals
    ``G`` separate fits bit for bit; a data set leaves the batch at its own step.

    Parameters
    ----------
    features : ndarray, shape (G, N, d+1)
    labels : ndarray of int, shape (G, N)
    num_classes : int
    tolerance : float
    max_steps : int
        Gradient steps allowed per data set.

    Returns
    -------
    weights : ndarray, shape (G, C, d+1)
        The minimisers (NaN for a data set that did not converge within ``max_steps``).
    steps : ndarray of int, shape (G,)
        Gradient steps taken (``max_steps + 1`` where not converged).
    """
    count = features.shape[1]
    step_sizes = np.array([1.0 / (0.5 * np.linalg.eigvalsh(x.T @ x / count)[-1] * count) for x in features])
    onehot = np.eye(num_classes)[labels]
    result = np.full((len(features), num_classes, features.shape[2]), np.nan)
    steps = np.full(len(features), max_steps + 1, dtype=np.int64)
    active = np.arange(len(features))
    weights = np.zeros_like(result)
    x, targets, sizes = features, onehot, step_sizes[:, None, None]
    for step in range(max_steps):
        if len(active) == 1:  # the slow tail (one ill-conditioned group): the same steps, without allocations
            result[active[0]], steps[active[0]] = _descend_one(x[0], targets[0], weights[0], float(sizes[0, 0, 0]),
                                                               step, max_steps, tolerance * count)
            break
        logits = np.matmul(x, weights.transpose(0, 2, 1))
        probabilities = np.exp(logits - _class_max(logits)[..., None])
        probabilities /= _class_sum(probabilities)[..., None]
        grad = np.matmul((probabilities - targets).transpose(0, 2, 1), x)  # N × the mean gradient
        flat = grad.reshape(len(grad), -1)
        converged = np.array([np.sqrt(row @ row) < tolerance * count for row in flat])
        if converged.any():
            result[active[converged]] = weights[converged]
            steps[active[converged]] = step
            keep = ~converged
            active, x, targets, sizes = active[keep], x[keep], targets[keep], sizes[keep]
            weights, grad = weights[keep], grad[keep]
            if not len(active):
                break
        weights -= sizes * grad
    return result, steps


def _descend_one(features: NDArray[np.float64], targets: NDArray[np.float64], weights: NDArray[np.float64],
                 step_size: float, first_step: int, max_steps: int, threshold: float,
                 ) -> tuple[NDArray[np.float64], int]:
    """The loop of :func:`fit_logistic_regressions` for one data set from step ``first_step`` on, with the
    same operations in the same order written into preallocated buffers; ``(weights, step)`` at
    convergence, ``(NaN, max_steps + 1)`` without."""
    count, classes = targets.shape
    weights = weights.copy()
    logits, probabilities = np.empty((count, classes)), np.empty((count, classes))
    top, total = np.empty(count), np.empty(count)
    grad, scaled = np.empty_like(weights), np.empty_like(weights)
    flat = grad.reshape(-1)
    for step in range(first_step, max_steps):
        np.matmul(features, weights.T, out=logits)
        np.copyto(top, logits[:, 0])
        for column in range(1, classes):
            np.maximum(top, logits[:, column], out=top)
        np.subtract(logits, top[:, None], out=probabilities)
        np.exp(probabilities, out=probabilities)
        if classes >= 8:
            np.sum(probabilities, axis=1, out=total)
        else:  # left to right, as numpy sums a short contiguous axis (see _class_sum)
            np.copyto(total, probabilities[:, 0])
            for column in range(1, classes):
                np.add(total, probabilities[:, column], out=total)
        np.divide(probabilities, total[:, None], out=probabilities)
        np.subtract(probabilities, targets, out=probabilities)
        np.matmul(probabilities.T, features, out=grad)
        if np.sqrt(flat @ flat) < threshold:
            return weights, step
        np.multiply(step_size, grad, out=scaled)
        np.subtract(weights, scaled, out=weights)
    return np.full_like(weights, np.nan), max_steps + 1


def fit_logistic_regression(
    features: NDArray[np.float64], labels: NDArray[np.int64], num_classes: int,
    tolerance: float = 1e-8, max_steps: int = ORACLE_STEP_CAP,
) -> NDArray[np.float64]:
    """Empirical minimiser of the mean cross-entropy by plain gradient descent from zero.

    Steps ``1/L`` with ``L = ½ λ_max(X̃ᵀX̃/N)`` (a bound on the Hessian); stops
    when the gradient's Euclidean norm is below ``tolerance``.

    Parameters
    ----------
    features : ndarray, shape (N, d+1)
        Augmented inputs ``[x; 1]``.
    labels : ndarray of int, shape (N,)
    num_classes : int
    tolerance : float
    max_steps : int
        Raise ``RuntimeError`` if not converged by then.

    Returns
    -------
    ndarray, shape (C, d+1)
        Rows sum to zero (gradient descent from zero never leaves that subspace).
    """
    weights, steps = fit_logistic_regressions(features[None], labels[None], num_classes, tolerance, max_steps)
    if steps[0] > max_steps:
        raise RuntimeError(_NOT_CONVERGED.format(max_steps=max_steps))
    return weights[0]


_NOT_CONVERGED = ("logistic regression did not converge in {max_steps} steps (the data may be (nearly) "
                  "separable, where the unpenalised optimum is at infinity: use more samples)")


def group_oracle_fit(task: "GMMTask", max_steps: int = ORACLE_STEP_CAP) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
    """``β*_g`` of every group fitted together (:func:`fit_logistic_regressions`), with the steps each took.

    Returns ``(G, P)`` parameters (NaN rows for groups not converged within
    ``max_steps``) and ``(G,)`` step counts.  Groups of unequal size are fitted
    one at a time (same result).
    """
    clients = task.clients(np.arange(task.num_clients))
    width = task.dimension + 1
    data = [(_augment(clients.train_inputs[clients.groups == g]).reshape(-1, width),
             clients.train_labels[clients.groups == g].reshape(-1)) for g in range(task.num_groups)]
    if len({len(labels) for _, labels in data}) == 1:
        weights, steps = fit_logistic_regressions(np.stack([f for f, _ in data]), np.stack([y for _, y in data]),
                                                  task.num_classes, max_steps=max_steps)
    else:
        fits = [fit_logistic_regressions(f[None], y[None], task.num_classes, max_steps=max_steps) for f, y in data]
        weights, steps = np.concatenate([w for w, _ in fits]), np.concatenate([n for _, n in fits])
    return weights.reshape(task.num_groups, -1), steps


@lru_cache(maxsize=512)
def _initial_draw(task: "GMMTask", num_clusters: int) -> tuple[NDArray[np.float64], int]:
    """:meth:`GMMTask.initial_draw` of a task (in-process cache: the methods of a sweep share a start)."""
    return task._search_draws(num_clusters)


@lru_cache(maxsize=64)
def _fitted_oracles(task: "GMMTask") -> NDArray[np.float64]:
    """The oracle parameters of ``task`` (see :attr:`GMMTask.oracle_parameters`), read-only."""
    oracle, steps = group_oracle_fit(task)
    if np.any(steps > ORACLE_STEP_CAP):
        raise RuntimeError(_NOT_CONVERGED.format(max_steps=ORACLE_STEP_CAP))
    oracle.flags.writeable = False
    return oracle


@dataclass(frozen=True)
class _SplitArrays:
    """One split's arrays laid out for the batched kernels (built once per client batch)."""

    features_t: NDArray[np.float64]
    """``[x; 1]ᵀ`` per client, (n, d+1, s): the right operand of ``logits = W X̃ᵀ``."""
    features: NDArray[np.float64]
    """``[x; 1]`` per client, (n, s, d+1)."""
    label_moments: NDArray[np.float64]
    """``M = onehot(y)ᵀ X̃ / s`` per client, (n, C, d+1): ``mean_s z_{y_s} = ⟨W, M⟩`` and the label
    part of the gradient."""
    labels: NDArray[np.int64]


def _split_arrays(inputs: NDArray[np.float64], labels: NDArray[np.int64], num_classes: int) -> _SplitArrays:
    features = _augment(inputs)
    onehot = (labels[:, None, :] == np.arange(num_classes)[None, :, None]).astype(np.float64)  # (n, C, s)
    return _SplitArrays(features_t=np.ascontiguousarray(features.transpose(0, 2, 1)), features=features,
                        label_moments=np.matmul(onehot, features) / features.shape[1], labels=labels)


def _log_sum_exp_classes(logits: NDArray[np.float64]) -> NDArray[np.float64]:
    """``log Σ_c exp z_c`` over the class axis (second to last) of ``logits (..., C, s)``, stable.

    Works in place: ``logits`` (a temporary) is overwritten.
    """
    top = logits.max(axis=-2, keepdims=True)
    np.subtract(logits, top, out=logits)
    np.exp(logits, out=logits)
    total = logits.sum(axis=-2)
    np.log(total, out=total)
    total += top[..., 0, :]
    return total


@dataclass(frozen=True)
class GMMClients:
    """Training and held-out data of a batch of GMM-task clients.

    ``*_inputs`` are (n, s, d) features, ``*_labels`` (n, s) class indices.

    The kernels are batched matrix products over clients (numpy ``matmul``,
    BLAS), with the class axis before the sample axis: ``logits = W X̃ᵀ`` is
    ``(C, d+1) × (d+1, s)`` per client and model, all ``K`` models of a client
    in one product.  The cross-entropy is ``mean_s logsumexp_c z − ⟨W, M⟩``
    and its gradient ``softmax(z) X̃ / s − M``, with the per-client label moment
    ``M = onehot(y)ᵀ X̃ / s`` computed once per batch (the label part of both
    is linear in ``W``, like the linear task's moments).
    """

    client_ids: NDArray[np.int64]
    groups: NDArray[np.int64]
    train_inputs: NDArray[np.float64]
    train_labels: NDArray[np.int64]
    test_inputs: NDArray[np.float64]
    test_labels: NDArray[np.int64]
    num_classes: int
    local_steps: int
    learning_rate: float

    @property
    def num_examples(self) -> NDArray[np.int64]:
        """``n_i`` (equal for all GMM clients)."""
        return np.full(len(self.client_ids), self.train_inputs.shape[1], dtype=np.int64)

    @cached_property
    def _train(self) -> _SplitArrays:
        return _split_arrays(self.train_inputs, self.train_labels, self.num_classes)

    @cached_property
    def _test(self) -> _SplitArrays:
        return _split_arrays(self.test_inputs, self.test_labels, self.num_classes)

    def _as_matrices(self, models: NDArray[np.floating]) -> NDArray[np.float64]:
        """Flat ``(..., P)`` parameters as ``(..., C, d+1)`` matrices."""
        models = np.asarray(models, dtype=np.float64)
        width = self.train_inputs.shape[-1] + 1
        if models.shape[-1] != self.num_classes * width:
            raise ValueError(f"models must have P = {self.num_classes * width} parameters, got {models.shape}")
        return models.reshape(models.shape[:-1] + (self.num_classes, width))

    def losses(self, cluster_models: NDArray[np.floating], split: str = "train") -> NDArray[np.float64]:
        """Mean cross-entropy of every model on every client, shape (n, K).

        ``cluster_models`` is ``(K, P)`` (shared) or ``(n, K, P)`` (one set per client).
        """
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        data = self._train if split == "train" else self._test
        weights = self._as_matrices(cluster_models)                      # (K, C, d+1) or (n, K, C, d+1)
        num_clusters, classes, width = weights.shape[-3:]
        stacked = weights.reshape(weights.shape[:-3] + (num_clusters * classes, width))
        logits = np.matmul(stacked, data.features_t)                      # (n, K·C, s)
        logits = logits.reshape(len(logits), num_clusters, classes, -1)
        log_normaliser = _log_sum_exp_classes(logits).mean(axis=-1)      # (n, K)
        flat = weights.reshape(weights.shape[:-2] + (-1,))               # (K, P) or (n, K, P)
        moments = data.label_moments.reshape(len(logits), -1)            # (n, P)
        picked = moments @ flat.T if flat.ndim == 2 else np.matmul(flat, moments[:, :, None])[..., 0]
        return log_normaliser - picked                                   # mean_s (logsumexp − z_y)

    def metrics(self, cluster_models: NDArray[np.floating], split: str = "test") -> dict[str, NDArray[np.float64]]:
        """``accuracy``: share of each client's samples whose largest logit is the label, (n, K).

        ``cluster_models`` is ``(K, P)`` (shared) or ``(n, K, P)`` (one set per client).
        """
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        data = self._train if split == "train" else self._test
        weights = self._as_matrices(cluster_models)                      # (K, C, d+1) or (n, K, C, d+1)
        if weights.ndim == 3:
            weights = np.broadcast_to(weights, (len(data.labels),) + weights.shape)
        logits = np.matmul(weights, data.features_t[:, None])            # (n, K, C, s)
        return {"accuracy": (logits.argmax(axis=2) == data.labels[:, None, :]).mean(axis=-1)}

    def local_update(
        self, models: NDArray[np.floating], client_index: NDArray[np.int64], round_index: int
    ) -> NDArray[np.floating]:
        """``E`` full-batch gradient steps of model ``j`` on client ``client_index[j]``."""
        data = self._train
        client_index = np.asarray(client_index)
        if len(client_index) == len(self.client_ids) and np.array_equal(client_index, np.arange(len(client_index))):
            features_t, features, label_moments = data.features_t, data.features, data.label_moments
        else:
            features_t, features = data.features_t[client_index], data.features[client_index]
            label_moments = data.label_moments[client_index]
        weights = self._as_matrices(models).copy()                        # (m, C, d+1)
        # One set of buffers for the E steps (fresh temporaries each step cost page faults, not flops).
        samples = features.shape[1]
        probabilities = np.empty(weights.shape[:2] + (samples,))          # logits → softmax, (m, C, s)
        column = np.empty((len(weights), 1, samples))                     # max, then sum, over classes
        gradient = np.empty_like(weights)
        for _ in range(self.local_steps):
            np.matmul(weights, features_t, out=probabilities)
            np.max(probabilities, axis=1, keepdims=True, out=column)
            np.subtract(probabilities, column, out=probabilities)
            np.exp(probabilities, out=probabilities)
            np.sum(probabilities, axis=1, keepdims=True, out=column)
            np.divide(probabilities, column, out=probabilities)
            np.matmul(probabilities, features, out=gradient)
            np.divide(gradient, samples, out=gradient)
            np.subtract(gradient, label_moments, out=gradient)            # softmax(z) X̃ / s − M
            np.multiply(gradient, self.learning_rate, out=gradient)
            np.subtract(weights, gradient, out=weights)
        return weights.reshape(len(weights), -1)


ENTRANCES = ("any", "collapsed")
"""Round-zero entrances of :class:`GMMTask` (``entrance``)."""
ORACLE_NEUTRAL = dict(local_steps=1, learning_rate=1.0, init_radius=0.0, init_jitter=0.0, entrance="any",
                      max_init_draws=1, rounds=1)
"""Settings that do not change the data: reset in the oracle fit's cache key."""


@dataclass(frozen=True)
class GMMTask:
    """Configuration of the multiclass Gaussian-mixture task (see the module docstring).

    Parameters
    ----------
    num_clients : int
        ``n`` (≥ ``num_groups``); client ``i`` is in group ``i mod G``.  Paper: 30.
    num_groups, num_classes, dimension : int
        ``G = 3``, ``C = 5``, ``d = 10`` (paper).
    centre_norm : float
        ``‖μ_g‖`` (> 0).
    noise_std : float
        ``σ`` (> 0).
    teacher_scale : float
        Entry std of ``V_g`` times ``√(d+1)`` (> 0).
    label_temperature : float
        Softmax temperature of the teacher (> 0).
    samples_per_client, test_samples_per_client : int
        Training and held-out samples per client (≥ 1).
    local_steps : int
        ``E`` (≥ 1).
    learning_rate : float
        ``η_loc`` in ``(0, 2]``.
    init_radius : float
        ``R`` (≥ 0).
    init_jitter : float
        Norm of each initial model's offset from ``ū(R)`` (≥ 0).
    entrance : {"collapsed", "any"}
        ``"collapsed"`` (default): the first init draw with ``K^0 < K``; ``"any"``: draw 0
        (module docstring).
    max_init_draws : int
        Draws ``"collapsed"`` may take before it raises (≥ 1).
    rounds : int
        ``T`` hint for experiments (≥ 1).
    seed : int
        Data, task and initialisation seed (≥ 0).
    """

    num_clients: int = 30
    num_groups: int = 3
    num_classes: int = 5
    dimension: int = 10
    centre_norm: float = 1.0
    noise_std: float = 1.0
    teacher_scale: float = 3.0
    label_temperature: float = 1.0
    samples_per_client: int = 50
    test_samples_per_client: int = 50
    local_steps: int = 5
    learning_rate: float = 0.5
    init_radius: float = 12.0
    init_jitter: float = 0.1
    entrance: str = "collapsed"
    max_init_draws: int = 1000
    rounds: int = 200
    seed: int = 0
    name: str = "gmm"

    def __post_init__(self) -> None:
        validate_task_settings(self, "gmm", integers=(
            "num_clients", "num_groups", "num_classes", "dimension", "samples_per_client", "test_samples_per_client",
            "local_steps", "max_init_draws", "rounds", "seed"), numbers=(
            "centre_norm", "noise_std", "teacher_scale", "label_temperature", "learning_rate", "init_radius",
            "init_jitter"), checks=lambda: [
            (self.num_groups >= 1, "num-groups", self.num_groups, "an integer ≥ 1"),
            (self.num_clients >= self.num_groups, "num-clients", self.num_clients,
             f"an integer ≥ num-groups ({self.num_groups})"),
            (self.num_classes >= 2, "num-classes", self.num_classes, "an integer ≥ 2"),
            (self.dimension >= 1, "dimension", self.dimension, "an integer ≥ 1"),
            (self.centre_norm > 0, "centre-norm", self.centre_norm, "> 0"),
            (self.noise_std > 0, "noise-std", self.noise_std, "> 0"),
            (self.teacher_scale > 0, "teacher-scale", self.teacher_scale, "> 0"),
            (self.label_temperature > 0, "label-temperature", self.label_temperature, "> 0"),
            (self.samples_per_client >= 1, "samples-per-client", self.samples_per_client, "an integer ≥ 1"),
            (self.test_samples_per_client >= 1, "test-samples-per-client", self.test_samples_per_client,
             "an integer ≥ 1"),
            (self.local_steps >= 1, "local-steps", self.local_steps, "an integer ≥ 1"),
            (0 < self.learning_rate <= 2, "learning-rate", self.learning_rate, "(0, 2]"),
            (self.init_radius >= 0, "init-radius", self.init_radius, "≥ 0"),
            (self.init_jitter >= 0, "init-jitter", self.init_jitter, "≥ 0"),
            (self.entrance in ENTRANCES, "entrance", self.entrance, f"one of {ENTRANCES}"),
            (self.max_init_draws >= 1, "max-init-draws", self.max_init_draws, "an integer ≥ 1"),
            (self.rounds >= 1, "rounds", self.rounds, "an integer ≥ 1"),
            (self.seed >= 0, "seed", self.seed, "an integer ≥ 0"),
        ])

    # ------------------------------------------------------------------ #
    # Task constants
    # ------------------------------------------------------------------ #
    @property
    def num_parameters(self) -> int:
        """``P = C (d+1)``."""
        return self.num_classes * (self.dimension + 1)

    @cached_property
    def _constants(self) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        rng = generator(self.seed, 0, 0, Purpose.TASK)
        centres = rng.standard_normal((self.num_groups, self.dimension))
        centres *= self.centre_norm / np.linalg.norm(centres, axis=1, keepdims=True)
        teachers = rng.standard_normal((self.num_groups, self.num_classes, self.dimension + 1))
        teachers *= self.teacher_scale / np.sqrt(self.dimension + 1)
        centres.flags.writeable = teachers.flags.writeable = False
        return centres, teachers

    @property
    def centres(self) -> NDArray[np.float64]:
        """``μ_g``, shape (G, d)."""
        return self._constants[0]

    @property
    def teacher_parameters(self) -> NDArray[np.float64]:
        """``V_g / temperature`` flattened like a model, shape (G, P)."""
        return self._constants[1].reshape(self.num_groups, -1) / self.label_temperature

    @property
    def oracle_parameters(self) -> NDArray[np.float64]:
        """``β*_g``: logistic regression fitted on group ``g``'s pooled training data, shape (G, P).

        Cached per data configuration (tasks differing only in ``init_*``,
        ``local_steps``, ``learning_rate`` or ``rounds`` share one fit).
        """
        return _fitted_oracles(replace(self, **ORACLE_NEUTRAL))

    @property
    def group_proportions(self) -> NDArray[np.float64]:
        """Fraction of clients in each group."""
        return np.bincount(self.groups(np.arange(self.num_clients)), minlength=self.num_groups) / self.num_clients

    def groups(self, client_ids: NDArray[np.int64]) -> NDArray[np.int64]:
        """Latent group of each client (evaluation only)."""
        return np.asarray(client_ids, dtype=np.int64) % self.num_groups

    # ------------------------------------------------------------------ #
    # Task protocol
    # ------------------------------------------------------------------ #
    def clients(self, client_ids: NDArray[np.int64]) -> GMMClients:
        """Data of the given clients; each client's data depend only on ``(seed, id)``."""
        client_ids = checked_client_ids(client_ids, self.num_clients)
        groups = self.groups(client_ids)
        centres, teachers = self._constants
        total = self.samples_per_client + self.test_samples_per_client
        inputs = np.empty((len(client_ids), total, self.dimension))
        labels = np.empty((len(client_ids), total), dtype=np.int64)
        for row, client in enumerate(client_ids):
            rng = generator(self.seed, client, 0, Purpose.DATA)
            inputs[row] = centres[groups[row]] + self.noise_std * rng.standard_normal((total, self.dimension))
            logits = _augment(inputs[row]) @ teachers[groups[row]].T / self.label_temperature
            cumulative = np.cumsum(np.exp(_log_softmax(logits)), axis=-1)
            uniforms = rng.random(total)[:, None] * cumulative[:, -1:]
            labels[row] = np.minimum(np.sum(cumulative <= uniforms, axis=-1), self.num_classes - 1)
        split = self.samples_per_client
        return GMMClients(
            client_ids=client_ids, groups=groups,
            train_inputs=inputs[:, :split], train_labels=labels[:, :split],
            test_inputs=inputs[:, split:], test_labels=labels[:, split:],
            num_classes=self.num_classes, local_steps=self.local_steps, learning_rate=self.learning_rate,
        )

    def _centred_unit_vectors(self, rng: np.random.Generator, count: int) -> NDArray[np.float64]:
        """Random unit vectors in ``R^P`` whose class rows sum to zero (softmax-identifiable part)."""
        vectors = rng.standard_normal((count, self.num_classes, self.dimension + 1))
        vectors -= vectors.mean(axis=1, keepdims=True)
        vectors = vectors.reshape(count, -1)
        return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)

    @property
    def directions(self) -> NDArray[np.float64]:
        """The fixed unit directions ``d_g``, shape (G, P)."""
        return self._centred_unit_vectors(generator(self.seed, 0, 0, Purpose.INIT), self.num_groups)

    def displaced_parameters(self, radius: float | None = None) -> NDArray[np.float64]:
        """``u_g(R) = β*_g + R d_g``, shape (G, P) (``R = init_radius`` by default)."""
        radius = self.init_radius if radius is None else radius
        return self.oracle_parameters + radius * self.directions

    def initial_centre(self, radius: float | None = None) -> NDArray[np.float64]:
        """``ū(R)``, the mean of the ``u_g(R)``, shape (P,)."""
        return self.displaced_parameters(radius).mean(axis=0)

    def _init_draw(self, draw: int, num_clusters: int) -> NDArray[np.float64]:
        """Init draw ``draw``: ``ū(R) + init_jitter · e_k`` with ``e_k`` from ``generator(seed, 0, draw, INIT)``."""
        rng = generator(self.seed, 0, draw, Purpose.INIT)
        self._centred_unit_vectors(rng, self.num_groups)  # the directions d_g come first in this stream
        jitter = self._centred_unit_vectors(rng, num_clusters)
        return self.initial_centre() + self.init_jitter * jitter

    def initial_draw(self, num_clusters: int) -> tuple[NDArray[np.float64], int]:
        """``(W^0, draws)``: the start of :attr:`entrance` and the number of init draws it took (cached).

        See :meth:`_search_draws`.
        """
        models, draws = _initial_draw(self, num_clusters)
        return models.copy(), draws

    def _search_draws(self, num_clusters: int) -> tuple[NDArray[np.float64], int]:
        """``(W^0, draws)``: the start of :attr:`entrance` and the number of init draws it took.

        ``"any"``: draw 0 (one draw).  ``"collapsed"``: the first draw whose controller-free greedy
        choices (training losses, ties to the lowest index) use fewer than ``num_clusters`` models.

        Raises
        ------
        ValueError
            ``"collapsed"`` with ``num_clusters < 2``, or no collapsed draw within ``max_init_draws``.
        """
        if self.entrance == "any":
            return self._init_draw(0, num_clusters), 1
        if num_clusters < 2:
            raise ValueError(f"gmm task setting 'entrance' = 'collapsed' needs num_clusters ≥ 2, got {num_clusters}")
        clients = self.clients(np.arange(self.num_clients))
        for draw in range(self.max_init_draws):
            models = self._init_draw(draw, num_clusters)
            if len(np.unique(np.argmin(clients.losses(models), axis=1))) < num_clusters:
                return models, draw + 1
        raise ValueError(f"gmm task (seed {self.seed}, R = {self.init_radius:g}): no collapsed entrance in "
                         f"max-init-draws = {self.max_init_draws} draws; allowed: a larger 'max-init-draws' "
                         f"or a larger 'init-jitter'")

    def initial_models(self, num_clusters: int) -> NDArray[np.float64]:
        """``W^0`` of shape (K, P): ``w_k^0 = ū(R) + init_jitter · e_k`` (the draw of :meth:`initial_draw`)."""
        return self.initial_draw(num_clusters)[0]
