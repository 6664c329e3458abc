"""Real data for clustered FL: ``flwr-datasets`` partitions of a hub or local dataset, seen through group transforms.

The data side of ``task = "dataset"`` (:mod:`fedroute.tasks.dataset`), usable from a
user's own ClientApp: :func:`grouped_partitions` gives every client its partition
(IID, Dirichlet, pathological or natural-id, by ``flwr-datasets``), transformed by
its group (rotated images, permuted labels) and split into train / held-out rows;
:func:`fedroute.data.models.build_model` a small CNN/MLP for the rows' shape.
Importing this package imports neither torch nor ``datasets``.
"""

from fedroute.data.partitions import PARTITIONERS, ClientData, PartitionSettings, grouped_partition, \
    grouped_partitions
from fedroute.data.transforms import GROUP_TRANSFORMS

__all__ = ["PARTITIONERS", "GROUP_TRANSFORMS", "ClientData", "PartitionSettings", "grouped_partition",
           "grouped_partitions"]
