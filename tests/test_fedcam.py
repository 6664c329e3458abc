"""FedCAM: the client round by hand, the simulator against a plain reference loop, exact recovery
of an additive decomposition, collapse, batching."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import numpy as np

import torch

from fedroute.core.fedcam import combined_models, fedcam_client_round, task_uses_output_sum, uses_output_sum
from fedroute.simulation.fedcam import FedCAMTask, simulate_fedcam_batch
from fedroute.core.metrics import recovery_error
from fedroute.core.methods import method_settings
from fedroute.tasks.characters import CharactersTask, mlp_forward
from fedroute.tasks.linear import LinearTask
from support.app_config import app_run_config
from support.grid import InProcessGrid

pytestmark = pytest.mark.usefixtures("task_identity")  # Flower messages need a task identity


class QuadraticClients:
    """Loss ½‖w − a_i‖² per client; local update = one gradient step with rate η."""

    def __init__(self, targets: np.ndarray, learning_rate: float) -> None:
        self.targets = targets
        self.learning_rate = learning_rate
        self.client_ids = np.arange(len(targets))
        self.groups = np.arange(len(targets))
        self.num_examples = np.ones(len(targets), dtype=np.int64)

    def losses(self, models: np.ndarray, split: str = "train") -> np.ndarray:
        models = models if models.ndim == 3 else models[None]
        return 0.5 * np.sum((models - self.targets[:, None, :]) ** 2, axis=-1)

    def local_update(self, models: np.ndarray, client_index: np.ndarray, round_index: int) -> np.ndarray:
        return models - self.learning_rate * (models - self.targets[client_index])


def test_one_round_by_hand() -> None:
    clients = QuadraticClients(np.array([[1.0, 0.0], [0.0, 3.0]]), learning_rate=0.5)
    global_model = np.array([0.5, 0.5])
    cluster_models = np.array([[0.5, -0.5], [-0.5, 2.0]])
    # Combined: [1, 0] and [0, 2.5]; client 0 prefers 0 (loss 0), client 1 prefers 1 (loss 0.125).
    np.testing.assert_allclose(combined_models(global_model, cluster_models), [[1.0, 0.0], [0.0, 2.5]])
    result = fedcam_client_round(clients, global_model, cluster_models, 0)
    np.testing.assert_array_equal(result.routes, [0, 1])
    np.testing.assert_allclose(result.losses, [[0.0, 0.5 * (1 + 6.25)], [0.5 * (1 + 9), 0.125]])
    # Client 1: combined step 0.5·([0, 3] − [0, 2.5]) = [0, 0.25], shared equally by both parts.
    np.testing.assert_allclose(result.global_models, [[0.5, 0.5], [0.5, 0.625]])
    np.testing.assert_allclose(result.cluster_models, [[0.5, -0.5], [-0.5, 2.125]])


def test_exact_additive_decomposition_is_recovered() -> None:
    # Noiseless groups θ_g = ±2e_0 = shared 0 + group part; a start where the groups prefer different clusters.
    task = LinearTask(num_clients=10, noise_std=0.0, init="spread", init_spread=0.3, seed=1, samples_per_client=40)
    start = task.initial_models(2)
    theta = task.group_parameters
    preferred = [int(np.argmin(np.linalg.norm(start - theta[g], axis=1))) for g in range(2)]
    assert preferred[0] != preferred[1], "the test needs a favourable start"
    history = simulate_fedcam_batch([task], method_settings("greedy", preset="linear"), 300, [0], detail=True)
    final = history.cluster_models[-1, 0]
    assert recovery_error(final, theta) < 1e-6
    # Evaluation uses the combined predictor: one global part shared by both clusters plus each cluster part.
    glob = history.detail["global_models"][-1, 0]
    np.testing.assert_allclose(final, glob + history.detail["cluster_parts"][0], atol=1e-12)
    assert np.linalg.norm(glob) > 1e-3  # the global part is trained, not left at its zero start


def test_fedcam_stays_collapsed_from_the_collapsed_start() -> None:
    tasks = [LinearTask(init="collapsed", seed=seed) for seed in range(3)]
    history = simulate_fedcam_batch(tasks, method_settings("greedy", preset="linear"), 150, [0, 1, 2])
    errors = recovery_error(history.cluster_models[-1], tasks[0].group_parameters)
    assert np.all(errors >= 0.5)
    assert np.all(history.routes == 0)  # nobody ever routes to the starved cluster


def _fedcam_reference(task: LinearTask, num_clusters: int, num_rounds: int) -> tuple[np.ndarray, np.ndarray]:
    """FedCAM written out client by client and round by round (no batching, no shared helpers):
    each client picks ``argmin_k L_i(Θ_glob + Θ_k)`` (ties to the lowest k), takes the task's local
    update of that combined model and splits the displacement equally between the two parts;
    the server averages Θ_k over its clients and Θ_glob over all (sample weighted).  Returns the
    routes (T, n) and the combined models (T+1, K, P)."""
    clients = task.clients(np.arange(task.num_clients))
    parts = np.array(task.initial_models(num_clusters), dtype=np.float64)
    shared = np.zeros(parts.shape[1])
    weights = clients.num_examples.astype(np.float64)
    routes, combined = [], [parts + shared]
    for round_index in range(num_rounds):
        chosen, new_shared, new_parts = [], [], []
        for i in range(task.num_clients):
            losses = [clients.losses((shared + parts[k])[None], "train")[i, 0] for k in range(num_clusters)]
            k = min(range(num_clusters), key=lambda c: (losses[c], c))
            start = shared + parts[k]
            step = clients.local_update(start[None], np.array([i]), round_index)[0] - start
            chosen.append(k)
            new_shared.append(shared + step / 2)
            new_parts.append(parts[k] + step / 2)
        chosen = np.array(chosen)
        shared = sum(w * g for w, g in zip(weights, new_shared)) / weights.sum()
        for k in range(num_clusters):
            members = np.flatnonzero(chosen == k)
            if members.size:
                parts[k] = sum(weights[i] * new_parts[i] for i in members) / weights[members].sum()
        routes.append(chosen)
        combined.append(parts + shared)
    return np.array(routes), np.array(combined)


def test_fedcam_simulator_equals_a_plain_reference() -> None:
    task = LinearTask(num_clients=6, init="spread", init_spread=1.5, seed=2, samples_per_client=12)
    routes, combined = _fedcam_reference(task, 2, 25)
    assert 0 < (routes == 1).mean() < 1  # both clusters are used: the comparison is not trivial
    batch = simulate_fedcam_batch([task], method_settings("greedy", preset="linear"), 25, [0])
    np.testing.assert_array_equal(batch.routes[:, 0], routes)
    np.testing.assert_allclose(batch.cluster_models[:, 0], combined, rtol=0, atol=1e-12)


def test_batched_fedcam_equals_single_runs() -> None:
    tasks = [LinearTask(num_clients=8, init="spread", init_spread=1.0 + seed, seed=seed) for seed in range(3)]
    batch = simulate_fedcam_batch(tasks, method_settings("greedy", preset="linear"), 30, [0, 1, 2])
    for index, task in enumerate(tasks):
        single = simulate_fedcam_batch([task], method_settings("greedy", preset="linear"), 30, [index])
        np.testing.assert_allclose(batch.cluster_models[:, index], single.cluster_models[:, 0], atol=1e-12)
        np.testing.assert_array_equal(batch.routes[:, index], single.routes[:, 0])


# --------------------------------------------------------------------------- output-sum form
@dataclass(frozen=True)
class LinearOutputSumClients:
    """The linear task's clients in FedCAM's output-sum form, computed from the raw samples.

    ``h(x; g) + f(x; θ) = xᵀg + xᵀθ`` with the loss ``½ mean (output − y)²``; the joint update takes
    ``E`` gradient steps on ``(g, θ)`` with ``η/2`` per part.  Nothing here uses ``g + θ`` as a model.
    """

    client_ids: np.ndarray
    groups: np.ndarray
    num_examples: np.ndarray
    train_inputs: np.ndarray
    train_targets: np.ndarray
    test_inputs: np.ndarray
    test_targets: np.ndarray
    local_steps: int
    learning_rate: float

    @classmethod
    def of(cls, task: LinearTask, client_ids: np.ndarray) -> "LinearOutputSumClients":
        samples = task.samples(client_ids)
        return cls(samples.client_ids, samples.groups, np.full(len(client_ids), task.samples_per_client),
                   samples.train_inputs, samples.train_targets, samples.test_inputs, samples.test_targets,
                   task.local_steps, task.learning_rate)

    def _outputs(self, weights: np.ndarray, inputs: np.ndarray) -> np.ndarray:
        return np.einsum("nsd,n...d->n...s", inputs, weights)

    def losses(self, models: np.ndarray, split: str = "train") -> np.ndarray:
        raise AssertionError("the output-sum form must not score a parameter vector")

    def local_update(self, models: np.ndarray, client_index: np.ndarray, round_index: int) -> np.ndarray:
        raise AssertionError("the output-sum form must not train a parameter vector")

    def output_sum_losses(self, global_models, cluster_models, split="train"):
        inputs, targets = ((self.train_inputs, self.train_targets) if split == "train"
                           else (self.test_inputs, self.test_targets))
        n = len(inputs)
        clusters = np.broadcast_to(cluster_models, (n,) + np.shape(cluster_models)[-2:])
        outputs = self._outputs(np.broadcast_to(global_models, (n, clusters.shape[-1])), inputs)[:, None, :] \
            + self._outputs(clusters, inputs)
        return 0.5 * np.mean((outputs - targets[:, None, :]) ** 2, axis=-1)

    def output_sum_update(self, global_models, cluster_models, client_index, round_index):
        inputs, targets = self.train_inputs[client_index], self.train_targets[client_index]
        glob, cluster = np.array(global_models, dtype=float), np.array(cluster_models, dtype=float)
        for _ in range(self.local_steps):
            residual = self._outputs(glob, inputs) + self._outputs(cluster, inputs) - targets
            gradient = np.einsum("ns,nsd->nd", residual, inputs) / inputs.shape[1]  # the same for both parts
            glob, cluster = glob - 0.5 * self.learning_rate * gradient, cluster - 0.5 * self.learning_rate * gradient
        return glob, cluster


class LinearOutputSumTask:
    """:class:`LinearTask` whose clients are :class:`LinearOutputSumClients` (the output-sum form)."""

    def __init__(self, task: LinearTask) -> None:
        self.task, self.num_clients, self.name = task, task.num_clients, "linear-output-sum"

    def clients(self, client_ids: np.ndarray) -> LinearOutputSumClients:
        return LinearOutputSumClients.of(self.task, np.asarray(client_ids))

    def initial_models(self, num_clusters: int) -> np.ndarray:
        return self.task.initial_models(num_clusters)

    def initial_global_model(self) -> np.ndarray:
        return np.zeros(self.task.dimension)


@pytest.mark.parametrize("local_steps", [1, 3])
def test_output_sum_form_on_the_linear_model_equals_the_additive_form(local_steps: int) -> None:
    """The linear case: FedCAM on two networks' summed outputs (joint GD, η/2 per part) is exactly the
    additive form (the task's update of Θ_glob + Θ_k, displacement split equally)."""
    tasks = [LinearTask(num_clients=12, init="spread", init_spread=1.5, local_steps=local_steps, seed=seed)
             for seed in range(3)]
    routing = method_settings("fedcam", preset="linear")
    additive = simulate_fedcam_batch(tasks, routing, 40, [0, 1, 2], detail=True)
    output_sum = simulate_fedcam_batch([LinearOutputSumTask(t) for t in tasks], routing, 40, [0, 1, 2], detail=True)
    np.testing.assert_array_equal(output_sum.routes, additive.routes)
    assert len(np.unique(additive.routes)) == 2  # both clusters are used: the parts really differ
    pairs = output_sum.cluster_models                                  # [Θ_glob | Θ_k], (T+1, R, K, 2d)
    assert pairs.shape[-1] == 2 * tasks[0].dimension
    np.testing.assert_allclose(pairs[..., :5] + pairs[..., 5:], additive.cluster_models, rtol=0, atol=1e-10)
    np.testing.assert_allclose(output_sum.detail["global_models"], additive.detail["global_models"], atol=1e-10)
    np.testing.assert_allclose(output_sum.detail["cluster_parts"], additive.detail["cluster_parts"], atol=1e-10)
    assert np.abs(additive.detail["global_models"][-1]).max() > 1e-3  # the global part is trained
    # Scoring the pairs through FedCAMTask gives the combined predictors' losses.
    scored = FedCAMTask(LinearOutputSumTask(tasks[0])).clients(np.arange(12)).losses(pairs[-1, 0], "test")
    np.testing.assert_allclose(scored, tasks[0].clients(np.arange(12)).losses(additive.cluster_models[-1, 0], "test"),
                               rtol=1e-10)


SMALL_CHARACTERS = dict(num_clients=4, pretrain_epochs=3, alpha=0.7, seed=0)


def _reference_loss(task: CharactersTask, clients, glob, cluster, row: int):
    """The mean cross-entropy of ``mlp(x; glob) + mlp(x; cluster)`` on client ``row`` (torch autograd)."""
    weights = torch.from_numpy(clients.train_weights[row])
    x, y = torch.from_numpy(clients.train_inputs[row]), torch.from_numpy(clients.train_labels[row])
    logits = mlp_forward(glob, x, task.hidden_units, task.classes) + mlp_forward(cluster, x, task.hidden_units,
                                                                                 task.classes)
    return (torch.nn.functional.cross_entropy(logits, y, reduction="none") * weights).sum()


def test_characters_output_sum_kernels_are_two_networks_summed() -> None:
    task = CharactersTask(**SMALL_CHARACTERS)
    clients = task.clients(np.arange(task.num_clients))
    models = task.initial_models(2)
    start = task.initial_global_model()
    hidden_end = task.hidden_units * task.input_size + task.hidden_units  # W1, b1 end here
    assert np.all(start[hidden_end:] == 0) and np.any(start[:hidden_end] != 0)
    assert np.array_equal(start[:hidden_end], task.pretrained()["xi"][:hidden_end])
    # Zero output: the combined predictors start at W^0.  Two float32 code paths (the output-sum kernel
    # and the plain one) sum in different orders: on some CPUs (AMD EPYC) they differ by an ulp (2.4e-7
    # at a loss of 2), so they are compared within a few float32 ulps, not exactly.
    np.testing.assert_allclose(clients.output_sum_losses(start, models), clients.losses(models),
                               rtol=4 * np.finfo(np.float32).eps, atol=0)
    rng = np.random.default_rng(0)
    glob = (start + 0.05 * rng.standard_normal(start.shape)).astype(np.float32)
    losses = clients.output_sum_losses(glob, models, "train")
    trained_global, trained_cluster = clients.output_sum_update(np.stack([glob, glob]), models[[1, 0]],
                                                                np.array([2, 3]), 0)
    for row, (k, client) in enumerate(zip([1, 0], [2, 3])):
        g = torch.tensor(glob, requires_grad=True)
        c = torch.tensor(models[k], requires_grad=True)
        loss = _reference_loss(task, clients, g, c, client)
        loss.backward()
        np.testing.assert_allclose(losses[client, k], loss.item(), rtol=1e-5)
        step = 0.5 * task.learning_rate                              # η/2 per part
        np.testing.assert_allclose(trained_global[row], glob - step * g.grad.numpy(), rtol=0, atol=1e-6)
        np.testing.assert_allclose(trained_cluster[row], models[k] - step * c.grad.numpy(), rtol=0, atol=1e-6)
        assert np.abs(g.grad.numpy()).max() > 1e-4 and np.abs(c.grad.numpy()).max() > 1e-4
    # Shared (K, P) and per-client (n, K, P) inputs agree.
    per_client = clients.output_sum_losses(np.stack([glob] * 4), np.stack([models] * 4), "test")
    np.testing.assert_allclose(per_client, clients.output_sum_losses(glob, models, "test"),
                               rtol=4 * np.finfo(np.float32).eps, atol=0)


def test_characters_fedcam_is_the_output_sum_form_and_trains_the_global_network() -> None:
    task = CharactersTask(**SMALL_CHARACTERS)
    assert uses_output_sum(task.clients(np.arange(2))) and task_uses_output_sum(task)
    assert not uses_output_sum(LinearTask().clients(np.arange(2))) and not task_uses_output_sum(LinearTask())
    history = simulate_fedcam_batch([task], method_settings("fedcam", preset="characters"), 3, [0], detail=True)
    start = task.initial_global_model()
    trained = history.detail["global_models"]                         # (T+1, 1, P)
    np.testing.assert_array_equal(trained[0, 0], start)
    hidden_end = task.hidden_units * task.input_size + task.hidden_units
    assert np.abs(trained[1, 0, hidden_end:]).max() > 0              # the output layer learns first…
    np.testing.assert_array_equal(trained[1, 0, :hidden_end], start[:hidden_end])  # (zero W2: no hidden gradient)
    assert np.abs(trained[2, 0, :hidden_end] - start[:hidden_end]).max() > 0  # …then the hidden layer
    pairs = history.cluster_models                                    # [Θ_glob | Θ_k]
    np.testing.assert_array_equal(pairs[0, 0], FedCAMTask(task).initial_models(2))


def test_flower_fedcam_on_characters_is_the_simulators_output_sum_form(tmp_path) -> None:
    """ServerApp's run_method + the built-in ClientApp (in process): the same routes, parts and
    combined-predictor evaluation as the simulator — one implementation in both runtimes."""
    from flwr.app import MessageType

    from fedroute.client import app as client_app
    from fedroute.server.app import make_strategy, run_method
    from fedroute.server.run_config import parse_run_config

    run_config = app_run_config({"task": "characters", "num-clients": 4, "pretrain-epochs": 3, "alpha": 0.7,
                                 "seed": 0, "num-server-rounds": 3, "method": "fedcam"})
    settings = parse_run_config(run_config)
    grid = InProcessGrid({MessageType.TRAIN: client_app.train, MessageType.EVALUATE: client_app.evaluate}, 4,
                         run_config)
    strategy = make_strategy(settings, "fedcam", tmp_path)
    run_method(grid, settings, "fedcam", strategy)
    assert not strategy.rejected
    batch = simulate_fedcam_batch([settings.task], settings.routing["fedcam"], 3, [settings.seed], detail=True)
    routes = np.array([[strategy.client_routes[t][c] for c in range(4)] for t in range(3)])
    np.testing.assert_array_equal(routes, batch.routes[:, 0])
    parts = np.stack([model["weights"] for model in strategy.cluster_models])
    np.testing.assert_allclose(parts, batch.detail["cluster_parts"][0], rtol=0, atol=1e-6)
    np.testing.assert_allclose(strategy.global_model["weights"], batch.detail["global_models"][-1, 0], rtol=0,
                               atol=1e-6)
    assert np.abs(strategy.global_model["weights"]).max() > 0
    evaluated = np.stack([reply.train_losses for reply in sorted(strategy.final_evaluation, key=lambda r: r.client_id)])
    expected = FedCAMTask(settings.task).clients(np.arange(4)).losses(batch.cluster_models[-1, 0])
    np.testing.assert_allclose(evaluated, expected, rtol=1e-5)
    parameter_sum = settings.task.clients(np.arange(4)).losses(np.stack([m["weights"] for m in
                                                                        strategy.combined_models()]))
    assert np.abs(evaluated - parameter_sum).max() > 1e-4  # not the parameter-sum predictor
