"""E4 speed: the full characters grid in the batched simulator, against a per-client loop.

Run: ``python bench/bench_characters.py [--rounds 800] [--loop-rounds 5] [--loop-runs 2]``.

1. **Batched**: the E4 experiment's run on its grid (144 runs, 4 methods; ``--rounds``
   shortens ``T`` for a quick look), one process.  Prints the wall time per method
   and in total, run-rounds per second, and the target (full grid ≤ 10 min on the
   2-core machine).
2. **Per-client loop** (what a Flower ClientApp does, without the network): for
   ``--loop-runs`` runs of each method and ``--loop-rounds`` rounds, every client
   calls :func:`fedroute.core.client_step.client_round` (FedCAM:
   :func:`~fedroute.core.fedcam.fedcam_client_round`) on a batch of **one**
   client, and the server aggregates per round.  The routes are checked against
   the batched simulator's on the same runs.  Its time per run-round is
   **extrapolated** to the grid's ``Σ_method runs · T`` run-rounds; that figure
   is an estimate, labelled as such, not a measurement.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace

import numpy as np
from tqdm import tqdm

from fedroute.core.agent import AgentState
from fedroute.core.fedcam import fedcam_client_round
from fedroute.core.methods import FEDCAM
from fedroute.core.client_step import client_round, provisional_greedy_routes
from fedroute.simulation.experiments.characters import (
    EXPERIMENT,
    CharactersExperimentConfig,
    make_characters_task,
    method_spec,
)
from fedroute.simulation.experiments.kit import Sweep
from fedroute.core.aggregation import hard_update, routing_masses
from fedroute.tasks.characters import CharactersTask


def per_client_loop(task, settings, method: str, num_rounds: int, seed: int) -> np.ndarray:
    """One run, one client at a time; returns the executed routes (T, n)."""
    clients = [task.clients(np.array([client])) for client in range(task.num_clients)]
    num_examples = np.array([int(batch.num_examples[0]) for batch in clients])
    num_clusters = settings.num_clusters
    models = task.initial_models(num_clusters)
    all_routes = []
    if method == FEDCAM:
        global_model = np.zeros(models.shape[-1], dtype=models.dtype)
        for round_index in range(num_rounds):
            results = [fedcam_client_round(batch, global_model, models, round_index) for batch in clients]
            routes = np.array([int(r.routes[0]) for r in results])
            models = hard_update(models, np.stack([r.cluster_models[0] for r in results]), routes, num_examples)
            global_model = hard_update(global_model[None], np.stack([r.global_models[0] for r in results]),
                                       np.zeros_like(routes), num_examples)[0]
            all_routes.append(routes)
        return np.stack(all_routes)
    states = [AgentState.initial(1, settings) for _ in clients]
    masses = None
    if settings.synchronized_entry:
        greedy = np.array([int(provisional_greedy_routes(batch, models)[0]) for batch in clients])
        masses = routing_masses(greedy, num_examples, num_clusters)
    for round_index in range(num_rounds):
        trained, routes = [], []
        for client, batch in enumerate(clients):
            result = client_round(batch, states[client], settings, models, masses, round_index, seed)
            states[client] = result.state
            trained.append(result.trained_models[0])
            routes.append(int(result.decision.routes[0]))
        routes_array = np.array(routes)
        models = hard_update(models, np.stack(trained), routes_array, num_examples)
        masses = routing_masses(routes_array, num_examples, num_clusters)
        all_routes.append(routes_array)
    return np.stack(all_routes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=800, help="T of the batched grid (paper: 800)")
    parser.add_argument("--loop-rounds", type=int, default=5, help="rounds of the per-client loop")
    parser.add_argument("--loop-runs", type=int, default=2, help="runs per method of the per-client loop")
    parser.add_argument("--skip-grid", action="store_true", help="only the per-client loop")
    args = parser.parse_args()
    config = CharactersExperimentConfig(rounds=args.rounds)
    grid_run_rounds = {m: len(config.cells(m)) * config.rounds for m in config.methods}
    total_run_rounds = sum(grid_run_rounds.values())
    clients_per_run = CharactersTask(**config.task).num_clients

    batched_per_run_round = {}
    if not args.skip_grid:
        started = time.perf_counter()
        sweep = Sweep(progress=True)
        EXPERIMENT.run(config, sweep)
        seconds = time.perf_counter() - started
        print(f"E4 grid: {sum(len(config.cells(m)) for m in config.methods)} runs x T = {config.rounds} "
              f"x {clients_per_run} clients, one process")
        for method in config.methods:
            s = sweep.seconds[method]
            batched_per_run_round[method] = s / grid_run_rounds[method]
            print(f"  {method:<10}: {s:8.1f} s  {grid_run_rounds[method] / s:8.1f} run-rounds/s "
                  f"({len(config.cells(method))} runs)")
        other = seconds - sum(sweep.seconds[m] for m in config.methods)
        print(f"  audit + representative run + tables: {other:6.1f} s")
        print(f"batched total: {seconds:8.1f} s = {seconds / 60:.1f} min  ({total_run_rounds / seconds:.1f} "
              f"run-rounds/s, {total_run_rounds * clients_per_run / seconds:.0f} client-rounds/s)  "
              f"target: full 144 x 800 grid <= 10 min on 2 cores")

    loop_total, checked = 0.0, True
    print(f"per-client loop: {args.loop_runs} runs per method x {args.loop_rounds} rounds, one client per call")
    for method in config.methods:
        spec = method_spec(method, replace(config, rounds=args.loop_rounds, sustained_window=1),
                           model_rounds=[args.loop_rounds])
        cells = config.cells(method)[:args.loop_runs]
        tasks = [make_characters_task(cell, **config.task) for cell in cells]
        for task in tasks:
            task.initial_models(2)  # pretraining outside the timing
        started = time.perf_counter()
        loop_routes = [per_client_loop(task, spec.settings, method, args.loop_rounds, int(cell["seed"]))
                       for task, cell in tqdm(list(zip(tasks, cells)), desc=f"{method} per-client loop",
                                              unit="run", file=sys.stderr)]
        loop_seconds = time.perf_counter() - started
        batch = spec.simulate(tasks, spec.settings, args.loop_rounds, [int(cell["seed"]) for cell in cells])
        same = all(np.array_equal(routes, batch.routes[:, index]) for index, routes in enumerate(loop_routes))
        checked &= same
        per_run_round = loop_seconds / (len(cells) * args.loop_rounds)
        estimate = per_run_round * grid_run_rounds[method]
        loop_total += estimate
        print(f"  {method:<10}: {per_run_round * 1e3:8.1f} ms per run-round (measured); same routes as batched: "
              f"{'yes' if same else 'NO'}; EXTRAPOLATED to the grid's {grid_run_rounds[method]} run-rounds: "
              f"{estimate / 60:7.1f} min")
    print(f"per-client loop, EXTRAPOLATED to the whole grid: {loop_total:8.0f} s = {loop_total / 3600:.1f} h")
    if batched_per_run_round:
        batched_total = sum(batched_per_run_round[m] * grid_run_rounds[m] for m in config.methods)
        print(f"speed-up (extrapolated loop / measured batched): {loop_total / batched_total:.0f}x")
    if not checked:
        raise SystemExit("the per-client loop and the batched simulator disagree on some routes")


if __name__ == "__main__":
    main()
