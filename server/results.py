"""A run's results directory: config.json, status.json, summary.json, cluster_models.npz, routes.

The per-round and per-client tables (``rounds.csv``, ``clients.csv``, their
Parquet copies) and ``alarms.jsonl`` are appended round by round by the
strategies' :class:`~fedroute.monitoring.recorder.RunRecorder`; the files here
are rewritten whenever a method ends, so a method's results are on disk as
soon as it is done.  Each of them is written to a temporary file in the same
directory, flushed to disk and renamed over the old one
(:func:`fedroute.atomic_files.atomic_write`): a crash leaves the previous
complete file or the new one, never a torn file.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Mapping, Optional

import numpy as np
import pandas as pd
from numpy.typing import NDArray

from fedroute.atomic_files import atomic_write
from fedroute.monitoring.recorder import STATUS_FILE

__all__ = ["write_results", "write_status", "summary_table", "atomic_write_text"]


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename."""
    atomic_write(path, lambda stream: stream.write(text), mode="w")


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


def write_status(directory: Path, state: str, **fields: Any) -> None:
    """``status.json``: ``{"state": running|finished|failed, "updated": <unix time>, **fields}`` (atomic)."""
    atomic_write_text(directory / STATUS_FILE,
                      json.dumps({"state": state, "updated": time.time(), **fields}, indent=2, default=_json_default))


def write_results(
    directory: Path,
    config: Mapping[str, Any],
    rounds: Optional[pd.DataFrame],
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
    rounds : DataFrame or None
        One row per (method, round); ``None`` when the telemetry writer keeps ``rounds.csv``.
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
    tables = {name: table for name, table in (("rounds", rounds), ("routes", routes)) if table is not None}
    for name, table in tables.items():
        atomic_write(directory / f"{name}.csv", lambda stream, table=table: table.to_csv(stream, index=False),
                     mode="w")
        atomic_write(directory / f"{name}.parquet", lambda stream, table=table: table.to_parquet(stream, index=False))
    atomic_write(directory / "cluster_models.npz",
                 lambda stream: np.savez(stream, **{name: np.asarray(value) for name, value in cluster_models.items()}))
    # Last: a summary.json that lists a method means its other files are complete.
    atomic_write_text(directory / "summary.json", json.dumps(summaries, indent=2, default=_json_default))
    return directory


def summary_table(summaries: Mapping[str, Mapping[str, Any]]) -> str:
    """The per-method table printed at the end of a run (accuracy: the mean over clients, each at its
    lowest-training-loss model, and the mean of the worst decile of clients; ``-`` where the task has none)."""
    header = f"{'method':<12} {'R_T':>7} {'recovered':>9} {'K_eval tr/te':>12} {'assign acc':>10} " \
             f"{'test loss':>9} {'accuracy':>8} {'worst 10%':>9} {'rounds':>6} {'wall s':>7}  alarms at the end"
    lines = [header, "-" * len(header)]
    for method, summary in summaries.items():
        if "usable_models_train" not in summary:  # the method failed or was not evaluated
            lines.append(f"{method:<12} {summary.get('error', 'no evaluation')}")
            continue
        error = summary.get("recovery_error")
        recovered = summary.get("recovered")
        evaluation = summary.get("evaluation_metrics", {})
        lines.append(
            f"{method:<12} {error if error is not None else float('nan'):>7.3f} "
            f"{('yes' if recovered else 'no') if recovered is not None else '-':>9} "
            f"{summary['usable_models_train']:>6}/{summary['usable_models_test']:<5} "
            f"{summary['assignment_accuracy_test']:>10.3f} {_value(evaluation, 'test_loss'):>9} "
            f"{_value(evaluation, 'accuracy'):>8} {_value(evaluation, 'accuracy_worst_decile'):>9} "
            f"{summary['rounds']:>6} {summary['wall_seconds']:>7.1f}  {_alarm_text(summary)}"
        )
    return "\n".join(lines)


def _value(metrics: Mapping[str, Any], key: str) -> str:
    """A metric with three decimals, ``-`` when absent."""
    return f"{metrics[key]:.3f}" if key in metrics else "-"


def _alarm_text(summary: Mapping[str, Any]) -> str:
    """``starvation(1), collapsed-entrance(1)`` for the alarms still active; ``recovered at t=1`` / ``none``."""
    alarms = summary.get("alarms", [])
    active = [alarm for alarm in alarms if alarm["kind"] != "recovery" and alarm["cleared_round"] is None]
    if active:
        return ", ".join(f"{alarm['kind']}({','.join(map(str, alarm['clusters']))})" for alarm in active)
    recoveries = [alarm for alarm in alarms if alarm["kind"] == "recovery"]
    return f"none (recovery at t={recoveries[-1]['raised_round']})" if recoveries else "none"
