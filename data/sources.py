"""Where the dataset task's rows come from: a Hugging Face hub name, or a local Parquet, CSV or image folder.

Local files are read into memory (pyarrow for Parquet and CSV; an image folder is
listed ``<class>/<file>``), with no ``datasets`` cache directory; a hub name goes
through :func:`datasets.load_dataset` (``split="train"``).  Either way the result
is a :class:`datasets.Dataset`, which the ``flwr-datasets`` partitioners split.

Offline, a hub name fails with a :class:`ConnectionError` that names the dataset
and says how to point the task at a local copy.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

__all__ = ["IMAGE_SUFFIXES", "load_source", "offline_message", "looks_like_path"]

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")
"""Files an image folder's class folders may hold."""

_TABLE_SUFFIXES = (".parquet", ".pq", ".csv")


def looks_like_path(dataset: str) -> bool:
    """Whether ``dataset`` is meant as a local path (rather than a hub name ``owner/name``)."""
    text = str(dataset)
    return text.startswith(("/", ".", "~")) or text.lower().endswith(_TABLE_SUFFIXES) or Path(text).expanduser().exists()


def offline_message(dataset: str, error: BaseException) -> str:
    """What to do when the hub cannot be reached for ``dataset``."""
    stem = dataset.replace("/", "_")
    return (f"could not load the dataset '{dataset}' from the Hugging Face Hub ({type(error).__name__}: {error}). "
            "This machine may be offline. Download it where the hub is reachable, e.g. "
            f"python -c \"import datasets; datasets.load_dataset('{dataset}', split='train').to_parquet('{stem}.parquet')\""
            f", copy the file here and point the task at it: run-config dataset = \"/path/to/{stem}.parquet\" "
            "(a local Parquet or CSV file, or an image folder <class>/<image> also works)")


def _image_folder(root: Path) -> Any:
    """An image folder ``root/<class>/<image>`` as a Dataset with columns ``image`` (file path) and ``label``."""
    import datasets

    classes = sorted(child.name for child in root.iterdir() if child.is_dir())
    paths, labels = [], []
    for label, name in enumerate(classes):
        for file in sorted((root / name).rglob("*")):
            if file.suffix.lower() in IMAGE_SUFFIXES:
                paths.append(str(file))
                labels.append(label)
    if not paths:
        raise ValueError(f"run-config 'dataset' = '{root}' is a folder without images in class sub-folders; "
                         f"allowed: an image folder <class>/<image> ({', '.join(IMAGE_SUFFIXES)}), or a folder of "
                         "Parquet files")
    features = datasets.Features({"image": datasets.Image(), "label": datasets.ClassLabel(names=classes)})
    return datasets.Dataset.from_dict({"image": paths, "label": labels}, features=features)


def _table(paths: list[Path]) -> Any:
    """Parquet or CSV files as one in-memory Dataset (Hugging Face feature metadata, if any, kept)."""
    import datasets
    import pyarrow as pa
    import pyarrow.csv as pa_csv
    import pyarrow.parquet as pq

    tables = [pq.read_table(path) if path.suffix.lower() != ".csv" else pa_csv.read_csv(path) for path in paths]
    table = pa.concat_tables(tables) if len(tables) > 1 else tables[0]
    return datasets.Dataset(datasets.table.InMemoryTable(table))


@lru_cache(maxsize=4)
def load_source(dataset: str) -> Any:
    """The rows of ``dataset`` as a :class:`datasets.Dataset` (cached per process).

    Parameters
    ----------
    dataset : str
        A local Parquet (``.parquet``/``.pq``) or CSV file, a folder of Parquet
        files, an image folder ``<class>/<image>``, or a hub name (its
        ``train`` split).

    Raises
    ------
    FileNotFoundError
        A path that does not exist.
    ConnectionError
        A hub name while the hub is unreachable (the message says how to use a local copy).
    ValueError
        A folder that holds neither images in class folders nor Parquet files.
    """
    path = Path(dataset).expanduser()
    if path.is_file():
        if path.suffix.lower() not in _TABLE_SUFFIXES:
            raise ValueError(f"run-config 'dataset' = '{dataset}' is a {path.suffix or 'suffix-less'} file; allowed: "
                             "a .parquet, .pq or .csv file, an image folder, or a hub name")
        return _table([path])
    if path.is_dir():
        parquet = sorted(path.glob("*.parquet"))
        return _table(parquet) if parquet else _image_folder(path)
    if looks_like_path(dataset):
        raise FileNotFoundError(f"run-config 'dataset' = '{dataset}': no such file or folder (a local Parquet or "
                                "CSV file, an image folder, or a Hugging Face hub name such as 'ylecun/mnist')")
    import datasets

    try:
        return datasets.load_dataset(dataset, split="train")
    except (ConnectionError, OSError) as error:
        raise ConnectionError(offline_message(dataset, error)) from error
