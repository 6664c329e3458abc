"""One client's data of the dataset task: a ``flwr-datasets`` partition, its group transform, its split.

:class:`PartitionSettings` says which dataset, how to partition it (the
partitioner and its parameters), how many groups and which transform; it is
validated on construction without reading any data.  :func:`grouped_partition`
gives client ``c``'s :class:`ClientData`:

1. the rows of the dataset (:func:`fedroute.data.sources.load_source`), split
   by the ``flwr-datasets`` partitioner into ``num_partitions`` partitions
   (``iid``: ``IidPartitioner``; ``dirichlet``: ``DirichletPartitioner`` over
   ``partition-by`` with concentration ``dirichlet-alpha``; ``pathological``:
   ``PathologicalPartitioner`` with ``classes-per-client`` classes of
   ``partition-by`` per client; ``natural-id``: ``NaturalIdPartitioner`` over
   the ``partition-by`` column, the first ``num_partitions`` ids in sorted order),
   partitioner seed = the task seed;
2. partition ``c`` as arrays (:func:`fedroute.data.columns.as_arrays`), seen
   through group ``c mod G``'s transform (:mod:`fedroute.data.transforms`);
3. its rows permuted with ``generator(seed, c, 0, Purpose.DATA)``, the first
   ``round(test_fraction · s)`` (at least 1, at most ``s − 1``) held out.

The dataset and the partitioner are cached per process (a Ray simulation worker
serves many messages), so each client reads the rows once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
from numpy.typing import NDArray

from fedroute.core.randomness import Purpose, generator
from fedroute.core.validation import invalid
from fedroute.data.columns import as_arrays, image_column, label_column
from fedroute.data.sources import load_source
from fedroute.data.transforms import GROUP_TRANSFORMS, apply_group_transform, group_of

__all__ = ["PARTITIONERS", "PartitionSettings", "ClientData", "DatasetSchema", "grouped_partition",
           "grouped_partitions", "dataset_schema", "available_partitions", "invalid_setting"]

PARTITIONERS = ("iid", "dirichlet", "pathological", "natural-id")
"""Values of run-config ``partitioner`` (``flwr_datasets.partitioner``: Iid, Dirichlet, Pathological, NaturalId)."""


def invalid_setting(key: str, value: Any, allowed: str) -> None:
    """Raise the dataset task's error for one run-config key (the key, its value, what is allowed)."""
    raise invalid(f"dataset task setting '{key}'", value, allowed)


@dataclass(frozen=True)
class PartitionSettings:
    """Which data a client of the dataset task gets.

    Parameters
    ----------
    dataset : str
        Hub name or local path (Parquet, CSV, a folder of Parquet files, an image folder).
    num_partitions : int
        Clients ``n`` (≥ 1).
    partitioner : str
        One of :data:`PARTITIONERS`.
    dirichlet_alpha : float
        Concentration of ``dirichlet`` (> 0; small = skewed label mixes).
    partition_by : str
        Column ``dirichlet``/``pathological`` split by (``"auto"``: the label column) and that
        ``natural-id`` groups by (required there).
    classes_per_client : int
        Classes per client under ``pathological`` (≥ 1).
    num_groups : int
        ``G`` (1 … 64): client ``c`` is in group ``c mod G``.
    group_transform : str
        One of :data:`~fedroute.data.transforms.GROUP_TRANSFORMS`.
    label_column : str
        The class column (``"auto"``: the first of :data:`~fedroute.data.columns.LABEL_COLUMNS`).
    test_fraction : float
        Held-out share of each client's rows, in ``(0, 1)``.
    seed : int
        Partitioner, split and label-permutation seed (≥ 0).
    """

    dataset: str
    num_partitions: int
    partitioner: str = "iid"
    dirichlet_alpha: float = 0.5
    partition_by: str = "auto"
    classes_per_client: int = 2
    num_groups: int = 4
    group_transform: str = "rotate"
    label_column: str = "auto"
    test_fraction: float = 0.2
    seed: int = 0

    def __post_init__(self) -> None:
        for key in ("num_partitions", "classes_per_client", "num_groups", "seed"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                invalid_setting(key.replace("_", "-") if key != "num_partitions" else "num-clients", value, "an integer")
        for key in ("dirichlet_alpha", "test_fraction"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not np.isfinite(value):
                invalid_setting(key.replace("_", "-"), value, "a finite number")
        checks = [
            (bool(self.dataset) and self.dataset != "auto", "dataset", self.dataset,
             "a Hugging Face hub name (e.g. 'ylecun/mnist') or a local Parquet/CSV file or image folder"),
            (self.num_partitions >= 1, "num-clients", self.num_partitions, "an integer ≥ 1"),
            (self.partitioner in PARTITIONERS, "partitioner", self.partitioner, f"one of {PARTITIONERS}"),
            (self.dirichlet_alpha > 0, "dirichlet-alpha", self.dirichlet_alpha, "a number > 0 (e.g. 0.5)"),
            (self.partitioner != "natural-id" or self.partition_by != "auto", "partition-by", self.partition_by,
             "under partitioner 'natural-id', the column that names each row's client (e.g. 'writer_id')"),
            (self.classes_per_client >= 1, "classes-per-client", self.classes_per_client, "an integer ≥ 1"),
            (1 <= self.num_groups <= 64, "num-groups", self.num_groups, "an integer in [1, 64]"),
            (self.group_transform in GROUP_TRANSFORMS, "group-transform", self.group_transform,
             f"one of {GROUP_TRANSFORMS}"),
            (0 < self.test_fraction < 1, "test-fraction", self.test_fraction, "a number in (0, 1)"),
            (self.seed >= 0, "seed", self.seed, "an integer ≥ 0"),
        ]
        for holds, key, value, allowed in checks:
            if not holds:
                invalid_setting(key, value, allowed)


@dataclass(frozen=True)
class DatasetSchema:
    """What the model needs to know of a dataset: one row's shape and the number of classes."""

    input_shape: tuple[int, ...]
    """``(C, H, W)`` for images, ``(D,)`` for tabular rows."""
    num_classes: int
    label: str
    """The label column."""
    num_rows: int


@dataclass(frozen=True)
class ClientData:
    """One client's rows: features ``(s, C, H, W)`` or ``(s, D)`` float32, labels ``(s,)`` int64."""

    partition_id: int
    group: int
    """Latent group (``c mod G``; 0 for everyone under group-transform ``none``); evaluation only."""
    train_features: NDArray[np.float32]
    train_labels: NDArray[np.int64]
    test_features: NDArray[np.float32]
    test_labels: NDArray[np.int64]

    @property
    def num_examples(self) -> int:
        """Training rows (the client's aggregation weight)."""
        return int(len(self.train_labels))


def _excluded(settings: PartitionSettings) -> tuple[str, ...]:
    return (settings.partition_by,) if settings.partition_by != "auto" else ()


@lru_cache(maxsize=8)
def dataset_schema(dataset: str, label: str = "auto", exclude: tuple[str, ...] = ()) -> DatasetSchema:
    """:class:`DatasetSchema` of ``dataset`` (reads one row's features and the whole label column)."""
    import datasets

    rows = load_source(dataset)
    name = label_column(rows.column_names, label)
    feature = rows.features[name]
    labels = np.asarray(rows[name])
    if labels.dtype.kind not in "iub":
        raise ValueError(f"label column '{name}' holds {labels.dtype} values; allowed: integer classes (set run-config "
                         "'label-column' to an integer column)")
    if len(labels) == 0:
        raise ValueError(f"run-config 'dataset' = '{dataset}' has no rows")
    if labels.min() < 0:
        raise ValueError(f"label column '{name}' has negative classes ({int(labels.min())}); allowed: 0, 1, …")
    num_classes = feature.num_classes if isinstance(feature, datasets.ClassLabel) else int(labels.max()) + 1
    first, _ = as_arrays(rows.select([0]), name, exclude)
    return DatasetSchema(tuple(int(size) for size in first.shape[1:]), int(num_classes), name, len(labels))


def _partition_by(settings: PartitionSettings, label: str) -> str:
    return label if settings.partition_by == "auto" else settings.partition_by


@lru_cache(maxsize=8)
def _partitioner(settings: PartitionSettings) -> Any:
    """The ``flwr-datasets`` partitioner of ``settings`` with the dataset assigned (cached per process)."""
    from flwr_datasets.partitioner import DirichletPartitioner, IidPartitioner, NaturalIdPartitioner, \
        PathologicalPartitioner

    rows = load_source(settings.dataset)
    label = dataset_schema(settings.dataset, settings.label_column, _excluded(settings)).label
    by = _partition_by(settings, label)
    if by not in rows.column_names:
        invalid_setting("partition-by", by, f"a column of the dataset: {rows.column_names}")
    n = settings.num_partitions
    if settings.partitioner == "iid":
        partitioner = IidPartitioner(num_partitions=n)
    elif settings.partitioner == "dirichlet":
        partitioner = DirichletPartitioner(num_partitions=n, partition_by=by, alpha=float(settings.dirichlet_alpha),
                                           min_partition_size=max(2, min(10, len(rows) // (2 * n))),
                                           self_balancing=True, seed=settings.seed)
    elif settings.partitioner == "pathological":
        partitioner = PathologicalPartitioner(num_partitions=n, partition_by=by,
                                              num_classes_per_partition=settings.classes_per_client,
                                              seed=settings.seed)
    else:
        partitioner = NaturalIdPartitioner(partition_by=by)
    partitioner.dataset = rows
    return partitioner


def available_partitions(settings: PartitionSettings) -> int:
    """How many partitions the partitioner makes (``natural-id``: the distinct ids; else ``num_partitions``)."""
    return int(_partitioner(settings).num_partitions)


@lru_cache(maxsize=256)
def grouped_partition(settings: PartitionSettings, partition_id: int) -> ClientData:
    """Client ``partition_id``'s rows: its partition, its group's transform, its train/held-out split.

    Cached per process (a simulation worker serves the same clients every round); treat the arrays as
    read-only.

    Raises
    ------
    ValueError
        A partition id outside ``[0, num_partitions − 1]``, a ``natural-id`` column with fewer ids than
        clients, or a partition with fewer than 2 rows (naming the settings to change).
    """
    if not 0 <= int(partition_id) < settings.num_partitions:
        raise ValueError(f"partition id {partition_id} is outside [0, {settings.num_partitions - 1}] "
                         f"(num-clients = {settings.num_partitions})")
    partitioner = _partitioner(settings)
    if settings.partitioner == "natural-id" and partitioner.num_partitions < settings.num_partitions:
        invalid_setting("num-clients", settings.num_partitions, f"at most {partitioner.num_partitions} (the distinct values of "
              f"column '{settings.partition_by}' in {settings.dataset})")
    schema = dataset_schema(settings.dataset, settings.label_column, _excluded(settings))
    part = partitioner.load_partition(int(partition_id))
    if len(part) < 2:
        raise ValueError(f"partition {partition_id} of {settings.dataset} has {len(part)} row(s) under partitioner "
                         f"'{settings.partitioner}'; each client needs at least 2 (one held out): use fewer clients "
                         "(num-clients) or a larger dirichlet-alpha")
    features, labels = as_arrays(part, schema.label, _excluded(settings))
    group = group_of(int(partition_id), settings.num_groups, settings.group_transform)
    features, labels = apply_group_transform(features, labels, settings.group_transform, group, settings.num_groups,
                                             schema.num_classes, settings.seed)
    order = generator(settings.seed, int(partition_id), 0, Purpose.DATA).permutation(len(labels))
    held_out = min(len(labels) - 1, max(1, int(round(settings.test_fraction * len(labels)))))
    test, train = order[:held_out], order[held_out:]
    return ClientData(int(partition_id), group, np.ascontiguousarray(features[train]), labels[train],
                      np.ascontiguousarray(features[test]), labels[test])


class GroupedPartitions(Sequence):
    """The clients' :class:`ClientData`, computed when first asked for (``len`` = number of clients)."""

    def __init__(self, settings: PartitionSettings) -> None:
        self.settings = settings

    def __len__(self) -> int:
        return self.settings.num_partitions

    def __getitem__(self, partition_id: Any) -> Any:
        if isinstance(partition_id, slice):
            return [self[i] for i in range(len(self))[partition_id]]
        index = int(partition_id)
        if index < 0:
            index += len(self)
        return grouped_partition(self.settings, index)

    @property
    def schema(self) -> DatasetSchema:
        """Input shape and number of classes (for the model)."""
        return dataset_schema(self.settings.dataset, self.settings.label_column, _excluded(self.settings))


def grouped_partitions(dataset: str, num_partitions: int, **settings: Any) -> GroupedPartitions:
    """Partitions of ``dataset`` for a user's own ClientApp, one per client, each seen through its group's transform.

    Parameters
    ----------
    dataset : str
        Hub name or local path (see :class:`PartitionSettings`).
    num_partitions : int
        Number of clients.
    **settings
        The other :class:`PartitionSettings` fields: ``partitioner``, ``dirichlet_alpha``,
        ``partition_by``, ``classes_per_client``, ``num_groups``, ``group_transform``,
        ``label_column``, ``test_fraction``, ``seed``.

    Returns
    -------
    GroupedPartitions
        ``partitions[i]`` is client ``i``'s :class:`ClientData` (read on first access, cached per
        process); ``partitions.schema`` the input shape and number of classes.

    Examples
    --------
    >>> parts = grouped_partitions("digits.parquet", 20, partitioner="dirichlet", dirichlet_alpha=0.5,
    ...                            num_groups=4, group_transform="rotate")  # doctest: +SKIP
    >>> data = parts[int(context.node_config["partition-id"])]  # doctest: +SKIP
    """
    return GroupedPartitions(PartitionSettings(dataset=dataset, num_partitions=num_partitions, **settings))
