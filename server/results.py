"""A run's results directory: config.json, rounds.csv/.parquet, summary.json, cluster_models.npz."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import pandas as pd
from numpy.typing import NDArray

__all__ = ["write_results", "summary_table", "atomic_write_text"]


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(handle, "w") as stream:
        stream.write(text)
    os.replace(temporary, path)


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, tuple):
        return list(value)
    raise TypeError(f"cannot serialise {type(value).__name__}")


def write_results(
    directory: Path,
    config: Mapping[str, Any],
    rounds: pd.DataFrame,
    summaries: Mapping[str, Mapping[str, Any]],
    cluster_models: Mapping[str, NDArray],
    routes: pd.DataFrame | None = None,
) -> Path:
    """Write the four result files into ``directory`` (created if needed).

    Parameters
    ----------
    directory : Path
        ``results/<run-id>/``.
    config : mapping
        The full resolved config.
    rounds : DataFrame
        One row per (method, round).
    summaries : mapping
        Method → summary dict.
    cluster_models : mapping
        Array name (``<method>/cluster-<k>``) → final model vector.
    routes : DataFrame, optional
        One row per (method, round, client): the executed hard route
        (``routes.csv`` / ``routes.parquet``).

    Returns
    -------
    Path
        ``directory``.
    """
    directory.mkdir(parents=True, exist_ok=True)
    atomic_write_text(directory / "config.json", json.dumps(config, indent=2, default=_json_default))
    atomic_write_text(directory / "summary.json", json.dumps(summaries, indent=2, default=_json_default))
    rounds.to_csv(directory / "rounds.csv", index=False)
    rounds.to_parquet(directory / "rounds.parquet", index=False)
    if routes is not None:
        routes.to_csv(directory / "routes.csv", index=False)
        routes.to_parquet(directory / "routes.parquet", index=False)
    np.savez(directory / "cluster_models.npz", **{name: np.asarray(value) for name, value in cluster_models.items()})
    return directory


def summary_table(summaries: Mapping[str, Mapping[str, Any]]) -> str:
    """The per-method table printed at the end of a run."""
    header = f"{'method':<12} {'R_T':>7} {'recovered':>9} {'K_eval tr/te':>12} {'assign acc':>10} {'rounds':>6} {'wall s':>7}"
    lines = [header, "-" * len(header)]
    for method, summary in summaries.items():
        error = summary.get("recovery_error")
        recovered = summary.get("recovered")
        lines.append(
            f"{method:<12} {error if error is not None else float('nan'):>7.3f} "
            f"{('yes' if recovered else 'no') if recovered is not None else '-':>9} "
            f"{summary['usable_models_train']:>6}/{summary['usable_models_test']:<5} "
            f"{summary['assignment_accuracy_test']:>10.3f} {summary['rounds']:>6} {summary['wall_seconds']:>7.1f}"
        )
    return "\n".join(lines)
