"""Does routing with early-stopped loss passes route as on every row?  The dataset task, ``routing-early-stop``.

Run: ``python bench/study_routing_early_stop.py [--seeds 0 1 2] [--clients 12] [--rounds 20]
[--methods greedy exp3] [--partitioners iid dirichlet]`` (≈ 1 min per run on 2 loaded cores).

Two measurements on the offline digits (scikit-learn's 1,797 8×8 digits as Parquet,
:mod:`fedroute.data.standins`), 4 rotation groups (client ``c`` in group ``c mod 4``), ``K = 4``,
5 local epochs, the ServerApp and the built-in ClientApp in this process
(:mod:`study_routing_loss_rows`):

* **decisions, paired**: one run routed on every row (``routing-early-stop = false``,
  ``save-round-models = true``); then, for every round's ``K`` broadcast models and every
  client, the ``K`` losses on every row and with early stop, on the *same* models.  Per run:
  the share of (client, round) decisions whose argmin agrees; the largest and the mean
  excess of the early-stop choice's loss (on every row) over the best model's loss; the
  share of the loss-pass rows early stop scored.  This isolates the early stop from the
  chaos of two trajectories.
* **outcomes**: the same run twice, routed on every row and with early stop: final routes on
  the group's model, held-out assignment, accuracy, worst decile (as in
  :mod:`study_routing_loss_rows`).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Optional

import numpy as np

from fedroute.core.methods import EXP3, GREEDY, METHODS


def decisions(results: Path, config: dict[str, Any], method: str) -> dict[str, Any]:
    """Paired decisions of the two loss passes on every round's models of one run (module docstring)."""
    from fedroute.tasks.dataset import DatasetTask

    saved = np.load(results / "1" / "round_models.npz")
    rounds = saved[f"{method}/cluster_models"]  # (m, K, P): the models after each round
    task_keys = {"dataset": "dataset", "partitioner": "partitioner", "num-groups": "num_groups",
                 "group-transform": "group_transform", "num-clients": "num_clients", "seed": "seed"}
    settings = {field: config[key] for key, field in task_keys.items()}
    full, early = (DatasetTask(**settings, routing_early_stop=flag) for flag in ("false", "true"))
    agree, excess, scored, total = [], [], 0, 0
    for client in range(int(config["num-clients"])):
        every_row = full.clients(np.array([client]))
        stopped = early.clients(np.array([client]))
        rows = len(stopped.loss_fn.targets)
        for models in rounds[:-1]:  # the models broadcast in the next round
            exact = every_row.losses(models)[0]
            estimate = stopped.losses(models)[0]
            choice = int(np.argmin(estimate))
            agree.append(choice == int(np.argmin(exact)))
            excess.append(exact[choice] / exact.min() - 1.0)
            scored += int(stopped.loss_fn.last_rows_scored)
            total += rows * len(models)
    excess_array = np.asarray(excess)
    return {"decisions": len(agree), "agree": float(np.mean(agree)), "max_excess": float(excess_array.max()),
            "mean_excess": float(excess_array.mean()), "rows_scored": scored / total}


def study(seeds: list[int], clients: int, rounds: int, methods: list[str],
          partitioners: list[str]) -> list[dict[str, Any]]:
    """Every (partitioner, method, seed): the paired decisions, then the two runs' outcomes."""
    from study_routing_loss_rows import digits_workspace, run_config, run_once

    out = []
    with digits_workspace("fedroute-early-") as (work, dataset):
        for partitioner in partitioners:
            for method in methods:
                for seed in seeds:
                    row: dict[str, Any] = {"partitioner": partitioner, "method": method, "seed": seed}
                    for flag in ("false", "true"):
                        results = work / f"results-{partitioner}-{method}-{seed}-{flag}"
                        config = run_config(dataset, results, 0, seed, clients, rounds, method,
                                            partitioner=partitioner, **{"routing-early-stop": flag,
                                                                        "save-round-models": flag == "false"})
                        numbers = run_once(config, results)
                        row.update({f"{key}_{'early' if flag == 'true' else 'all'}": value
                                    for key, value in numbers.items()})
                        if flag == "false":
                            row.update(decisions(results, config, method))
                    out.append(row)
                    print(json.dumps(out[-1]), flush=True)
    return out


def table(runs: list[dict[str, Any]]) -> str:
    """Markdown: one line per (partitioner, method, seed)."""
    lines = ["| partitioner | method | seed | decisions agreeing | mean / max excess of the choice | rows scored "
             "| final routes all / early | accuracy all / early | worst 10 % all / early |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        lines.append(f"| {r['partitioner']} | {r['method']} | {r['seed']} | {r['agree']:.3f} of {r['decisions']} "
                     f"| {r['mean_excess']:.4f} / {r['max_excess']:.3f} | {r['rows_scored']:.2f} "
                     f"| {r['final_routes_all']:.2f} / {r['final_routes_early']:.2f} "
                     f"| {r['accuracy_all']:.3f} / {r['accuracy_early']:.3f} "
                     f"| {r['worst_decile_all']:.3f} / {r['worst_decile_early']:.3f} |")
    return "\n".join(lines) + "\n"


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--clients", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--methods", nargs="+", default=[GREEDY, EXP3], choices=METHODS)
    parser.add_argument("--partitioners", nargs="+", default=["iid", "dirichlet"], choices=["iid", "dirichlet"])
    args = parser.parse_args(argv)
    print(table(study(args.seeds, args.clients, args.rounds, args.methods, args.partitioners)))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
