"""Collapse alarms: the state machine, its messages, and a federation whose clients all fail."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest

from fedroute import AlarmSettings, ClusteredRouting, method_settings
from fedroute.monitoring.alarms import (
    COLLAPSED_ENTRANCE,
    DEAD_FEDERATION,
    DUPLICATION,
    RECOVERY,
    SPARE,
    STARVATION,
    AlarmMonitor,
    DeadFederation,
    task_starvation_basin,
)
from fedroute.tasks.linear import LinearTask
from support.grid import InProcessGrid
from support.linear_app import TASK, linear_initial_models, linear_user_app

pytestmark = pytest.mark.usefixtures("task_identity")  # Flower messages need a task identity

# Three clients; cluster 0 is everybody's best model at the start.
COLLAPSED = np.array([[1.0, 5.0], [2.0, 6.0], [1.5, 4.0]])
SEPARATED = np.array([[1.0, 5.0], [6.0, 2.0], [1.5, 4.0]])


def _kinds(events) -> list[tuple[str, str]]:
    return [(event.kind, event.event) for event in events]


def test_greedy_like_run_raises_entrance_and_starvation_and_never_clears() -> None:
    monitor = AlarmMonitor(2, AlarmSettings(starvation_rounds=4), starvation_basin=True)
    first = monitor.observe(0, COLLAPSED, np.zeros(3, dtype=int))
    assert _kinds(first) == [(COLLAPSED_ENTRANCE, "raised")] and first[0].level == logging.WARNING
    assert "cluster 1" in first[0].message and "certified starvation basin" in first[0].message
    assert "method exp3" in first[0].message  # what to do, for Greedy routing
    events = [monitor.observe(t, COLLAPSED, np.zeros(3, dtype=int)) for t in range(1, 30)]
    raised = [(t + 1, event) for t, round_events in enumerate(events) for event in round_events]
    assert [(t, event.kind) for t, event in raised] == [(3, STARVATION)]  # unrouted in rounds 0..3
    assert "4 rounds (t=0…3)" in raised[0][1].message
    assert [alarm.kind for alarm in monitor.active] == [COLLAPSED_ENTRANCE, STARVATION]
    assert monitor.rounds_unrouted == [0, 30]


def test_exp3_like_run_clears_and_recovers() -> None:
    monitor = AlarmMonitor(2, AlarmSettings(starvation_rounds=3), controllers=("gr", "rh"))
    assert _kinds(monitor.observe(0, COLLAPSED, np.array([0, 0, 0]))) == [(COLLAPSED_ENTRANCE, "raised")]
    assert "routing control (gr,rh)" in monitor.alarms[0].message
    assert monitor.observe(1, COLLAPSED, np.array([0, 1, 0])) == []  # routed, but nobody's best model yet
    events = monitor.observe(2, SEPARATED, np.array([0, 1, 0]))
    assert _kinds(events) == [(COLLAPSED_ENTRANCE, "cleared"), (RECOVERY, "raised")]
    assert all(event.level == logging.INFO for event in events)
    assert monitor.alarms[0].cleared_round == 2 and not monitor.active
    # starving again later: raised, cleared, and a second recovery
    for t in range(3, 6):
        events = monitor.observe(t, SEPARATED, np.array([0, 0, 0]))
    assert _kinds(events) == [(STARVATION, "raised")]
    assert _kinds(monitor.observe(6, SEPARATED, np.array([0, 1, 0]))) == [(STARVATION, "cleared"), (RECOVERY, "raised")]


def test_duplicated_clusters_are_flagged_until_a_client_tells_them_apart() -> None:
    monitor = AlarmMonitor(3, AlarmSettings(duplication_tolerance=1e-3))
    copies = np.array([[1.0, 1.0005, 3.0], [2.0, 2.001, 0.5]])
    events = monitor.observe(0, copies, np.array([0, 2]))
    # cluster 1 (the copy losing every tie) is also nobody's best model: a collapsed entrance
    assert _kinds(events) == [(COLLAPSED_ENTRANCE, "raised"), (DUPLICATION, "raised")]
    assert events[1].clusters == (0, 1) and "equally good for every client" in events[1].message
    assert monitor.observe(1, copies, np.array([0, 2])) == []  # raised once, not every round
    apart = copies + np.array([[0.0, 0.5, 0.0], [0.0, 0.0, 0.0]])
    assert _kinds(monitor.observe(2, apart, np.array([0, 2]))) == [(DUPLICATION, "cleared")]


def test_identical_copies_are_named_as_ties_not_as_a_preference() -> None:
    monitor = AlarmMonitor(3)
    events = monitor.observe(0, np.array([[1.0, 1.0, 1.0], [2.0, 2.0, 2.0]]), np.array([2, 1]))
    entrance = [event for event in events if event.kind == COLLAPSED_ENTRANCE]
    assert entrance[0].clusters == (1, 2)
    assert "tie exactly between clusters 0, 1 and 2" in entrance[0].message
    assert "every client prefers" not in entrance[0].message
    # a real preference (cluster 0 strictly best for one client) keeps the usual wording
    events = AlarmMonitor(3).observe(0, np.array([[1.0, 1.0, 1.0], [1.0, 2.0, 2.0]]), np.array([0, 0]))
    assert "every client prefers cluster 0" in events[0].message


def test_a_warm_start_with_random_ties_raises_no_warning() -> None:
    """Before: K identical copies logged a collapsed entrance and one duplication WARNING per pair (7 at K = 4),
    one telling the user to start from different models — the start the docs recommend."""
    monitor = AlarmMonitor(4, random_ties=True)
    copies = np.tile([[1.0, 1.0, 1.0, 1.0]], (8, 1))
    preferred = np.arange(8) % 4                                    # the clients' random tie-breaks
    events = monitor.observe(0, copies, preferred, preferred=preferred)
    assert all(event.level == logging.INFO for event in events)
    assert {event.kind for event in events} == {DUPLICATION}
    assert "identical copies" in events[0].message and "separate" in events[0].message
    assert "Start them from different models" not in events[0].message


def test_a_copy_that_no_client_drew_under_random_ties_is_no_collapsed_entrance() -> None:
    """Seen in a Ray run of 40 nodes at fraction 0.25 from K = 4 copies: the sampled clients' random tie-breaks
    missed cluster 3 in round 0, and a collapsed-entrance WARNING told the user the recommended start was wrong."""
    copies = np.tile([[1.0, 1.0, 1.0, 1.0]], (3, 1))
    drawn = np.array([0, 1, 1])                                     # nobody drew clusters 2 and 3
    events = AlarmMonitor(4, random_ties=True).observe(0, copies, drawn, preferred=drawn)
    assert events and all(event.level == logging.INFO and event.kind == DUPLICATION for event in events)
    lowest = AlarmMonitor(4).observe(0, copies, np.zeros(3, dtype=np.int64))   # lowest-index ties: a real collapse
    assert [event.kind for event in lowest if event.level == logging.WARNING][0] == COLLAPSED_ENTRANCE


def test_a_spare_cluster_raises_no_starvation_warning_and_is_reported_as_spare() -> None:
    monitor = AlarmMonitor(3, AlarmSettings(starvation_rounds=3), controllers=("gr", "rh"))
    losses = np.array([[1.0, 3.0, 5.0], [3.0, 1.0, 5.0]])
    routes = np.array([0, 1])
    for t in range(3):
        events = monitor.observe(t, losses, routes, masses=np.array([0.5, 0.5, 0.0]))
    assert (STARVATION, "raised") in _kinds(events)
    events = monitor.observe(3, losses, routes, masses=np.array([0.5, 0.5, 0.0]), spare=np.array([False, False, True]))
    assert _kinds(events) == [(COLLAPSED_ENTRANCE, "cleared"), (SPARE, "raised"), (STARVATION, "cleared"),
                              (RECOVERY, "raised")]   # every cluster starved before is routed or found spare
    assert all(event.level == logging.INFO for event in events) and "not needed" in events[1].message
    for t in range(4, 20):                                          # it stays unrouted: no new warning
        assert monitor.observe(t, losses, routes, masses=np.array([0.5, 0.5, 0.0]),
                               spare=np.array([False, False, True])) == []
    assert [alarm.kind for alarm in monitor.active] == [SPARE]      # INFO, "spare(2)" at the end


def test_starvation_reads_the_federation_estimate_not_the_round_sample() -> None:
    """Partial participation: a cluster whose clients were not sampled is not starving while their routes count."""
    monitor = AlarmMonitor(2, AlarmSettings(starvation_rounds=2))
    for t in range(6):
        events = monitor.observe(t, np.array([[1.0, 2.0]]), np.array([0]), masses=np.array([0.7, 0.3]))
        assert STARVATION not in {event.kind for event in events}


def test_dead_federation_after_n_silent_rounds_names_the_first_reasons() -> None:
    monitor = AlarmMonitor(2, AlarmSettings(dead_rounds=3))
    empty = np.zeros((0, 2))
    for t in range(2):
        assert monitor.observe(t, empty, np.zeros(0, dtype=int), ["error reply: boom", "error reply: boom"]) == []
    (event,) = monitor.observe(2, empty, np.zeros(0, dtype=int), ["metric 'losses' is missing"])
    assert event.kind == DEAD_FEDERATION and event.level == logging.ERROR and monitor.dead is not None
    assert "3 rounds in a row (t=0…2)" in event.message
    assert "error reply: boom (4 replies); metric 'losses' is missing (1 reply)" in event.message
    assert monitor.rounds_unrouted == [0, 0]  # silent rounds do not count as starvation
    assert _kinds(monitor.observe(3, COLLAPSED, np.zeros(3, dtype=int)))[0] == (DEAD_FEDERATION, "cleared")


def test_state_survives_a_restart() -> None:
    settings = AlarmSettings(starvation_rounds=5)
    whole = AlarmMonitor(2, settings)
    for t in range(3):
        whole.observe(t, COLLAPSED, np.zeros(3, dtype=int))
    resumed = AlarmMonitor(2, settings)
    resumed.load_state_dict(json.loads(json.dumps(whole.state_dict())))
    for t in range(3, 8):
        assert _kinds(resumed.observe(t, COLLAPSED, np.zeros(3, dtype=int))) == \
            _kinds(whole.observe(t, COLLAPSED, np.zeros(3, dtype=int)))
    assert [alarm.to_dict() for alarm in resumed.alarms] == [alarm.to_dict() for alarm in whole.alarms]


@pytest.mark.parametrize(("field", "value"), [("starvation_rounds", 0), ("dead_rounds", 1.5),
                                              ("duplication_tolerance", 1.0), ("duplication_tolerance", -0.1)])
def test_bad_settings_name_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        AlarmSettings(**{field: value})


def test_the_certified_basin_is_checked_where_the_task_can_tell() -> None:
    assert task_starvation_basin(LinearTask(init="collapsed"), 2) is True
    assert task_starvation_basin(LinearTask(init="spread", init_spread=1.0, seed=2), 2) is False
    assert task_starvation_basin(LinearTask(init="collapsed"), 3) is None  # certified for K = 2 only


def test_strategy_stops_a_dead_federation_and_keeps_its_alarm(caplog: pytest.LogCaptureFixture) -> None:
    def failing(message, context):
        raise RuntimeError("the client crashed")

    grid = InProcessGrid({**linear_user_app(TASK)}, TASK.num_clients)
    grid.handlers = {kind: failing for kind in grid.handlers}
    strategy = ClusteredRouting(method_settings("exp3", preset="linear"), min_available_nodes=TASK.num_clients,
                                alarm_settings=AlarmSettings(dead_rounds=2), progress_interval=None)
    original = grid.send_and_receive

    def send_and_receive(messages, timeout=None):
        try:
            return original(messages, timeout)
        except RuntimeError:
            return [_error_reply(message) for message in messages]

    grid.send_and_receive = send_and_receive
    with caplog.at_level(logging.INFO, logger="fedroute"), pytest.raises(DeadFederation, match="the client crashed"):
        strategy.start(grid, linear_initial_models(TASK, 2), num_rounds=10)
    assert len(strategy.history) == 2  # stopped after N = 2 silent rounds, not after 10
    assert [alarm.kind for alarm in strategy.alarms] == [DEAD_FEDERATION]
    assert any(record.levelno == logging.ERROR and "dead federation" in record.message for record in caplog.records)


def _error_reply(message):
    from flwr.app import Error, Message

    return Message(Error(code=0, reason="the client crashed"), reply_to=message)


@pytest.mark.process
def test_a_flower_run_whose_clients_all_fail_exits_non_zero(test_app, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """``fedroute flower`` on an app whose ClientApp always raises: stopped after N rounds, exit 1, recorded."""
    from fedroute.cli import main

    app_dir = test_app("failing")
    results = tmp_path / "results"
    code = main(["flower", "--app-dir", str(app_dir), "--supernodes", "3", "--results-dir", str(results),
                 "--timeout", "600", "--run-config", "method=exp3", "num-server-rounds=50", "dead-rounds=2"])
    captured = capsys.readouterr()
    assert code == 1
    assert "dead federation" in captured.err and "disk full on this node" in captured.err
    (directory,) = list(results.iterdir())
    summary = json.loads((directory / "summary.json").read_text())["exp3"]
    assert summary["error"].startswith("DeadFederation") and summary["active_alarms"] == [DEAD_FEDERATION]
    status = json.loads((directory / "status.json").read_text())
    assert status["state"] == "failed" and "dead federation" in status["error"]
    rounds = (directory / "rounds.csv").read_text().splitlines()
    assert len(rounds) == 1 + 2  # header and the two silent rounds: the run did not go on to round 50
