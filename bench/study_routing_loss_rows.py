"""Does routing on a subsample of the rows still route right?  The dataset task with ``routing-loss-rows`` ∈ {all, …}.

Run: ``python bench/study_routing_loss_rows.py [--rows 0 64 32 16] [--seeds 0 1] [--clients 12] [--rounds 10]``
(≈ 1 min per run on 2 loaded cores).

The dataset task on the offline digits (scikit-learn's 1,797 8×8 digits written as
Parquet, :mod:`fedroute.data.standins`), IID partitions, 4 rotation groups (0°, 90°,
180°, 270°; client ``c`` in group ``c mod 4``), ``K = 4``, ``--method`` (default EXP3),
5 local epochs, the ServerApp and the built-in ClientApp in this process.  Every
setting but ``routing-loss-rows`` (``0`` = every training row) is the same, so the
runs differ only in the rows the ``K`` models are scored on (the training and the
held-out evaluation use every row).  Per run:

* **final routes**: the best group-balanced share of clients on their group's model in
  the last round (:func:`fedroute.core.metrics.assignment_accuracy` of the executed
  routes; ``1.0``: every group on its own model, one model per group);
* **held-out assignment**: the same of the clients' lowest held-out-loss model at the end;
* **accuracy**: mean held-out accuracy of every client at its lowest-training-loss model
  (the routing signal: on the subsample) and the mean of the worst decile of clients.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Any, Iterator, Optional

import numpy as np

from fedroute.core.methods import EXP3, METHODS

REPOSITORY = Path(__file__).resolve().parents[1]
NUM_GROUPS = 4


def run_config(dataset: Path, results: Path, rows: int, seed: int, clients: int, rounds: int,
               method: str = EXP3, partitioner: str = "iid", **overrides: Any) -> dict[str, Any]:
    """The app's defaults with the study's settings (only ``routing-loss-rows`` and ``seed`` vary); ``overrides``:
    other run-config keys."""
    with open(REPOSITORY / "pyproject.toml", "rb") as stream:
        defaults = tomllib.load(stream)["tool"]["flwr"]["app"]["config"]
    return {**defaults, "task": "dataset", "dataset": str(dataset), "partitioner": partitioner,
            "num-groups": NUM_GROUPS, "group-transform": "rotate", "num-clusters": NUM_GROUPS,
            "num-clients": clients, "num-server-rounds": rounds, "min-train-nodes": clients,
            "method": method, "client-device": "cpu", "routing-loss-rows": rows, "seed": seed,
            "results-dir": str(results), "progress-interval": 0.0,
            "routing-early-stop": "false", **overrides}             # every row: the subsample is the variable


def run_once(config: dict[str, Any], results: Path) -> dict[str, Any]:
    """One in-process run; its numbers (see the module docstring)."""
    import pandas as pd
    from flwr.app import Context, MessageType, RecordDict
    from flwr.common.constant import SUPERLINK_NODE_ID

    from bench_batched_losses import LocalGrid
    from fedroute.client import app as client
    from fedroute.core.metrics import assignment_accuracy
    from fedroute.server.app import main

    handlers = {MessageType.TRAIN: client.train, MessageType.QUERY: client.provisional,
                MessageType.EVALUATE: client.evaluate}
    grid = LocalGrid(int(config["num-clients"]),
                     lambda message, context: handlers[message.metadata.message_type](message, context), config)
    started = time.perf_counter()
    main(grid, Context(run_id=1, node_id=SUPERLINK_NODE_ID, node_config={}, state=RecordDict(),
                       run_config=dict(config)))
    seconds = time.perf_counter() - started
    summary = json.loads((results / "1" / "summary.json").read_text())[config["method"]]
    routes = pd.read_parquet(results / "1" / "routes.parquet")
    last = routes[routes["round_index"] == routes["round_index"].max()].sort_values("client_id")
    final_routes = assignment_accuracy(last["cluster"].to_numpy(), last["client_id"].to_numpy() % NUM_GROUPS,
                                       NUM_GROUPS)
    metrics = summary["evaluation_metrics"]
    return {"final_routes": float(final_routes), "heldout_assignment": summary["assignment_accuracy_test"],
            "accuracy": metrics["accuracy"], "worst_decile": metrics["accuracy_worst_decile"],
            "usable_models": summary["usable_models_test"], "seconds": seconds}


@contextlib.contextmanager
def digits_workspace(prefix: str) -> Iterator[tuple[Path, Path]]:
    """``(work, dataset)``: a temporary folder holding the offline digits Parquet, set up for in-process runs."""
    from bench_batched_losses import in_process_runs
    from fedroute.data.standins import write_digits_parquet

    in_process_runs()
    with tempfile.TemporaryDirectory(prefix=prefix) as work:
        yield Path(work), write_digits_parquet(Path(work) / "digits.parquet")


def study(rows: list[int], seeds: list[int], clients: int, rounds: int, method: str = EXP3) -> list[dict[str, Any]]:
    """Every ``(rows, seed)`` run, interleaved by seed."""
    out = []
    with digits_workspace("fedroute-rows-") as (work, dataset):
        for seed in seeds:
            for m in rows:
                results = work / f"results-{seed}-{m}"
                numbers = run_once(run_config(dataset, results, m, seed, clients, rounds, method), results)
                out.append({"rows": m, "seed": seed, **numbers})
                print(json.dumps(out[-1]), flush=True)
    return out


def table(runs: list[dict[str, Any]], clients: int, rounds: int, train_rows: Optional[float],
          method: str = EXP3) -> str:
    """Markdown: one line per ``routing-loss-rows``, the seeds' values side by side."""
    seeds = sorted({run["seed"] for run in runs})
    lines = ["| routing-loss-rows | final routes on the group's model | held-out assignment | accuracy "
             "| worst 10 % | usable models |", "|---|---|---|---|---|---|"]
    for m in dict.fromkeys(run["rows"] for run in runs):
        chosen = [next(r for r in runs if r["rows"] == m and r["seed"] == s) for s in seeds]

        def cell(key: str, form: str = "{:.2f}") -> str:
            return " / ".join(form.format(r[key]) for r in chosen)

        label = f"all (≈ {train_rows:.0f})" if m == 0 and train_rows else ("all" if m == 0 else str(m))
        lines.append(f"| {label} | {cell('final_routes')} | {cell('heldout_assignment')} | {cell('accuracy', '{:.3f}')} "
                     f"| {cell('worst_decile', '{:.3f}')} | {cell('usable_models', '{}')} |")
    return (f"*{clients} clients (IID digits, 4 rotation groups), K = 4, method {method}, 5 local epochs, "
            f"{rounds} rounds; seeds {' / '.join(map(str, seeds))} side by side*\n\n" + "\n".join(lines) + "\n")


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", nargs="+", type=int, default=[0, 64, 32, 16], help="0 = every training row")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    parser.add_argument("--clients", type=int, default=12)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--method", default=EXP3, choices=METHODS)
    args = parser.parse_args(argv)
    runs = study(args.rows, args.seeds, args.clients, args.rounds, args.method)
    train_rows = 1797 / args.clients * 0.8
    print(table(runs, args.clients, args.rounds, train_rows, args.method))


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()
