"""Routing telemetry: one schema from the Flower strategy and the simulator, written round by round.

The strategy runs in this process on the plugin test's in-process grid (a
user's torch ClientApp for the linear task); its tables must equal those the
batched simulator writes for the same configuration.  The same comparison on
a real ``flwr run`` is in ``test_flower_runtime.py``.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from fedroute import ClusteredRouting, FedCAM, method_settings
from fedroute.monitoring.recorder import ALARMS_FILE, RunRecorder
from fedroute.monitoring.telemetry import (
    CLIENT_COLUMNS,
    CLIENTS_FILE,
    ROUND_COLUMNS,
    ROUNDS_FILE,
    ClientReplies,
    TelemetryWriter,
    client_columns,
    read_table,
    round_record,
)
from fedroute.simulation.fedcam import simulate_fedcam_batch
from fedroute.simulation.simulator import recording, simulate
from support.grid import InProcessGrid
from support.telemetry import assert_same_telemetry
from support.linear_app import TASK, linear_initial_models, linear_user_app

pytestmark = pytest.mark.usefixtures("task_identity")  # Flower messages need a task identity

NUM_ROUNDS = 12
def _simulated(directory: Path, method: str, routing, seed: int) -> None:
    recorder = RunRecorder(method, routing.num_clusters, routing.controllers, NUM_ROUNDS, telemetry_dir=directory,
                           progress_interval=None)
    recorder.start()
    if method == "fedcam":
        simulate_fedcam_batch([TASK], routing, NUM_ROUNDS, [seed], on_round=recording(recorder))
    else:
        simulate(TASK, routing, NUM_ROUNDS, seed, on_round=recording(recorder))
    recorder.close()


def test_strategy_and_simulator_write_the_same_telemetry(tmp_path: Path) -> None:
    seed = 7
    for method in ("greedy", "exp3", "sync-entry", "fedcam"):
        overrides = {"entry_threshold": 1.0, "hysteresis_min_rounds": 3, "block_length": 3}
        routing = method_settings(method, preset="linear", **(overrides if method != "fedcam" else {}))
        strategy_class = FedCAM if method == "fedcam" else ClusteredRouting
        strategy = strategy_class(routing, min_available_nodes=TASK.num_clients, seed=seed, run_key=method,
                                  telemetry_dir=tmp_path / "flower", progress_interval=None)
        strategy.start(InProcessGrid(linear_user_app(TASK), TASK.num_clients),
                       linear_initial_models(TASK, routing.num_clusters), num_rounds=NUM_ROUNDS)
        _simulated(tmp_path / "simulator", method, routing, seed)
        # the history a plugin user reads is the per-round table
        history = pd.DataFrame(strategy.history)
        table = read_table(tmp_path / "flower" / ROUNDS_FILE)
        pd.testing.assert_frame_equal(history, table[table.method == method].drop(columns="method")
                                      .reset_index(drop=True), check_dtype=False)
    assert_same_telemetry(tmp_path / "flower", tmp_path / "simulator")
    clients = read_table(tmp_path / "flower" / CLIENTS_FILE)
    assert len(clients) == 4 * NUM_ROUNDS * TASK.num_clients and clients.accepted.all()
    assert (clients.node_id.astype(int) >= 1000).all()  # the Flower node each reply came from
    exp3 = clients[clients.method == "exp3"]
    assert set(exp3.arm) == {"gr", "rh"} and set(exp3.controller) <= {"gr", "rh"}
    np.testing.assert_allclose(exp3[["route_probability_0", "route_probability_1"]].sum(axis=1), 1.0)
    assert clients[clients.method == "sync-entry"].entered.any()
    for name in (ROUNDS_FILE, CLIENTS_FILE):  # Parquet copies, same content
        pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "flower" / name.replace(".csv", ".parquet")),
                                      read_table(tmp_path / "flower" / name), check_dtype=False)


def _replies(num_clients: int, round_index: int) -> ClientReplies:
    rng = np.random.default_rng(round_index)
    metrics = [{"losses": rng.random(2).tolist(), "route-distribution": [1.0, 0.0], "controller": 0, "arm": 0,
                "feedback": 0.5, "entered": 0, "released": 0, "rounds-played": round_index + 1,
                "exp3-log-weights": [0.0, -0.5]} for _ in range(num_clients)]
    return ClientReplies.from_metrics(range(num_clients), [2**63 + 5] * num_clients, [0] * num_clients,
                                      [10.0] * num_clients, metrics, 2)


def test_each_round_is_on_disk_when_it_ends_and_a_torn_line_is_ignored(tmp_path: Path) -> None:
    writer = TelemetryWriter(tmp_path, num_clusters=2)
    for server_round in (1, 2, 3):
        replies = _replies(4, server_round - 1)
        record = round_record(server_round, replies, np.array([1.0, 0.0]), [True, False], 0, 0.1, ("gr", "rh"))
        writer.write_round("exp3", record, client_columns("exp3", server_round, replies, ("gr", "rh")))
        # readable as soon as the round is written, also by another reader
        assert read_table(tmp_path / ROUNDS_FILE).server_round.tolist() == list(range(1, server_round + 1))
    with open(tmp_path / CLIENTS_FILE, "a") as stream:  # a crash in the middle of a round's write
        stream.write("exp3,4,3,train,0,")
    clients = read_table(tmp_path / CLIENTS_FILE)
    assert len(clients) == 12 and clients.node_id.unique().tolist() == [str(2**63 + 5)]  # node ids beyond int64
    assert read_table(tmp_path / ROUNDS_FILE).loc[0, "exp3_weight_spread"] == 0.5
    with pytest.raises(ValueError, match="K = 3"):
        TelemetryWriter(tmp_path, num_clusters=3)  # another K cannot append to these files


def test_rejected_replies_are_rows_with_their_reason(tmp_path: Path) -> None:
    recorder = RunRecorder("greedy", 2, ("gr",), 3, telemetry_dir=tmp_path, progress_interval=None)
    recorder.start()
    replies = _replies(3, 0)
    traceback = "error reply: Traceback (most recent call last):\n  File \"client.py\", line 3\nRuntimeError: disk full"
    rejected = [{"server_round": 1, "phase": "train", "node_id": 77, "reason": traceback},
                {"server_round": 1, "phase": "train", "node_id": 79, "reason": "x" * 1000}]
    record = recorder.round(1, replies, np.array([1.0, 0.0]), [True, False], rejected)
    recorder.rejected_outside_rounds([{"server_round": 3, "phase": "evaluate", "node_id": 78, "reason": "late"}])
    recorder.close()
    assert record["rejected"] == 2 and record["num_replies"] == 3
    clients = read_table(tmp_path / CLIENTS_FILE)
    bad = clients[~clients.accepted]
    # one line each: a client's traceback keeps its label and its last line; a long reason is cut
    assert bad.reject_reason.tolist() == ["error reply: … RuntimeError: disk full", "x" * 299 + "…", "late"]
    assert bad.phase.tolist() == ["train", "train", "evaluate"] and bad.node_id.tolist() == ["77", "79", "78"]
    assert (bad.cluster == -1).all() and bad.loss_0.isna().all()


def test_docs_describe_every_column(repository: Path) -> None:
    text = (repository / "docs" / "telemetry.md").read_text()
    documented = set(re.findall(r"^\| `([a-z_<>0-9]+)` \|", text, flags=re.MULTILINE))
    for column in (*ROUND_COLUMNS, *CLIENT_COLUMNS):
        if column.name.startswith("arm_"):
            assert "arm_<controller>" in documented, column.name
        else:
            assert column.name in documented, f"docs/telemetry.md does not describe column {column.name!r}"
    assert ALARMS_FILE in text
