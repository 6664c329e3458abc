"""What clustered routing costs: Flower's FedAvg against ClusteredRouting (K = 2, 4, 8), side by side.

Run: ``python bench/bench_fedavg.py [--docs FILE]`` (≈ 1.5 h on 2 loaded cores with the defaults; see
``--help`` for sizes, rounds and repeats, e.g. ``--skip-large --deployment --repeat 1 --headline-repeat 0``
for a quick look).  ``bench/run_all.py --write docs/performance.md`` runs it together with
``bench/bench_reproduce.py`` and writes the targets table too.

Both sides use the same Flower app, built by this script in a temporary
directory from this file and the example's user code
(``examples/digits_cnn/digits_app``): the same clients (sklearn digits, four
transformed groups, 96 training examples each), the same CNN (38 k
parameters) and the same local training (one epoch of SGD, batch 16).  FedAvg
is ``flwr.serverapp.strategy.FedAvg`` with a plain ClientApp handler (load the
global model, train, reply); routing is :class:`fedroute.ClusteredRouting`
(EXP3 over Greedy and selective hysteresis) with :func:`fedroute.routing_train`
in the same handler.  Three measurements:

1. **Flower simulation** (``flwr run``, Ray, one CPU per simulated client),
   every configuration run ``--repeat`` times, interleaved, so that a busy
   spell of the machine hits all alike (FedAvg and ``K = 2``, the headline
   comparison, ``--headline-repeat`` times more), with 1 local epoch and,
   for FedAvg and ``K = 2``, ``--longer-epochs`` local epochs.  The ServerApp records per round the
   wall time from one ``configure_train`` call to the next (start-up and the
   first ``--warmup`` round, which loads the ClientApps, excluded), the
   strategy's own time, the simulation process's CPU time, the bytes of the
   ArrayRecords sent and received (``count_bytes()``), and each client's CPU
   time in its handler, ``loss_fn`` and ``train_fn``; at the end the process's
   peak RSS (``resource.getrusage``; the ServerApp runs in the simulation
   process, next to Ray's driver and the in-memory link state).
2. **1,000 virtual clients**, 5 % sampled per round, the same way.
3. **In-process compute** (no Flower transport, one thread): the same
   handlers and strategies, rounds of ``--clients`` clients driven in this
   process, CPU time per part.  Flower's simulation polls for messages every
   0.1 s, so its round times move in steps of 0.1 s; this measurement shows
   the cost of the work itself.

The script prints markdown tables and, with ``--docs``, writes them between
the ``bench-table`` markers of that file.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import FedAvg

from bench_clientapp import FLOOR, NO_LOSS, client_app, client_evaluate, client_train  # noqa: F401  (client_app: the app's)
from ratios import pair_ratios_of, paired_ratio
from fedroute import ClusteredRouting, cluster_models_from_torch, method_settings
from fedroute.core.methods import EXP3, FEDAVG

REPOSITORY = Path(__file__).resolve().parents[1]
EXAMPLE = REPOSITORY / "examples" / "digits_cnn"
TABLE_BEGIN, TABLE_END = "<!-- bench-table:begin -->", "<!-- bench-table:end -->"
APP_CONFIG = {
    "strategy": FEDAVG,          # FEDAVG, "fedavg-evaluate", "routing"; diagnostics "routing-no-loss", "fedavg-losses"
    "num-clusters": 2,
    "routing-preset": "",        # "" = the generic default a user's app gets; "characters" = the paper's E4 preset
    "num-server-rounds": 11,
    "fraction-train": 1.0,
    "min-nodes": 12,
    "seed": 0,
    "samples-per-client": 120,
    "local-epochs": 1,
    "batch-size": 16,
    "learning-rate": 0.1,
    "results-path": "",
}
LABELS = {FEDAVG: "FedAvg", "fedavg-evaluate": "FedAvg + evaluate every round (Flower's default)"}
def label_of(strategy: str, num_clusters: int) -> str:
    """A configuration's name in the tables."""
    if strategy == NO_LOSS:
        return f"ClusteredRouting K={num_clusters}, loss_fn not run (diagnostic)"
    if strategy == FLOOR:
        return f"FedAvg + {num_clusters} loss_fn passes per client (diagnostic)"
    return LABELS.get(strategy, f"ClusteredRouting K={num_clusters}")


def carries_k(strategy: str) -> bool:
    """Whether a configuration has a ``K`` (routing, and the floor diagnostic's number of loss passes)."""
    return strategy.startswith("routing") or strategy == FLOOR

# ================================================================================ the app
server_app = ServerApp()


def _array_bytes(content: RecordDict) -> int:
    return sum(record.count_bytes() for record in content.array_records.values())


class _Timing:
    """Per round: wall time, strategy time, CPU time of this thread and process, bytes, client timings."""

    def _init_timing(self) -> None:
        self.marks: list[float] = []
        self.thread_cpu_marks: list[float] = []
        self.process_cpu_marks: list[float] = []
        self.strategy_seconds: list[float] = []
        self.bytes_down: list[int] = []
        self.bytes_up: list[int] = []
        self.num_messages: list[int] = []
        self.client_timings: list[list[dict[str, float]]] = []
        self.sent_at: list[float] = []
        self.replies_seen_at: list[float] = []
        self.replies_created_at: list[list[float]] = []

    def _mark(self) -> float:
        now = time.perf_counter()
        self.marks.append(now)
        self.thread_cpu_marks.append(time.thread_time())
        self.process_cpu_marks.append(time.process_time())
        return now

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: Any, grid: Grid) -> Iterable[Message]:
        started = self._mark()
        messages = list(super().configure_train(server_round, arrays, config, grid))  # type: ignore[misc]
        self.strategy_seconds.append(time.perf_counter() - started)
        self.bytes_down.append(sum(_array_bytes(message.content) for message in messages))
        self.num_messages.append(len(messages))
        self.sent_at.append(time.time())
        return messages

    def aggregate_train(self, server_round: int, replies: Iterable[Message]) -> Any:
        self.replies_seen_at.append(time.time())
        replies = list(replies)
        good = [reply for reply in replies if not reply.has_error()]
        self.replies_created_at.append([float(reply.metadata.created_at) for reply in good])
        self.bytes_up.append(sum(_array_bytes(reply.content) for reply in good))
        self.client_timings.append([
            {key: float(value) for key, value in reply.content["metrics"].items() if key.startswith("bench-")}
            for reply in good if "metrics" in reply.content.metric_records])
        started = time.perf_counter()
        result = super().aggregate_train(server_round, replies)  # type: ignore[misc]
        self.strategy_seconds[-1] += time.perf_counter() - started
        return result

    def finish(self) -> None:
        self._mark()


class TimedFedAvg(_Timing, FedAvg):
    """Flower's FedAvg, timed."""


class TimedRouting(_Timing, ClusteredRouting):
    """fedroute's ClusteredRouting, timed."""


def make_strategy(config: dict[str, Any]) -> tuple[Any, Any]:
    """The timed strategy of a run config and its initial arrays."""
    from digits_app.task import make_model

    seed, fraction, min_nodes = int(config["seed"]), float(config["fraction-train"]), int(config["min-nodes"])
    name = str(config["strategy"])
    if name in (FEDAVG, "fedavg-evaluate", FLOOR):
        strategy: Any = TimedFedAvg(fraction_train=fraction, fraction_evaluate=fraction if name == "fedavg-evaluate" else 0.0,
                                    min_available_nodes=min_nodes, min_train_nodes=min(2, min_nodes),
                                    min_evaluate_nodes=min(2, min_nodes))
        initial: Any = ArrayRecord(make_model(seed * 100).state_dict())
    else:
        num_clusters = int(config["num-clusters"])
        strategy = TimedRouting(method_settings(EXP3, preset=str(config.get("routing-preset", "")) or None,
                                                num_clusters=num_clusters),
                                fraction_train=fraction, min_available_nodes=min_nodes,
                                min_train_nodes=min(2, min_nodes), seed=seed, evaluate_at_end=False)
        initial = cluster_models_from_torch([make_model(seed * 100 + k) for k in range(num_clusters)])
    strategy._init_timing()
    return strategy, initial


def _max_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _deltas(marks: list[float]) -> list[float]:
    return [b - a for a, b in zip(marks, marks[1:])]


@server_app.main()
def server_main(grid: Grid, context: Context) -> None:
    """Run one strategy for ``num-server-rounds`` rounds and write the measurements."""
    rss_at_start = _max_rss_mib()
    config = dict(context.run_config)
    strategy, initial = make_strategy(config)
    strategy.start(grid, initial, num_rounds=int(config["num-server-rounds"]))
    strategy.finish()
    results = {
        "strategy": str(config["strategy"]),
        "num_clusters": int(config["num-clusters"]) if carries_k(str(config["strategy"])) else 1,
        "round_seconds": _deltas(strategy.marks),
        "thread_cpu_seconds": _deltas(strategy.thread_cpu_marks),
        "process_cpu_seconds": _deltas(strategy.process_cpu_marks),
        "strategy_seconds": strategy.strategy_seconds,
        "bytes_down": strategy.bytes_down,
        "bytes_up": strategy.bytes_up,
        "num_messages": strategy.num_messages,
        "client_timings": strategy.client_timings,
        "sent_at": strategy.sent_at,
        "replies_seen_at": strategy.replies_seen_at,
        "replies_created_at": strategy.replies_created_at,
        "max_rss_mib_at_start": rss_at_start,
        "max_rss_mib": _max_rss_mib(),
        "rejected": len(getattr(strategy, "rejected", [])),
    }
    Path(str(config["results-path"])).write_text(json.dumps(results))


# ================================================================ flower simulation runs
def build_app(directory: Path) -> Path:
    """A Flower app directory: this module, the example's user code and a pyproject."""
    app = directory / "bench_app"
    app.mkdir(parents=True)
    shutil.copy(Path(__file__), app / "bench_fedavg.py")
    for module in ("bench_clientapp.py", "ratios.py"):
        shutil.copy(Path(__file__).with_name(module), app / module)
    shutil.copytree(EXAMPLE / "digits_app", app / "digits_app", ignore=shutil.ignore_patterns("__pycache__"))
    config = "\n".join(f"{key} = {json.dumps(value)}" for key, value in APP_CONFIG.items())
    (app / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools>=61"]\nbuild-backend = "setuptools.build_meta"\n\n'
        '[project]\nname = "fedroute-bench"\nversion = "1.0.0"\nlicense = "Apache-2.0"\ndependencies = []\n\n'
        '[tool.flwr.app]\npublisher = "fedroute"\n\n'
        '[tool.flwr.app.components]\nserverapp = "bench_fedavg:server_app"\nclientapp = "bench_clientapp:client_app"\n\n'
        f"[tool.flwr.app.config]\n{config}\n")
    return app


def run_configuration(app: Path, results: Path, strategy: str, num_clusters: int, num_clients: int,
                      fraction: float, rounds: int, timeout: float, local_epochs: int = 1) -> dict[str, Any]:
    """One ``flwr run``; returns the ServerApp's measurements."""
    from fedroute.deployment.launcher import run_flower_app

    path = results / f"{strategy}-k{num_clusters}-n{num_clients}-e{local_epochs}-{time.time_ns()}.json"
    load_average = os.getloadavg()[0]
    run = run_flower_app(app, {"strategy": strategy, "num-clusters": num_clusters, "num-server-rounds": rounds,
                               "fraction-train": fraction, "min-nodes": num_clients, "local-epochs": local_epochs,
                               "results-path": str(path)},
                         num_supernodes=num_clients, timeout=timeout)
    if not run.completed or not path.exists():
        raise RuntimeError(f"{strategy} K={num_clusters} n={num_clients}: {run.status}\n{run.stdout[-3000:]}")
    measured = json.loads(path.read_text())
    measured.update(wall_seconds=run.wall_seconds, load_average=load_average, local_epochs=local_epochs)
    path.write_text(json.dumps(measured))
    return measured


def summarise(runs: list[dict[str, Any]], warmup: int) -> dict[str, Any]:
    """Pooled over the measured rounds of all runs of one configuration (each run's first ``warmup`` dropped)."""
    keep = slice(warmup, None)

    def pooled(key: str) -> list[Any]:
        return [value for run in runs for value in run[key][keep]]

    clients = [timing for round_timings in pooled("client_timings") for timing in round_timings]

    def client_mean(key: str, scale: float = 1000.0) -> float:
        return scale * statistics.fmean(timing.get(key, 0.0) for timing in clients) if clients else float("nan")

    first = runs[0]
    return {
        "label": label_of(first["strategy"], first["num_clusters"]),
        "seconds": statistics.fmean(pooled("round_seconds")),
        "median_seconds": statistics.median(pooled("round_seconds")),
        "seconds_per_run": [statistics.fmean(run["round_seconds"][keep]) for run in runs],
        "strategy_seconds": statistics.fmean(pooled("strategy_seconds")),
        "process_cpu_seconds": statistics.fmean(pooled("process_cpu_seconds")),
        "clients_per_round": statistics.median(pooled("num_messages")),
        "mib_down": statistics.median(pooled("bytes_down")) / 2**20,
        "mib_up": statistics.median(pooled("bytes_up")) / 2**20,
        "handler_ms": client_mean("bench-handler"),
        "loss_ms": client_mean("bench-loss"),
        "loss_calls": client_mean("bench-loss-calls", 1.0),
        "train_ms": client_mean("bench-train"),
        "train_calls": client_mean("bench-train-calls", 1.0),
        "rss_mib": max(run["max_rss_mib"] for run in runs),
        "rss_growth_mib": max(run["max_rss_mib"] - run["max_rss_mib_at_start"] for run in runs),
        "rounds": len(pooled("round_seconds")),
        "runs": len(runs),
        "load": max(run["load_average"] for run in runs),
        "min_load": min(run["load_average"] for run in runs),
        "rejected": sum(run["rejected"] for run in runs),
    }


def pair_ratios(row: dict[str, Any], baseline: dict[str, Any]) -> str:
    """``median (min–max)`` of the per-pair ratios: run ``i`` of ``row`` over run ``i`` of the baseline
    (interleaved runs: the pairs ran next to each other)."""
    ratios = pair_ratios_of(row, baseline)
    if len(ratios) == 1:
        return f"{ratios[0]:.2f}"
    return f"{statistics.median(ratios):.2f} ({min(ratios):.2f}–{max(ratios):.2f})"


def _per_run_line(rows: list[dict[str, Any]]) -> str:
    per_run = "; ".join(f"{row['label'].split(' (')[0]} " + "/".join(f"{v:.3f}" for v in row["seconds_per_run"])
                        for row in rows)
    return (f"Mean s / round of each run: {per_run}. 1-minute load average at the runs' starts: "
            f"{min(row['min_load'] for row in rows):.1f}–{max(row['load'] for row in rows):.1f} on "
            f"{os.cpu_count()} CPUs. Rejected replies: {sum(row['rejected'] for row in rows)}.")


_ROUND_COLUMNS = ("| strategy | runs × rounds | s / round (mean; median) | × FedAvg (of the means of the paired runs) "
                  "| × FedAvg per pair (median; range) ")


def _round_cells(row: dict[str, Any], baseline: dict[str, Any], digits: int = 3) -> str:
    """The cells under :data:`_ROUND_COLUMNS`: round times and their ratios to the baseline."""
    return (f"| {row['label']} | {row['runs']} × {row['rounds'] // row['runs']} | {row['seconds']:.{digits}f}; "
            f"{row['median_seconds']:.2f} | {paired_ratio(row, baseline):.2f} | {pair_ratios(row, baseline)} ")


def _table_head(title: str, more_columns: str) -> list[str]:
    """Title, header (:data:`_ROUND_COLUMNS` then ``more_columns``) and alignment row of a table."""
    header = _ROUND_COLUMNS + more_columns
    return [f"**{title}**", "", header, "|---" + "|---:" * (header.count("|") - 2) + "|"]


def simulation_table(rows: list[dict[str, Any]], title: str) -> str:
    """Markdown table of summarised configurations (the first row is the FedAvg baseline)."""
    baseline = rows[0]
    lines = _table_head(title, "| strategy s / round | simulation-process CPU s / round | client CPU ms: handler "
                               "| loss_fn (calls) | train_fn (calls) | MiB sent / round | MiB received / round "
                               "| peak RSS MiB (growth) |")
    for row in rows:
        lines.append(
            _round_cells(row, baseline) + f"| {row['strategy_seconds']:.3f} | {row['process_cpu_seconds']:.3f} | {row['handler_ms']:.1f} "
            f"| {row['loss_ms']:.1f} ({row['loss_calls']:.0f}) | {row['train_ms']:.1f} ({row['train_calls']:.2f}) "
            f"| {row['mib_down']:.2f} | {row['mib_up']:.2f} | {row['rss_mib']:.0f} ({row['rss_growth_mib']:+.0f}) |")
    lines += ["", _per_run_line(rows)]
    return "\n".join(lines)


# ============================================================ native deployment, side by side
def deployment_phases(runs: list[dict[str, Any]], warmup: int) -> dict[str, float]:
    """Mean seconds per round of each phase of a deployment round (wall clock, one machine).

    Per client message: *wait for pickup* (the server created the message → the
    ClientApp process started: the SuperNode's 3 s poll, the SuperExec's poll,
    the spawn), *process start* (→ the handler runs: Python, Flower, loading
    the app, pulling the message), *handler imports* (torch, the user's code,
    fedroute's plugin for routing), *handler work* (data, ``loss_fn``,
    routing, ``train_fn``, the reply); per round: *last reply → ServerApp*
    (the reply's push and the ServerApp's 3 s poll); and the CPU time of a
    ClientApp process per message (start-up and imports included), which does
    not depend on how busy the machine is.
    """
    keep = slice(warmup, None)
    parts: dict[str, list[float]] = {"pickup": [], "startup": [], "imports": [], "work": [], "delivery": [],
                                     "cpu": []}
    for run in runs:
        for timings, created, seen in zip(run["client_timings"][keep], run["replies_created_at"][keep],
                                          run["replies_seen_at"][keep]):
            for timing in timings:
                parts["pickup"].append(timing["bench-process-start"] - timing["bench-received-created"])
                parts["startup"].append(timing["bench-handler-start"] - timing["bench-process-start"])
                parts["imports"].append(timing["bench-imported"] - timing["bench-handler-start"])
                parts["work"].append(timing["bench-handler-end"] - timing["bench-imported"])
                parts["cpu"].append(timing["bench-process-cpu"])
            if created:
                parts["delivery"].append(seen - max(created))
    return {name: statistics.fmean(values) if values else float("nan") for name, values in parts.items()}


def deployment_table(rows: list[dict[str, Any]], title: str) -> str:
    """Round times and their phases (:func:`deployment_phases`), FedAvg first."""
    baseline = rows[0]
    lines = _table_head(title, "| wait for pickup s | process start → handler s | handler imports s "
                               "| handler work s | last reply → ServerApp s | strategy s / round "
                               "| ClientApp process CPU s / message (× FedAvg) | handler CPU ms (its imports included) "
                               "| MiB sent / round |")
    for row in rows:
        phases = row["phases"]
        lines.append(
            _round_cells(row, baseline, digits=2) + f"| {phases['pickup']:.2f} | {phases['startup']:.2f} | {phases['imports']:.2f} | {phases['work']:.3f} "
            f"| {phases['delivery']:.2f} | {row['strategy_seconds']:.3f} "
            f"| {phases['cpu']:.2f} ({phases['cpu'] / baseline['phases']['cpu']:.2f}) | {row['handler_ms']:.0f} "
            f"| {row['mib_down']:.2f} |")
    lines += ["", _per_run_line(rows)]
    return "\n".join(lines)


def run_deployment(app: Path, results: Path, num_supernodes: int, ks: list[int], rounds: int, warmup: int,
                   repeat: int, timeout: float) -> list[dict[str, Any]]:
    """FedAvg and ClusteredRouting (each ``K``) in turn on one native deployment of ``num_supernodes``."""
    from fedroute.deployment.local import LocalFederation

    configurations = [(FEDAVG, 1)] + [("routing", k) for k in ks]
    measured: dict[tuple[str, int], list[dict[str, Any]]] = {c: [] for c in configurations}
    # In-memory SuperLink state: its SQLite database can lose a push under load ("database is locked").
    with LocalFederation(app, num_supernodes, log_dir=results / f"deploy-{num_supernodes}-logs",
                         log_level="WARNING", persistent_superlink=False) as federation:
        for repetition in range(repeat):
            for strategy, num_clusters in configurations:  # interleaved: a busy spell hits all alike
                path = results / f"deploy-{strategy}-k{num_clusters}-n{num_supernodes}-{time.time_ns()}.json"
                load_average = os.getloadavg()[0]
                run = federation.run({"strategy": strategy, "num-clusters": num_clusters,
                                      "num-server-rounds": rounds + warmup, "fraction-train": 1.0,
                                      "min-nodes": num_supernodes, "results-path": str(path)}, timeout=timeout)
                if not run.completed or not path.exists():
                    raise RuntimeError(f"deployment {strategy} K={num_clusters} n={num_supernodes}: {run.status}\n"
                                       f"{run.stdout[-3000:]}")
                result = json.loads(path.read_text())
                result.update(wall_seconds=run.wall_seconds, load_average=load_average)
                measured[(strategy, num_clusters)].append(result)
                print(f"[deployment {repetition + 1}] {strategy} K={num_clusters}, {num_supernodes} SuperNodes: "
                      f"{statistics.fmean(result['round_seconds'][warmup:]):.2f} s/round "
                      f"(run {run.wall_seconds:.0f} s, load {load_average:.1f})", file=sys.stderr, flush=True)
    rows = []
    for configuration in configurations:
        row = summarise(measured[configuration], warmup)
        row["phases"] = deployment_phases(measured[configuration], warmup)
        rows.append(row)
    return rows


# ====================================================================== in-process compute
class _LocalGrid:
    """A Grid whose nodes are this module's ClientApp handlers, called in this process."""

    def __init__(self, num_nodes: int, run_config: dict[str, Any]) -> None:
        self.contexts = {100 + i: Context(run_id=1, node_id=100 + i,
                                          node_config={"partition-id": i, "num-partitions": num_nodes},
                                          state=RecordDict(), run_config=run_config) for i in range(num_nodes)}
        self.handler_cpu: list[float] = []

    def get_node_ids(self) -> list[int]:
        return list(self.contexts)

    def send_and_receive(self, messages: Iterable[Message], timeout: Optional[float] = None) -> list[Message]:
        replies = []
        for message in messages:
            handler = client_train if message.metadata.message_type == "train" else client_evaluate
            begin = time.thread_time()
            replies.append(handler(message, self.contexts[message.metadata.dst_node_id]))
            self.handler_cpu.append(time.thread_time() - begin)
        return replies


def in_process(ks: list[int], num_clients: int, rounds: int, warmup: int,
               local_epochs: int = 1) -> list[dict[str, Any]]:
    """Rounds driven in this process (no Flower transport): CPU time of the clients and of the strategy."""
    import logging

    import torch
    from flwr.common.constant import SUPERLINK_NODE_ID
    from flwr.supercore.task_identity import TaskIdentity

    sys.path.insert(0, str(EXAMPLE))
    torch.set_num_threads(1)
    logging.getLogger("flwr").setLevel(logging.WARNING)
    # Flower stamps a new Message with the running task's identity: play the ServerApp's.
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, SUPERLINK_NODE_ID, 1
    rows = []
    for strategy_name, num_clusters in [(FEDAVG, 1)] + [("routing", k) for k in ks]:
        config = {**APP_CONFIG, "strategy": strategy_name, "num-clusters": num_clusters, "min-nodes": num_clients,
                  "num-server-rounds": rounds + warmup, "local-epochs": local_epochs}
        strategy, initial = make_strategy(config)
        grid = _LocalGrid(num_clients, config)
        strategy.start(grid, initial, num_rounds=rounds + warmup)
        strategy.finish()
        keep = slice(warmup, None)
        thread_cpu = _deltas(strategy.thread_cpu_marks)[keep]
        handler = grid.handler_cpu[warmup * num_clients:]
        clients = [t for round_timings in strategy.client_timings[keep] for t in round_timings]
        server = [total - sum(handler[i * num_clients:(i + 1) * num_clients]) for i, total in enumerate(thread_cpu)]
        rows.append({
            "label": label_of(strategy_name, num_clusters),
            "handler_ms": 1000 * statistics.fmean(handler),
            "loss_ms": 1000 * statistics.fmean(t["bench-loss"] for t in clients),
            "train_ms": 1000 * statistics.fmean(t["bench-train"] for t in clients),
            "train_calls": statistics.fmean(t["bench-train-calls"] for t in clients),
            "server_ms": 1000 * statistics.fmean(server),
            "strategy_ms": 1000 * statistics.fmean(strategy.strategy_seconds[keep]),
            "round_cpu_s": statistics.fmean(thread_cpu),
        })
    return rows


def in_process_table(rows: list[dict[str, Any]], num_clients: int, rounds: int, local_epochs: int) -> str:
    baseline = rows[0]
    lines = [
        f"**In-process compute, {num_clients} clients, {local_epochs} local epoch(s), mean of {rounds} rounds "
        "(CPU time, one thread, no Flower transport)**", "",
        "| strategy | client handler ms | × FedAvg | loss_fn ms | train_fn ms (calls) | rest of handler ms "
        "| server ms / round (strategy) | CPU s / round | × FedAvg |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        rest = row["handler_ms"] - row["loss_ms"] - row["train_ms"]
        lines.append(
            f"| {row['label']} | {row['handler_ms']:.1f} | {row['handler_ms'] / baseline['handler_ms']:.2f} "
            f"| {row['loss_ms']:.1f} | {row['train_ms']:.1f} ({row['train_calls']:.2f}) | {rest:.1f} "
            f"| {row['server_ms']:.1f} ({row['strategy_ms']:.1f}) | {row['round_cpu_s']:.3f} "
            f"| {row['round_cpu_s'] / baseline['round_cpu_s']:.2f} |")
    return "\n".join(lines)


def server_breakdown(ks: list[int], num_clients: int) -> str:
    """CPU time of the parts of one ClusteredRouting round on the server (``num_clients`` replies)."""
    import logging
    import timeit

    import numpy as np
    import torch
    from flwr.app import ConfigRecord
    from flwr.common.constant import SUPERLINK_NODE_ID
    from flwr.supercore.task_identity import TaskIdentity

    from fedroute import protocol
    from fedroute.core.aggregation import hard_update
    from fedroute.strategies.records import array_record, arrays_of
    from fedroute.strategies.validation import validate_train_reply

    sys.path.insert(0, str(EXAMPLE))
    from digits_app.task import make_model

    torch.set_num_threads(1)
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, SUPERLINK_NODE_ID, 1
    logging.getLogger("fedroute").setLevel(logging.ERROR)  # the synthetic replies tie: no alarm lines

    def cpu_ms(function: Callable[[], Any], number: int = 10) -> float:
        return 1000 * min(timeit.repeat(function, number=number, repeat=5, timer=time.thread_time)) / number

    class Nodes:
        def get_node_ids(self) -> list[int]:
            return list(range(100, 100 + num_clients))

    lines = [f"**Server side of one round, {num_clients} replies (CPU ms, min of 5 × 10 calls)**", "",
             "| K | `_messages` (records shared by the nodes) | encode the K models (once per round) "
             "| validate replies | flatten replies (`stack_flat`) | `hard_update` (segment sums, column blocks) | one-hot matmul (not used) "
             "| `aggregate_train` total |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for k in ks:
        strategy = ClusteredRouting(method_settings(EXP3, preset=str(APP_CONFIG["routing-preset"]) or None,
                                                    num_clusters=k),
                                    min_available_nodes=num_clients)
        strategy.cluster_models = [arrays_of(r) for r in cluster_models_from_torch([make_model(c) for c in range(k)])]
        strategy._num_rounds = 10  # what start(num_rounds=10) sets: the generic default's exploitation phase needs T
        strategy.progress_interval = None
        messages = strategy.configure_train(1, strategy._packed_models(), ConfigRecord(), Nodes())
        replies = [Message(content=RecordDict({
            protocol.MODEL: ArrayRecord(make_model(50 + i).state_dict()),
            protocol.METRICS: MetricRecord({protocol.CLUSTER: i % k, protocol.NUM_EXAMPLES: 96, protocol.CLIENT_ID: i,
                                            protocol.LOSSES: [2.3] * k, protocol.ROUTE_DISTRIBUTION: [1.0 / k] * k}),
        }), reply_to=message) for i, message in enumerate(messages)]
        template = strategy.cluster_models[0]
        valid = [validate_train_reply(reply.content, k, template) for reply in replies]
        flat = protocol.stack_flat([reply.model for reply in valid], protocol.flat_dtype(template))
        current = protocol.stack_flat(strategy.cluster_models)
        routes, weights = np.array([reply.cluster for reply in valid]), np.full(len(valid), 96.0)

        def matmul_update() -> np.ndarray:
            onehot = np.zeros((k, len(routes)))
            onehot[routes, np.arange(len(routes))] = weights
            totals, updated = onehot.sum(axis=1), current.copy()
            updated[totals > 0] = (onehot @ flat)[totals > 0] / totals[totals > 0, None]
            return updated

        parts = [
            cpu_ms(lambda: strategy._messages(Nodes().get_node_ids(), "train", {})),
            cpu_ms(lambda: [array_record(model) for model in strategy.cluster_models]),
            cpu_ms(lambda: [validate_train_reply(reply.content, k, template) for reply in replies]),
            cpu_ms(lambda: protocol.stack_flat([reply.model for reply in valid], protocol.flat_dtype(template))),
            cpu_ms(lambda: hard_update(current, flat, routes, weights)),
            cpu_ms(matmul_update),
            cpu_ms(lambda: strategy.aggregate_train(2, replies), number=3),
        ]
        lines.append(f"| {k} | " + " | ".join(f"{part:.1f}" for part in parts) + " |")
    return "\n".join(lines)


# ======================================================================= ClientApp imports
IMPORT_STEPS = [
    ("Flower's ClientApp API and numpy (every ClientApp)", "import numpy, flwr.app, flwr.clientapp"),
    ("fedroute's built-in ClientApp (`fedroute.client.app`)", "import fedroute.client.app"),
    ("the linear task it builds for a message", "from fedroute.tasks.registry import task_from_config; "
                                                 "task_from_config({'task': 'linear'})"),
    ("torch (a user's model)", "import torch"),
    ("fedroute's plugin (`from fedroute import routing_train`)", "from fedroute import routing_train"),
    ("the example's data (`sklearn.datasets`)", "import sklearn.datasets"),
]


def import_times(repeat: int = 5) -> str:
    """Wall ms of each import step in fresh processes, one after the other (median of ``repeat`` processes)."""
    import subprocess

    script = ("import time, json\nmarks = []\n" + "".join(
        f"start = time.perf_counter()\n{code}\nmarks.append(time.perf_counter() - start)\n"
        for _, code in IMPORT_STEPS) + "print(json.dumps(marks))\n")
    samples = []
    for _ in range(repeat):
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True,
                              cwd=tempfile.gettempdir())
        samples.append(json.loads(done.stdout.strip().splitlines()[-1]))
    lines = [f"**Imports of a fresh ClientApp process, in this order (wall ms, median of {repeat} processes; "
             f"1-minute load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)**", "",
             "| step | ms |", "|---|---:|"]
    for index, (label, _) in enumerate(IMPORT_STEPS):
        lines.append(f"| {label} | {1000 * statistics.median(sample[index] for sample in samples):.0f} |")
    return "\n".join(lines)


# ================================================================================ driver
def write_docs(path: Path, text: str) -> None:
    """Replace what lies between the ``bench-table`` markers of ``path``."""
    document = path.read_text()
    if TABLE_BEGIN not in document or TABLE_END not in document:
        raise ValueError(f"{path} has no {TABLE_BEGIN} … {TABLE_END} markers")
    head, rest = document.split(TABLE_BEGIN, 1)
    _, tail = rest.split(TABLE_END, 1)
    path.write_text(f"{head}{TABLE_BEGIN}\n{text}\n{TABLE_END}{tail}")


def build_parser(parser: Optional[argparse.ArgumentParser] = None) -> argparse.ArgumentParser:
    """The sizes, rounds and repeats of :func:`measure` (added to ``parser`` if given)."""
    parser = parser or argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=12, help="clients of the small population (all train)")
    parser.add_argument("--rounds", type=int, default=10, help="measured rounds per run (small population)")
    parser.add_argument("--warmup", type=int, default=1, help="rounds dropped from the start of every run")
    parser.add_argument("--repeat", type=int, default=2, help="runs per configuration, interleaved")
    parser.add_argument("--headline-repeat", type=int, default=3,
                        help="further interleaved runs of FedAvg and K = 2 (12 clients, 1 epoch): the headline ratio")
    parser.add_argument("--ks", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--routing-preset", default="", choices=["", "characters"],
                        help="routing settings of ClusteredRouting: '' = the generic default (what a user's app "
                             "gets: fair-share entry threshold, at most 2 entry probes), 'characters' = the "
                             "paper's E4 preset (every cluster an entry candidate at K >= 5)")
    parser.add_argument("--longer-epochs", type=int, default=5,
                        help="also compare FedAvg and K = 2 with this many local epochs (0 = skip)")
    parser.add_argument("--diagnostics", action=argparse.BooleanOptionalAction, default=True,
                        help="12 clients, 1 epoch: also run FedAvg plus K loss_fn passes per client (each K: "
                             "the floor of routing's cost) and K = 2 with a loss_fn that runs no forward pass "
                             "(what routing costs apart from the K loss passes); K = 2's with the headline runs")
    parser.add_argument("--with-evaluate", action=argparse.BooleanOptionalAction, default=True,
                        help="also run FedAvg with Flower's default per-round evaluation (small population)")
    parser.add_argument("--large-clients", type=int, default=1000)
    parser.add_argument("--large-fraction", type=float, default=0.05)
    parser.add_argument("--large-rounds", type=int, default=3, help="measured rounds per run (large population)")
    parser.add_argument("--large-ks", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--skip-small", action="store_true", help="skip the Flower simulations of --clients clients")
    parser.add_argument("--skip-large", action="store_true")
    parser.add_argument("--skip-simulation", action="store_true",
                        help="no Flower runs (simulation or deployment): only the in-process measurements")
    parser.add_argument("--skip-in-process", action="store_true", help="no in-process compute measurement")
    parser.add_argument("--in-process-rounds", type=int, default=20)
    parser.add_argument("--skip-breakdown", action="store_true", help="skip the server-side breakdown")
    parser.add_argument("--deployment", type=int, nargs="*", default=[3, 10], metavar="N",
                        help="native deployments to measure (SuperNodes each; none: skip)")
    parser.add_argument("--deployment-ks", type=int, nargs="+", default=[2])
    parser.add_argument("--deployment-rounds", type=int, default=4, help="measured rounds per deployment run")
    parser.add_argument("--deployment-repeat", type=int, default=3, help="interleaved runs per configuration")
    parser.add_argument("--timeout", type=float, default=1800.0, help="seconds per flwr run")
    parser.add_argument("--keep", type=Path, help="directory for the raw per-run measurements (JSON)")
    return parser


def measure(args: argparse.Namespace) -> tuple[list[str], dict[str, list[dict[str, Any]]]]:
    """Every measurement ``args`` asks for: the markdown sections, and the summarised rows of each
    comparison (``"simulation-<clients>-<epochs>"``, ``"deployment-<supernodes>"``; FedAvg first)."""
    sections: list[str] = []
    rows_of: dict[str, list[dict[str, Any]]] = {}
    APP_CONFIG["routing-preset"] = args.routing_preset
    if not args.skip_simulation:
        work = Path(tempfile.mkdtemp(prefix="fedroute-bench-"))
        results = args.keep or work / "results"
        results.mkdir(parents=True, exist_ok=True)
        app = build_app(work)
        populations = [] if args.skip_small else [(args.clients, 1.0, args.rounds, 1,
                                                    [FEDAVG] + (["fedavg-evaluate"] if args.with_evaluate else []),
                                                    args.ks)]
        if args.longer_epochs and not args.skip_small:
            populations.append((args.clients, 1.0, args.rounds, args.longer_epochs, [FEDAVG], [2]))
        if not args.skip_large:
            populations.append((args.large_clients, args.large_fraction, args.large_rounds, 1, [FEDAVG],
                                args.large_ks))
        try:
            for num_clients, fraction, rounds, epochs, baselines, ks in populations:
                configurations = [(name, 1) for name in baselines] + [("routing", k) for k in ks]
                headline = [(FEDAVG, 1), ("routing", 2)]
                if (num_clients, epochs) == (args.clients, 1) and args.diagnostics:
                    for k in ks:
                        configurations.insert(configurations.index(("routing", k)) + 1, (FLOOR, k))
                    if 2 in ks:
                        configurations.insert(configurations.index((FLOOR, 2)) + 1, (NO_LOSS, 2))
                        headline += [(FLOOR, 2), (NO_LOSS, 2)]
                measured: dict[tuple[str, int], list[dict[str, Any]]] = {c: [] for c in configurations}
                plan = [configurations] * args.repeat
                if (num_clients, epochs) == (args.clients, 1) and 2 in ks:
                    plan += [headline] * args.headline_repeat
                for repeat, round_robin in enumerate(plan):  # interleaved: a busy spell hits all alike
                    for strategy, num_clusters in round_robin:
                        begin = time.monotonic()
                        run = run_configuration(app, results, strategy, num_clusters, num_clients, fraction,
                                                rounds + args.warmup, args.timeout, epochs)
                        measured[(strategy, num_clusters)].append(run)
                        print(f"[{repeat + 1}] {strategy} K={num_clusters}, {num_clients} clients, "
                              f"{epochs} epoch(s): "
                              f"{statistics.fmean(run['round_seconds'][args.warmup:]):.3f} s/round "
                              f"(run {time.monotonic() - begin:.0f} s, load {run['load_average']:.1f})",
                              file=sys.stderr, flush=True)
                rows = [summarise(measured[c], args.warmup) for c in configurations]
                rows_of[f"simulation-{num_clients}-{epochs}"] = rows
                sampled = int(rows[0]["clients_per_round"])
                sections.append(simulation_table(
                    rows, f"Flower simulation, {num_clients} clients, {sampled} per round ({fraction:.0%}), "
                          f"{epochs} local epoch(s); {rounds} measured rounds per run, runs interleaved"))
                print(sections[-1], "\n", file=sys.stderr, flush=True)
            for num_supernodes in args.deployment:
                rows = run_deployment(app, results, num_supernodes, args.deployment_ks, args.deployment_rounds,
                                      args.warmup, args.deployment_repeat, args.timeout)
                rows_of[f"deployment-{num_supernodes}"] = rows
                sections.append(deployment_table(
                    rows, f"Native deployment (flower-superlink + {num_supernodes} flower-supernode processes on "
                          f"127.0.0.1), 1 local epoch; {args.deployment_rounds} measured rounds per run, "
                          "runs interleaved"))
                print(sections[-1], "\n", file=sys.stderr, flush=True)
        finally:
            if args.keep is None:
                shutil.rmtree(work, ignore_errors=True)
    if not args.skip_in_process:
        rows = in_process(args.ks, args.clients, args.in_process_rounds, args.warmup)
        sections.append(in_process_table(rows, args.clients, args.in_process_rounds, 1))
    if args.longer_epochs and not args.skip_in_process:
        rows = in_process([2], args.clients, args.in_process_rounds, args.warmup, args.longer_epochs)
        sections.append(in_process_table(rows, args.clients, args.in_process_rounds, args.longer_epochs))
    if not args.skip_breakdown:
        sections.append(server_breakdown(args.ks, args.clients))
        sections.append(import_times())
    return sections, rows_of


def main(argv: Optional[list[str]] = None) -> None:
    parser = build_parser()
    parser.add_argument("--docs", type=Path, help="markdown file whose bench-table section is rewritten "
                                                  "(bench/run_all.py --write regenerates all of docs/performance.md's)")
    args = parser.parse_args(argv)
    text = "\n\n".join(measure(args)[0])
    print(text)
    if args.docs:
        write_docs(args.docs, text)


if __name__ == "__main__":
    main()
