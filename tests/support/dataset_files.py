"""Small local datasets for the dataset task: scikit-learn's 8×8 digits as Parquet, an image folder and CSV."""

from __future__ import annotations

from pathlib import Path

from fedroute.data.standins import digit_images, write_digits_parquet

__all__ = ["NUM_WRITERS", "digit_images", "write_parquet", "write_image_folder", "write_csv", "small_factory"]

NUM_WRITERS = 7
"""The Parquet file's ``writer`` column: row ``i`` is by writer ``i mod 7`` (for ``natural-id``)."""


def write_parquet(path: Path, limit: int | None = None) -> Path:
    """Columns ``image`` (PNG ``{bytes, path}`` structs, as ``datasets`` stores images), ``label``, ``writer``."""
    return write_digits_parquet(path, writer="writer", num_writers=NUM_WRITERS, limit=limit)


def write_image_folder(root: Path, limit: int) -> Path:
    """``root/<digit>/<index>.png`` for the first ``limit`` digits."""
    from PIL import Image

    images, labels = digit_images()
    for index in range(limit):
        folder = root / str(labels[index])
        folder.mkdir(parents=True, exist_ok=True)
        Image.fromarray(images[index]).save(folder / f"{index:04d}.png")
    return root


def write_csv(path: Path, limit: int) -> Path:
    """64 pixel columns ``p0 … p63`` (``0 … 16``) and ``label``: a tabular dataset."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    header = ",".join([f"p{i}" for i in range(64)] + ["label"])
    rows = [",".join(map(str, [*map(int, digits.data[i]), int(digits.target[i])])) for i in range(limit)]
    path.write_text(header + "\n" + "\n".join(rows) + "\n")
    return path


def small_factory(input_shape: tuple[int, ...], num_classes: int):
    """A user's model factory for run-config ``model = "support.dataset_files:small_factory"``."""
    import math

    from torch import nn

    return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), 16), nn.ReLU(), nn.Linear(16, num_classes))
