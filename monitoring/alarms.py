"""Collapse alarms: a pure state machine over the rounds of a run.

:class:`AlarmMonitor` is fed one training round at a time (the accepted
replies' pre-training losses and executed routes, and the reasons of the
rejected ones) and returns the alarm events of that round: one ``WARNING``
when an alarm is raised, one ``INFO`` when it clears.  Every alarm it ever
raised stays in :attr:`AlarmMonitor.alarms` (written to ``summary.json``).

========================  ==============================================================
kind                      raised when … / cleared when …
========================  ==============================================================
``collapsed-entrance``    at the first round with replies: some clusters are nobody's
                          Greedy choice at ``W^0`` (the message adds whether ``W^0`` lies
                          in the certified starvation basin, where the task can tell) /
                          each of them is some client's lowest-loss model again
``starvation``            a cluster has had no client for ``S`` rounds / it is routed again
``duplication``           two clusters are equally good for every client (losses within
                          a relative tolerance) / some client tells them apart again (an
                          ``INFO`` when clients break ties at random: identical copies
                          of a warm start split their clients and separate as they train)
``spare``                 (``INFO``) the server found a cluster not needed — no client's
                          best model while every other cluster serves one group, or
                          through its exploration budget, or a duplicate merged into
                          its twin (:mod:`fedroute.core.health`) / it is needed again;
                          a spare cluster raises no starvation warning
``recovery``              (an ``INFO`` event) after collapsed entrance or starvation, every
                          cluster they named has been routed again and none is active
``dead-federation``       (``ERROR``) no valid reply for ``N`` rounds in a row, or in any
                          round of a run shorter than that (:meth:`AlarmMonitor.unanswered_run`):
                          the run must stop (:class:`DeadFederation`)
========================  ==============================================================

:func:`missing_handler_advice` recognises Flower's error replies of a ClientApp
that lacks a handler and names the fedroute call to register; the messages of a
dead federation, of a final evaluation without a valid reply
(:func:`evaluation_failure`) and of synchronized entry without a valid report
(:func:`query_failure`) include it.

Rounds are the paper's ``t = server_round - 1``.  Nothing here logs or
writes: see :func:`log_events` and :mod:`fedroute.monitoring.recorder`.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any, Mapping, Optional, Sequence

import numpy as np
from numpy.typing import NDArray

from fedroute.core.controllers import GREEDY as GREEDY_CONTROLLER
from fedroute.core.methods import EXP3, SYNC_ENTRY
from fedroute.core.validation import invalid

__all__ = [
    "AlarmSettings", "Alarm", "AlarmEvent", "AlarmMonitor", "DeadFederation", "log_events", "starvation_basin",
    "task_starvation_basin", "missing_handler_advice", "evaluation_failure", "query_failure",
    "COLLAPSED_ENTRANCE", "STARVATION", "DUPLICATION", "RECOVERY", "DEAD_FEDERATION", "SPARE",
]

COLLAPSED_ENTRANCE = "collapsed-entrance"
STARVATION = "starvation"
DUPLICATION = "duplication"
RECOVERY = "recovery"
DEAD_FEDERATION = "dead-federation"
SPARE = "spare"
_COLLAPSE_KINDS = (COLLAPSED_ENTRANCE, STARVATION)
_MAX_REASONS = 3


class DeadFederation(RuntimeError):
    """No valid reply arrived where the run needs one; the message names the first reasons and the fix.

    Raised by ``ClusteredRouting.start`` after ``dead_rounds`` training rounds in a row without a valid
    reply, at the end of a shorter run none of whose rounds had one, when the final evaluation brought no
    valid reply, and when synchronized entry's query brought no valid report.
    """


_HANDLERS = {"train": "routing_train", "evaluate": "routing_evaluate", "query": "routing_query"}
_MISSING_HANDLER = re.compile(r"No (train|evaluate|query) function registered")
_CHECKS = ("Check that the ClientApp starts on the nodes (SuperNode logs, `flwr log`), that it replies with "
           "fedroute's reply schema (docs/plugin.md), and that round-timeout is long enough")


def missing_handler_advice(reasons: Iterable[str]) -> str:
    """What to register when rejected replies are Flower's errors for a ClientApp without a handler.

    Flower 1.42's ``ClientApp`` answers a message type it has no function for with
    ``ValueError: No <type> function registered with name 'default'`` (an error
    reply).  Returns ``""`` when no reason says so.

    >>> advice = missing_handler_advice(["... Message: No query function registered with name 'default'"])
    >>> advice[:46], "fedroute.routing_query(" in advice
    ('The ClientApp has no @app.query() handler (Flo', True)
    """
    missing = sorted({match.group(1) for reason in reasons if (match := _MISSING_HANDLER.search(str(reason)))})
    return " ".join(f"The ClientApp has no @app.{kind}() handler (Flower: 'No {kind} function registered'): "
                    f"register one that returns fedroute.{_HANDLERS[kind]}(msg, context, model, "
                    f"{'train_fn, ' if kind == 'train' else ''}loss_fn, num_examples) (docs/plugin.md)."
                    for kind in missing)


def _reasons_text(counts: Mapping[str, int], nothing: str) -> str:
    """``reason (n replies); ...`` of the first distinct reasons, or ``nothing`` when there are none."""
    return "; ".join(f"{reason} ({count} {'replies' if count > 1 else 'reply'})"
                     for reason, count in list(counts.items())[:_MAX_REASONS]) or nothing


def _failure(what: str, reasons: Mapping[str, int], nothing: str, then: str) -> str:
    """A no-valid-reply error: what failed, its first reasons (reason → count), the missing handler if that is
    why, else what to check."""
    return f"{what}. Reasons: {_reasons_text(reasons, nothing)}. {missing_handler_advice(reasons) or then}"


def evaluation_failure(num_asked: int, reasons: Sequence[str]) -> str:
    """The error of a final evaluation none of whose ``num_asked`` replies was valid (``reasons``: the rejections)."""
    return _failure(f"final evaluation: none of the {num_asked} nodes asked sent a valid reply, so the run has no "
                    "result (its trained models are in strategy.cluster_models, its rounds in strategy.history)",
                    Counter(map(str, reasons)), "no reply arrived (every node timed out)",
                    "Check that the ClientApp's @app.evaluate() handler returns fedroute.routing_evaluate(...) and "
                    "works on the final models, and that round-timeout is long enough")


def query_failure(reasons: Sequence[str]) -> str:
    """The error of synchronized entry's provisional query without a valid report (``reasons``: the rejections)."""
    return _failure("synchronized entry: no valid provisional report arrived", Counter(map(str, reasons)),
                    "no reply arrived (every node timed out)", _CHECKS)


@dataclass(frozen=True)
class AlarmSettings:
    """When the alarms fire.

    Parameters
    ----------
    starvation_rounds : int, default 10
        ``S``: a cluster unrouted for this many rounds in a row is starving (≥ 1).
    duplication_tolerance : float, default 1e-3
        Two clusters are duplicates when, for every client,
        ``|ℓ_ij - ℓ_ik| ≤ tolerance · max(|ℓ_ij|, |ℓ_ik|)`` (in ``[0, 1)``; 0 = exact ties only).
    dead_rounds : int, default 3
        ``N``: rounds in a row without a valid reply before the run stops (≥ 1).
    """

    starvation_rounds: int = 10
    duplication_tolerance: float = 1e-3
    dead_rounds: int = 3

    def __post_init__(self) -> None:
        for name in ("starvation_rounds", "dead_rounds"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise invalid(name, value, "an integer ≥ 1")
        tolerance = self.duplication_tolerance
        if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or not 0 <= tolerance < 1:
            raise invalid("duplication_tolerance", tolerance, "a number in [0, 1)")


@dataclass
class Alarm:
    """One alarm of a run (a JSON-ready record in ``summary.json`` under ``alarms``).

    Attributes
    ----------
    kind : str
        ``collapsed-entrance``, ``starvation``, ``duplication``, ``recovery`` or ``dead-federation``.
    level : str
        ``warning``, ``info`` (recovery) or ``error`` (dead federation).
    clusters : list of int
        The clusters it is about (empty for a dead federation).
    raised_round : int
        Round ``t`` at which it was raised.
    message : str
        What happened and what to do.
    cleared_round : int or None
        Round at which it cleared (``None``: still active at the end, or an event).
    cleared_message : str or None
        The message logged when it cleared.
    """

    kind: str
    level: str
    clusters: list[int]
    raised_round: int
    message: str
    cleared_round: Optional[int] = None
    cleared_message: Optional[str] = None

    @property
    def active(self) -> bool:
        """Raised and not cleared (events — recovery — are never active)."""
        return self.kind != RECOVERY and self.cleared_round is None

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return asdict(self)


@dataclass(frozen=True)
class AlarmEvent:
    """An alarm raised or cleared in one round (what is logged, appended to ``alarms.jsonl``, sent to TensorBoard)."""

    kind: str
    event: str
    """``raised`` or ``cleared``."""
    level: int
    """The logging level: ``WARNING`` raised, ``INFO`` cleared or recovery, ``ERROR`` dead federation."""
    round_index: int
    clusters: tuple[int, ...]
    message: str

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (``level`` as its name)."""
        return {"kind": self.kind, "event": self.event, "level": logging.getLevelName(self.level),
                "round_index": self.round_index, "clusters": list(self.clusters), "message": self.message}


def _names(clusters: Sequence[int]) -> str:
    clusters = list(clusters)
    if len(clusters) == 1:
        return f"cluster {clusters[0]}"
    return "clusters " + ", ".join(str(k) for k in clusters[:-1]) + f" and {clusters[-1]}"


def _rounds(first: int, last: int) -> str:
    return f"t={first}" if first == last else f"t={first}…{last}"


_GREEDY_ADVICE = (f"Greedy routing (IFCA) cannot revive it: use EXP3 routing (method {EXP3}) or synchronized entry "
                  f"(method {SYNC_ENTRY}), or start the cluster models further apart")
_CONTROL_ADVICE = ("This method's routing control ({controllers}) may revive it, and a recovery message follows if "
                   "it does; if it stays starved, let clients explore more (exp3-exploration, "
                   "reversal-mass-threshold, entry-threshold) or start the cluster models further apart")


@dataclass
class _State:
    """The monitor's mutable state (everything a resumed run must get back)."""

    entrance_checked: bool = False
    unrouted: list[int] = field(default_factory=list)
    silent_rounds: int = 0
    silent_since: int = -1
    silent_reasons: dict[str, int] = field(default_factory=dict)
    awaiting: list[int] = field(default_factory=list)
    revived: list[int] = field(default_factory=list)
    duplicates: list[list[int]] = field(default_factory=list)


class AlarmMonitor:
    """The alarm state machine of one run (one method).

    Parameters
    ----------
    num_clusters : int
        ``K``.
    settings : AlarmSettings
        Thresholds.
    starvation_basin : bool, optional
        Whether ``W^0`` lies in the certified starvation basin (known only on
        the two-group linear task, :func:`starvation_basin`); named in the
        collapsed-entrance message (the alarm itself comes from the clients' own losses: the basin is a
        statement about population losses, which a small sample of clients may contradict).
    controllers : sequence of str, default ("gr",)
        The method's controllers: the advice of a collapse alarm depends on
        whether routing is Greedy only.
    random_ties : bool, default False
        Whether clients break exact ties at random (the generic default): identical
        copies are then a warm start that splits its clients, not a collapse.
    """

    def __init__(self, num_clusters: int, settings: AlarmSettings = AlarmSettings(),
                 starvation_basin: Optional[bool] = None, controllers: Sequence[str] = (GREEDY_CONTROLLER,),
                 random_ties: bool = False) -> None:
        self.num_clusters = int(num_clusters)
        self.settings = settings
        self.random_ties = bool(random_ties)
        self.starvation_basin = starvation_basin
        self._advice = _GREEDY_ADVICE if tuple(controllers) == (GREEDY_CONTROLLER,) else \
            _CONTROL_ADVICE.format(controllers=",".join(controllers))
        self.alarms: list[Alarm] = []
        self._state = _State(unrouted=[0] * self.num_clusters)

    # ------------------------------------------------------------------ queries
    @property
    def active(self) -> list[Alarm]:
        """Alarms raised and not cleared."""
        return [alarm for alarm in self.alarms if alarm.active]

    @property
    def dead(self) -> Optional[Alarm]:
        """The active dead-federation alarm, if any."""
        return next((alarm for alarm in self.active if alarm.kind == DEAD_FEDERATION), None)

    @property
    def rounds_unrouted(self) -> list[int]:
        """Rounds in a row each cluster has had no client (0 = routed in the last round)."""
        return list(self._state.unrouted)

    # ------------------------------------------------------------------ one round
    def observe(
        self,
        round_index: int,
        losses: NDArray[np.float64],
        routes: NDArray[np.int64],
        rejected_reasons: Sequence[str] = (),
        preferred: Optional[NDArray[np.int64]] = None,
        masses: Optional[NDArray[np.float64]] = None,
        spare: Optional[NDArray[np.bool_]] = None,
    ) -> list[AlarmEvent]:
        """Update the alarms with round ``t``; return the events it raised and cleared.

        Parameters
        ----------
        round_index : int
            ``t``.
        losses : ndarray, shape (n, K)
            The accepted replies' losses of every cluster model before training.
        routes : ndarray of int, shape (n,)
            Their executed hard routes.
        rejected_reasons : sequence of str
            Why this round's other replies were rejected (named by a dead-federation alarm).
        preferred : ndarray of int, shape (n,), optional
            The clients' Greedy choices (their ties broken as they break them); the lowest loss by default.
        masses : ndarray, shape (K,), optional
            The federation estimate ``μ̂`` (every client's latest route): a cluster starves when nobody's latest
            route is it, whichever clients were sampled; the round's own routes by default.
        spare : ndarray of bool, shape (K,), optional
            The server's spare clusters (:mod:`fedroute.core.health`).
        """
        losses = np.asarray(losses, dtype=np.float64).reshape(-1, self.num_clusters)
        routes = np.asarray(routes, dtype=np.int64).reshape(-1)
        events: list[AlarmEvent] = []
        if len(routes) == 0:
            return self._silent_round(round_index, rejected_reasons)
        events += self._replies_returned(round_index)
        routed = np.bincount(routes, minlength=self.num_clusters)
        if masses is not None:
            routed = np.where(np.asarray(masses) > 0, np.maximum(routed, 1), 0)
        choices = np.argmin(losses, axis=1) if preferred is None else np.asarray(preferred, dtype=np.int64)
        chosen = set(choices.tolist())
        if not self._state.entrance_checked:
            self._state.entrance_checked = True
            tied_for_all = np.all(losses == losses.min(axis=1, keepdims=True), axis=0)
            events += self._check_entrance(round_index, chosen, tied_for_all)
        spare_now = np.zeros(self.num_clusters, dtype=bool) if spare is None else np.asarray(spare, dtype=bool)
        events += self._clear_entrance(round_index, chosen, spare_now)
        events += self._check_spares(round_index, spare_now)
        events += self._check_starvation(round_index, routed, spare_now)
        events += self._check_duplication(round_index, losses)
        events += self._check_recovery(round_index, routed, spare_now)
        return events

    def _check_spares(self, round_index: int, spare: NDArray[np.bool_]) -> list[AlarmEvent]:
        """An INFO when the server declares a cluster spare (and when it is needed again)."""
        events = []
        current = {alarm.clusters[0]: alarm for alarm in self._active(SPARE)}
        for k in range(self.num_clusters):
            if spare[k] and k not in current:
                message = (f"spare: cluster {k} is not needed at round t={round_index} (no client's best model "
                           "while every other cluster serves one group of clients, or through its exploration "
                           "budget, or a duplicate of another cluster merged into it); it no longer triggers "
                           "exploration and raises no starvation warning, and is reconsidered when it is some "
                           "client's best model again, when two groups show up on one cluster, or when clients join")
                events.append(self._raise(round_index, SPARE, [k], message, logging.INFO))
            elif not spare[k] and k in current:
                events.append(self._clear(current[k], round_index, f"cluster {k} is needed again at round "
                                          f"t={round_index} (no longer spare)"))
        return events

    def _raise(self, round_index: int, kind: str, clusters: Sequence[int], message: str,
               level: int = logging.WARNING) -> AlarmEvent:
        name = {logging.WARNING: "warning", logging.INFO: "info", logging.ERROR: "error"}[level]
        self.alarms.append(Alarm(kind=kind, level=name, clusters=[int(k) for k in clusters],
                                 raised_round=int(round_index), message=message))
        if kind in _COLLAPSE_KINDS:
            self._state.awaiting = sorted(set(self._state.awaiting) | set(int(k) for k in clusters))
        return AlarmEvent(kind, "raised", level, int(round_index), tuple(int(k) for k in clusters), message)

    @staticmethod
    def _clear(alarm: Alarm, round_index: int, message: str) -> AlarmEvent:
        alarm.cleared_round, alarm.cleared_message = int(round_index), message
        return AlarmEvent(alarm.kind, "cleared", logging.INFO, int(round_index), tuple(alarm.clusters), message)

    def _active(self, kind: str) -> list[Alarm]:
        return [alarm for alarm in self.active if alarm.kind == kind]

    def _silent_round(self, round_index: int, reasons: Sequence[str]) -> list[AlarmEvent]:
        state = self._state
        if state.silent_rounds == 0:
            state.silent_since, state.silent_reasons = int(round_index), {}
        state.silent_rounds += 1
        for reason in map(str, reasons):
            if reason in state.silent_reasons or len(state.silent_reasons) < _MAX_REASONS:
                state.silent_reasons[reason] = state.silent_reasons.get(reason, 0) + 1
        if state.silent_rounds != self.settings.dead_rounds or self.dead is not None:
            return []
        return [self._dead(round_index, f"{state.silent_rounds} rounds in a row")]

    def unanswered_run(self, num_rounds: int) -> Optional[AlarmEvent]:
        """At the end of training: raise the dead-federation alarm if none of the run's ``num_rounds``
        rounds had a valid reply and the alarm has not stopped it already (a run shorter than ``N`` rounds).

        Returns the event (``None`` if some round had a valid reply); the caller logs it and stops the run
        with :class:`DeadFederation` rather than evaluating the untrained initial models.
        """
        state = self._state
        if num_rounds < 1 or state.silent_rounds < num_rounds or self.dead is not None:
            return None
        return self._dead(state.silent_since + state.silent_rounds - 1, f"any of the run's {num_rounds} rounds")

    def _dead(self, round_index: int, rounds_text: str) -> AlarmEvent:
        """Raise the dead-federation alarm at round ``t``: no valid reply in ``rounds_text``."""
        state = self._state
        message = _failure(f"dead federation: no valid training reply in {rounds_text} "
                           f"({_rounds(state.silent_since, round_index)}); the run stops", state.silent_reasons,
                           "no reply arrived (every node timed out)", _CHECKS)
        return self._raise(round_index, DEAD_FEDERATION, [], message, logging.ERROR)

    def _replies_returned(self, round_index: int) -> list[AlarmEvent]:
        self._state.silent_rounds = 0
        return [self._clear(alarm, round_index, f"dead federation cleared at round t={round_index}: valid "
                            "replies arrived again") for alarm in self._active(DEAD_FEDERATION)]

    def _check_entrance(self, round_index: int, preferred: set[int],
                        tied_for_all: NDArray[np.bool_]) -> list[AlarmEvent]:
        unattractive = [k for k in range(self.num_clusters) if k not in preferred]
        if not unattractive:
            return []
        chosen = sorted(preferred)
        if all(tied_for_all[k] for k in unattractive):
            if self.random_ties:
                # Identical copies under random ties: which copy no client drew this round is chance (likely with
                # few clients a round), not a collapse; the duplication INFO already says they are copies.
                return []
            # Identical copies: every client's losses tie, and the lowest index wins argmin.
            tied = [k for k in range(self.num_clusters) if tied_for_all[k]]
            preference = (f"every client's losses tie exactly between {_names(tied)} — identical copies? Routing "
                          "with random tie-breaking (the generic default) splits the clients among them; with "
                          "lowest-index ties (the paper presets) the higher-index copies stay unused")
        else:
            preference = (f"every client prefers cluster {chosen[0]}" if len(chosen) == 1
                          else "clients prefer only " + _names(chosen))
        basin = ""
        if self.starvation_basin is True:
            basin = ("; W^0 lies in the certified starvation basin of the two-group linear task, so Greedy "
                     "routing provably never trains it")
        elif self.starvation_basin is False:
            basin = "; W^0 lies outside the certified starvation basin, so Greedy routing may still recover"
        message = (f"collapsed entrance at round t={round_index}: {_names(unattractive)} "
                   f"{'is' if len(unattractive) == 1 else 'are'} no client's lowest-loss model at W^0 "
                   f"({preference}){basin}. {self._advice}")
        return [self._raise(round_index, COLLAPSED_ENTRANCE, unattractive, message)]

    def _clear_entrance(self, round_index: int, preferred: set[int],
                        spare: Optional[NDArray[np.bool_]] = None) -> list[AlarmEvent]:
        settled = preferred | ({int(k) for k in np.flatnonzero(spare)} if spare is not None else set())
        return [self._clear(alarm, round_index, f"collapsed entrance cleared at round t={round_index}: "
                            f"{_names(alarm.clusters)} {'is' if len(alarm.clusters) == 1 else 'are'} again some "
                            "client's lowest-loss model" + ("" if set(alarm.clusters) <= preferred
                                                           else " or spare (not needed)"))
                for alarm in self._active(COLLAPSED_ENTRANCE) if set(alarm.clusters) <= settled]

    def _check_starvation(self, round_index: int, routed: NDArray[np.int64],
                          spare: NDArray[np.bool_]) -> list[AlarmEvent]:
        events = []
        state, limit = self._state, self.settings.starvation_rounds
        starving = {alarm.clusters[0]: alarm for alarm in self._active(STARVATION)}
        for k in range(self.num_clusters):
            if spare[k]:
                state.unrouted[k] = 0 if routed[k] > 0 else state.unrouted[k] + 1
                if k in starving:
                    events.append(self._clear(starving[k], round_index, f"starvation of cluster {k} cleared at "
                                              f"round t={round_index}: it is spare (not needed)"))
                continue
            if routed[k] > 0:
                state.unrouted[k] = 0
                if k in starving:
                    events.append(self._clear(starving[k], round_index, f"starvation of cluster {k} cleared at "
                                              f"round t={round_index}: {int(routed[k])} clients routed to it"))
                continue
            state.unrouted[k] += 1
            if state.unrouted[k] >= limit and k not in starving:
                message = (f"starvation: cluster {k} has had no client for {state.unrouted[k]} rounds "
                           f"({_rounds(round_index - state.unrouted[k] + 1, round_index)}), so its model is not "
                           f"trained. {self._advice}")
                events.append(self._raise(round_index, STARVATION, [k], message))
        return events

    def _check_duplication(self, round_index: int, losses: NDArray[np.float64]) -> list[AlarmEvent]:
        tolerance = self.settings.duplication_tolerance
        scale = np.maximum(np.abs(losses[:, :, None]), np.abs(losses[:, None, :]))
        equal = np.all(np.abs(losses[:, :, None] - losses[:, None, :]) <= tolerance * scale, axis=0)
        pairs = [[j, k] for j in range(self.num_clusters) for k in range(j + 1, self.num_clusters) if equal[j, k]]
        events = []
        for alarm in self._active(DUPLICATION):
            if alarm.clusters not in pairs:
                events.append(self._clear(alarm, round_index, f"duplication of {_names(alarm.clusters)} cleared "
                                          f"at round t={round_index}: some client now tells them apart"))
        current = [alarm.clusters for alarm in self._active(DUPLICATION)]
        for pair in pairs:
            if pair in current:
                continue
            if self.random_ties:
                message = (f"duplication at round t={round_index}: {_names(pair)} are equally good for every "
                           f"client (losses within {tolerance:.3g} relative): identical copies, e.g. a warm start. "
                           "Clients break the ties at random, so the copies train on different clients and "
                           "separate; this clears when some client tells them apart")
                events.append(self._raise(round_index, DUPLICATION, pair, message, logging.INFO))
            else:
                message = (f"duplication at round t={round_index}: {_names(pair)} are equally good for every "
                           f"client (losses within {tolerance:.3g} relative), and ties go to the lowest index, so "
                           "the higher-index copy gets no client. Use random tie-breaking (tie-breaking = random, "
                           "the generic default), start them from different models, or use fewer clusters")
                events.append(self._raise(round_index, DUPLICATION, pair, message))
        self._state.duplicates = pairs
        return events

    def _check_recovery(self, round_index: int, routed: NDArray[np.int64],
                        spare: Optional[NDArray[np.bool_]] = None) -> list[AlarmEvent]:
        state = self._state
        if not state.awaiting:
            return []
        settled = {k for k in state.awaiting if routed[k] > 0 or (spare is not None and spare[k])}
        state.revived = sorted(set(state.revived) | settled)
        if any(alarm.kind in _COLLAPSE_KINDS for alarm in self.active) or set(state.awaiting) - set(state.revived):
            return []
        clusters = list(range(self.num_clusters))
        message = (f"recovery at round t={round_index}: every cluster starved before ({_names(state.awaiting)}) "
                   f"is routed again (or found spare) and is some client's lowest-loss model; clients per cluster now: "
                   f"{', '.join(str(int(count)) for count in routed)}")
        state.awaiting, state.revived = [], []
        self.alarms.append(Alarm(kind=RECOVERY, level="info", clusters=clusters, raised_round=int(round_index),
                                 message=message))
        return [AlarmEvent(RECOVERY, "raised", logging.INFO, int(round_index), tuple(clusters), message)]

    # ------------------------------------------------------------------ persistence
    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue after a restart (JSON-ready)."""
        return {"alarms": [alarm.to_dict() for alarm in self.alarms], "state": asdict(self._state)}

    def load_state_dict(self, stored: Mapping[str, Any]) -> None:
        """Inverse of :meth:`state_dict`."""
        self.alarms = [Alarm(**alarm) for alarm in stored["alarms"]]
        self._state = _State(**stored["state"])


def log_events(logger: logging.Logger, label: str, events: Sequence[AlarmEvent]) -> None:
    """Log each event at its level, prefixed with the run's label (e.g. the method)."""
    for event in events:
        logger.log(event.level, "[%s] %s", label, event.message)


def starvation_basin(initial_models: NDArray[np.floating], group_parameters: Optional[NDArray[np.floating]],
                     group_proportions: Optional[NDArray[np.floating]]) -> Optional[bool]:
    """Whether ``W^0`` lies in the certified starvation basin (two groups, ``K = 2``), else ``None``.

    The basin (``docs/telemetry.md``) is certified for the two-group linear task
    with ``L_g(w) = ½‖w - θ_g‖²``; a task without group parameters, or with
    other numbers of groups or clusters, cannot be checked.
    """
    if group_parameters is None or group_proportions is None:
        return None
    models = np.asarray(initial_models, dtype=np.float64)
    theta = np.asarray(group_parameters, dtype=np.float64)
    if models.ndim != 2 or models.shape[0] != 2 or theta.shape != (2, models.shape[1]):
        return None
    from fedroute.core.metrics import certified_starvation_basin

    return bool(certified_starvation_basin(models, theta, float(np.asarray(group_proportions)[0])))


def task_starvation_basin(task: Any, num_clusters: int) -> Optional[bool]:
    """:func:`starvation_basin` of a task's initial models, from its ``group_parameters`` and
    ``group_proportions`` if it has them (the linear task), else ``None``."""
    return starvation_basin(task.initial_models(num_clusters), getattr(task, "group_parameters", None),
                            getattr(task, "group_proportions", None))
