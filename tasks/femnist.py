"""Transformed FEMNIST through ``flwr-datasets`` (paper §4, Appendix B.3, EXPERIMENTS E4): writers as clients.

The real data path of E4.  The model, the local update, the pretraining, the
starts ``W^0``, the round-zero audit and the entry-threshold calibration are
those of :mod:`fedroute.tasks.characters` (this task only supplies the
images); see that module for every setting and its measurements.

Data
    ``flwr_datasets.FederatedDataset(dataset="flwrlabs/femnist",
    partitioners={"train": NaturalIdPartitioner(partition_by="writer_id")},
    shuffle=False)``: one partition per writer, partition ids in sorted
    ``writer_id`` order (that is how ``NaturalIdPartitioner`` numbers them).
    Columns ``image`` (a 28×28 grayscale PIL image, the ``datasets.Image``
    feature), ``writer_id``, ``hsf_id``, ``character`` (62 classes: digits
    ``0–9`` are labels ``0–9``).  Offline, point the task at a local parquet
    file with the same columns (``data_file=`` / run-config ``data-file``; it
    is read with ``FederatedDataset(dataset="parquet", data_files={"train":
    path})``, the same partitioner and the same code below).  Without either,
    an unreachable hub raises a ``ConnectionError`` that names the hub and the
    two ways out (this file, or the embedded ``characters`` task).

Clients
    The ``num_clients`` writers with partition ids ``first_writer …
    first_writer + num_clients − 1`` (sorted writer ids: deterministic, no
    seed).  A writer keeps the images whose ``character < num_classes``
    (``num_classes = 62``: all; ``10``: the digits only).  Writers
    ``n/2 … n−1`` of the selection are transformed (group 1): their images of
    labels 6 and 9 are rotated by 180°, labels unchanged, on both splits.
    Split per client with the data seed: ``generator(seed, client, 0,
    Purpose.DATA)`` permutes the writer's images, the first
    ``round(test_fraction · s_i)`` are held out.  Pixels are scaled to
    ``[0, 1]`` (``/255``) and flattened: the MLP's input size is
    ``image_size² = 784``.  Clients are padded to the largest writer with a
    sample mask (:class:`~fedroute.tasks.characters.CharactersClients`).

Cost
    ``D = 784`` and writers of ≈ 225 images on average (padded to the largest
    selected writer) make a round about ``(784/64)·(S/72) ≈ 30–60×`` the
    embedded task's (estimate, not measured on the real data: the hub is not
    reachable here); the 144-run grid that takes minutes on the digits is a
    job of hours here.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Optional

import numpy as np
from numpy.typing import NDArray

from fedroute.core.randomness import Purpose, generator
from fedroute.core.task import validate_task_settings
from fedroute.tasks.characters import TransformedCharactersTask, rotate_classes

__all__ = ["FEMNIST_DATASET", "FemnistTask", "load_writers"]

FEMNIST_DATASET = "flwrlabs/femnist"
"""The Hugging Face hub id of FEMNIST as Flower publishes it."""

_COLUMNS = ("image", "writer_id", "character")


def _offline_message(dataset: str, error: BaseException) -> str:
    return (f"could not load '{dataset}' from the Hugging Face Hub through flwr-datasets ({type(error).__name__}: "
            f"{error}). This machine may be offline. Use the embedded task instead (run-config task = "
            "'characters': scikit-learn's handwritten digits, no download), or give the FEMNIST task a local "
            "parquet file with the columns image, writer_id, hsf_id, character (run-config data-file = PATH; "
            "FemnistTask(data_file=PATH)).")


def _as_array(image: Any) -> NDArray[np.uint8]:
    """One stored image as a 2-D array: a PIL image, a ``{"bytes", "path"}`` dict (undecoded), or an array."""
    if isinstance(image, dict):
        from PIL import Image

        if image.get("bytes") is not None:
            image = Image.open(io.BytesIO(image["bytes"]))
        else:
            image = Image.open(image["path"])
    if hasattr(image, "convert"):
        image = image.convert("L")
    array = np.asarray(image)
    if array.ndim == 3 and array.shape[-1] == 1:
        array = array[..., 0]
    if array.ndim != 2:
        raise ValueError(f"FEMNIST images must be 2-D grayscale, got an array of shape {array.shape}")
    return array


@lru_cache(maxsize=4)
def load_writers(
    dataset: str, data_file: Optional[str], first_writer: int, num_writers: int
) -> tuple[tuple[str, NDArray[np.uint8], NDArray[np.int64]], ...]:
    """``(writer_id, images (s, h, w) uint8, labels (s,))`` of the selected writers, read through flwr-datasets.

    Raises
    ------
    ConnectionError
        The hub cannot be reached (the message names the hub and the ways out).
    FileNotFoundError
        ``data_file`` does not exist.
    ValueError
        Fewer writers than requested, or a column is missing.
    """
    try:
        from flwr_datasets import FederatedDataset
        from flwr_datasets.partitioner import NaturalIdPartitioner
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise ImportError("the FEMNIST task needs flwr-datasets (pip install flwr-datasets); the embedded "
                          "'characters' task does not") from error
    partitioner = NaturalIdPartitioner(partition_by="writer_id")
    if data_file:
        path = Path(data_file).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"FEMNIST data-file '{data_file}' does not exist (expected a parquet file "
                                    "with the columns image, writer_id, hsf_id, character)")
        source = f"parquet file {path}"
        make = lambda: FederatedDataset(dataset="parquet", data_files={"train": str(path)},  # noqa: E731
                                        partitioners={"train": partitioner}, shuffle=False)
    else:
        source = dataset
        make = lambda: FederatedDataset(dataset=dataset, partitioners={"train": partitioner},  # noqa: E731
                                        shuffle=False)
    try:
        federated = make()
        available = federated.partitioners["train"].num_partitions
    except (ConnectionError, OSError) as error:
        if data_file:
            raise
        raise ConnectionError(_offline_message(dataset, error)) from error
    if first_writer + num_writers > available:
        raise ValueError(f"{source} has {available} writers; writers {first_writer} … "
                         f"{first_writer + num_writers - 1} were requested")
    writers = []
    for partition_id in range(first_writer, first_writer + num_writers):
        part = federated.load_partition(partition_id, "train")
        missing = [column for column in _COLUMNS if column not in part.column_names]
        if missing:
            raise ValueError(f"{source} lacks the column(s) {missing}; FEMNIST has image, writer_id, hsf_id, "
                             "character")
        images = np.stack([_as_array(image) for image in part["image"]]).astype(np.uint8)
        labels = np.asarray(part["character"], dtype=np.int64)
        writer = str(federated.partitioners["train"].partition_id_to_natural_id[partition_id])
        images.flags.writeable = labels.flags.writeable = False
        writers.append((writer, images, labels))
    return tuple(writers)


@dataclass(frozen=True)
class FemnistTask(TransformedCharactersTask):
    """Transformed FEMNIST (writers as clients) with the MLP and starts of the characters task.

    Parameters (besides those of
    :class:`~fedroute.tasks.characters.TransformedCharactersTask`)
    ----------
    dataset : str
        Hub id (default ``flwrlabs/femnist``).
    data_file : str or None
        Local parquet file with the FEMNIST columns; read instead of the hub.
    first_writer : int
        Partition id (sorted writer ids) of the first selected writer (≥ 0).
    num_classes : int
        Keep the images with ``character < num_classes`` (2 … 62).
    image_size : int
        Side of the (square) images; the MLP has ``image_size²`` inputs.
    """

    dataset: str = FEMNIST_DATASET
    data_file: Optional[str] = None
    first_writer: int = 0
    num_classes: int = 62
    image_size: int = 28

    name = "femnist"

    def __post_init__(self) -> None:
        super().__post_init__()
        validate_task_settings(self, "femnist", integers=("first_writer", "num_classes", "image_size"), numbers=(),
                               checks=lambda: [
            (self.first_writer >= 0, "first-writer", self.first_writer, "an integer ≥ 0"),
            (10 <= self.num_classes <= 62, "num-classes", self.num_classes,
             "an integer in [10, 62] (labels 6 and 9 must exist)"),
            (self.image_size >= 1, "image-size", self.image_size, "an integer ≥ 1"),
            (bool(self.dataset), "dataset", self.dataset, "a hub dataset id"),
        ])

    @property
    def input_size(self) -> int:
        """``D = image_size²``."""
        return self.image_size * self.image_size

    @property
    def classes(self) -> int:
        """``C = num_classes``."""
        return self.num_classes

    def writers(self) -> tuple[tuple[str, NDArray[np.uint8], NDArray[np.int64]], ...]:
        """The selected writers' ``(writer_id, images, labels)``, classes ``≥ num_classes`` dropped."""
        kept = []
        for writer, images, labels in load_writers(self.dataset, self.data_file or None, self.first_writer,
                                                   self.num_clients):
            if images.shape[1:] != (self.image_size, self.image_size):
                raise ValueError(f"writer {writer} has images of shape {images.shape[1:]}; the task's "
                                 f"image-size is {self.image_size}")
            chosen = labels < self.num_classes
            if chosen.sum() < 2:
                raise ValueError(f"writer {writer} has {int(chosen.sum())} images of classes < {self.num_classes}; "
                                 "each client needs at least 2 (one to train, one held out)")
            kept.append((writer, images[chosen], labels[chosen]))
        return tuple(kept)

    def _sizes(self) -> list[tuple[int, int]]:
        """``(train, test)`` counts per client (seed independent)."""
        sizes = []
        for _, _, labels in self.writers():
            held_out = min(len(labels) - 1, max(1, int(round(self.test_fraction * len(labels)))))
            sizes.append((len(labels) - held_out, held_out))
        return sizes

    def _padded_lengths(self) -> tuple[int, int]:
        sizes = self._sizes()
        return max(train for train, _ in sizes), max(test for _, test in sizes)

    def _client_parts(self):
        parts = []
        for client, ((_, images, labels), (_, held_out)) in enumerate(zip(self.writers(), self._sizes())):
            order = generator(self.seed, client, 0, Purpose.DATA).permutation(len(labels))
            x = images[order].astype(np.float32) / np.float32(255.0)
            y = labels[order]
            if client >= self.num_clients // 2:
                x = rotate_classes(x, y)
            parts.append((x[held_out:], y[held_out:], x[:held_out], y[:held_out]))
        return parts
