"""Rows of a dataset as arrays: which column holds the label and which the features.

An *image* dataset has a column of images (a ``datasets.Image`` feature, PIL
images, ``{"bytes", "path"}`` structs as Parquet stores them, or file paths);
its images become ``float32`` arrays ``(C, H, W)`` in ``[0, 1]``.  A *tabular*
dataset has numeric columns; every numeric column but the label (and the
partitioner's ``partition-by`` column) becomes one ``float32`` feature vector.
"""

from __future__ import annotations

import io
from typing import Any, Optional, Sequence

import numpy as np
from numpy.typing import NDArray

__all__ = ["IMAGE_COLUMNS", "LABEL_COLUMNS", "label_column", "image_column", "feature_columns", "as_arrays",
           "image_array"]

LABEL_COLUMNS = ("label", "labels", "character", "fine_label", "target", "class", "y")
"""Names taken as the label column when run-config ``label-column = "auto"`` (first present wins)."""
IMAGE_COLUMNS = ("image", "img", "pixel_values", "png", "jpg")
"""Names taken as the image column (besides any column of the ``datasets.Image`` feature)."""


def label_column(columns: Sequence[str], requested: str = "auto") -> str:
    """The label column: ``requested``, or with ``"auto"`` the first of :data:`LABEL_COLUMNS` present.

    Raises
    ------
    ValueError
        Naming run-config ``label-column``, the columns there are and the fix.
    """
    if requested != "auto":
        if requested not in columns:
            raise ValueError(f"run-config 'label-column' = '{requested}' is not a column of the dataset; allowed: "
                             f"one of {list(columns)}")
        return requested
    for name in LABEL_COLUMNS:
        if name in columns:
            return name
    raise ValueError(f"the dataset has no label column among {list(LABEL_COLUMNS)} (its columns: {list(columns)}); "
                     "set run-config 'label-column' to the column holding the class")


def image_column(dataset: Any) -> Optional[str]:
    """The dataset's image column (a ``datasets.Image`` feature or a conventional name), or None."""
    import datasets

    for name, feature in dataset.features.items():
        if isinstance(feature, datasets.Image):
            return name
    for name in IMAGE_COLUMNS:
        if name in dataset.column_names:
            return name
    return None


def feature_columns(dataset: Any, exclude: Sequence[str]) -> list[str]:
    """The numeric columns of a tabular dataset (all but ``exclude``).

    Raises
    ------
    ValueError
        If there is none.
    """
    import datasets

    numeric = [name for name, feature in dataset.features.items() if name not in exclude
               and isinstance(feature, datasets.Value) and feature.dtype.startswith(("int", "uint", "float", "bool"))]
    if not numeric:
        raise ValueError(f"the dataset has neither an image column ({list(IMAGE_COLUMNS)} or a datasets.Image "
                         f"feature) nor numeric feature columns besides {list(exclude)} (its columns: "
                         f"{dataset.column_names})")
    return numeric


def image_array(image: Any) -> NDArray[np.float32]:
    """One stored image as ``(C, H, W)`` float32 in ``[0, 1]`` (grayscale: ``C = 1``; colour: ``C = 3``)."""
    from PIL import Image

    if isinstance(image, dict):
        image = Image.open(io.BytesIO(image["bytes"])) if image.get("bytes") is not None else Image.open(image["path"])
    elif isinstance(image, (str, bytes)):
        image = Image.open(io.BytesIO(image)) if isinstance(image, bytes) else Image.open(image)
    if hasattr(image, "mode"):
        if image.mode not in ("L", "RGB"):
            image = image.convert("L" if image.mode in ("1", "I", "I;16", "F", "LA") else "RGB")
        array = np.asarray(image, dtype=np.float32) / np.float32(255.0)
    else:
        array = np.asarray(image, dtype=np.float32)
        if array.max(initial=0.0) > 1.0:
            array = array / np.float32(255.0)
    if array.ndim == 2:
        array = array[None]
    elif array.ndim == 3 and array.shape[-1] in (1, 3, 4) and array.shape[0] not in (1, 3):
        array = np.moveaxis(array, -1, 0)
    if array.ndim != 3:
        raise ValueError(f"an image of the dataset has shape {array.shape}; allowed: (H, W), (H, W, C) or (C, H, W)")
    return np.ascontiguousarray(array, dtype=np.float32)


def as_arrays(dataset: Any, label: str, exclude: Sequence[str] = ()) -> tuple[NDArray[np.float32], NDArray[np.int64]]:
    """Features and labels of ``dataset``: images ``(n, C, H, W)`` or vectors ``(n, D)``, labels ``(n,)``.

    The rows are read once as an Arrow table (images undecoded, decoded here with PIL).

    Raises
    ------
    ValueError
        Images of different shapes, or labels that are not integers.
    """
    column = image_column(dataset)
    names = [] if column is not None else feature_columns(dataset, [label, *exclude])
    table = dataset.with_format("arrow")[:]
    labels = table.column(label).to_numpy(zero_copy_only=False)
    if labels.dtype.kind not in "iub":
        raise ValueError(f"label column '{label}' holds {labels.dtype} values; allowed: integer classes (set run-config "
                         "'label-column' to an integer column)")
    if column is not None:
        images = [image_array(image) for image in table.column(column).to_pylist()]
        shapes = {image.shape for image in images}
        if len(shapes) > 1:
            raise ValueError(f"the images of column '{column}' have different shapes {sorted(shapes)[:4]}; "
                             "the dataset task needs one image size (resize the images first)")
        features = np.stack(images) if images else np.zeros((0, 1, 1, 1), np.float32)
    else:
        features = np.stack([table.column(name).to_numpy(zero_copy_only=False).astype(np.float32) for name in names],
                            axis=1) if len(labels) else np.zeros((0, len(names)), np.float32)
    return features.astype(np.float32, copy=False), labels.astype(np.int64)
