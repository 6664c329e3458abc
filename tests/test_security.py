"""One test (or a few) per attack and fault of issue 11's review, each by a direct call or a crafted message.

Every test here failed on the code before the fix (docs/security.md lists which
test shows which finding and what happens now).  The real-process faults
(a SuperNode SIGKILLed, the server side killed and restarted) are in
``tests/test_faults.py``; the property tests of the bounds in
``tests/test_identity_and_influence.py``.
"""

from __future__ import annotations

import json
import logging
import math
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
from flwr.app import Array, ArrayRecord, Context, Error, Message

from fedroute import protocol
from fedroute.core.agent import AgentState
from fedroute.client.state_store import load_agent_state, save_agent_state
from fedroute.server.results import write_results
from fedroute.server.run_config import parse_run_config
from fedroute.core.aggregation import hard_update_checked
from fedroute.strategies.checkpoint import CHECKPOINT_FILE, CheckpointError, load_checkpoint, save_checkpoint
from fedroute.strategies.clustered import ClusteredRouting
from fedroute.strategies.fedcam import FedCAM
from fedroute.core.influence import DEFAULT_MAX_WEIGHT_RATIO
from fedroute.core.methods import method_settings
from fedroute.monitoring.alarms import DeadFederation
from fedroute.strategies.rejections import MAX_RECORDED_PER_ROUND
from fedroute.strategies.validation import ReplyRejected, validate_train_reply
from support.app_config import app_run_config
from support.grid import builtin_grid, node_context, server_main
from support.replies import ROUTING, SHAPE, OnlineNodes, error_reply, reply, strategy, train_metrics

CAP = DEFAULT_MAX_WEIGHT_RATIO


# --------------------------------------------------------------------------- 1. sample-count takeover
HONEST_N = 100
ADVERSARY = {"node": 999, "client": 9, "n": 1e9, "value": -1000.0}


def _takeover_round(kind: type) -> ClusteredRouting:
    """Nine honest clients (n = 100): 0–3 in cluster 0 (model 1.0), 4–8 in cluster 1 (2.0); one node
    claims n = 10⁹ in cluster 0 with model −1000 (and, for FedCAM, global part −1000; honest: 1.0)."""
    fedcam = kind is FedCAM
    replies = [reply(100 + i, i, int(i >= 4), HONEST_N, 1.0 if i < 4 else 2.0, global_value=1.0 if fedcam else None)
               for i in range(9)]
    replies.insert(3, reply(ADVERSARY["node"], ADVERSARY["client"], 0, ADVERSARY["n"], ADVERSARY["value"],
                            global_value=ADVERSARY["value"] if fedcam else None))
    made = strategy(kind)
    made.aggregate_train(1, replies)
    return made


@pytest.mark.parametrize("kind", [ClusteredRouting, FedCAM])
def test_a_huge_sample_count_buys_at_most_the_capped_share(kind: type) -> None:
    """Before: cluster 0 = −999.999 and masses [1, 0] (the claimed n = 10⁹ took everything)."""
    made = _takeover_round(kind)
    cluster_0 = made.cluster_models[0]["w"]
    assert np.all(np.isfinite(cluster_0)) and np.all(cluster_0 == cluster_0[0])
    # cluster 0 = s·(−1000) + (1 − s)·1: the adversary's share s of cluster 0's weight
    share = (1.0 - cluster_0[0]) / (1.0 - ADVERSARY["value"])
    assert share == pytest.approx(CAP / (CAP + 4), abs=1e-12)  # weight 4·100 against 4 honest × 100
    # Its share of the masses: μ_1 = 500 / (900 + a) → a / (900 + a) = 1 − μ_1 / (500/900)
    mass_share = 1.0 - made.routing_masses[1] / (5 / 9)
    assert mass_share == pytest.approx(CAP / (CAP + 9), abs=1e-12) and mass_share < 0.31
    np.testing.assert_array_equal(made.cluster_models[1]["w"], 2.0)  # cluster 1: honest replies only
    if kind is FedCAM:
        global_share = (1.0 - made.global_model["w"][0]) / (1.0 - ADVERSARY["value"])
        assert global_share == pytest.approx(CAP / (CAP + 9), abs=1e-12)


# --------------------------------------------------------------------------- 2. permanent cluster death
@pytest.mark.parametrize(("claims", "description"), [
    ([(1e9, 1e300), (100, 1.0)], "1e300 with n = 1e9"),
    ([(1, 1.7e308), (1, 1.7e308)], "two replies of 1.7e308"),
    ([(1e9, -1.7e308), (1e9, -1.7e308), (5, 3.0)], "negative overflow"),
])
@pytest.mark.parametrize("kind", [ClusteredRouting, FedCAM])
def test_huge_finite_values_never_kill_a_cluster(kind: type, claims: list, description: str,
                                                 tmp_path: Path) -> None:
    """Before: the weighted sum overflowed to inf, the model was broadcast and every later reply failed."""
    fedcam = kind is FedCAM
    made = strategy(kind, checkpoint_dir=tmp_path)
    made.aggregate_train(1, [reply(10 + i, i, 0, n, value, global_value=value if fedcam else None)
                             for i, (n, value) in enumerate(claims)])
    made._save(1)
    assert np.all(np.isfinite(made.cluster_models[0]["w"])), description
    assert np.all(np.isfinite(made.routing_masses))
    if fedcam:
        assert np.all(np.isfinite(made.global_model["w"]))
    arrays, _ = load_checkpoint(tmp_path)
    assert all(np.all(np.isfinite(value)) for value in arrays.values())
    # The cluster lives on: the next honest round is accepted and moves it.
    made.aggregate_train(2, [reply(10 + i, i, 0, 10, 0.5, server_round=2, global_value=0.5 if fedcam else None)
                             for i in range(len(claims))])
    assert made.history[-1]["num_replies"] == len(claims) and made.history[-1]["rejected"] == 0
    np.testing.assert_allclose(made.cluster_models[0]["w"], 0.5)


def test_a_non_finite_aggregate_is_never_committed() -> None:
    """The simulator's clients are not validated: a NaN reply leaves its cluster's model as it was."""
    clusters = np.array([[1.0, 2.0], [3.0, 4.0]])
    replies = np.array([[np.nan, 0.0], [5.0, 5.0], [7.0, 7.0]])
    updated, kept = hard_update_checked(clusters, replies, np.array([0, 1, 1]), np.array([1.0, 1.0, 1.0]))
    np.testing.assert_array_equal(updated[0], [1.0, 2.0])
    np.testing.assert_array_equal(updated[1], [6.0, 6.0])
    assert kept.tolist() == [True, False]


# --------------------------------------------------------------------------- 3. identity spoofing
def test_a_node_cannot_reply_for_another_client() -> None:
    """Before: the spoofed reply arrived first, was averaged in, and the honest one was dropped (node −1)."""
    made = strategy()
    made.state.grid = OnlineNodes({101, 102, 103, 999})
    made.aggregate_train(1, [reply(101 + i, i, 0, 10, 1.0) for i in range(3)] + [reply(999, 9, 1, 10, 1.0)])
    spoofed = reply(999, 1, 0, 10, -1000.0, server_round=2)
    made.aggregate_train(2, [spoofed] + [reply(101 + i, i, 0, 10, 2.0, server_round=2) for i in range(3)])
    np.testing.assert_array_equal(made.cluster_models[0]["w"], 2.0)  # the honest replies only
    assert made.client_routes[1] == {0: 0, 1: 0, 2: 0}
    (entry,) = [r for r in made.rejected if r["server_round"] == 2]
    assert entry["node_id"] == 999 and "client 1" in entry["reason"] and "node 102" in entry["reason"]


def test_a_client_id_is_bound_by_its_first_reply_and_one_node_speaks_for_one_client(
        caplog: pytest.LogCaptureFixture) -> None:
    made = strategy()
    made.state.grid = OnlineNodes({101, 102})
    with caplog.at_level(logging.WARNING, logger="fedroute"):
        # Round 1: node 101 binds client 0; node 102's claim of the same id in the same round is refused.
        made.aggregate_train(1, [reply(101, 0, 0, 10, 1.0), reply(102, 0, 0, 10, 5.0)])
        # Node 101 is client 0's: it cannot also speak for client 7.
        made.aggregate_train(2, [reply(101, 7, 0, 10, 5.0, server_round=2)])
    np.testing.assert_array_equal(made.cluster_models[0]["w"], 1.0)
    reasons = [r["reason"] for r in made.rejected]
    assert "client 0 is bound to node 101" in reasons[0] and "node 102" in reasons[0]
    assert "node 101 speaks for client 0" in reasons[1]
    assert "node 102" in caplog.text and "node 101" in caplog.text


def test_a_restarted_node_takes_over_its_client_only_when_the_old_node_is_gone(
        caplog: pytest.LogCaptureFixture) -> None:
    made = strategy()
    online = OnlineNodes({101, 102})
    made.state.grid = online
    made.aggregate_train(1, [reply(101, 0, 0, 10, 1.0), reply(102, 1, 1, 10, 1.0)])
    online.node_ids.add(202)  # client 1's node restarted (new id) while Flower still lists the old one
    made.aggregate_train(2, [reply(202, 1, 1, 10, 3.0, server_round=2)])
    assert made.history[-1]["num_replies"] == 0 and "node 102, which is connected" in made.rejected[-1]["reason"]
    online.node_ids.discard(102)  # the old node's heartbeat expired
    with caplog.at_level(logging.WARNING, logger="fedroute"):
        made.aggregate_train(3, [reply(202, 1, 1, 10, 3.0, server_round=3)])
    np.testing.assert_array_equal(made.cluster_models[1]["w"], 3.0)
    assert made.bindings.as_mapping() == {0: 101, 1: 202}
    assert "client 1 moves from node 102" in caplog.text and "to node 202" in caplog.text


def test_bindings_survive_a_checkpoint(tmp_path: Path) -> None:
    made = strategy(checkpoint_dir=tmp_path)
    made.aggregate_train(1, [reply(101, 0, 0, 10, 1.0), reply(102, 1, 1, 10, 1.0)])
    made._save(1)
    resumed = strategy(checkpoint_dir=tmp_path)
    assert resumed._restore() == 1 and resumed.bindings.as_mapping() == {0: 101, 1: 102}
    resumed.aggregate_train(2, [reply(555, 0, 0, 10, -1.0, server_round=2)])
    assert resumed.history[-1]["num_replies"] == 0 and "bound to node 101" in resumed.rejected[-1]["reason"]


# --------------------------------------------------------------------------- 4. unbounded text
def test_reasons_never_embed_the_offending_value() -> None:
    """Before: a 2M-element list produced a 38M-character reason."""
    huge = [0.25] * 2_000_000
    for key, value in [(protocol.LOSSES, huge), (protocol.EXP3_LOG_WEIGHTS, huge), (protocol.CLUSTER, huge),
                       (protocol.NUM_EXAMPLES, huge), (protocol.FEEDBACK, huge)]:
        metrics = {**train_metrics(1, 0, 10), key: value}
        with pytest.raises(ReplyRejected) as caught:
            validate_train_reply(reply(5, 1, 0, 10, 1.0, metrics=metrics).content, 2, {"w": np.zeros(SHAPE)}, 2)
        assert f"'{key}'" in str(caught.value) and len(str(caught.value)) < 200, (key, str(caught.value)[:300])


def test_client_error_text_is_escaped_and_cut(caplog: pytest.LogCaptureFixture) -> None:
    """Before: an error reply's reason went into the log as sent (terminal escapes, newlines, any length)."""
    made = strategy()
    hostile = "\x1b[2J\x1b[31mFAKE: round 1 ok\nWARNING fedroute: all good\r" + "A" * 1_000_000
    with caplog.at_level(logging.WARNING, logger="fedroute"):
        made.aggregate_train(1, [error_reply(5, hostile), reply(6, 1, 0, 10, 1.0)])
    (entry,) = made.rejected
    assert entry["reason"].startswith("error reply: \\x1b[2J") and len(entry["reason"]) < 400
    for line in caplog.text.splitlines():
        assert "\x1b" not in line and "\r" not in line and len(line) < 600
    assert not any(line.startswith("WARNING fedroute: all good") for line in caplog.text.splitlines())


def test_rejected_replies_are_bounded_per_round_and_in_checkpoints(tmp_path: Path) -> None:
    """Before: each round's rejected reasons were rewritten into every checkpoint (8.5 → 17 → 25.5 MB)."""
    made = strategy(checkpoint_dir=tmp_path)
    bad_metrics = {**train_metrics(1, 0, 10), protocol.LOSSES: [0.25] * 2_000_000}
    sizes = []
    for server_round in (1, 2, 3):
        replies = [reply(5, 1, 0, 10, 1.0, metrics=bad_metrics, server_round=server_round)]
        replies += [error_reply(1000 + i, "x" * 1000, server_round) for i in range(2 * MAX_RECORDED_PER_ROUND)]
        made.aggregate_train(server_round, replies)
        made._save(server_round)
        sizes.append((tmp_path / CHECKPOINT_FILE).stat().st_size)
        assert made.history[-1]["rejected"] == 2 * MAX_RECORDED_PER_ROUND + 1  # counted exactly
        assert sum(r["server_round"] == server_round for r in made.rejected) == MAX_RECORDED_PER_ROUND
    assert max(sizes) < 200_000, sizes
    assert made.rejections.total == 3 * (2 * MAX_RECORDED_PER_ROUND + 1)
    resumed = strategy(checkpoint_dir=tmp_path)
    resumed._restore()
    assert resumed.rejections.total == made.rejections.total and resumed.rejected == made.rejected


def _oversized(declared_shape: tuple[int, ...], payload_bytes: int) -> ArrayRecord:
    header = Array(np.zeros(declared_shape)).data[:128]
    return ArrayRecord({"w": Array(dtype="float64", shape=declared_shape, stype="numpy.ndarray",
                                   data=header + b"\0" * payload_bytes)})


@pytest.mark.parametrize("declared_shape", [SHAPE, (2_000_000,)])
def test_oversized_arrays_are_refused_before_they_are_decoded(declared_shape: tuple[int, ...]) -> None:
    """Before: a 160 MB payload was decoded (copied) before its shape was checked (347 MB peak)."""
    payload = 16_000_000
    message = reply(5, 1, 0, 10, 1.0, model=_oversized(declared_shape, payload))
    template = {"w": np.zeros(SHAPE)}
    tracemalloc.start()
    try:
        with pytest.raises(ReplyRejected, match="model array 'w'"):
            validate_train_reply(message.content, 2, template)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < payload / 16, peak


def test_accepted_arrays_are_read_in_place() -> None:
    values = np.arange(1_000_000, dtype=np.float64)
    message = reply(5, 1, 0, 10, 1.0, model=ArrayRecord({"w": Array(values)}))
    template = {"w": np.zeros(values.shape)}
    tracemalloc.start()
    try:
        accepted = validate_train_reply(message.content, 2, template)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    np.testing.assert_array_equal(accepted.model["w"], values)
    assert peak < values.nbytes / 2, peak  # no copy of the 8 MB payload (the finite check needs 1 MB)


# --------------------------------------------------------------------------- 5. lost work
def test_a_truncated_state_file_is_moved_aside_and_the_client_starts_afresh(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Before: ``BadZipFile`` on every load and save: the client failed every round from then on."""
    settings = method_settings("exp3", preset="linear")
    state = AgentState.initial(1, settings)
    played = AgentState(**{**state.to_arrays(), "rounds_played": np.array([5])})
    save_agent_state(node_context(), "key", played, 4, 3, tmp_path)
    path = tmp_path / "key" / "client-3.npz"
    path.write_bytes(path.read_bytes()[:40])  # torn by a crash or a full disk
    with caplog.at_level(logging.WARNING, logger="fedroute"):
        loaded = load_agent_state(node_context(), "key", settings, 5, 3, tmp_path)
    assert int(loaded.rounds_played[0]) == 0  # afresh
    assert "cannot be read" in caplog.text and "starts afresh" in caplog.text
    (aside,) = list((tmp_path / "key").glob("client-3.npz.corrupt-*"))
    assert aside.stat().st_size == 40 and not path.exists()
    save_agent_state(node_context(), "key", played, 5, 3, tmp_path)  # and it goes on
    assert int(load_agent_state(node_context(), "key", settings, 6, 3, tmp_path).rounds_played[0]) == 5


def test_a_node_whose_state_starts_afresh_says_so(caplog: pytest.LogCaptureFixture) -> None:
    """Before: a restarted node without its state reset its controllers with an INFO line."""
    with caplog.at_level(logging.WARNING, logger="fedroute"):
        load_agent_state(node_context(), "key", method_settings("exp3", preset="linear"), 7, 3, None)
    assert [record.levelname for record in caplog.records] == ["WARNING"]
    assert "round 7" in caplog.text and "starts afresh" in caplog.text


def _run_config(tmp_path: Path, **changes: Any) -> dict[str, Any]:
    return app_run_config({"num-clients": 3, "num-server-rounds": 2, "results-dir": str(tmp_path / "results"),
                           "round-timeout": 5.0}, **changes)


def test_each_method_is_written_as_soon_as_it_ends(tmp_path: Path, task_identity: None,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: results were written after all methods: a failure in the last lost the others."""
    def crash(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("FedCAM crashed")

    monkeypatch.setattr(FedCAM, "start", crash)
    config = _run_config(tmp_path)
    with pytest.raises(RuntimeError, match="FedCAM crashed"):
        server_main(builtin_grid(3, config), config)
    directory = tmp_path / "results" / "77"
    summary = json.loads((directory / "summary.json").read_text())
    assert list(summary) == ["greedy", "exp3", "sync-entry", "fedcam"]
    assert all(summary[method]["evaluation"] == "complete" for method in ("greedy", "exp3", "sync-entry"))
    assert summary["fedcam"]["error"] == "RuntimeError: FedCAM crashed"
    rounds = pd.read_csv(directory / "rounds.csv")
    assert rounds.method.tolist() == ["greedy"] * 2 + ["exp3"] * 2 + ["sync-entry"] * 2
    assert {name.split("/")[0] for name in np.load(directory / "cluster_models.npz").files} == \
        {"greedy", "exp3", "sync-entry"}
    assert not [path.name for path in directory.iterdir() if path.name.startswith(".")]  # no temporaries


def test_no_valid_evaluation_reply_fails_the_run_and_keeps_its_rounds(
        tmp_path: Path, task_identity: None) -> None:
    """Before: ``need at least one array to stack``; later ``"evaluation": "missing"`` and a normal end (exit 0)."""
    config = _run_config(tmp_path, method="exp3")
    with pytest.raises(DeadFederation, match=r"final evaluation: none of the 3 nodes .* evaluation crashed \(3 "):
        server_main(builtin_grid(3, config, fail_evaluation=True), config)
    directory = tmp_path / "results" / "77"
    summary = json.loads((directory / "summary.json").read_text())["exp3"]
    assert summary["error"].startswith("DeadFederation: final evaluation")
    status = json.loads((directory / "status.json").read_text())
    assert status["state"] == "failed" and "final evaluation" in status["error"]
    assert len(pd.read_csv(directory / "rounds.csv")) == 2  # the trained rounds are on disk


def test_a_short_run_without_any_valid_reply_fails_instead_of_returning_its_initial_models(
        tmp_path: Path, task_identity: None) -> None:
    """Before: 2 rounds (< dead-rounds = 3) of failing replies ended normally with W^0 and exit 0."""
    config = _run_config(tmp_path, method="exp3")
    grid = builtin_grid(3, config)
    grid.handlers = {kind: _crashing for kind in grid.handlers}
    with pytest.raises(DeadFederation, match=r"no valid training reply in any of the run's 2 rounds \(t=0…1\)"):
        server_main(grid, config)
    directory = tmp_path / "results" / "77"
    summary = json.loads((directory / "summary.json").read_text())["exp3"]
    assert "disk full (6 replies)" in summary["error"] and summary["active_alarms"] == ["dead-federation"]
    assert json.loads((directory / "status.json").read_text())["state"] == "failed"


def _crashing(message: Message, context: Context) -> Message:
    return Message(error=Error(code=1, reason="disk full"), reply_to=message)


def test_a_deployment_checkpoints_by_default_where_the_environment_says(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The compose executor sets FEDROUTE_CHECKPOINT_DIR (a volume): runs checkpoint without a run-config key."""
    base = _run_config(tmp_path, **{"checkpoint-dir": ""})
    assert parse_run_config(base).checkpoint_dir is None
    monkeypatch.setenv("FEDROUTE_CHECKPOINT_DIR", str(tmp_path / "volume"))
    first, other = parse_run_config(base), parse_run_config({**base, "seed": 7})
    assert first.checkpoint_dir == tmp_path / "volume" / first.run_digest
    assert other.checkpoint_dir.parent == first.checkpoint_dir.parent != other.checkpoint_dir  # one per setting
    explicit = parse_run_config({**base, "checkpoint-dir": str(tmp_path / "mine")})
    assert explicit.checkpoint_dir == tmp_path / "mine"


def test_result_files_are_replaced_atomically(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: files were written in place: a crash mid-write left a torn ``rounds.parquet``."""
    rounds = pd.DataFrame({"round_index": [0, 1], "mass_0": [0.5, 0.25]})
    write_results(tmp_path, {"run_id": 1}, rounds, {"exp3": {"rounds": 2}}, {"exp3/cluster-0": np.zeros(2)})

    def torn(self: pd.DataFrame, target: Any, *args: Any, **kwargs: Any) -> None:
        if isinstance(target, (str, Path)):
            Path(target).write_bytes(b"PAR1 torn")
        else:
            target.write(b"PAR1 torn")
        raise OSError("disk full")

    monkeypatch.setattr(pd.DataFrame, "to_parquet", torn)
    with pytest.raises(OSError, match="disk full"):
        write_results(tmp_path, {"run_id": 1}, rounds.assign(mass_0=1.0), {"exp3": {"rounds": 2}}, {})
    monkeypatch.undo()
    pd.testing.assert_frame_equal(pd.read_parquet(tmp_path / "rounds.parquet"), rounds)
    assert not [path.name for path in tmp_path.iterdir() if path.name.startswith(".")]


# --------------------------------------------------------------------------- 6. smaller findings
@pytest.mark.parametrize(("distribution", "why"), [
    ([1.5, -0.5], "negative entries"),
    ([0.0, 1.0], "probability 0"),  # the route is cluster 0
    ([0.6, 0.6], "does not sum to 1"),
])
def test_route_distributions_are_checked(distribution: list[float], why: str) -> None:
    """Before: negative entries and mass on another cluster were accepted."""
    metrics = {**train_metrics(1, 0, 10), protocol.ROUTE_DISTRIBUTION: distribution}
    with pytest.raises(ReplyRejected, match=f"'{protocol.ROUTE_DISTRIBUTION}' .*{why}"):
        validate_train_reply(reply(5, 1, 0, 10, 1.0, metrics=metrics).content, 2, {"w": np.zeros(SHAPE)})


@pytest.mark.parametrize("run_key", ["../../escaped", "..", "a/b", "", "x" * 200, "name\n"])
def test_run_keys_stay_inside_the_state_directory(tmp_path: Path, run_key: str) -> None:
    """Before: ``run_key = '../../escaped'`` wrote outside the state directory."""
    with pytest.raises(ValueError, match="run_key"):
        ClusteredRouting(ROUTING, run_key=run_key)
    state_dir = tmp_path / "deep" / "state"
    settings = method_settings("exp3", preset="linear")
    with pytest.raises(ValueError, match="run key"):
        save_agent_state(node_context(), run_key, AgentState.initial(1, settings), 0, 3, state_dir)
    assert not [path for path in tmp_path.rglob("*") if path.is_file()]


@pytest.mark.parametrize(("key", "value"), [
    ("seed", 1e300), ("seed", 2**64), ("num-server-rounds", 10**12), ("min-train-nodes", 1e15),
    ("block-length", 1e30), ("num-clients", 10**12), ("samples-per-client", 1e18), ("noise-std", math.inf),
    ("max-weight-ratio", 1e300), ("max-weight-ratio", 0.5), ("max-update-norm", -1.0), ("aggregation", "mode"),
    ("trim-fraction", 0.5),
])
def test_run_config_numbers_have_upper_bounds_and_errors_name_the_key(key: str, value: Any) -> None:
    """Before: ``seed = 1e300`` was accepted and failed later without naming the key."""
    base = _run_config(Path("/tmp"))
    with pytest.raises(ValueError, match=f"'{key}'"):
        parse_run_config({**base, key: value})


def test_a_corrupt_checkpoint_stops_the_run_naming_the_file(tmp_path: Path) -> None:
    """Before: ``BadZipFile: File is not a zip file`` — which file?"""
    (tmp_path / CHECKPOINT_FILE).write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(CheckpointError, match=str(tmp_path / CHECKPOINT_FILE)):
        strategy(checkpoint_dir=tmp_path)._restore()


def test_a_checkpoint_with_wrong_shapes_is_refused(tmp_path: Path) -> None:
    """Before: arrays of another shape were loaded silently."""
    made = strategy(checkpoint_dir=tmp_path)
    made.aggregate_train(1, [reply(101, 0, 0, 10, 1.0)])
    made._save(1)
    arrays, meta = load_checkpoint(tmp_path)
    save_checkpoint(tmp_path, {**arrays, "cluster-1/w": np.zeros(7)}, meta)  # same settings, other shape
    with pytest.raises(CheckpointError, match=r"array 'cluster-1/w' is \(7,\)"):
        strategy(checkpoint_dir=tmp_path)._restore()
    save_checkpoint(tmp_path, arrays, {**meta, "routing_masses": [0.5, "x"]})
    with pytest.raises(CheckpointError, match="malformed"):
        strategy(checkpoint_dir=tmp_path)._restore()
