"""Batched K-model losses: FedAvg against ClusteredRouting with the K loss passes looped and batched, side by side.

Run: ``python bench/bench_batched_losses.py [--ks 2 4 8] [--rows 64 32] [--epochs 5] [--repeat 3] [--paired]
[--docs docs/performance.md]`` (≈ 40 min of wall time at a 1-minute load of 10–15 on 2 cores).

What is measured: the **CPU time of one federated round** (every client's handler and
the strategy, one thread, in this process: no Flower transport, whose 0.1-s polls
would hide milliseconds), for

* **FedAvg**: Flower's ``FedAvg`` and the usual handler (load the model, train, reply);
* **routing, the user's loss_fn**: ``ClusteredRouting`` (the generic default, ``K``
  clusters) and :func:`fedroute.routing_train` with a plain ``loss_fn`` (one forward
  pass over all training rows, as the example app's ``mean_loss``), run once per model:
  what routing cost before;
* **routing, DataLoss looped**: the ``loss_fn`` a
  :class:`~fedroute.client.batched_losses.DataLoss` (batches of at most 128 rows and, on
  the CPU, of at most 2 MiB for the largest activation of a pass — ``batch_bytes``: 32
  rows on cifar-like, every row on digits —, images in the channels-last layout on the
  CPU), run once per model (``batched=False``): since issue 24 item 5 that is
  :meth:`~fedroute.client.batched_losses.DataLoss.each` (the ``K`` models as
  ``functional_call`` states, convolution weights channels-last, no ``load_state_dict``);
* **routing, DataLoss looped in fixed batches** (``--kinds … fixed``, not run by default): the
  same with ``batch_bytes=None``, batches of 128 rows whatever their activations (the
  looped path before the byte cap), side by side;
* **routing, DataLoss loaded** (``--kinds … loaded``, not run by default): the same
  ``DataLoss`` behind a plain function, so the client loads each model into the module
  and calls it (the looped path before ``each``);
* **routing, DataLoss batched**: the same with ``batched=True``: the ``K`` losses in
  one ``torch.func.vmap(functional_call)`` pass per data batch;
* **routing, DataLoss on m rows**: the looped ``DataLoss`` with ``max_rows = m``
  (``--rows``): the ``K`` models scored on a fixed subsample of ``m`` of the client's
  training rows (drawn once per client; the training still uses every row).

Two workloads, each client the same local training on both sides (SGD, momentum 0.9):

* ``digits``: the example app's clients and CNN (``examples/digits_cnn``: 96 training
  images 8×8, 38 k parameters, batch 16);
* ``cifar-like``: images 3×32×32 (a smooth random template per class plus uniform noise, the classes permuted per
  client: learnable, so that ``--separated`` starts each client on its own model; the arithmetic is a CIFAR one),
  250 training images per client, :class:`~fedroute.data.models.SmallCNN` (136 k
  parameters), batch 32 — the shape of Flower's quickstart-pytorch (CIFAR-10), smaller.

Configurations run interleaved, ``--repeat`` times each (a busy spell of the machine hits
all alike); the tables give the mean round and the median of the per-repeat ratios to
the FedAvg run next to it (``--paired``: a FedAvg run right before every configuration, the
ratio against that one — on a loaded machine the repeat's single FedAvg run is minutes away from
its last configurations).  One thread: torch's and numpy's BLAS (``threadpoolctl``, when
installed): the CPU time measured is this thread's, and a second BLAS thread's work (or a wait
for it, spinning, on a loaded machine) would go missing or be counted as this thread's.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Optional

import numpy as np

from fedroute.core.methods import EXP3, FEDAVG

REPOSITORY = Path(__file__).resolve().parents[1]
TABLE_BEGIN, TABLE_END = "<!-- batched-losses-table:begin -->", "<!-- batched-losses-table:end -->"


# ------------------------------------------------------------------------------------------ workloads
class Workload:
    """Clients' data, the model and the local training of one workload."""

    def __init__(self, name: str, num_clients: int, epochs: int, data_clients: int = 0) -> None:
        import torch

        self.name, self.num_clients, self.epochs = name, num_clients, epochs
        self._pretrained: dict[int, Any] = {}
        data_clients = max(num_clients, data_clients)
        if name == "digits":
            sys.path.insert(0, str(REPOSITORY / "examples" / "digits_cnn"))
            from digits_app.task import DigitsCNN, client_data

            self.make_model = DigitsCNN
            self.data = [(client_data(i).train.images, client_data(i).train.labels) for i in range(data_clients)]
            self.batch_size, self.learning_rate = 16, 0.1
        elif name == "cifar-like":
            from fedroute.data.models import SmallCNN

            self.make_model = lambda: SmallCNN((3, 32, 32), 10)
            generator = torch.Generator().manual_seed(0)
            coarse = torch.rand(10, 3, 4, 4, generator=generator)          # smooth: survives the pooling
            templates = coarse.repeat_interleave(8, dim=2).repeat_interleave(8, dim=3)

            def client(index: int) -> tuple[Any, Any]:
                # a class template plus noise, the classes permuted per client (each its own group): learnable
                labels = torch.randint(0, 10, (250,), generator=generator)
                permutation = torch.randperm(10, generator=torch.Generator().manual_seed(1000 + index))
                noise = torch.rand(250, 3, 32, 32, generator=generator)
                return 0.5 * templates[permutation[labels]] + 0.5 * noise, labels

            self.data = [client(i) for i in range(data_clients)]
            self.batch_size, self.learning_rate = 32, 0.01
        else:
            raise ValueError(f"workload {name!r} is unknown; allowed: 'digits', 'cifar-like'")

    def model(self, seed: int) -> Any:
        import torch

        torch.manual_seed(seed)
        return self.make_model()

    def start(self, k: int, separated: bool) -> Any:
        """Cluster ``k``'s start: a fresh model, or (``separated``) one trained on client ``k``'s data alone for
        :data:`SEPARATING_ROUNDS` × ``epochs`` epochs — each measured client's own model far better for it than the
        others, as in a federation whose groups have separated (built once per workload)."""
        if not separated:
            return self.model(k)
        if k not in self._pretrained:
            model = self.model(k)
            for round_index in range(SEPARATING_ROUNDS):
                self.train(model, k, round_index)
            self._pretrained[k] = model.state_dict()
        model = self.make_model()
        model.load_state_dict(self._pretrained[k])
        return model

    def train(self, model: Any, client: int, seed: int) -> float:
        import torch
        from torch.nn import functional as F

        images, labels = self.data[client]
        optimizer = torch.optim.SGD(model.parameters(), lr=self.learning_rate, momentum=0.9)
        order = torch.Generator().manual_seed(seed)
        total = 0.0
        for _ in range(self.epochs):
            total = 0.0
            for batch in torch.randperm(len(labels), generator=order).split(self.batch_size):
                optimizer.zero_grad()
                loss = F.cross_entropy(model(images[batch]), labels[batch])
                loss.backward()
                optimizer.step()
                total += float(loss.detach()) * len(batch)
        return total / len(labels)


SEPARATING_ROUNDS = 3
"""``--separated``: rounds of local training that make cluster ``k``'s start client ``k``'s own model."""


# ----------------------------------------------------------------------------------------- the grid
class LocalGrid:
    """Nodes whose handler is called in this process (each node's ``Context`` with ``run_config``)."""

    def __init__(self, num_nodes: int, handler: Callable[..., Any], run_config: Optional[dict[str, Any]] = None) -> None:
        from flwr.app import Context, RecordDict

        self.contexts = {100 + i: Context(run_id=1, node_id=100 + i,
                                          node_config={"partition-id": i, "num-partitions": num_nodes},
                                          state=RecordDict(), run_config=dict(run_config or {}))
                         for i in range(num_nodes)}
        self.handler = handler

    def get_node_ids(self) -> list[int]:
        return list(self.contexts)

    def send_and_receive(self, messages: Iterable[Any], timeout: Optional[float] = None) -> list[Any]:
        return [self.handler(message, self.contexts[message.metadata.dst_node_id]) for message in messages]


def in_process_runs(fedroute_level: int = logging.WARNING) -> None:
    """Set this process up to drive a ServerApp and its ClientApps itself (:class:`LocalGrid`): one torch thread,
    Flower's logger at WARNING and fedroute's at ``fedroute_level``, and the task identity Flower's ServerApp reads."""
    import torch
    from flwr.common.constant import SUPERLINK_NODE_ID
    from flwr.supercore.task_identity import TaskIdentity

    torch.set_num_threads(1)
    logging.getLogger("fedroute").setLevel(fedroute_level)
    logging.getLogger("flwr").setLevel(logging.WARNING)
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, SUPERLINK_NODE_ID, 1


def _fedavg_handler(workload: Workload) -> Callable[..., Any]:
    from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict

    def handle(message: Any, context: Any) -> Any:
        client = int(context.node_config["partition-id"])
        model = workload.make_model()
        model.load_state_dict(message.content["arrays"].to_torch_state_dict())
        workload.train(model, client, int(message.content["config"]["server-round"]))
        return Message(content=RecordDict({"arrays": ArrayRecord(model.state_dict()),
                                           "metrics": MetricRecord({"num-examples": len(workload.data[client][1])})}),
                       reply_to=message)

    return handle


def _user_loss(images: Any, labels: Any) -> Callable[[Any], float]:
    """A user's own ``loss_fn``: one forward pass over all training rows (the example app's ``mean_loss``)."""
    from torch.nn import functional as F

    return lambda model: float(F.cross_entropy(model(images), labels))


KINDS = ("user", "loop", "batched")
"""The routing configurations on every row: the user's ``loss_fn``, ``DataLoss`` looped, ``DataLoss`` batched."""

KIND_CHOICES = (*KINDS, "loaded", "fixed", "early")
"""``--kinds`` may also name ``loaded`` (``DataLoss`` behind a plain function: each model loaded, then scored),
``fixed`` (``DataLoss(batch_bytes=None)``: batches of 128 rows, whatever their activations' bytes) and ``early``
(``DataLoss(early_stop=True)``: each model scored until it is decided worse than the leader)."""

ROWS_PREFIX = "rows-"
"""Configuration ``rows-m``: the looped ``DataLoss`` with ``max_rows = m``."""


def _routing_loss(workload: Workload, kind: str, client: int) -> Callable[[Any], float]:
    """Client ``client``'s ``loss_fn`` in configuration ``kind`` (``user``, ``loop``, ``batched``, ``rows-m``)."""
    from fedroute.client.batched_losses import DataLoss

    if kind == "user":
        return _user_loss(*workload.data[client])
    if kind == "loaded":
        loss = DataLoss(*workload.data[client], client_id=client)
        return lambda model: loss(model)  # a plain function: no each(), the client loads every model
    if kind == "fixed":
        return DataLoss(*workload.data[client], client_id=client, batch_bytes=None)
    if kind == "early":
        return DataLoss(*workload.data[client], client_id=client, early_stop=True)
    max_rows = int(kind[len(ROWS_PREFIX):]) if kind.startswith(ROWS_PREFIX) else None
    return DataLoss(*workload.data[client], max_rows=max_rows, client_id=client)


def _routing_handler(workload: Workload, kind: str) -> Callable[..., Any]:
    from fedroute import routing_train

    losses = [_routing_loss(workload, kind, i) for i in range(workload.num_clients)]
    batched = kind == "batched"

    def handle(message: Any, context: Any) -> Any:
        client = int(context.node_config["partition-id"])
        server_round = int(message.content["config"]["server-round"])
        return routing_train(message, context, workload.make_model(),
                             lambda model: workload.train(model, client, server_round), losses[client],
                             num_examples=len(workload.data[client][1]), batched=batched)

    return handle


def measure_round_cpu(workload: Workload, strategy_name: str, num_clusters: int, rounds: int,
                      separated: bool = False) -> float:
    """Mean CPU seconds (this thread: handlers + strategy) per round after a warm-up round."""
    from flwr.serverapp.strategy import FedAvg

    from fedroute import ClusteredRouting, cluster_models_from_torch, method_settings

    n = workload.num_clients
    if strategy_name == FEDAVG:
        from flwr.app import ArrayRecord

        strategy: Any = FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_available_nodes=n, min_train_nodes=n)
        initial: Any = ArrayRecord(workload.model(0).state_dict())
        grid = LocalGrid(n, _fedavg_handler(workload))
    else:
        strategy = ClusteredRouting(method_settings(EXP3, num_clusters=num_clusters), fraction_train=1.0,
                                    min_available_nodes=n, min_train_nodes=n, evaluate_at_end=False)
        initial = cluster_models_from_torch([workload.start(k, separated) for k in range(num_clusters)])
        grid = LocalGrid(n, _routing_handler(workload, strategy_name))
    marks: list[float] = []
    original = grid.send_and_receive

    def timed(messages: Iterable[Any], timeout: Optional[float] = None) -> list[Any]:
        messages = list(messages)
        if messages and messages[0].metadata.message_type == "train":
            marks.append(time.thread_time())
        return original(messages, timeout)

    grid.send_and_receive = timed  # type: ignore[method-assign]
    strategy.start(grid, initial, num_rounds=rounds + 1)
    marks.append(time.thread_time())
    deltas = np.diff(marks)[1:]  # the first round loads and warms up
    return float(np.mean(deltas))


def run(workloads: list[str], ks: list[int], epochs: int, rounds: int, repeat: int,
        num_clients: int, rows: Iterable[int] = (), kinds: Iterable[str] = KINDS,
        paired: bool = False, separated: bool = False) -> dict[str, list[dict[str, Any]]]:
    """Every configuration ``repeat`` times, interleaved; ``paired``: a FedAvg run right before each one (its ratio's
    baseline), else one FedAvg run per repeat for all; ``separated``: the clusters start as the clients' own models
    (:meth:`Workload.start`)."""
    in_process_runs(fedroute_level=logging.ERROR)
    try:  # numpy's BLAS too (the server step's norms and products)
        from threadpoolctl import threadpool_limits
    except ImportError:  # pragma: no cover - comes with scikit-learn
        pass
    else:
        threadpool_limits(limits=1)
    results: dict[str, list[dict[str, Any]]] = {}
    for name in workloads:
        workload = Workload(name, num_clients, epochs, max(ks) if separated else 0)
        kinds_here = [*kinds, *(f"{ROWS_PREFIX}{m}" for m in rows)]
        configurations = [(FEDAVG, 1)] + [(kind, k) for k in ks for kind in kinds_here]
        samples: dict[tuple[str, int], list[float]] = {c: [] for c in configurations}
        ratios: dict[tuple[str, int], list[float]] = {c: [] for c in configurations}
        for _ in range(repeat):
            baseline = measure_round_cpu(workload, FEDAVG, 1, rounds)
            samples[(FEDAVG, 1)].append(baseline)
            for index, configuration in enumerate(configurations[1:]):
                if paired and index:
                    baseline = measure_round_cpu(workload, FEDAVG, 1, rounds)
                    samples[(FEDAVG, 1)].append(baseline)
                value = measure_round_cpu(workload, configuration[0], configuration[1], rounds, separated)
                samples[configuration].append(value)
                ratios[configuration].append(value / baseline)
        results[name] = [{"kind": kind, "k": k, "seconds": statistics.fmean(samples[(kind, k)]),
                          "ratio": statistics.median(ratios[(kind, k)]) if ratios[(kind, k)] else 1.0,
                          "range": (min(ratios[(kind, k)]), max(ratios[(kind, k)])) if ratios[(kind, k)] else (1, 1)}
                         for kind, k in configurations]
    return results


def _label(kind: str) -> str:
    if kind.startswith(ROWS_PREFIX):
        return f"DataLoss looped on {kind[len(ROWS_PREFIX):]} rows (max_rows)"
    return {"user": "the user's loss_fn (one pass over all rows), looped",
            "loop": "DataLoss looped (DataLoss.each: batches of ≤ 128 rows and ≤ 2 MiB activations, channels-last)",
            "fixed": "DataLoss looped in fixed batches of 128 rows (batch_bytes=None: before)",
            "loaded": "DataLoss loaded per model (load_state_dict, then the loop)",
            "batched": "DataLoss batched (torch.func.vmap)",
            "early": "DataLoss looped, early stop (early_stop=True: each model until decided worse)"}[kind]


def table(results: dict[str, list[dict[str, Any]]], epochs: int, rounds: int, repeat: int,
          num_clients: int, subsamples: Iterable[int] = (), kinds: Iterable[str] = KINDS,
          start_load: Optional[float] = None, paired: bool = False, separated: bool = False) -> str:
    import os

    subsamples = list(subsamples)
    ks = sorted({row["k"] for rows in results.values() for row in rows if row["kind"] != FEDAVG})
    options = (f"--workloads {' '.join(results)} --ks {' '.join(map(str, ks))} --epochs {epochs} --rounds {rounds} "
               f"--repeat {repeat} --rows {' '.join(map(str, subsamples))}").strip()
    if tuple(kinds) != KINDS:
        options += f" --kinds {' '.join(kinds)}"
    if paired:
        options += " --paired"
    if separated:
        options += " --separated"
    load = f"{os.getloadavg()[0]:.1f}" if start_load is None else f"{start_load:.1f} → {os.getloadavg()[0]:.1f}"
    lines = [f"**Batched K-model losses: CPU time of one round, {num_clients} clients, {epochs} local epochs** "
             f"(`python bench/bench_batched_losses.py {options.strip()}`; "
             f"in process, one thread, mean of {rounds} rounds after one warm-up, {repeat} interleaved repeats; "
             f"1-minute load at the start and the end {load} on {os.cpu_count()} CPUs)", ""]
    for name, rows in results.items():
        lines += [f"*{name}*", "", "| configuration | CPU s / round | × FedAvg (median; range) |", "|---|---:|---:|"]
        for row in rows:
            label = "FedAvg" if row["kind"] == FEDAVG else f"ClusteredRouting K={row['k']}, " + _label(row["kind"])
            low, high = row["range"]
            lines.append(f"| {label} | {row['seconds']:.3f} | {row['ratio']:.2f} ({low:.2f}–{high:.2f}) |")
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def write_docs(path: Path, text: str) -> None:
    """Replace what lies between the markers in ``path`` with ``text``."""
    content = path.read_text()
    if TABLE_BEGIN not in content or TABLE_END not in content:
        raise ValueError(f"{path} lacks the markers {TABLE_BEGIN} … {TABLE_END}")
    head, rest = content.split(TABLE_BEGIN, 1)
    _, tail = rest.split(TABLE_END, 1)
    path.write_text(f"{head}{TABLE_BEGIN}\n{text}{TABLE_END}{tail}")


def main(argv: Optional[list[str]] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", nargs="+", default=["digits", "cifar-like"])
    parser.add_argument("--ks", nargs="+", type=int, default=[2, 4, 8])
    parser.add_argument("--rows", nargs="*", type=int, default=[64, 32],
                        help="also DataLoss with max_rows = each of these (the routing losses on a subsample)")
    parser.add_argument("--kinds", nargs="*", default=list(KINDS), choices=KIND_CHOICES,
                        help="the full-data routing configurations to run")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--clients", type=int, default=2)
    parser.add_argument("--paired", action="store_true",
                        help="a FedAvg run right before every configuration, each ratio against it (on a busy machine "
                             "the pairs are closer in time; twice the FedAvg runs)")
    parser.add_argument("--separated", action="store_true",
                        help="start cluster k as client k's own model (trained on its data alone): the clients' K "
                             "models separated, as after a recovery (what early_stop saves on)")
    parser.add_argument("--docs", type=Path, default=None, help="write the tables between the markers of this file")
    args = parser.parse_args(argv)
    import os

    start_load = os.getloadavg()[0]
    results = run(args.workloads, args.ks, args.epochs, args.rounds, args.repeat, args.clients, args.rows, args.kinds,
                  args.paired, args.separated)
    text = table(results, args.epochs, args.rounds, args.repeat, args.clients, args.rows, args.kinds, start_load,
                 args.paired, args.separated)
    print(text)
    if args.docs is not None:
        write_docs(args.docs, text)


if __name__ == "__main__":
    main()
