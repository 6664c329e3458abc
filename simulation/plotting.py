"""Small matplotlib helpers shared by the ``fedroute reproduce`` experiments (Agg backend), and their figure
declaration :class:`Panel`."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence, Union

from fedroute.core.methods import REGISTRY

__all__ = ["pyplot", "save_figure", "log2_axis", "Panel", "METHOD_STYLES"]

METHOD_STYLES = {name: {"label": method.label, "color": method.color} for name, method in REGISTRY.items()}
"""Line style of each method in every figure (its label and colour in :data:`~fedroute.core.methods.REGISTRY`)."""


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


@dataclass(frozen=True)
class Panel:
    """One figure ``figures/<stem>.{png,pdf}``: ``y`` against ``x`` of a table, one line per value of ``by``.

    ``data`` is a table name of the results (read as an attribute) or a function of the results returning the
    (long) table; ``bars``: grouped bars per ``x`` value instead of lines;
    ``styles`` maps a line to matplotlib keywords (over :data:`METHOD_STYLES`; ``offset`` shifts it
    vertically); ``title`` may be a function of ``(results, config)``; ``extra(ax, results, config)``
    draws more.
    """

    stem: str
    data: Union[str, Callable[[Any], Any]]
    x: str
    y: str
    xlabel: str
    ylabel: str
    title: Union[str, Callable[[Any, Any], str]] = ""
    by: str = "method"
    styles: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    marker: Optional[str] = "o"
    step: bool = False
    ylim: Optional[tuple[float, float]] = None
    xticks: bool = False
    log2_x: bool = False
    extra: Optional[Callable[[Any, Any, Any], None]] = None
    bars: bool = False

    def draw(self, results: Any, config: Any, figures: Path) -> None:
        """Draw the panel of ``results`` into ``figures/<stem>.{png,pdf}``."""
        plt = pyplot()
        table = self.data(results) if callable(self.data) else getattr(results, self.data)
        fig, ax = plt.subplots(figsize=(max(5.4, 0.4 * table[self.x].nunique()) if self.bars else 5.4, 3.7))
        lines, positions = table[self.by].unique(), list(table[self.x].unique())
        for j, (key, part) in enumerate(table.groupby(self.by, sort=False)):
            style = {"label": key, **METHOD_STYLES.get(key, {}), **self.styles.get(key, {})}
            offset = style.pop("offset", 0.0)
            if self.bars:
                width = 0.8 / len(lines)
                ax.bar([positions.index(v) + (j - (len(lines) - 1) / 2) * width for v in part[self.x]],
                       part[self.y] + offset, width, **style)
            elif self.step:
                ax.step(part[self.x], part[self.y] + offset, where="post", linewidth=1.2, **style)
            else:
                ax.plot(part[self.x], part[self.y] + offset, **{"marker": self.marker, **style})
        if self.extra is not None:
            self.extra(ax, results, config)
        if self.bars:
            ax.set_xticks(range(len(positions)), positions, fontsize=7)
        elif self.log2_x:
            log2_axis(ax, table[self.x])
        elif self.xticks:
            ax.set_xticks(sorted(table[self.x].unique()))
        if self.ylim is not None:
            ax.set_ylim(*self.ylim)
        ax.set_xlabel(self.xlabel)
        ax.set_ylabel(self.ylabel)
        ax.set_title(self.title(results, config) if callable(self.title) else self.title, fontsize=9)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
        fig.tight_layout()
        save_figure(fig, figures, self.stem)
