"""Small matplotlib helpers shared by the ``fedroute reproduce`` experiments (Agg backend)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

__all__ = ["pyplot", "save_figure", "log2_axis"]


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the non-interactive Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig: Any, directory: str | Path, stem: str, dpi: int = 150) -> list[Path]:
    """Write ``directory/stem.png`` and ``directory/stem.pdf`` (no creation date: reproducible bytes), close ``fig``."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = [directory / f"{stem}.png", directory / f"{stem}.pdf"]
    fig.savefig(paths[0], dpi=dpi)
    fig.savefig(paths[1], metadata={"CreationDate": None})
    pyplot().close(fig)
    return paths


def log2_axis(ax: Any, values: Sequence[float]) -> None:
    """Base-2 log x axis ticked at ``values`` (left linear when a value is ≤ 0 or there is only one)."""
    values = sorted(set(float(v) for v in values))
    if len(values) > 1 and values[0] > 0:
        ax.set_xscale("log", base=2)
        ax.set_xticks(values, [f"{v:g}" for v in values])
        ax.minorticks_off()
