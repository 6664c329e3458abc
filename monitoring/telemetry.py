"""Routing telemetry: the per-round and per-client tables, one schema for every runtime.

The Flower strategy (from its validated replies) and the batched simulator
(from its per-client arrays) both describe a training round as a
:class:`ClientReplies` and turn it into rows with the same pure functions,
:func:`round_record` and :func:`client_columns`.  :class:`TelemetryWriter`
appends each round to ``rounds.csv`` and ``clients.csv`` as soon as the round
ends (one ``write`` per file per round: a crashed run leaves every completed
round readable, memory stays bounded), and :meth:`TelemetryWriter.to_parquet`
streams both into Parquet copies when the run ends.  :func:`read_table`
reads a table back, also while it is being written.

Every column is documented in ``docs/telemetry.md``; a column template
``mass_<k>`` stands for one column per cluster ``k = 0 … K-1``.  This module
imports neither Flower nor torch.
"""

from __future__ import annotations

import csv
import io
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Optional, Sequence

import numpy as np
from numpy.typing import NDArray

from fedroute import protocol
from fedroute.core.controllers import CONTROLLER_IDS

__all__ = [
    "Column", "ROUND_COLUMNS", "CLIENT_COLUMNS", "ROUNDS_FILE", "CLIENTS_FILE", "NOT_REPORTED",
    "MAX_REASON_LENGTH", "short_reason", "ClientReplies", "column_names", "round_record", "client_columns", "rejected_columns",
    "TelemetryWriter", "read_table",
]

ROUNDS_FILE = "rounds.csv"
"""The per-round table (one row per method × training round)."""
CLIENTS_FILE = "clients.csv"
"""The per-client table (one row per method × round × reply, rejected replies included)."""
NOT_REPORTED = "none"
"""Controller / arm value when a reply names none (no arm in force, or a FedCAM reply)."""
MAX_REASON_LENGTH = 300
"""Rejection reasons are cut to this many characters (see :func:`short_reason`)."""
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def short_reason(reason: str, length: int = MAX_REASON_LENGTH) -> str:
    """One line of at most ``length`` characters saying why a reply was rejected.

    A multi-line reason (a client's traceback, e.g. Ray's) keeps its first
    line's label and its last line (the exception message); colour codes go.
    """
    lines = [line.strip() for line in _ANSI.sub("", str(reason)).splitlines() if line.strip()]
    if len(lines) > 1:
        label = lines[0].split(":", 1)[0]
        lines = [f"{label}: … {lines[-1]}"]
    text = " ".join(" ".join(lines).split())
    return text if len(text) <= length else text[: length - 1] + "…"


@dataclass(frozen=True)
class Column:
    """One column: ``name`` (``<k>`` = cluster index), ``kind`` (int, float, bool, str)."""

    name: str
    kind: str

    @property
    def per_cluster(self) -> bool:
        """One column per cluster (``name`` holds ``<k>``)."""
        return "<k>" in self.name


ROUND_COLUMNS: tuple[Column, ...] = (
    Column("method", "str"),
    Column("server_round", "int"),
    Column("round_index", "int"),
    Column("num_replies", "int"),
    Column("rejected", "int"),
    Column("routed_train_loss", "float"),
    Column("mean_feedback", "float"),
    Column("entered", "int"),
    Column("released", "int"),
    Column("mass_<k>", "float"),
    Column("routed_<k>", "int"),
    Column("changed_<k>", "bool"),
    Column("preferred_<k>", "int"),
    *(Column(f"arm_{name}", "float") for name in CONTROLLER_IDS),
    Column(f"arm_{NOT_REPORTED}", "float"),
    Column("min_rounds_played", "int"),
    Column("max_rounds_played", "int"),
    Column("exp3_weight_spread", "float"),
    Column("seconds", "float"),
)
"""The per-round table (``rounds.csv``), in column order."""

CLIENT_COLUMNS: tuple[Column, ...] = (
    Column("method", "str"),
    Column("server_round", "int"),
    Column("round_index", "int"),
    Column("phase", "str"),
    Column("client_id", "int"),
    Column("node_id", "str"),
    Column("accepted", "bool"),
    Column("reject_reason", "str"),
    Column("cluster", "int"),
    Column("num_examples", "float"),
    Column("controller", "str"),
    Column("arm", "str"),
    Column("feedback", "float"),
    Column("entered", "bool"),
    Column("released", "bool"),
    Column("rounds_played", "int"),
    Column("loss_<k>", "float"),
    Column("route_probability_<k>", "float"),
)
"""The per-client table (``clients.csv``), in column order."""


def column_names(columns: Sequence[Column], num_clusters: int) -> list[str]:
    """Concrete column names for ``K = num_clusters`` (per-cluster templates expanded in place)."""
    names: list[str] = []
    for column in columns:
        if column.per_cluster:
            names.extend(column.name.replace("<k>", str(k)) for k in range(num_clusters))
        else:
            names.append(column.name)
    return names


def _kinds(columns: Sequence[Column], num_clusters: int) -> dict[str, str]:
    kinds: dict[str, str] = {}
    for column in columns:
        names = [column.name.replace("<k>", str(k)) for k in range(num_clusters)] if column.per_cluster \
            else [column.name]
        kinds.update({name: column.kind for name in names})
    return kinds


# ------------------------------------------------------------------------ what a round saw
@dataclass(frozen=True)
class ClientReplies:
    """The accepted training replies of one round (``n`` replies, ``K`` clusters), in client-id order.

    Attributes
    ----------
    client_ids : ndarray of int, shape (n,)
        Client ids.
    node_ids : ndarray of object, shape (n,)
        The Flower node each reply came from (Python ints: node ids are unsigned
        64-bit), ``None`` when unknown (the simulator).
    num_examples : ndarray, shape (n,)
        ``n_i``, the aggregation weight.
    routes : ndarray of int, shape (n,)
        Executed hard routes ``r_i^t``.
    losses : ndarray, shape (n, K)
        ``ℓ_ik^t``: every cluster model's training loss before local training.
    route_distributions : ndarray, shape (n, K)
        ``π_i^t``.
    controllers : ndarray of int, shape (n,)
        Code of the executed controller (index into ``CONTROLLER_IDS``), ``-1`` if not reported.
    arms : ndarray of int, shape (n,)
        EXP3 arm in force (index into the method's controllers), ``-1`` for none.
    feedback : ndarray, shape (n,)
        EXP3 feedback ``f_i^t`` (NaN if not reported).
    entered, released : ndarray of bool, shape (n,)
        Entered / released a hysteresis episode this round.
    rounds_played : ndarray of int, shape (n,)
        Rounds the client has played (``-1`` if not reported).
    preferred : ndarray of int, shape (n,)
        The client's Greedy choice (its ties broken as it breaks them; the lowest loss if not reported).
    exp3_weight_spread : ndarray, shape (n,)
        ``max v - min v`` of the client's EXP3 log-weights after the round (0 if not reported).
    """

    client_ids: NDArray[np.int64]
    node_ids: NDArray[np.object_]
    num_examples: NDArray[np.float64]
    routes: NDArray[np.int64]
    losses: NDArray[np.float64]
    route_distributions: NDArray[np.float64]
    controllers: NDArray[np.int64]
    arms: NDArray[np.int64]
    feedback: NDArray[np.float64]
    entered: NDArray[np.bool_]
    released: NDArray[np.bool_]
    rounds_played: NDArray[np.int64]
    exp3_weight_spread: NDArray[np.float64]
    preferred: Optional[NDArray[np.int64]] = None

    def __post_init__(self) -> None:
        if self.preferred is None:
            object.__setattr__(self, "preferred", np.argmin(self.losses, axis=1).astype(np.int64)
                               if len(self.losses) else np.zeros(0, dtype=np.int64))

    def __len__(self) -> int:
        return len(self.client_ids)

    def select(self, index: NDArray[np.int64] | slice) -> "ClientReplies":
        """The replies of rows ``index`` (e.g. one run of a simulated batch)."""
        return ClientReplies(**{name: getattr(self, name)[index] for name in self.__dataclass_fields__})

    @classmethod
    def from_metrics(
        cls,
        client_ids: Sequence[int],
        node_ids: Sequence[Optional[int]],
        routes: Sequence[int],
        num_examples: Sequence[float],
        metrics: Sequence[Mapping[str, Any]],
        num_clusters: int,
    ) -> "ClientReplies":
        """From validated reply metrics (:mod:`fedroute.protocol` keys; optional ones may be missing)."""
        def column(key: str, default: Any, dtype: Any) -> NDArray:
            return np.array([m.get(key, default) for m in metrics], dtype=dtype).reshape(len(metrics))

        def matrix(key: str) -> NDArray[np.float64]:
            return np.array([m[key] for m in metrics], dtype=np.float64).reshape(len(metrics), num_clusters)

        spread = [float(np.ptp(m[protocol.EXP3_LOG_WEIGHTS])) if len(m.get(protocol.EXP3_LOG_WEIGHTS, ())) else 0.0
                  for m in metrics]
        return cls(
            client_ids=np.asarray(client_ids, dtype=np.int64).reshape(-1),
            node_ids=node_id_array(node_ids),
            num_examples=np.asarray(num_examples, dtype=np.float64).reshape(-1),
            routes=np.asarray(routes, dtype=np.int64).reshape(-1),
            losses=matrix(protocol.LOSSES),
            route_distributions=matrix(protocol.ROUTE_DISTRIBUTION),
            controllers=column(protocol.CONTROLLER, -1, np.int64),
            arms=column(protocol.ARM, -1, np.int64),
            feedback=column(protocol.FEEDBACK, np.nan, np.float64),
            entered=column(protocol.ENTERED, 0, np.int64).astype(bool),
            released=column(protocol.RELEASED, 0, np.int64).astype(bool),
            rounds_played=column(protocol.ROUNDS_PLAYED, -1, np.int64),
            exp3_weight_spread=np.array(spread, dtype=np.float64),
            preferred=np.array([m.get(protocol.PREFERRED, int(np.argmin(m[protocol.LOSSES]))) for m in metrics],
                               dtype=np.int64).reshape(len(metrics)),
        )


def node_id_array(node_ids: Sequence[Optional[int]]) -> NDArray[np.object_]:
    """Node ids as an object array of Python ints (or ``None``): they do not fit ``int64``."""
    array = np.empty(len(node_ids), dtype=object)
    array[:] = [None if node is None or int(node) < 0 else int(node) for node in node_ids]
    return array


def _node_text(node_id: Optional[int]) -> str:
    return "" if node_id is None or int(node_id) < 0 else str(int(node_id))


def _controller_name(code: int) -> str:
    return CONTROLLER_IDS[code] if 0 <= code < len(CONTROLLER_IDS) else NOT_REPORTED


def _arm_names(arms: NDArray[np.int64], controllers: Sequence[str]) -> list[str]:
    return [controllers[arm] if 0 <= arm < len(controllers) else NOT_REPORTED for arm in arms.tolist()]


def round_record(
    server_round: int,
    replies: ClientReplies,
    masses: Optional[NDArray[np.float64]],
    changed: Sequence[bool],
    rejected: int,
    seconds: float,
    controllers: Sequence[str],
) -> dict[str, Any]:
    """One row of the per-round table (without ``method``): what :attr:`ClusteredRouting.history` holds.

    Parameters
    ----------
    server_round : int
        Flower's round (``t = server_round - 1``).
    replies : ClientReplies
        The round's accepted replies.
    masses : ndarray, shape (K,), or None
        Routing masses after the round (zeros when none exist yet).
    changed : sequence of bool, length K
        Whether each cluster model changed in the round.
    rejected : int
        Training replies rejected this round.
    seconds : float
        Wall time of the round.
    controllers : sequence of str
        The method's EXP3 arms (controller ids), to name the arm in force.
    """
    num_clusters = len(changed)
    masses = np.zeros(num_clusters) if masses is None else np.asarray(masses, dtype=np.float64)
    count = len(replies)
    routed_losses = replies.losses[np.arange(count), replies.routes]
    record: dict[str, Any] = {
        "server_round": int(server_round),
        "round_index": int(server_round) - 1,
        "num_replies": count,
        "rejected": int(rejected),
        "routed_train_loss": float(np.average(routed_losses, weights=replies.num_examples)) if count else math.nan,
        "mean_feedback": float(np.mean(replies.feedback)) if count else math.nan,
        "entered": int(replies.entered.sum()),
        "released": int(replies.released.sum()),
    }
    routed = np.bincount(replies.routes, minlength=num_clusters)
    preferred = np.bincount(np.argmin(replies.losses, axis=1), minlength=num_clusters) if count \
        else np.zeros(num_clusters, dtype=np.int64)
    record.update({f"mass_{k}": float(masses[k]) for k in range(num_clusters)})
    record.update({f"routed_{k}": int(routed[k]) for k in range(num_clusters)})
    record.update({f"changed_{k}": bool(changed[k]) for k in range(num_clusters)})
    record.update({f"preferred_{k}": int(preferred[k]) for k in range(num_clusters)})
    arm_names = _arm_names(replies.arms, controllers)
    for name in (*CONTROLLER_IDS, NOT_REPORTED):
        record[f"arm_{name}"] = arm_names.count(name) / count if count else 0.0
    record["min_rounds_played"] = int(replies.rounds_played.min()) if count else -1
    record["max_rounds_played"] = int(replies.rounds_played.max()) if count else -1
    record["exp3_weight_spread"] = float(replies.exp3_weight_spread.max()) if count else 0.0
    record["seconds"] = float(seconds)
    return record


def client_columns(method: str, server_round: int, replies: ClientReplies,
                   controllers: Sequence[str]) -> dict[str, list]:
    """The per-client rows of one round's accepted replies, as columns of Python values."""
    count, num_clusters = replies.losses.shape
    columns: dict[str, list] = {
        "method": [method] * count,
        "server_round": [int(server_round)] * count,
        "round_index": [int(server_round) - 1] * count,
        "phase": [protocol.PHASE_TRAIN] * count,
        "client_id": replies.client_ids.tolist(),
        "node_id": [_node_text(node) for node in replies.node_ids.tolist()],
        "accepted": [True] * count,
        "reject_reason": [""] * count,
        "cluster": replies.routes.tolist(),
        "num_examples": replies.num_examples.tolist(),
        "controller": [_controller_name(code) for code in replies.controllers.tolist()],
        "arm": _arm_names(replies.arms, controllers),
        "feedback": replies.feedback.tolist(),
        "entered": replies.entered.tolist(),
        "released": replies.released.tolist(),
        "rounds_played": replies.rounds_played.tolist(),
    }
    for k in range(num_clusters):
        columns[f"loss_{k}"] = replies.losses[:, k].tolist()
    for k in range(num_clusters):
        columns[f"route_probability_{k}"] = replies.route_distributions[:, k].tolist()
    return columns


def rejected_columns(method: str, rejected: Sequence[Mapping[str, Any]], num_clusters: int) -> dict[str, list]:
    """Per-client rows of rejected replies (``server_round``, ``phase``, ``node_id``, ``reason`` each)."""
    count = len(rejected)
    columns: dict[str, list] = {
        "method": [method] * count,
        "server_round": [int(entry["server_round"]) for entry in rejected],
        "round_index": [int(entry["server_round"]) - 1 for entry in rejected],
        "phase": [str(entry["phase"]) for entry in rejected],
        "client_id": [-1] * count,
        "node_id": [_node_text(entry["node_id"]) for entry in rejected],
        "accepted": [False] * count,
        "reject_reason": [short_reason(entry["reason"]) for entry in rejected],
        "cluster": [-1] * count,
        "num_examples": [math.nan] * count,
        "controller": [NOT_REPORTED] * count,
        "arm": [NOT_REPORTED] * count,
        "feedback": [math.nan] * count,
        "entered": [False] * count,
        "released": [False] * count,
        "rounds_played": [-1] * count,
    }
    for template in ("loss_{}", "route_probability_{}"):
        columns.update({template.format(k): [math.nan] * count for k in range(num_clusters)})
    return columns


# ------------------------------------------------------------------------------ files
_PYTHON = {"int": int, "float": float, "bool": bool, "str": str}
_STRING_COLUMNS = {column.name for column in (*ROUND_COLUMNS, *CLIENT_COLUMNS) if column.kind == "str"}


def _csv_text(rows: Iterable[Sequence[Any]]) -> str:
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerows(rows)
    return buffer.getvalue()


class TelemetryWriter:
    """Appends rounds to ``rounds.csv`` and ``clients.csv`` in ``directory``.

    Several writers (e.g. one strategy per method of a ServerApp) may append to
    the same directory one after the other; the files must have been written
    with the same table width (the header is checked): ``K`` per-cluster columns, or more when
    methods of fewer clusters (``fedavg``, ``local``: ``K = 1``) share the tables of wider ones
    (their missing clusters' cells are empty).  Every value is written with
    Python's ``repr`` of floats, so numbers read back exactly.

    Parameters
    ----------
    directory : path
        Created if missing.
    num_clusters : int
        ``K`` (the per-cluster columns this writer fills).
    width : int, optional
        Per-cluster columns of the tables (≥ ``K``; default ``K``, or the width of tables already in
        ``directory`` when they are wider).
    """

    def __init__(self, directory: str | Path, num_clusters: int, width: Optional[int] = None) -> None:
        self.directory = Path(directory)
        self.num_clusters = int(num_clusters)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.width = max(self.num_clusters, int(width or 0), self._written_width())
        self._names = {ROUNDS_FILE: column_names(ROUND_COLUMNS, self.width),
                       CLIENTS_FILE: column_names(CLIENT_COLUMNS, self.width)}
        self._kinds = {ROUNDS_FILE: _kinds(ROUND_COLUMNS, self.width),
                       CLIENTS_FILE: _kinds(CLIENT_COLUMNS, self.width)}
        for name in self._names:
            self._check_header(name)

    def _written_width(self) -> int:
        """The per-cluster width of a ``rounds.csv`` already written here (0: none)."""
        path = self.directory / ROUNDS_FILE
        if not path.is_file() or path.stat().st_size == 0:
            return 0
        with open(path, newline="") as stream:
            header = next(csv.reader(stream), [])
        width = sum(1 for name in header if name.startswith("mass_"))
        return width if header == column_names(ROUND_COLUMNS, width) else 0

    def _check_header(self, name: str) -> None:
        path = self.directory / name
        if not path.is_file() or path.stat().st_size == 0:
            return
        with open(path, newline="") as stream:
            header = next(csv.reader(stream), [])
        if header != self._names[name]:
            raise ValueError(f"{path} holds columns {header[:12]}…, not those of K = {self.num_clusters} "
                             f"({self._names[name][:12]}…): write this run's telemetry to another directory")

    def _append(self, name: str, rows: list[list[Any]]) -> None:
        path = self.directory / name
        fresh = not path.is_file() or path.stat().st_size == 0
        text = _csv_text(([self._names[name]] if fresh else []) + rows)
        with open(path, "a", newline="") as stream:  # one write per round: a round is on disk or not
            stream.write(text)
            stream.flush()

    def _rows(self, name: str, columns: Mapping[str, Sequence[Any]]) -> list[list[Any]]:
        names, kinds = self._names[name], self._kinds[name]
        padding = set(column_names(ROUND_COLUMNS if name == ROUNDS_FILE else CLIENT_COLUMNS, self.width)) - set(
            column_names(ROUND_COLUMNS if name == ROUNDS_FILE else CLIENT_COLUMNS, self.num_clusters))
        missing = [column for column in names if column not in columns and column not in padding]
        if missing:
            raise ValueError(f"{name}: columns {missing} are missing")
        count = len(next(iter(columns.values()))) if columns else 0
        converted = [[_PYTHON[kinds[column]](value) for value in columns[column]] if column in columns
                     else [""] * count for column in names]
        return [list(row) for row in zip(*converted)]

    def write_round(self, method: str, record: Mapping[str, Any], clients: Optional[Mapping[str, Sequence]] = None
                    ) -> None:
        """Append one per-round row (``record`` + ``method``) and the round's per-client rows."""
        if clients is not None:
            self.write_clients(clients)
        self._append(ROUNDS_FILE, self._rows(ROUNDS_FILE, {key: [value] for key, value in
                                                         {**record, "method": method}.items()}))

    def write_clients(self, clients: Mapping[str, Sequence]) -> None:
        """Append per-client rows (columns of :func:`client_columns` / :func:`rejected_columns`)."""
        rows = self._rows(CLIENTS_FILE, clients)
        if rows:
            self._append(CLIENTS_FILE, rows)

    def written_rounds(self, method: str) -> set[int]:
        """Server rounds of ``method`` already in ``rounds.csv``."""
        path = self.directory / ROUNDS_FILE
        if not path.is_file():
            return set()
        table = read_table(path)
        return set(table.loc[table["method"] == method, "server_round"].astype(int))

    def to_parquet(self) -> list[Path]:
        """Stream both CSV files into ``rounds.parquet`` / ``clients.parquet`` (atomic replace)."""
        written = []
        for name in (ROUNDS_FILE, CLIENTS_FILE):
            source = self.directory / name
            if source.is_file() and source.stat().st_size:
                written.append(_csv_to_parquet(source, self._kinds[name]))
        return written


def _arrow_type(kind: str) -> Any:
    import pyarrow as pa

    return {"int": pa.int64(), "float": pa.float64(), "bool": pa.bool_(), "str": pa.string()}[kind]


def _csv_to_parquet(source: Path, kinds: Mapping[str, str], block_size: int = 1 << 22) -> Path:
    """``x.csv`` → ``x.parquet`` in blocks (bounded memory); written to a temporary file, then renamed."""
    import pyarrow.csv as pa_csv
    import pyarrow.parquet as pq

    target = source.with_suffix(".parquet")
    temporary = target.with_name(f".{target.name}.partial")
    reader = pa_csv.open_csv(
        source,
        read_options=pa_csv.ReadOptions(block_size=block_size),
        parse_options=pa_csv.ParseOptions(newlines_in_values=True),
        convert_options=pa_csv.ConvertOptions(column_types={name: _arrow_type(kind) for name, kind in kinds.items()},
                                              strings_can_be_null=False, quoted_strings_can_be_null=False),
    )
    writer = None
    try:
        for batch in reader:
            if writer is None:
                writer = pq.ParquetWriter(temporary, batch.schema)
            writer.write_batch(batch)
    finally:
        if writer is not None:
            writer.close()
    if writer is None:
        return target
    os.replace(temporary, target)
    return target


def read_table(path: str | Path) -> "Any":
    """A telemetry CSV (or its Parquet copy) as a DataFrame, also while it is being appended to.

    An incomplete last line (a round being written, or a crashed run) is left out.
    String columns keep empty strings (no NaN).
    """
    import pandas as pd

    path = Path(path)
    if path.suffix == ".parquet":
        return pd.read_parquet(path)
    text = path.read_text() if path.is_file() else ""
    if not text.endswith("\n"):
        text = text[: text.rfind("\n") + 1]
    if not text:
        return pd.DataFrame()
    header = next(csv.reader(io.StringIO(text.partition("\n")[0])))
    strings = {name for name in header if name in _STRING_COLUMNS}
    return pd.read_csv(io.StringIO(text), dtype={name: str for name in strings}, keep_default_na=False,
                       na_values={name: ["nan", "NaN", ""] for name in header if name not in strings})
