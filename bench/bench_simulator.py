"""Simulator speed: batched runs against a per-client Python loop doing the same arithmetic.

Run: ``python bench/bench_simulator.py [--runs 20] [--rounds 50]``.  Both sides run in
this process, one after the other, on the same runs (EXP3 on the linear task, 80
clients); the loop calls :func:`fedroute.core.client_step.client_round` on one client
at a time (what a Flower ClientApp does) and aggregates per round.  Prints
rounds/second of each and their ratio, and checks that both give the same routes.
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
from tqdm import tqdm

from fedroute.core.agent import AgentState
from fedroute.core.client_step import client_round
from fedroute.simulation.simulator import simulate_batch
from fedroute.core.aggregation import hard_update, routing_masses
from fedroute.core.methods import EXP3, method_settings
from fedroute.tasks.linear import LinearTask


def per_client_loop(task: LinearTask, settings, num_rounds: int, seed: int) -> np.ndarray:
    """One run, one client at a time; returns the routes (T, n)."""
    clients = [task.clients(np.array([client])) for client in range(task.num_clients)]
    states = [AgentState.initial(1, settings) for _ in clients]
    models, masses, all_routes = task.initial_models(settings.num_clusters), None, []
    for round_index in range(num_rounds):
        trained, routes = [], []
        for client, batch in enumerate(clients):
            result = client_round(batch, states[client], settings, models, masses, round_index, seed)
            states[client] = result.state
            trained.append(result.trained_models[0])
            routes.append(int(result.decision.routes[0]))
        routes_array = np.array(routes)
        num_examples = np.full(len(routes), task.samples_per_client)
        models = hard_update(models, np.stack(trained), routes_array, num_examples)
        masses = routing_masses(routes_array, num_examples, settings.num_clusters)
        all_routes.append(routes_array)
    return np.stack(all_routes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=50)
    args = parser.parse_args()
    settings = method_settings(EXP3, preset="linear")
    tasks = [LinearTask(init="spread", init_spread=2.0, seed=seed) for seed in range(args.runs)]
    started = time.perf_counter()
    batch = simulate_batch(tasks, settings, args.rounds, [task.seed for task in tasks])
    batched_seconds = time.perf_counter() - started
    started = time.perf_counter()
    loop_routes = [per_client_loop(task, settings, args.rounds, task.seed)
                   for task in tqdm(tasks, desc=f"exp3 per-client loop ({args.rounds} rounds per run)", unit="run",
                                    file=sys.stderr)]
    loop_seconds = time.perf_counter() - started
    for index, routes in enumerate(loop_routes):
        assert np.array_equal(routes, batch.routes[:, index]), f"run {index} differs"
    total_rounds = args.runs * args.rounds
    print(f"{args.runs} runs x {args.rounds} rounds x {tasks[0].num_clients} clients (EXP3, linear)")
    print(f"batched simulator : {batched_seconds:8.2f} s  {total_rounds / batched_seconds:10.1f} run-rounds/s")
    print(f"per-client loop   : {loop_seconds:8.2f} s  {total_rounds / loop_seconds:10.1f} run-rounds/s")
    print(f"speed-up (loop / batched): {loop_seconds / batched_seconds:.1f}x  (same routes: yes)")


if __name__ == "__main__":
    main()
