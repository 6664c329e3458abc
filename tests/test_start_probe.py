"""The start probe: in round 0 a client routed to a copy chains ``start_updates`` local updates
(fedroute.core.client_step.local_training, routed_has_copy), in the numpy core, through a TorchClient's
``train_fn`` and from the run config (``start-updates``; an option, 1 in every preset and the generic default)."""

from __future__ import annotations

import numpy as np
import pytest

from fedroute.core.client_step import local_training, routed_has_copy
from fedroute.core.methods import method_settings
from fedroute.core.settings import RoutingSettings
from support.app_config import app_run_config


class _PullClients:
    """Client ``i``'s update pulls a model a fraction ``rate`` of the way to its target (counts its calls)."""

    def __init__(self, targets: np.ndarray, rate: float = 0.1) -> None:
        self.targets, self.rate = np.asarray(targets, dtype=np.float64), rate
        self.client_ids = np.arange(len(targets))
        self.calls: list[np.ndarray] = []

    def local_update(self, models: np.ndarray, client_index: np.ndarray, round_index: int) -> np.ndarray:
        self.calls.append(np.asarray(client_index).copy())
        return models + self.rate * (self.targets[client_index] - models)


def _settings(start_updates: int) -> RoutingSettings:
    return RoutingSettings(num_clusters=3, start_updates=start_updates)


def test_a_copy_is_a_model_closer_than_the_clients_own_update() -> None:
    models = np.array([[0.0, 0.0], [0.0, 0.0], [5.0, 0.0]])
    routed = models[[0, 2]]
    moved_far = routed + np.array([[1.0, 0.0], [1.0, 0.0]])
    # client 0 sits on a model with an exact twin; client 2's nearest other model is 5 away, its update 1
    assert routed_has_copy(models, np.array([0, 2]), routed, moved_far).tolist() == [True, False]
    moved_more = routed + np.array([[0.1, 0.0], [6.0, 0.0]])
    assert routed_has_copy(models, np.array([0, 2]), routed, moved_more).tolist() == [True, True]
    # a model within the step counts as a copy (a warm start with a little noise), one beyond it does not
    near = np.array([[0.0, 0.0], [0.3, 0.0], [5.0, 0.0]])
    assert routed_has_copy(near, np.array([0]), near[[0]], near[[0]] + [[0.5, 0.0]]).tolist() == [True]
    assert routed_has_copy(near, np.array([0]), near[[0]], near[[0]] + [[0.2, 0.0]]).tolist() == [False]
    # one model has no copy; batched (n, K, P) models give the rows' own answers
    assert routed_has_copy(models[:1], np.array([0]), models[:1], models[:1] + 1.0).tolist() == [False]
    batched = np.stack([models, near])
    assert routed_has_copy(batched, np.array([0, 0]), batched[:, 0], batched[:, 0] + [[0.2, 0.0], [0.2, 0.0]]
                           ).tolist() == [True, False]


def test_round_0_chains_start_updates_on_copies_only() -> None:
    targets = np.array([[1.0, 0.0], [0.0, 1.0], [4.0, 4.0]])
    clients = _PullClients(targets)
    models = np.array([[0.0, 0.0], [0.0, 0.0], [9.0, 9.0]])          # two copies and a distinct model
    routes = np.array([0, 1, 2])
    trained = local_training(clients, models, routes, 0, _settings(20))
    # clients 0 and 1 (on the copies) chained 20 pulls: w = target (1 - (1 - rate)^20)
    for client in (0, 1):
        np.testing.assert_allclose(trained[client], targets[client] * (1 - 0.9 ** 20), rtol=1e-12)
    # client 2 (9√2 from any other model, moved 0.1 · 5√2) trained once
    np.testing.assert_allclose(trained[2], models[2] + 0.1 * (targets[2] - models[2]), rtol=1e-12)
    assert len(clients.calls) == 20 and clients.calls[0].tolist() == [0, 1, 2]
    assert all(call.tolist() == [0, 1] for call in clients.calls[1:])


@pytest.mark.parametrize("round_index, start_updates", [(1, 20), (7, 20), (0, 1)])
def test_later_rounds_and_one_start_update_train_once(round_index: int, start_updates: int) -> None:
    clients = _PullClients(np.array([[1.0, 0.0], [0.0, 1.0], [4.0, 4.0]]))
    models = np.zeros((3, 2))
    trained = local_training(clients, models, np.array([0, 1, 2]), round_index, _settings(start_updates))
    np.testing.assert_allclose(trained, 0.1 * clients.targets, rtol=1e-12)
    assert len(clients.calls) == 1


def test_start_updates_is_validated_and_the_presets_do_not_probe() -> None:
    for bad in (0, -3, 1001, 2.5, True):
        with pytest.raises(ValueError, match="start_updates"):
            RoutingSettings(start_updates=bad)
    assert method_settings("greedy", num_clusters=4).start_updates == 1
    assert method_settings("exp3", num_clusters=4).start_updates == 1     # tried as the default, not adopted


def test_run_config_start_updates_reaches_the_routing_and_is_validated_naming_the_key() -> None:
    from fedroute.server.run_config import parse_run_config

    assert parse_run_config(app_run_config(preset="generic", **{"start-updates": 5})).routing["exp3"].start_updates == 5
    assert parse_run_config(app_run_config(preset="generic")).routing["exp3"].start_updates == 1
    for bad in (0, 1001, "five"):
        with pytest.raises(ValueError, match=r"'start-updates'.*\[1, 1000\]"):
            parse_run_config(app_run_config(**{"start-updates": bad}))


def test_a_torch_client_chains_its_train_fn_on_a_warm_start_copy() -> None:
    import torch

    from fedroute.client.torch_adapter import TorchClient

    torch.manual_seed(0)
    inputs, targets = torch.randn(16, 3), torch.randn(16, 1)
    model = torch.nn.Linear(3, 1).double()
    calls = []

    def train_fn(module):                                          # one full-batch SGD step
        calls.append(1)
        optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(module(inputs.double()), targets.double()).backward()
        optimizer.step()

    client = TorchClient(model, lambda module: 0.0, train_fn=train_fn, num_examples=16, batched=False)
    start = client.to_vector()
    copies = np.stack([start, start])                              # a warm start: K = 2 copies
    probed = local_training(client, copies, np.array([0]), 0, RoutingSettings(num_clusters=2, start_updates=3))
    assert len(calls) == 3
    client.load_vector(start)
    for _ in range(3):                                             # the same three steps, chained by hand
        train_fn(model)
    np.testing.assert_allclose(probed[0], client.to_vector(), rtol=1e-12, atol=1e-15)
    calls.clear()
    local_training(client, copies, np.array([0]), 1, RoutingSettings(num_clusters=2, start_updates=3))
    assert len(calls) == 1                                         # later rounds train once
