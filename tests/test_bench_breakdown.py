"""The server-side breakdown of ``bench/bench_fedavg.py`` runs with the strategy a user's app gets (the generic
default, whose exploitation phase needs the run's number of rounds) and reports consistent parts."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import bench_fedavg  # noqa: E402  (bench/ is a folder of scripts, not a package)


def test_server_breakdown_has_a_row_per_k_and_the_total_contains_its_parts() -> None:
    table = bench_fedavg.server_breakdown([2, 4], num_clients=6)
    rows = [line for line in table.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert [row.split("|")[1].strip() for row in rows] == ["2", "4"]
    for row in rows:
        cells = [float(cell) for cell in row.strip("|").split("|")[1:]]
        messages, encode, validate, flatten, hard_update, matmul, total = cells
        assert all(value > 0 for value in (encode, validate, hard_update, total))
        assert total >= validate + hard_update  # aggregate_train validates and updates, among other things
