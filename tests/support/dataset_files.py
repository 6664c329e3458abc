"""Small local datasets for the dataset task: scikit-learn's 8×8 digits as Parquet, an image folder and CSV."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np

NUM_WRITERS = 7
"""The Parquet file's ``writer`` column: row ``i`` is by writer ``i mod 7`` (for ``natural-id``)."""


def digit_images() -> tuple[np.ndarray, np.ndarray]:
    """The 1,797 digits as uint8 images (8×8, ``0 … 255``) and their labels."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    return np.round(digits.images * 255 / 16).astype(np.uint8), digits.target.astype(np.int64)


def _png(image: np.ndarray) -> bytes:
    from PIL import Image

    stream = io.BytesIO()
    Image.fromarray(image).save(stream, format="PNG")
    return stream.getvalue()


def write_parquet(path: Path, limit: int | None = None) -> Path:
    """Columns ``image`` (PNG ``{bytes, path}`` structs, as ``datasets`` stores images), ``label``, ``writer``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    images, labels = digit_images()
    images, labels = images[:limit], labels[:limit]
    image_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    table = pa.table({"image": pa.array([{"bytes": _png(image), "path": None} for image in images], type=image_type),
                      "label": pa.array(labels),
                      "writer": pa.array(np.arange(len(labels)) % NUM_WRITERS)})
    pq.write_table(table, path)
    return path


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
