"""Progress lines: a round counter with the method and an ETA."""

from __future__ import annotations

import logging
import math
import sys
import time
from typing import Callable, Optional, Sequence

__all__ = ["RoundProgress", "format_duration", "progress_line", "ensure_console_handler"]

LOG_FORMAT = "%(levelname)s fedroute: %(message)s"


def ensure_console_handler(logger: logging.Logger) -> None:
    """Make ``logger``'s INFO lines (progress, cleared alarms) visible unless logging is configured already.

    Adds a stderr handler at INFO when neither ``logger`` nor the root logger
    has a handler (a plain script, a Flower ServerApp process); a user who
    configured logging keeps their setup.  Silence fedroute with
    ``logging.getLogger("fedroute").setLevel(logging.WARNING)``.
    """
    if logger.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    logger.addHandler(handler)
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.INFO)


def format_duration(seconds: float) -> str:
    """``42 s``, ``3 min 05 s``, ``1 h 02 min``; ``?`` when unknown."""
    if not math.isfinite(seconds) or seconds < 0:
        return "?"
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {(seconds % 3600) // 60:02d} min"


def progress_line(label: str, server_round: int, num_rounds: int, seconds_per_round: float,
                  masses: Optional[Sequence[float]] = None, routed_loss: Optional[float] = None) -> str:
    """``[exp3] round 12/100 · 0.45 s/round · ETA 40 s · masses 0.55 0.45 · routed loss 0.612``.

    A NaN ``seconds_per_round`` (only the first round, with its start-up, has run) prints no ETA.
    """
    parts = [f"[{label}] round {server_round}/{num_rounds}"]
    if math.isfinite(seconds_per_round):
        parts += [f"{seconds_per_round:.2f} s/round",
                  f"ETA {format_duration((num_rounds - server_round) * seconds_per_round)}"]
    elif server_round < num_rounds:
        parts.append("ETA after the next round")
    if masses is not None:
        parts.append("masses " + " ".join(f"{m:.2f}" for m in masses))
    if routed_loss is not None and math.isfinite(routed_loss):
        parts.append(f"routed loss {routed_loss:.4g}")
    return " · ".join(parts)


class RoundProgress:
    """Measures the pace of a run and decides when a progress line is due.

    A line is due at the first and last round and whenever ``interval``
    seconds have passed since the previous one, so fast runs do not flood the
    log and slow ones (deployment: seconds per round) show every round.  The
    pace leaves out the first round (Ray or node start-up) once later rounds exist.

    Parameters
    ----------
    num_rounds : int
        Rounds the run will have.
    first_round : int
        The first round this process runs (``> 1`` after a resume).
    interval : float
        Minimum seconds between two lines (0: every round).
    clock : callable
        Monotonic clock (tests pass a fake one).
    """

    def __init__(self, num_rounds: int, first_round: int = 1, interval: float = 5.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.num_rounds = int(num_rounds)
        self.first_round = int(first_round)
        self.interval = float(interval)
        self._clock = clock
        self._started = clock()
        self._first_done: Optional[float] = None
        self._last_done: Optional[float] = None
        self._rounds_done = 0
        self._last_line: Optional[float] = None

    def round_done(self, server_round: int) -> bool:
        """Note that ``server_round`` ended; return whether a progress line is due now."""
        now = self._clock()
        self._rounds_done += 1
        self._first_done = now if self._first_done is None else self._first_done
        self._last_done = now
        due = (self._last_line is None or server_round >= self.num_rounds
               or now - self._last_line >= self.interval)
        if due:
            self._last_line = now
        return due

    @property
    def seconds_per_round(self) -> float:
        """Mean wall time per round after the first one (NaN until a second round has run: the first
        includes start-up, e.g. Ray's, and would make a wild ETA)."""
        if self._first_done is None or self._last_done is None or self._rounds_done <= 1:
            return math.nan
        return (self._last_done - self._first_done) / (self._rounds_done - 1)
