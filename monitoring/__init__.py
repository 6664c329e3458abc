"""Observability of a routing run: telemetry tables, alarms, TensorBoard, progress and the live monitor.

* :mod:`~fedroute.monitoring.telemetry` — the per-round and per-client tables
  (schema, pure row builders, an incremental CSV writer with Parquet copies,
  a reader);
* :mod:`~fedroute.monitoring.alarms` — the collapse alarms as a pure state
  machine over the rounds (collapsed entrance, starvation, duplication,
  recovery, dead federation);
* :mod:`~fedroute.monitoring.progress` — round counter and ETA lines;
* :mod:`~fedroute.monitoring.tensorboard` — TensorBoard event files (optional
  extra ``fedroute[tensorboard]``);
* :mod:`~fedroute.monitoring.recorder` — one object per run that the Flower
  strategy and the batched simulator both feed (rows → alarms → files);
* :mod:`~fedroute.monitoring.monitor` — ``fedroute monitor RUN_DIR`` (rich) and its figure.

Nothing here imports Flower or torch; ``docs/telemetry.md`` documents every column.
"""
