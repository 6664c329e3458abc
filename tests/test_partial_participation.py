"""Partial participation: the same clients in every runtime, masses that do not depend on the sample.

Flower draws new node ids for every simulation; the strategy samples *client ids* (asked once
per node), so the same seed gives the same run whatever the node ids, and the batched simulator
(``participation=Participation(...)``) makes exactly the same draws.  The masses the clients
receive are estimated from every client's latest report.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from flwr.app import MessageType

from fedroute import protocol
from fedroute.core.federation import FederationState, estimate_federation
from fedroute.core.methods import method_settings
from fedroute.core.participation import Participation, participating, report_memory, sample_size
from fedroute.server.run_config import parse_run_config
from fedroute.simulation.simulator import simulate
from fedroute.strategies.clustered import ClusteredRouting
from support.app_config import app_run_config
from support.builtin_runs import builtin_nodes, builtin_run
from support.grid import InProcessGrid

NUM_CLIENTS, NUM_ROUNDS, FRACTION, SEED = 16, 14, 0.25, 3


# ----------------------------------------------------------------------------- the sampling rule
def test_report_memory_keeps_a_report_until_a_miss_is_unlikely() -> None:
    assert [report_memory(f) for f in (1.0, 0.5, 0.25, 0.1)] == [1, 7, 17, 44]
    for fraction in (0.5, 0.25, 0.1, 0.03):
        rounds = report_memory(fraction)
        assert (1 - fraction) ** rounds <= 0.01 < (1 - fraction) ** (rounds - 1)
    with pytest.raises(ValueError, match="fraction"):
        report_memory(0.0)


def test_a_rounds_sample_depends_on_seed_client_ids_and_round_only() -> None:
    participation = Participation(fraction=0.25, min_clients=2)
    ids = np.arange(10, 50)
    sample = participation.sample(ids, seed=3, round_index=5)
    assert len(sample) == sample_size(40, 0.25, 2) == 10 and set(sample) <= set(ids)
    np.testing.assert_array_equal(participation.sample(ids[::-1].copy(), 3, 5), sample)   # order-free
    assert not np.array_equal(participation.sample(ids, 3, 6), sample)                  # rounds differ
    assert not np.array_equal(participation.sample(ids, 4, 5), sample)                  # seeds differ
    # A client that leaves changes nobody else's draw: the sample of the others is a prefix of the same order.
    without = participation.sample(ids[ids != sample[0]], 3, 5)
    assert set(sample[1:]) <= set(without) and len(without) == sample_size(39, 0.25, 2)
    # Everyone plays with full participation; min_clients lifts a tiny sample.
    np.testing.assert_array_equal(Participation().sample(ids, 3, 5), ids)
    assert len(Participation(fraction=0.01, min_clients=3).sample(ids, 3, 5)) == 3


def test_batched_runs_are_sampled_as_single_runs() -> None:
    participation = Participation(fraction=0.3, min_clients=1)
    runs, n = 4, 20
    ids = np.tile(np.arange(n), runs)
    run_index = np.repeat(np.arange(runs), n)
    seeds = np.array([7, 8, 9, 10])[run_index]
    available = np.ones(runs * n, dtype=bool)
    available[n:n + 5] = False                                   # run 1: five clients not joined yet
    mask = participating(ids, run_index, seeds, runs, 2, participation, available)
    for run in range(runs):
        rows = run_index == run
        alone = participation.sample(ids[rows & available], int(seeds[rows][0]), 2)
        np.testing.assert_array_equal(ids[rows & mask], alone)


@pytest.mark.parametrize("bad", [0.0, 1.5, "a", True])
def test_a_bad_fraction_is_refused_naming_the_field(bad: Any) -> None:
    with pytest.raises(ValueError, match=r"fraction_train .* \(0, 1\]"):
        Participation(fraction=bad)


# ----------------------------------------------------------------------------- the estimate
def test_the_masses_count_every_clients_latest_report_within_the_memory() -> None:
    state = FederationState.of_clients(np.arange(4), 2)
    state = state.record(np.array([0, 1, 2, 3]), 0, np.array([0, 0, 1, 1]), np.array([0, 1, 1, 1]), np.ones(4))
    state = state.record(np.array([0]), 1, np.array([1]), np.array([1]), np.ones(1))  # only client 0 plays
    latest = estimate_federation(state, 1, report_rounds=2, num_clusters=2)
    np.testing.assert_allclose(latest.masses, [[0.25, 0.75]])           # client 0 now on 1, the others as before
    np.testing.assert_allclose(latest.preferred_masses, [[0.0, 1.0]])
    this_round = estimate_federation(state, 1, report_rounds=1, num_clusters=2)
    np.testing.assert_allclose(this_round.masses, [[0.0, 1.0]])         # L = 1: the round's own replies only
    assert this_round.reporting.tolist() == [1]
    nobody = estimate_federation(state, 9, report_rounds=1, num_clusters=2, previous=latest)
    np.testing.assert_allclose(nobody.masses, latest.masses)            # no report counts: kept


def test_one_clients_claim_is_capped_in_the_estimate() -> None:
    state = FederationState.of_clients(np.arange(5), 2)
    state = state.record(np.arange(5), 0, np.array([1, 0, 0, 0, 0]), np.zeros(5, np.int64),
                         np.array([1e9, 10, 10, 10, 10]))
    masses = estimate_federation(state, 0, 1, 2, max_weight_ratio=4.0).masses[0]
    np.testing.assert_allclose(masses, [40 / 80, 40 / 80])              # 1e9 counts as 4 × the median 10


# ----------------------------------------------------------------------------- Flower ≡ simulator
pytestmark = pytest.mark.usefixtures("task_identity")


def _run_config(**changes: Any) -> dict[str, Any]:
    return app_run_config({"num-clients": NUM_CLIENTS, "num-server-rounds": NUM_ROUNDS, "seed": SEED,
                           "fraction-train": FRACTION, "preset": "generic", "init": "spread"}, **changes)


def _flower_run(run_config: dict[str, Any], method: str, node_seed: int, **grid_options: Any
                ) -> tuple[ClusteredRouting, InProcessGrid]:
    grid = builtin_nodes(run_config, NUM_CLIENTS, node_seed, **grid_options)
    return builtin_run(run_config, method, grid, FRACTION, num_models=2), grid


@pytest.mark.parametrize("method", ["exp3", "sync-entry"])
def test_flower_equals_the_simulator_and_node_ids_do_not_matter(method: str) -> None:
    run_config = _run_config(method=method)
    strategy, grid = _flower_run(run_config, method, node_seed=0)
    again, _ = _flower_run(run_config, method, node_seed=1)          # other node ids: the same run
    assert again.client_routes == strategy.client_routes
    settings = parse_run_config(run_config)
    history = simulate(settings.task, settings.routing[method], NUM_ROUNDS, SEED,
                       participation=Participation(FRACTION, 2))
    for t in range(NUM_ROUNDS):
        played = np.flatnonzero(history.played[t])
        assert sorted(strategy.client_routes[t]) == played.tolist(), t
        assert [strategy.client_routes[t][c] for c in played] == history.routes[t, played].tolist(), t
        assert len(played) == 4
    np.testing.assert_allclose(np.stack([m["weights"] for m in strategy.cluster_models]),
                               history.cluster_models[-1], rtol=0, atol=1e-12)
    np.testing.assert_allclose(strategy.routing_masses, history.masses[-1], rtol=0, atol=1e-12)
    # Each node is identified once; no models travel with the identification.
    assert grid.count(MessageType.QUERY, protocol.PHASE_IDENTIFY) == NUM_CLIENTS
    assert grid.count(MessageType.TRAIN, protocol.PHASE_TRAIN) == 4 * NUM_ROUNDS
    identify = [m for m in grid.sent if m.content.config_records[protocol.CONFIG].get(protocol.PHASE)
                == protocol.PHASE_IDENTIFY]
    assert all(not m.content.array_records for m in identify)
    # Over the run every client played, and the masses counted clients that did not play in the last round.
    assert history.played.any(axis=0).all()
    assert history.masses[-1].sum() == pytest.approx(1.0)


def test_without_a_query_handler_the_run_stops_naming_it() -> None:
    with pytest.raises(RuntimeError, match=r"@app\.query\(\) returning fedroute\.routing_query"):
        _flower_run(_run_config(method="exp3"), "exp3", node_seed=0, query_handler=False)


def test_the_simulator_command_replays_partial_participation_and_refuses_what_it_cannot(tmp_path) -> None:
    """``fedroute simulate`` with ``fraction-train < 1``: the round's sample from the seed (4 of 16), the
    collapsed start left without start exploration (re-seeding); FedCAM and Local are refused by name."""
    import pandas as pd

    from fedroute.simulation.recorded import check_simulable, simulate_run

    settings = parse_run_config(app_run_config(**{"method": "exp3", "preset": "generic", "num-clients": 16,
                                                  "num-server-rounds": 30, "seed": 5, "fraction-train": 0.25}))
    simulate_run(settings, tmp_path)
    rounds = pd.read_csv(tmp_path / "rounds.csv")
    assert (rounds[["routed_0", "routed_1"]].sum(axis=1) == 4).all()
    assert (rounds["arm_rh"] == 0).all()                       # partial participation: the start does not explore
    assert (rounds.loc[rounds.round_index < 10, "routed_1"] == 0).all()       # the collapsed start, kept by Greedy
    assert rounds.loc[rounds.round_index >= 10, "routed_1"].sum() > 0        # … until cluster 1 is re-seeded
    for method in ("fedcam", "local"):
        refused = parse_run_config(app_run_config(**{"method": method, "fraction-train": 0.25}))
        with pytest.raises(ValueError, match=f"fraction-train = 0.25 with method {method}"):
            check_simulable(refused)
