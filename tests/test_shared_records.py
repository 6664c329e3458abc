"""The records of a round are built once and shared by its messages; no message's content leaks into another's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from flwr.app import ArrayRecord, ConfigRecord

from fedroute.core.settings import RoutingSettings
from fedroute.deployment.launcher import run_flower_app
from fedroute.simulation.simulator import simulate
from fedroute.strategies.clustered import ClusteredRouting
from fedroute.strategies.records import array_record, pack_cluster_models
from support.app_config import app_settings

NUM_NODES = 6


class _Nodes:
    def get_node_ids(self) -> list[int]:
        return list(range(100, 100 + NUM_NODES))


def _strategy() -> ClusteredRouting:
    strategy = ClusteredRouting(RoutingSettings(num_clusters=2), min_available_nodes=NUM_NODES)
    strategy.cluster_models = [{"w": np.full(3, float(k)), "b": np.array([k + 0.5])} for k in range(2)]
    return strategy


@pytest.mark.usefixtures("task_identity")
def test_a_rounds_messages_share_the_model_and_config_records_built_once() -> None:
    strategy = _strategy()
    messages = list(strategy.configure_train(1, strategy.state.packed_models(), ConfigRecord(), _Nodes()))
    assert len(messages) == NUM_NODES and len({id(message.content) for message in messages}) == NUM_NODES
    for key in ("cluster-0", "cluster-1", "config"):
        assert len({id(message.content[key]) for message in messages}) == 1, key
    # The packed record start() carries between rounds holds the same encoded arrays: nothing is unpacked
    # or encoded again for the next configure_train, and the next round's messages share them as well.
    packed = strategy.state.packed_models()
    assert packed["cluster-1/w"] is messages[0].content["cluster-1"]["w"]
    again = list(strategy.configure_train(2, packed, ConfigRecord(), _Nodes()))
    assert again[0].content["cluster-0"] is messages[0].content["cluster-0"]
    np.testing.assert_array_equal(strategy.cluster_models[1]["w"], [1.0, 1.0, 1.0])


@pytest.mark.usefixtures("task_identity")
def test_new_models_get_new_records_and_a_foreign_packed_record_is_unpacked() -> None:
    strategy = _strategy()
    first = list(strategy.configure_train(1, strategy.state.packed_models(), ConfigRecord(), _Nodes()))[0]
    replaced = [{"w": np.full(3, 7.0), "b": np.array([7.5])}, {"w": np.full(3, 8.0), "b": np.array([8.5])}]
    second = list(strategy.configure_train(2, pack_cluster_models(replaced), ConfigRecord(), _Nodes()))[0]
    np.testing.assert_array_equal(second.content["cluster-1"]["w"].numpy(), [8.0, 8.0, 8.0])
    np.testing.assert_array_equal(first.content["cluster-1"]["w"].numpy(), [1.0, 1.0, 1.0])  # the sent one kept
    assert isinstance(strategy.state.packed_models(), ArrayRecord)
    strategy.cluster_models = [{"w": np.zeros(3), "b": np.zeros(1)}] * 2
    third = list(strategy.configure_train(3, strategy.state.packed_models(), ConfigRecord(), _Nodes()))[0]
    assert third.content["cluster-0"] is not second.content["cluster-0"]
    np.testing.assert_array_equal(third.content["cluster-0"]["w"].numpy(), np.zeros(3))
    assert array_record(replaced[0])["w"].numpy().tolist() == [7.0, 7.0, 7.0]


@pytest.mark.process
def test_a_clientapp_overwriting_what_it_received_changes_nothing_for_the_others(test_app, tmp_path: Path) -> None:
    app_dir = test_app("overwriting")
    rounds = 4
    config = {"method": "exp3", "num-clients": NUM_NODES, "num-server-rounds": rounds, "seed": 3,
              "block-length": 2, "results-dir": str(tmp_path / "results")}
    result = run_flower_app(app_dir, config, num_supernodes=NUM_NODES, timeout=600)
    assert result.completed, result.stdout[-3000:]
    (directory,) = [path for path in (tmp_path / "results").iterdir() if path.is_dir()]
    settings = app_settings(config)
    expected = simulate(settings.task, settings.routing["exp3"], rounds, settings.seed)
    routes = pd.read_csv(directory / "routes.csv").pivot(index="round_index", columns="client_id", values="cluster")
    np.testing.assert_array_equal(routes.to_numpy(), expected.routes)
    models = np.load(directory / "cluster_models.npz")
    final = np.stack([models[f"exp3/cluster-{k}"] for k in range(2)])
    np.testing.assert_allclose(final, expected.cluster_models[-1], rtol=0, atol=1e-12)
    assert np.abs(final).max() < 1e3  # no overwritten value (1e6) was averaged in


@pytest.mark.parametrize("value", [
    np.arange(12, dtype=np.float32).reshape(3, 4), np.array(2.5), np.arange(5), np.zeros((0, 3)),
    np.array([True, False]), np.arange(12.0).reshape(4, 3).T, np.arange(6, dtype=">i4").reshape(2, 3),
    np.array([1 + 2j]), np.zeros(2, dtype=np.float16), np.array(["a", "b"]),
])
def test_encode_array_makes_the_array_flowers_constructor_makes(value: np.ndarray) -> None:
    from flwr.app import Array

    from fedroute.strategies.records import encode_array

    assert encode_array(value).__dict__ == Array(np.ascontiguousarray(value)).__dict__


def test_a_model_left_byte_for_byte_unchanged_keeps_its_record_and_a_changed_one_is_encoded_again() -> None:
    strategy = _strategy()
    state = strategy.state
    before = state.model_records()
    packed = state.packed_models()
    state.cluster_models = [{name: value.copy() for name, value in model.items()} for model in state.cluster_models]
    assert all(now is then for now, then in zip(state.model_records(), before))
    assert state.packed_models() is packed  # nothing changed: the packed record stays too
    changed = [{"w": np.full(3, 0.0), "b": np.array([-0.0])}, {"w": np.full(3, 1.0), "b": np.array([1.5])}]
    state.cluster_models = changed  # cluster 0's b changed (0.5 → -0.0); cluster 1 the same values
    records = state.model_records()
    assert records[1] is before[1] and records[0] is not before[0]
    assert state.packed_models() is not packed and state.packed_models()["cluster-1/w"] is before[1]["w"]
    np.testing.assert_array_equal(records[0]["b"].numpy(), [-0.0])
    state.cluster_models = [{"w": np.zeros(3), "b": np.array([0.0])}, changed[1]]  # 0.0 is not the sent -0.0
    assert np.signbit(state.model_records()[0]["b"].numpy()).tolist() == [False]
    changed[1]["w"][:] = 9.0  # changed in place, then assigned again: its bytes differ from the record's
    state.cluster_models = [state.cluster_models[0], changed[1]]
    np.testing.assert_array_equal(state.model_records()[1]["w"].numpy(), [9.0, 9.0, 9.0])
    assert before[1]["w"].numpy().tolist() == [1.0, 1.0, 1.0]  # a record sent earlier is never changed
