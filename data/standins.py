"""Offline stand-ins for the standard benchmarks: scikit-learn's 8×8 digits written as the hub datasets' tables.

Where the Hugging Face hub is unreachable, the benchmark run configs
(``conf/benchmarks/``) run on these files with the same code path::

    python -m fedroute.data.standins mnist digits.parquet      # columns image, label (as ylecun/mnist)
    python -m fedroute.data.standins femnist digits-femnist.parquet   # image, writer_id, character (flwrlabs/femnist)

Images are stored as PNG ``{bytes, path}`` structs, as ``datasets`` stores an
``Image`` feature in Parquet; pixels ``0 … 16`` are scaled to ``0 … 255``.  The
FEMNIST stand-in has ``NUM_WRITERS`` writers (row ``i`` by writer ``i mod NUM_WRITERS``).
"""

from __future__ import annotations

import argparse
import io
from pathlib import Path
from typing import Optional

import numpy as np

__all__ = ["NUM_WRITERS", "digit_images", "write_digits_parquet", "main"]

NUM_WRITERS = 40
"""Writers of the FEMNIST stand-in."""


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


def write_digits_parquet(path: str | Path, label: str = "label", writer: Optional[str] = None,
                         num_writers: int = NUM_WRITERS, limit: Optional[int] = None) -> Path:
    """The digits as Parquet: ``image`` (PNG structs), ``label`` (or another name) and optionally a writer column.

    Parameters
    ----------
    path : path
        The file to write.
    label : str
        Name of the label column (``character`` for the FEMNIST stand-in).
    writer : str, optional
        Name of a writer column (row ``i`` by writer ``i mod num_writers``), for ``natural-id``.
    num_writers : int
        Writers of that column.
    limit : int, optional
        Only the first ``limit`` digits.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    images, labels = digit_images()
    images, labels = images[:limit], labels[:limit]
    image_type = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    columns = {"image": pa.array([{"bytes": _png(image), "path": None} for image in images], type=image_type),
               label: pa.array(labels)}
    if writer is not None:
        columns[writer] = pa.array(np.arange(len(labels)) % num_writers)
    path = Path(path)
    pq.write_table(pa.table(columns), path)
    return path


def main(argv: Optional[list[str]] = None) -> int:
    """``python -m fedroute.data.standins {mnist,femnist} OUT.parquet``."""
    parser = argparse.ArgumentParser(description="write an offline stand-in of a benchmark dataset (the digits)")
    parser.add_argument("kind", choices=("mnist", "femnist"))
    parser.add_argument("out")
    args = parser.parse_args(argv)
    if args.kind == "mnist":
        path = write_digits_parquet(args.out)
    else:
        path = write_digits_parquet(args.out, label="character", writer="writer_id")
    print(f"wrote {path} (scikit-learn's 1,797 digits, 8×8, as a {args.kind} stand-in)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
