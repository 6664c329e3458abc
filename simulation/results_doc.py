"""The generated tables of ``docs/results.md``: every claims table from an experiment's ``claims.json`` and every
numbers table from its Parquet tables (``fedroute reproduce all``, :func:`update_results_doc`)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np
import pandas as pd

__all__ = ["claims_markdown", "table_markdown", "update_results_doc"]

MARKER = re.compile(r"<!-- (claims|table):([\w-]+):begin -->\n.*?<!-- \1:\2:end -->", re.S)


def _cell(value: Any) -> Optional[str]:
    """A scalar (or a short flat list/dict of scalars) as table text; None for what does not fit a cell."""
    if isinstance(value, bool) or value is None:
        return {True: "yes", False: "no", None: "–"}[value]
    if isinstance(value, (int, float, np.number)):
        return f"{value:.4g}" if isinstance(value, float) else str(value)
    if isinstance(value, str):
        return value if len(value) <= 60 else None
    items = list(value.items()) if isinstance(value, dict) else list(enumerate(value))
    if not 0 < len(items) <= 12 or any(isinstance(v, (dict, list)) for _, v in items):
        return None
    texts = [_cell(v) for _, v in items]
    if isinstance(value, dict):
        return ", ".join(f"{k}: {t}" for (k, _), t in zip(items, texts))
    return "[" + ", ".join(str(t) for t in texts) + "]"


def _escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def claims_markdown(claims: Sequence[dict[str, Any]]) -> str:
    """A claims table: our claim as tested, the measured values that fit a cell, and whether it holds."""
    lines = ["| claim (as tested) | measured | holds |", "|---|---|---|"]
    for record in claims:
        measured = record["measured"]
        if isinstance(measured, dict):
            texts = [(key, _cell(value)) for key, value in measured.items()]
            measured = "; ".join(f"{key.replace('_', ' ')} = {text}" for key, text in texts if text is not None)
        holds = {True: "yes", False: "**no**", None: "untestable"}[record["holds"]]
        lines.append(f"| {_escape(record['claim'])} | {_escape(str(measured))} | {holds} |")
    return "\n".join(lines)


def table_markdown(table: pd.DataFrame) -> str:
    """A table as markdown: the first column (the key) as ``{:g}``, other floats to 3 decimals."""
    def text(value: Any, first: bool) -> str:
        return (f"{value:g}" if first else f"{value:.3f}") if isinstance(value, float) else str(value)

    lines = ["| " + " | ".join(map(str, table.columns)) + " |", "|" + "---|" * len(table.columns)]
    lines += ["| " + " | ".join(text(v, i == 0) for i, v in enumerate(row)) + " |"
              for row in table.itertuples(index=False)]
    return "\n".join(lines)


def update_results_doc(out: Path, doc: Path, shows: Mapping[str, Callable[[Any], Sequence[pd.DataFrame]]]) -> list[str]:
    """Rewrite the marked tables of ``doc`` from the outputs in ``out``; returns the markers rewritten.

    ``<!-- claims:<dir>:begin -->`` … ``<!-- claims:<dir>:end -->`` becomes the claims table of
    ``out/<dir>/claims.json``; ``<!-- table:<dir>:begin -->`` … the tables ``shows[experiment](results)`` of the
    experiment whose outputs ``<dir>`` holds (``<experiment>`` or ``<experiment>-<variant>``), ``results``
    giving its ``out/<dir>/*.parquet`` tables as attributes.  Markers whose outputs are missing stay as they are."""
    updated: list[str] = []

    def rewrite(match: re.Match) -> str:
        kind, name = match.group(1), match.group(2)
        source = out / name
        show = next((shows[e] for e in sorted(shows, key=len, reverse=True) if name == e or name.startswith(f"{e}-")),
                    None)
        if kind == "claims" and (source / "claims.json").is_file():
            body = claims_markdown(json.loads((source / "claims.json").read_text()))
        elif kind == "table" and show is not None and source.is_dir():
            tables = SimpleNamespace(**{path.stem: pd.read_parquet(path) for path in sorted(source.glob("*.parquet"))})
            body = "\n\n".join(table_markdown(table) for table in show(tables))
        else:
            return match.group(0)
        updated.append(f"{kind}:{name}")
        return f"<!-- {kind}:{name}:begin -->\n{body}\n<!-- {kind}:{name}:end -->"

    doc.write_text(MARKER.sub(rewrite, doc.read_text()))
    return updated
