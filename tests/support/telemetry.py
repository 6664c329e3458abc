"""The routing telemetry of two runtimes compared (the rounds and clients tables)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from fedroute.monitoring.telemetry import CLIENTS_FILE, ROUNDS_FILE, read_table

TIMING = ("seconds",)
UNKNOWN_TO_THE_SIMULATOR = ("node_id",)


def assert_same_telemetry(flower_dir: Path, simulator_dir: Path) -> None:
    """Both run directories hold the same rounds and clients tables (timing and node ids aside)."""
    for name, skip in ((ROUNDS_FILE, TIMING), (CLIENTS_FILE, UNKNOWN_TO_THE_SIMULATOR)):
        flower, simulated = read_table(flower_dir / name), read_table(simulator_dir / name)
        assert list(flower.columns) == list(simulated.columns), name
        keys = ["method", "server_round"] + (["client_id"] if name == CLIENTS_FILE else [])
        flower = flower.sort_values(keys, kind="stable").reset_index(drop=True)
        simulated = simulated.sort_values(keys, kind="stable").reset_index(drop=True)
        columns = [column for column in flower.columns if column not in skip]
        # losses go through a torch or a remote client and back: equal to float rounding
        pd.testing.assert_frame_equal(flower[columns], simulated[columns], check_exact=False, rtol=1e-9, atol=1e-12,
                                      obj=name)
