"""FedCAM: the client round by hand, the simulator against a plain reference loop, exact recovery
of an additive decomposition, collapse, batching."""

from __future__ import annotations

import numpy as np

from fedroute.client.fedcam import combined_models, fedcam_client_round
from fedroute.simulation.fedcam import simulate_fedcam_batch
from fedroute.simulation.metrics import recovery_error
from fedroute.strategies.methods import method_settings
from fedroute.tasks.linear import LinearTask


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
    history = simulate_fedcam_batch([task], method_settings("greedy", "linear"), 300, [0], detail=True)
    final = history.cluster_models[-1, 0]
    assert recovery_error(final, theta) < 1e-6
    # Evaluation uses the combined predictor: one global part shared by both clusters plus each cluster part.
    glob = history.detail["global_models"][-1, 0]
    np.testing.assert_allclose(final, glob + history.detail["cluster_parts"][0], atol=1e-12)
    assert np.linalg.norm(glob) > 1e-3  # the global part is trained, not left at its zero start


def test_fedcam_stays_collapsed_from_the_collapsed_start() -> None:
    tasks = [LinearTask(init="collapsed", seed=seed) for seed in range(3)]
    history = simulate_fedcam_batch(tasks, method_settings("greedy", "linear"), 150, [0, 1, 2])
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
    batch = simulate_fedcam_batch([task], method_settings("greedy", "linear"), 25, [0])
    np.testing.assert_array_equal(batch.routes[:, 0], routes)
    np.testing.assert_allclose(batch.cluster_models[:, 0], combined, rtol=0, atol=1e-12)


def test_batched_fedcam_equals_single_runs() -> None:
    tasks = [LinearTask(num_clients=8, init="spread", init_spread=1.0 + seed, seed=seed) for seed in range(3)]
    batch = simulate_fedcam_batch(tasks, method_settings("greedy", "linear"), 30, [0, 1, 2])
    for index, task in enumerate(tasks):
        single = simulate_fedcam_batch([task], method_settings("greedy", "linear"), 30, [index])
        np.testing.assert_allclose(batch.cluster_models[:, index], single.cluster_models[:, 0], atol=1e-12)
        np.testing.assert_array_equal(batch.routes[:, index], single.routes[:, 0])
