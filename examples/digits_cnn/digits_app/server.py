"""The ServerApp: ClusteredRouting in place of FedAvg, K CNNs as the initial cluster models."""

from __future__ import annotations

import json
import time
from collections import Counter
from pathlib import Path

import numpy as np
from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from fedroute import ClusteredRouting, cluster_models_from_torch, method_settings
from digits_app.task import GROUP_TRANSFORMS, make_model

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    """Run clustered routing, then print (and optionally write) the controller-free evaluation."""
    config = context.run_config
    num_clusters, seed = int(config["num-clusters"]), int(config["seed"])
    # The generic default (no preset): meant for a model the paper never ran.
    hold, start_on = config.get("signature-hold-rounds", "auto"), config.get("signature-start-on", "auto")
    routing = method_settings(str(config["method"]), num_clusters=num_clusters,
                              signature_hold_rounds=None if hold == "auto" else int(hold),
                              signature_start_on=None if start_on == "auto" else str(start_on))
    strategy = ClusteredRouting(
        routing,
        fraction_train=float(config["fraction-train"]),
        min_available_nodes=int(config["min-nodes"]),
        seed=seed,
    )
    initial = cluster_models_from_torch([make_model(seed * 100 + k) for k in range(num_clusters)])
    started = time.monotonic()
    strategy.start(grid, initial, num_rounds=int(config["num-server-rounds"]))
    wall = time.monotonic() - started

    evaluation = strategy.final_evaluation
    choices = {reply.client_id: int(np.argmin(reply.test_losses)) for reply in evaluation}
    groups = {reply.client_id: reply.group for reply in evaluation}
    masses = [] if strategy.routing_masses is None else [float(m) for m in strategy.routing_masses]
    print(f"\nclustered routing ({config['method']}, K={num_clusters}): {len(strategy.history)} rounds "
          f"in {wall:.1f} s; final masses {[round(m, 2) for m in masses]}")
    print("group  transform           clients  best model (held-out loss) per client")
    for group, transform in enumerate(GROUP_TRANSFORMS):
        members = sorted(c for c, g in groups.items() if g == group)
        if members:
            picked = Counter(choices[c] for c in members)
            print(f"{group:5d}  {transform:18s}  {len(members):7d}  {dict(sorted(picked.items()))}")
    usable = len(set(choices.values()))
    print(f"usable models (distinct best models): {usable} of {num_clusters}\n", flush=True)

    if str(config["results-path"]):
        summary = {
            "method": str(config["method"]),
            "num_clusters": num_clusters,
            "wall_seconds": wall,
            "history": strategy.history,
            "final_masses": masses,
            "final_evaluation": [
                {"client_id": r.client_id, "group": r.group, "num_examples": r.num_examples,
                 "train_losses": r.train_losses.tolist(), "test_losses": r.test_losses.tolist()}
                for r in evaluation
            ],
            "usable_models": usable,
            "rejected": strategy.rejected,
        }
        path = Path(str(config["results-path"]))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(summary, indent=1, default=float))
