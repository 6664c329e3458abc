"""``fedroute monitor RUN_DIR``: a live terminal view of a run's routing, and its figure.

Reads what a run writes as it goes (``docs/telemetry.md``): ``rounds.csv``,
``alarms.jsonl`` and ``status.json``.  For every method it shows the
per-cluster mass bars, the rounds since each cluster was last routed, the
clients whose lowest-loss model each cluster is, the EXP3 arm mix, the routed
training loss (last value and a sparkline) and the alarms (active ones first).
On a terminal the view refreshes in place; piped, a new view is printed
whenever a round lands.  ``--plot FILE`` writes masses and routed loss over
rounds, with the alarms marked, as PNG/PDF.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from fedroute.monitoring.recorder import ALARMS_FILE, EVALUATION_FILE, STATUS_FILE
from fedroute.monitoring.telemetry import ROUNDS_FILE, read_table

__all__ = ["RunView", "load_run", "render", "run_monitor", "plot_run"]

_SPARK = "▁▂▃▄▅▆▇█"
_BAR_WIDTH = 20
_SPARK_ROUNDS = 40


@dataclass
class RunView:
    """What a run directory holds right now."""

    directory: Path
    status: dict[str, Any]
    rounds: Any
    """The per-round table (a DataFrame; empty before the first round)."""
    alarm_events: list[dict[str, Any]] = field(default_factory=list)

    @property
    def state(self) -> str:
        """``running``, ``finished``, ``failed``, or ``unknown`` (no ``status.json``: a strategy's own telemetry)."""
        if self.status:
            return str(self.status.get("state", "unknown"))
        return "finished" if (self.directory / "rounds.parquet").is_file() else "unknown"

    @property
    def finished(self) -> bool:
        """The run will not change any more."""
        return self.state in ("finished", "failed")

    @property
    def methods(self) -> list[str]:
        """Methods in plan order (``status.json``), then any others the tables hold."""
        planned = list(self.status.get("methods", []))
        seen = [] if self.rounds.empty else list(dict.fromkeys(self.rounds["method"]))
        return planned + [method for method in seen if method not in planned]

    def fingerprint(self) -> tuple:
        """Changes whenever a round lands, an alarm fires or the state changes."""
        return (len(self.rounds), len(self.alarm_events), self.state, self.status.get("current_method"))


def load_run(directory: str | Path) -> RunView:
    """Read a run directory (also while it is being written)."""
    import pandas as pd

    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"{directory} is not a run directory (expected results/<run-id>/)")
    status: dict[str, Any] = {}
    if (directory / STATUS_FILE).is_file():
        try:
            status = json.loads((directory / STATUS_FILE).read_text())
        except json.JSONDecodeError:  # being replaced: atomic renames make this rare
            status = {}
    rounds = read_table(directory / ROUNDS_FILE) if (directory / ROUNDS_FILE).is_file() else pd.DataFrame()
    events = []
    if (directory / ALARMS_FILE).is_file():
        for line in (directory / ALARMS_FILE).read_text().splitlines(keepends=True):
            if line.endswith("\n"):
                events.append(json.loads(line))
    return RunView(directory=directory, status=status, rounds=rounds, alarm_events=events)


# ------------------------------------------------------------------------------ pieces
def _bar(fraction: float, width: int = _BAR_WIDTH) -> str:
    fraction = min(max(fraction, 0.0), 1.0) if math.isfinite(fraction) else 0.0
    filled = int(round(fraction * width))
    return "█" * filled + "·" * (width - filled)


def _sparkline(values: list[float]) -> str:
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return ""
    low, high = min(finite), max(finite)
    span = high - low or 1.0
    return "".join(" " if not math.isfinite(v) else _SPARK[int((v - low) / span * (len(_SPARK) - 1))]
                   for v in values)


def _num_clusters(table: Any) -> int:
    """``K`` of a method's rows: its filled ``mass_<k>`` columns (a ``K = 1`` reference shares wider tables)."""
    return sum(1 for column in table.columns if column.startswith("mass_") and table[column].notna().any())


def _evaluation_line(directory: Path, method: str) -> Any:
    """``evaluation (round 10)  accuracy 0.752 (worst decile 0.682), ...`` from ``evaluation.csv``, or None."""
    from rich.text import Text

    from fedroute.core.evaluation import evaluation_line

    path = directory / EVALUATION_FILE
    if not path.is_file():
        return None
    import pandas as pd

    try:
        rows = pd.read_csv(path)
    except (ValueError, OSError):  # being appended
        return None
    rows = rows[rows["method"] == method]
    if rows.empty:
        return None
    last = rows[rows["server_round"] == rows["server_round"].max()]
    metrics = {(row.metric if row.scope == "mean" else f"{row.metric}_{row.scope}"): float(row.value)
               for row in last.itertuples()}
    line = Text(f"evaluation (round {int(last['server_round'].iloc[0])})  ", style="bold")
    line.append(evaluation_line(metrics))
    return line


def _active_alarms(events: list[dict[str, Any]]) -> dict[tuple, dict[str, Any]]:
    """(kind, clusters) → the raising event of every alarm not cleared (recovery events excluded)."""
    active: dict[tuple, dict[str, Any]] = {}
    for event in events:
        key = (event["kind"], tuple(event["clusters"]))
        if event["kind"] == "recovery":
            continue
        if event["event"] == "raised":
            active[key] = event
        else:
            active.pop(key, None)
    return active


def _method_panel(view: RunView, method: str) -> Any:
    from rich.console import Group
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text

    table = view.rounds[view.rounds["method"] == method] if not view.rounds.empty else view.rounds
    events = [event for event in view.alarm_events if event.get("method") == method]
    num_rounds = view.status.get("num_rounds")
    if table.empty:
        waiting = "waiting for its first round" if view.status.get("current_method") == method else "not started"
        return Panel(Text(waiting, style="dim"), title=f"[bold]{method}", title_align="left")
    table = table.drop_duplicates("server_round", keep="last").sort_values("server_round")
    last = table.iloc[-1]
    num_clusters = _num_clusters(table)
    server_round = int(last["server_round"])
    pace = float(table["seconds"].tail(10).mean())
    title = (f"[bold]{method}[/]  round {server_round}/{num_rounds or '?'}  ·  {pace:.2f} s/round  ·  "
             f"routed loss {float(last['routed_train_loss']):.4g}")
    clusters = Table(box=None, pad_edge=False, show_edge=False)
    for name, justify in (("cluster", "right"), ("mass", "left"), ("", "right"), ("routed", "right"),
                          ("last routed", "right"), ("preferred by", "right")):
        clusters.add_column(name, justify=justify, no_wrap=True)
    active = _active_alarms(events)
    starving = {key[1][0] for key in active if key[0] == "starvation"}
    for k in range(num_clusters):
        routed_rounds = table.loc[table[f"routed_{k}"] > 0, "server_round"]
        since = "never" if routed_rounds.empty else (
            "this round" if int(routed_rounds.iloc[-1]) == server_round
            else f"{server_round - int(routed_rounds.iloc[-1])} rounds ago")
        style = "red" if k in starving or routed_rounds.empty else "green"
        mass = float(last[f"mass_{k}"])
        preferred = int(last[f"preferred_{k}"]) if f"preferred_{k}" in last else 0
        clusters.add_row(str(k), Text(_bar(mass), style=style), f"{mass:.2f}", str(int(last[f"routed_{k}"])),
                         Text(since, style="red" if k in starving else ""), str(preferred))
    arms = [(column[4:], float(last[column])) for column in table.columns
            if column.startswith("arm_") and float(last[column]) > 0]
    arm_line = Text("EXP3 arms  ", style="bold")
    arm_line.append("   ".join(f"{name} {share:.0%} {_bar(share, 10)}" for name, share in arms) or "—")
    losses = [float(v) for v in table["routed_train_loss"].tail(_SPARK_ROUNDS)]
    loss_line = Text("routed loss  ", style="bold")
    loss_line.append(f"{_sparkline(losses)}  {losses[-1]:.4g}" if losses else "—")
    alarm_lines = []
    for event in active.values():
        alarm_lines.append(Text(f"⚠ {event['kind']} (since t={event['round_index']}): {event['message']}",
                                style="bold red" if event["level"] == "ERROR" else "yellow"))
    for event in events:
        if event["event"] == "cleared" or event["kind"] == "recovery":
            alarm_lines.append(Text(f"✓ t={event['round_index']}: {event['message']}", style="green"))
    if not alarm_lines:
        alarm_lines.append(Text("no alarm", style="green"))
    evaluation = _evaluation_line(view.directory, method)
    return Panel(Group(clusters, arm_line, loss_line, *([evaluation] if evaluation is not None else []),
                       Text("alarms", style="bold"), *alarm_lines), title=title, title_align="left")


def render(view: RunView, method: Optional[str] = None) -> Any:
    """The whole view (a rich renderable): a header line and one panel per method."""
    from rich.console import Group
    from rich.text import Text

    state = view.state
    style = {"running": "bold cyan", "finished": "bold green", "failed": "bold red"}.get(state, "bold")
    header = Text(f"fedroute monitor  {view.directory}  ", style="bold")
    header.append(state, style=style)
    current = view.status.get("current_method")
    methods = view.methods if method is None else [method]
    if state == "running" and current in methods:
        header.append(f"  ·  method {current} ({view.methods.index(current) + 1}/{len(view.methods)})")
    if view.status.get("error"):
        header.append(f"\n{view.status['error']}", style="red")
    if not methods:
        return Group(header, Text("no round yet", style="dim"))
    return Group(header, *[_method_panel(view, name) for name in methods])


# ------------------------------------------------------------------------------ the command
def run_monitor(
    directory: Path,
    refresh: float = 1.0,
    once: bool = False,
    until_finished: bool = False,
    method: Optional[str] = None,
    plot: Optional[Path] = None,
    timeout: Optional[float] = None,
    console: Any = None,
) -> int:
    """``fedroute monitor``: show the run, follow it, or plot it.

    Returns 0, or 1 if the run failed, 2 if the directory is not a run.
    A run that is already finished is shown once.  Otherwise the view follows
    the run until it finishes (``until_finished``), Ctrl-C, or ``timeout``.
    """
    from rich.console import Console
    from rich.live import Live

    console = console or Console()
    try:
        view = load_run(directory)
    except FileNotFoundError as error:
        console.print(f"fedroute monitor: {error}")
        return 2
    if method is not None and method not in view.methods:
        console.print(f"fedroute monitor: method {method!r} is not in this run; it has {view.methods}")
        return 2
    if plot is not None:
        for path in plot_run(view, plot, method):
            console.print(f"wrote {path}")
        return 1 if view.state == "failed" else 0
    if once or view.finished:
        console.print(render(view, method))
        return 1 if view.state == "failed" else 0
    deadline = math.inf if timeout is None else time.monotonic() + timeout

    def done(current: RunView) -> bool:
        return (until_finished and current.finished) or time.monotonic() > deadline

    try:
        if console.is_terminal:
            with Live(render(view, method), console=console, refresh_per_second=max(1.0, 1.0 / refresh),
                      transient=False) as live:
                while not done(view):
                    time.sleep(refresh)
                    view = load_run(directory)
                    live.update(render(view, method))
        else:
            shown = view.fingerprint()
            console.print(render(view, method))
            while not done(view):
                time.sleep(refresh)
                view = load_run(directory)
                if view.fingerprint() != shown:
                    shown = view.fingerprint()
                    console.print(render(view, method))
    except KeyboardInterrupt:
        pass
    return 1 if view.state == "failed" else 0


def plot_run(view: RunView, path: Path, method: Optional[str] = None) -> list[Path]:
    """Masses (top) and routed loss (bottom) over rounds, one column per method, alarms marked.

    ``path`` with suffix ``.png`` or ``.pdf`` writes that file; without a suffix both.
    """
    from fedroute.simulation.plotting import pyplot, save_figure

    methods = [name for name in (view.methods if method is None else [method])
               if not view.rounds.empty and (view.rounds["method"] == name).any()]
    if not methods:
        raise ValueError(f"{view.directory} holds no round to plot yet")
    plt = pyplot()
    fig, axes = plt.subplots(2, len(methods), figsize=(4.2 * len(methods), 5.6), sharex="col", squeeze=False)
    for column, name in enumerate(methods):
        table = view.rounds[view.rounds["method"] == name].drop_duplicates("server_round", keep="last")
        table = table.sort_values("round_index")
        masses, losses = axes[0, column], axes[1, column]
        for k in range(_num_clusters(table)):
            masses.plot(table["round_index"], table[f"mass_{k}"], label=f"cluster {k}", lw=1.5)
        losses.plot(table["round_index"], table["routed_train_loss"], color="black", lw=1.2)
        labels: dict[tuple[int, str], list[str]] = {}
        for event in (e for e in view.alarm_events if e.get("method") == name):
            color = "green" if event["event"] == "cleared" or event["kind"] == "recovery" else "red"
            labels.setdefault((int(event["round_index"]), color), []).append(
                event["kind"] if event["kind"] == "recovery" else f"{event['kind']} {event['event']}")
        for (round_index, color), texts in labels.items():
            for axis in (masses, losses):
                axis.axvline(round_index, color=color, ls="--" if color == "red" else ":", lw=0.9)
            masses.annotate(", ".join(texts), (round_index, 1.0), rotation=90, va="top",
                            ha="right" if color == "red" else "left", fontsize=6, color=color)
        masses.set_title(name)
        masses.set_ylim(-0.02, 1.02)
        masses.set_ylabel("routing mass μ_k")
        losses.set_ylabel("routed training loss")
        losses.set_xlabel("round t")
        masses.legend(fontsize=7, loc="center right")
    fig.suptitle(f"{view.directory.name}: masses and routed loss (red: alarm raised, green: cleared / recovery)",
                 fontsize=9)
    fig.tight_layout()
    path = Path(path)
    if path.suffix.lower() in (".png", ".pdf"):
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=150, **({"metadata": {"CreationDate": None}} if path.suffix.lower() == ".pdf" else {}))
        plt.close(fig)
        return [path]
    return save_figure(fig, path.parent, path.name)
