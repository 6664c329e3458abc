"""The ServerApp: ClusteredRouting with the generic default; K identical copies of one module."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from fedroute import ClusteredRouting, cluster_models_from_torch, method_settings
from boundaries_app.task import make_model

app = ServerApp()


@app.main()
def main(grid: Grid, context: Context) -> None:
    config = context.run_config
    num_clusters, seed = int(config["num-clusters"]), int(config["seed"])
    torch.manual_seed(seed)
    module = make_model()
    summary = {}
    for method in str(config["methods"]).split(","):
        strategy = ClusteredRouting(method_settings(method, num_clusters=num_clusters), min_available_nodes=15,
                                    seed=seed, run_key=method)
        strategy.start(grid, cluster_models_from_torch([module] * num_clusters),
                       num_rounds=int(config["num-server-rounds"]))
        summary[method] = {
            "history": strategy.history,
            "final_evaluation": [{"client_id": r.client_id, "group": r.group, "test_losses": r.test_losses.tolist()}
                                 for r in strategy.final_evaluation],
            "cluster_models": [{name: value.tolist() for name, value in model.items()}
                               for model in strategy.cluster_models],
            "rejected": strategy.rejected,
        }
        print(f"{method}: final masses {strategy.routing_masses}", flush=True)
    Path(str(config["results-path"])).write_text(json.dumps(summary))
