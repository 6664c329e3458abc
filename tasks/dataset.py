"""``task = "dataset"``: a hub or local dataset, partitioned by ``flwr-datasets``, transformed per group, a torch model.

The task a user with real data runs without writing a ClientApp::

    fedroute flower --run-config task=dataset dataset=digits.parquet partitioner=dirichlet \\
        dirichlet-alpha=0.5 num-groups=4 group-transform=rotate num-clusters=4 num-clients=20

Data
    :mod:`fedroute.data`: the rows of ``dataset`` (hub name or local Parquet /
    CSV / image folder), the ``flwr-datasets`` partitioner (``iid``,
    ``dirichlet``, ``pathological``, ``natural-id``), group ``c mod G``'s
    transform (``rotate``, ``permute-labels``, ``none``), a train / held-out
    split per client (``test-fraction``).
Model
    :mod:`fedroute.data.models`: ``model = auto | cnn | mlp | package.module:factory``;
    ``K`` starts from seeds ``seed · 1000 + k``.  The models travel as flat
    float32 vectors (the ``state_dict`` in order).
Update
    ``local-epochs`` epochs of mini-batch SGD (``batch-size``, ``learning-rate``,
    momentum 0.9, a new optimiser every round), the batch order drawn from
    ``(seed, client, round)``; the routing and evaluation loss is the mean
    cross-entropy (:class:`~fedroute.client.batched_losses.DataLoss`, ``K``
    models in one batched pass where ``batched-losses`` allows), on every
    training row or, with ``routing-loss-rows = m``, on a fixed subsample of
    ``m`` of them (drawn once per client; docs/performance.md).  The final
    evaluation also reports every model's held-out accuracy.
Device
    ``client-device`` (:mod:`fedroute.client.devices`): the client's module,
    its data and the ``K`` models go to that device once per message.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import numpy as np
from numpy.typing import NDArray

from fedroute.client.devices import check_device_name
from fedroute.core.task import checked_client_ids
from fedroute.data.partitions import PartitionSettings, dataset_schema, grouped_partition, invalid_setting

__all__ = ["DatasetTask", "BATCHED_CHOICES", "EARLY_STOP_CHOICES"]

BATCHED_CHOICES = ("auto", "true", "false")
"""run-config ``batched-losses``: ``auto`` = batched on a GPU, the loop on the CPU (where ``vmap``'s grouped
convolutions measured slower, docs/performance.md); ``true``/``false`` force one or the other."""

EARLY_STOP_CHOICES = ("auto", "true", "false")
"""run-config ``routing-early-stop``: score each of the ``K`` models until it is decided worse than the best
(``true``: :class:`~fedroute.client.batched_losses.DataLoss` ``early_stop``, on the one-model-at-a-time pass),
on every row (``false``), or ``auto`` (the default): early stop where the ``K`` passes run one model at a time
(the CPU, where they are a sixth of a round's time), every row where they run as one batched pass (a GPU,
``batched-losses``), whose cost does not grow with ``K`` passes (docs/performance.md)."""


@dataclass(frozen=True)
class DatasetTask:
    """Configuration of the dataset task (see the module docstring); nothing is read until data are needed.

    Parameters
    ----------
    dataset, partitioner, dirichlet_alpha, partition_by, classes_per_client, num_groups, group_transform,
    label_column, test_fraction, seed
        As in :class:`fedroute.data.partitions.PartitionSettings` (``num_clients`` partitions).
    num_clients : int
        ``n`` (1 … 10⁶).
    model : str
        ``auto``, ``cnn``, ``mlp`` or ``package.module:factory``.
    local_epochs : int
        Epochs of local SGD per executed update (≥ 1).
    batch_size : int
        SGD mini-batch size (≥ 1).
    learning_rate : float
        SGD learning rate (> 0).
    client_device : str
        ``auto``, ``cpu``, ``cuda`` or ``cuda:N``.
    batched_losses : str
        One of :data:`BATCHED_CHOICES`.
    routing_loss_rows : int
        Score the ``K`` models on at most this many training rows per client, the same rows in every
        round, drawn once from ``(seed, client, 0, Purpose.LOSS_ROWS)``
        (:class:`~fedroute.client.batched_losses.DataLoss` ``max_rows``); ``0`` (the default): every row.
        The held-out evaluation always uses every held-out row.
    routing_early_stop : str
        ``true``: score each model on growing random prefixes of the rows until it is worse than the best
        beyond 3 standard errors (:class:`~fedroute.client.batched_losses.DataLoss` ``early_stop``; on the
        loop and ``DataLoss.each`` path, where ``batched-losses`` does not take the batched pass);
        ``false``: every row; ``auto`` (the default): ``true`` where the losses run looped, ``false`` where
        they run batched (:meth:`early_stop`).
    """

    dataset: str = "auto"
    num_clients: int = 20
    partitioner: str = "iid"
    dirichlet_alpha: float = 0.5
    partition_by: str = "auto"
    classes_per_client: int = 2
    num_groups: int = 4
    group_transform: str = "rotate"
    label_column: str = "auto"
    test_fraction: float = 0.2
    model: str = "auto"
    local_epochs: int = 5
    batch_size: int = 16
    learning_rate: float = 0.05
    client_device: str = "auto"
    batched_losses: str = "auto"
    routing_loss_rows: int = 0
    routing_early_stop: str = "auto"
    seed: int = 0
    name: str = "dataset"

    def __post_init__(self) -> None:
        self.partition_settings  # validates the data settings  # noqa: B018
        for key in ("local_epochs", "batch_size"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                invalid_setting(key.replace("_", "-"), value, "an integer ≥ 1")
        rows = self.routing_loss_rows
        if isinstance(rows, bool) or not isinstance(rows, (int, np.integer)) or rows < 0:
            invalid_setting("routing-loss-rows", rows, "an integer ≥ 1 (rows per client), or 0 for every row")
        if isinstance(self.learning_rate, bool) or not isinstance(self.learning_rate, (int, float)) \
                or not np.isfinite(self.learning_rate) or self.learning_rate <= 0:
            invalid_setting("learning-rate", self.learning_rate, "a finite number > 0")
        if not str(self.model):
            invalid_setting("model", self.model, "'auto', 'cnn', 'mlp' or 'package.module:factory'")
        check_device_name(self.client_device)
        if str(self.batched_losses).lower() not in BATCHED_CHOICES:
            invalid_setting("batched-losses", self.batched_losses, f"one of {BATCHED_CHOICES}")
        if str(self.routing_early_stop).lower() not in EARLY_STOP_CHOICES:
            invalid_setting("routing-early-stop", self.routing_early_stop, f"one of {EARLY_STOP_CHOICES}")

    @property
    def partition_settings(self) -> PartitionSettings:
        """The data side (:mod:`fedroute.data.partitions`)."""
        return PartitionSettings(dataset=self.dataset, num_partitions=self.num_clients, partitioner=self.partitioner,
                                 dirichlet_alpha=self.dirichlet_alpha, partition_by=self.partition_by,
                                 classes_per_client=self.classes_per_client, num_groups=self.num_groups,
                                 group_transform=self.group_transform, label_column=self.label_column,
                                 test_fraction=self.test_fraction, seed=self.seed)

    def _schema(self) -> Any:
        excluded = (self.partition_by,) if self.partition_by != "auto" else ()
        return dataset_schema(self.dataset, self.label_column, excluded)

    def groups(self, client_ids: NDArray[np.int64]) -> NDArray[np.int64]:
        """Latent group of each client (``c mod G``; ``0`` for everyone under group-transform ``none``)."""
        ids = np.asarray(client_ids, dtype=np.int64)
        return np.zeros_like(ids) if self.group_transform == "none" else ids % self.num_groups

    def clients(self, client_ids: NDArray[np.int64]) -> Any:
        """One client's data and model (a :class:`~fedroute.tasks.dataset_client.DatasetClient`)."""
        from fedroute.tasks.dataset_client import DatasetClient

        client_ids = checked_client_ids(client_ids, self.num_clients)
        if len(client_ids) != 1:
            raise ValueError(f"the dataset task builds one client at a time (a torch module per client); got "
                             f"{len(client_ids)} ids: it runs in Flower (fedroute flower, deploy local), not in the "
                             "batched simulator")
        schema = self._schema()
        data = grouped_partition(self.partition_settings, int(client_ids[0]))
        return DatasetClient(self, data, schema.input_shape, schema.num_classes)

    def initial_models(self, num_clusters: int) -> NDArray[np.float32]:
        """``K`` starts of the model, ``(K, P)`` float32 (module ``k`` under ``torch.manual_seed(seed·1000+k)``)."""
        from fedroute.data.models import initial_vectors

        schema = self._schema()
        return initial_vectors(self.model, schema.input_shape, schema.num_classes, num_clusters, self.seed)

    def early_stop(self, device: Optional[Any]) -> bool:
        """Whether the clients score the ``K`` models with early stop on ``device`` (``routing-early-stop``).

        ``auto``: where the losses run one model at a time (not :meth:`batched`).  There early stop cut the
        ``K = 4`` passes of a separated federation to about a third, with the same routing decisions on the
        development runs (docs/performance.md, "Batched K-model losses"); the batched pass scores every row
        in one pass whatever ``K``, so a GPU run keeps the exact losses.
        """
        choice = str(self.routing_early_stop).lower()
        return not self.batched(device) if choice == "auto" else choice == "true"

    def batched(self, device: Optional[Any]) -> bool:
        """Whether the ``K`` losses run as one batched pass on ``device`` (``batched-losses``)."""
        choice = str(self.batched_losses).lower()
        if choice == "auto":
            return device is not None and getattr(device, "type", "cpu") == "cuda"
        return choice == "true"
