"""TensorBoard event files of a routing run (``tensorboard --logdir <dir>``).

Per round ``t`` (the step): ``mass/cluster_<k>``, ``routed/cluster_<k>``,
``routed_train_loss``, ``arm/<controller>`` (the EXP3 arm mix) and
``alarms/active`` as scalars; every alarm raised or cleared as text under
``alarms``.  Written with TensorBoard's own event writer and protos (no
TensorFlow, no torch); needs the optional extra ``fedroute[tensorboard]``,
imported only when a writer is made.
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from fedroute.monitoring.alarms import AlarmEvent

__all__ = ["TensorBoardWriter"]


class TensorBoardWriter:
    """One TensorBoard run (a directory of event files).

    Parameters
    ----------
    directory : path
        The run's log directory (e.g. ``<results>/tensorboard/<method>``:
        TensorBoard shows each sub-directory as a run).
    num_clusters : int
        ``K``.
    controllers : sequence of str
        The method's arms (their mix is written as ``arm/<name>``).
    """

    def __init__(self, directory: str | Path, num_clusters: int, controllers: Sequence[str]) -> None:
        try:
            from tensorboard.summary.writer.event_file_writer import EventFileWriter
        except ImportError as error:  # pragma: no cover - depends on the installation
            raise ImportError("TensorBoard logging needs the package 'tensorboard': "
                              "pip install 'fedroute[tensorboard]'") from error
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.num_clusters = int(num_clusters)
        self.controllers = tuple(controllers)
        self._writer = EventFileWriter(str(self.directory))

    def _event(self, step: int, summary: Any) -> None:
        from tensorboard.compat.proto.event_pb2 import Event

        self._writer.add_event(Event(wall_time=time.time(), step=int(step), summary=summary))

    def write_round(self, record: Mapping[str, Any], events: Sequence[AlarmEvent] = (), active_alarms: int = 0
                    ) -> None:
        """Scalars of one per-round record (:func:`~fedroute.monitoring.telemetry.round_record`), and its alarms.

        ``active_alarms`` (alarms raised and not cleared after the round) is written as ``alarms/active``.
        """
        from tensorboard.compat.proto.summary_pb2 import Summary
        from tensorboard.plugins.text.summary_v2 import text_pb

        step = int(record["round_index"])
        values = {f"mass/cluster_{k}": record[f"mass_{k}"] for k in range(self.num_clusters)}
        values.update({f"routed/cluster_{k}": record[f"routed_{k}"] for k in range(self.num_clusters)})
        values.update({f"arm/{name}": record[f"arm_{name}"] for name in self.controllers})
        if math.isfinite(record["routed_train_loss"]):
            values["routed_train_loss"] = record["routed_train_loss"]
        for event in events:
            self._event(step, text_pb("alarms", f"**{event.kind} {event.event}** (t={step}): {event.message}"))
        values["alarms/active"] = active_alarms
        self._event(step, Summary(value=[Summary.Value(tag=tag, simple_value=float(value))
                                         for tag, value in values.items()]))
        self._writer.flush()

    def write_scalars(self, step: int, values: Mapping[str, float]) -> None:
        """Scalars at ``step`` (e.g. an evaluation's ``eval/accuracy/mean``)."""
        from tensorboard.compat.proto.summary_pb2 import Summary

        if values:
            self._event(step, Summary(value=[Summary.Value(tag=tag, simple_value=float(value))
                                             for tag, value in values.items()]))
            self._writer.flush()

    def close(self) -> None:
        """Flush and close the event file."""
        self._writer.close()
