"""One run's observer: rows → alarms → files, fed alike by the Flower strategy and the batched simulator.

:meth:`RunRecorder.round` turns a round's :class:`~fedroute.monitoring.telemetry.ClientReplies`
into the per-round record and per-client rows, updates the alarms and logs
their events at once; :meth:`RunRecorder.commit` then writes what is pending
(telemetry CSVs, ``alarms.jsonl``, TensorBoard) and logs a progress line when
one is due.  The strategy commits after its checkpoint of the round, so a
round on disk is a round the checkpoint holds.
"""

from __future__ import annotations

import csv
import json
import logging
import math
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

import numpy as np
from numpy.typing import NDArray

from fedroute.core.evaluation import evaluation_line, metric_table
from fedroute.monitoring.alarms import AlarmEvent, AlarmMonitor, AlarmSettings, log_events
from fedroute.monitoring.progress import RoundProgress, progress_line
from fedroute.monitoring.telemetry import (
    ClientReplies,
    TelemetryWriter,
    client_columns,
    rejected_columns,
    round_record,
    short_reason,
)

__all__ = ["RunRecorder", "ALARMS_FILE", "STATUS_FILE", "EVALUATION_FILE"]

EVALUATION_FILE = "evaluation.csv"
"""Every evaluation of the clients (during training and the final one), long format: ``method,
server_round, metric, scope, value`` (:func:`fedroute.core.evaluation.metric_table`)."""

ALARMS_FILE = "alarms.jsonl"
"""Alarm events, one JSON object per line, appended as they happen."""
EVALUATION_COLUMNS = ["method", "server_round", "metric", "scope", "value"]
STATUS_FILE = "status.json"
"""A run directory's state (``running``, ``finished``, ``failed``) and plan, written by the ServerApp and
``fedroute simulate``; read by ``fedroute monitor``."""


class RunRecorder:
    """Telemetry, alarms, TensorBoard and progress of one run (one method).

    Parameters
    ----------
    label : str
        The run's name in the tables (``method`` column), logs and TensorBoard.
    num_clusters : int
        ``K``.
    controllers : sequence of str
        The method's EXP3 arms.
    num_rounds : int
        Rounds the run will have (progress and ETA).
    alarm_settings : AlarmSettings
        Alarm thresholds.
    starvation_basin : bool, optional
        Whether ``W^0`` lies in the certified starvation basin, if the task can tell.
    telemetry_dir : path, optional
        Append ``rounds.csv``, ``clients.csv`` and ``alarms.jsonl`` here.
    tensorboard_dir : path, optional
        Write TensorBoard event files here (needs ``fedroute[tensorboard]``).
    progress_interval : float, optional
        Seconds between progress lines (``None``: no progress lines).
    logger : logging.Logger
        Where alarms and progress go.
    random_ties : bool
        Whether the clients break exact ties at random (identical copies are then no collapse).
    table_width : int, optional
        Per-cluster columns of the telemetry tables when methods of several ``K`` share them (≥ ``K``).
    """

    def __init__(
        self,
        label: str,
        num_clusters: int,
        controllers: Sequence[str],
        num_rounds: int,
        *,
        alarm_settings: AlarmSettings = AlarmSettings(),
        starvation_basin: Optional[bool] = None,
        telemetry_dir: Optional[str | Path] = None,
        tensorboard_dir: Optional[str | Path] = None,
        progress_interval: Optional[float] = 5.0,
        logger: logging.Logger = logging.getLogger("fedroute"),
        random_ties: bool = False,
        table_width: Optional[int] = None,
    ) -> None:
        self.label = label
        self.num_clusters = int(num_clusters)
        self.controllers = tuple(controllers)
        self.num_rounds = int(num_rounds)
        self.alarms = AlarmMonitor(num_clusters, alarm_settings, starvation_basin, controllers, random_ties)
        self.telemetry_dir = Path(telemetry_dir) if telemetry_dir is not None else None
        self.telemetry = TelemetryWriter(self.telemetry_dir, num_clusters, table_width) if self.telemetry_dir else None
        self.tensorboard_dir = Path(tensorboard_dir) if tensorboard_dir is not None else None
        self._tensorboard: Any = None
        self.progress_interval = progress_interval
        self._progress: Optional[RoundProgress] = None
        self.logger = logger
        # In arrival order: a round (record, client rows, alarm events) or rejections outside rounds.
        self._pending: list[tuple[dict[str, Any], dict[str, list], list[AlarmEvent]] | list[Mapping[str, Any]]] = []

    # ------------------------------------------------------------------ observing
    def start(self, first_round: int = 1, history: Sequence[Mapping[str, Any]] = ()) -> None:
        """Begin (or resume at ``first_round``); restored ``history`` rows missing from ``rounds.csv`` are written."""
        self._progress = RoundProgress(self.num_rounds, first_round,
                                       self.progress_interval if self.progress_interval is not None else math.inf)
        if self.tensorboard_dir is not None and self._tensorboard is None:
            from fedroute.monitoring.tensorboard import TensorBoardWriter

            self._tensorboard = TensorBoardWriter(self.tensorboard_dir, self.num_clusters, self.controllers)
        if self.telemetry is not None and history:
            written = self.telemetry.written_rounds(self.label)
            for record in history:
                if int(record["server_round"]) not in written:
                    self.telemetry.write_round(self.label, record)

    def round(
        self,
        server_round: int,
        replies: ClientReplies,
        masses: Optional[NDArray[np.float64]],
        changed: Sequence[bool],
        rejected: Sequence[Mapping[str, Any]] = (),
        seconds: float = 0.0,
        rejected_count: Optional[int] = None,
        spare: Optional[NDArray[np.bool_]] = None,
    ) -> dict[str, Any]:
        """Record training round ``server_round``; return its per-round record (alarms are logged now).

        ``rejected`` holds this round's rejected training replies
        (``server_round``, ``phase``, ``node_id``, ``reason`` each); ``rejected_count``
        how many there were if that is more (the strategy keeps at most 100 a round).
        ``masses`` are the masses the clients receive (the federation estimate), ``spare`` the
        server's spare clusters (:mod:`fedroute.core.health`), if the routing reads them.
        """
        count = len(rejected) if rejected_count is None else rejected_count
        record = round_record(server_round, replies, masses, changed, count, seconds, self.controllers)
        events = self.alarms.observe(server_round - 1, replies.losses, replies.routes,
                                     [short_reason(entry["reason"], 200) for entry in rejected],
                                     preferred=replies.preferred, masses=masses, spare=spare)
        log_events(self.logger, self.label, events)
        clients = client_columns(self.label, server_round, replies, self.controllers)
        if rejected:
            extra = rejected_columns(self.label, rejected, self.num_clusters)
            clients = {name: values + extra[name] for name, values in clients.items()}
        self._pending.append((record, clients, events))
        return record

    def evaluation(self, server_round: int, metrics: Mapping[str, float]) -> None:
        """Record an evaluation of the clients at the models after ``server_round``: ``evaluation.csv``
        (appended now), TensorBoard ``eval/<metric>/<scope>`` scalars and one log line."""
        rows = metric_table(self.label, server_round, metrics)
        if self.telemetry_dir is not None:
            path = self.telemetry_dir / EVALUATION_FILE
            fresh = not path.exists() or path.stat().st_size == 0
            self.telemetry_dir.mkdir(parents=True, exist_ok=True)
            with open(path, "a", newline="") as stream:
                writer = csv.DictWriter(stream, fieldnames=EVALUATION_COLUMNS, lineterminator="\n")
                if fresh:
                    writer.writeheader()
                writer.writerows(rows)
        if self._tensorboard is not None:
            self._tensorboard.write_scalars(server_round - 1, {
                f"eval/{row['metric']}/{row['scope']}": row["value"] for row in rows
                if row["metric"] != "num_clients" and math.isfinite(row["value"])})
        self.logger.info("[%s] evaluation after round %d (%d clients): %s", self.label, server_round,
                         int(metrics.get("num_clients", 0)), evaluation_line(metrics))

    def rejected_outside_rounds(self, rejected: Sequence[Mapping[str, Any]]) -> None:
        """Rejected replies of the provisional or evaluation exchange (written with the next commit)."""
        self._pending.append(list(rejected))

    # ------------------------------------------------------------------ writing
    def commit(self) -> None:
        """Write what is pending; log a progress line if one is due."""
        pending, self._pending = self._pending, []
        for item in pending:
            if isinstance(item, list):
                if self.telemetry is not None and item:
                    self.telemetry.write_clients(rejected_columns(self.label, item, self.num_clusters))
                continue
            record, clients, events = item
            if self.telemetry is not None:
                self.telemetry.write_round(self.label, record, clients)
                if events:
                    with open(self.telemetry_dir / ALARMS_FILE, "a") as stream:  # type: ignore[operator]
                        stream.write("".join(json.dumps({"method": self.label, "server_round": event.round_index + 1,
                                                         **event.to_dict()}) + "\n" for event in events))
            if self._tensorboard is not None:
                self._tensorboard.write_round(record, events, len(self.alarms.active))
            self._log_progress(record)

    def _log_progress(self, record: Mapping[str, Any]) -> None:
        if self._progress is None:
            self.start()
        assert self._progress is not None
        server_round = int(record["server_round"])
        if not self._progress.round_done(server_round) or self.progress_interval is None:
            return
        line = progress_line(self.label, server_round, self.num_rounds, self._progress.seconds_per_round,
                             [record[f"mass_{k}"] for k in range(self.num_clusters)], record["routed_train_loss"])
        active = self.alarms.active
        if active:
            line += " · alarms: " + ", ".join(
                alarm.kind + (f"({','.join(map(str, alarm.clusters))})" if alarm.clusters else "") for alarm in active)
        self.logger.info("%s", line)

    def close(self) -> None:
        """Write what is pending, the Parquet copies of the tables, and close TensorBoard."""
        self.commit()
        if self.telemetry is not None:
            self.telemetry.to_parquet()
        if self._tensorboard is not None:
            self._tensorboard.close()
            self._tensorboard = None

    def summary(self) -> dict[str, Any]:
        """``alarms`` (every alarm raised, JSON-ready) and ``active_alarms`` (kinds still active)."""
        return {"alarms": [alarm.to_dict() for alarm in self.alarms.alarms],
                "active_alarms": [alarm.kind for alarm in self.alarms.active]}
