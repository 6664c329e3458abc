"""The per-client agent step (docs/algorithm.md, rules §2–§6), vectorised over clients.

One call of :func:`agent_step` is one round ``t`` for a batch of clients:
controller (arm) choice → entry test → route distribution → hard route →
state update (EXP3 feedback, episode counters).  The Flower ClientApp calls it
with a batch of one client, the batched simulator with all clients at once.

:func:`agent_step` composes one pure function per phase, each mapping explicit
state and arrays to new ones: :func:`greedy_choices`, :func:`exploring_clients`
(exploration on evidence), :func:`in_exploitation_phase` /
:func:`exploitation_greedy`, then :func:`choose_arms` (1), :func:`entry_test` (2),
:func:`episode_releases` (3), :func:`executed_controllers` /
:func:`route_distributions` (4), the ``ROUTE`` draw and :func:`exp3_feedback_step` (5–6).

Timing conventions (``docs/algorithm.md``):

* Block mode: blocks run on the client's own clock ``τ`` (the rounds it has
  played before this one; ``τ = t`` when it plays every round): arms are drawn
  at ``τ ≡ 0 (mod B)`` and updated after ``τ ≡ B-1 (mod B)``, so a client
  sampled in a quarter of the rounds still learns from blocks of ``B`` rounds
  of its own.  A client in a forced episode draws no arm.  With synchronized
  entry (round 0 is the entry round) the first block starts at ``τ = 1`` (it is
  one round shorter).
* Action mode: a client with no action in force draws an arm; Greedy, Rank
  Hedge, Reversal and Commitment actions last one round; a hysteresis action
  lasts until its episode is released (release round included), or one round
  if its entry test finds no qualifying candidate.
* A client with no arm in force (before its first draw after a forced
  episode) acts greedily and gives no EXP3 feedback.
* Exploitation phase (``exploitation_fraction > 0``): from round
  ``settings.exploitation_start(T)`` every client executes Greedy, draws no
  arm, makes no EXP3 update (a block or action in progress is dropped) and
  leaves any episode; with ``exploitation_consolidates`` its Greedy choice
  skips the clusters that were underused in the previous round.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Callable, Optional

import numpy as np
from numpy.typing import NDArray

from fedroute.core import controllers as ctl
from fedroute.core.entry import entry_candidates, entry_decision, underused_clusters
from fedroute.core.exp3 import arm_probabilities, expected_route_loss, importance_weighted_update
from fedroute.core.health import RoutingView
from fedroute.core.randomness import Purpose, categorical, uniform
from fedroute.core.settings import RoutingSettings

__all__ = ["AgentState", "RoundDecision", "BenefitFunction", "agent_step", "CONTROLLER_INDEX"]

CONTROLLER_INDEX = {name: index for index, name in enumerate(ctl.CONTROLLER_IDS)}
"""Controller id → integer code used in decisions and replies."""

BenefitFunction = Callable[[NDArray[np.bool_], NDArray[np.int64]], NDArray[np.float64]]
"""``benefit_fn(candidate_mask (n, K), greedy_routes (n,)) -> benefits (n, K)``
(see :func:`fedroute.core.entry.entry_benefits`)."""


@dataclass(frozen=True)
class AgentState:
    """Controller state of a batch of clients (leading axis = clients).

    Attributes
    ----------
    exp3_log_weights : ndarray, shape (n, A)
        EXP3 log-weights ``v``.
    arm : ndarray of int, shape (n,)
        Arm in force (index into ``settings.controllers``), ``-1`` for none.
    arm_probability : ndarray, shape (n,)
        ``p(R)`` when the arm in force was drawn.
    feedback_sum : ndarray, shape (n,)
        Sum of per-round feedback since the arm was drawn.
    feedback_rounds : ndarray of int, shape (n,)
        Rounds summed in ``feedback_sum``.
    hysteresis_target : ndarray of int, shape (n,)
        Episode target ``c``, ``-1`` outside an episode.
    hysteresis_count : ndarray of int, shape (n,)
        Completed target updates ``d`` of the episode.
    forced_episode : ndarray of bool, shape (n,)
        The episode came from synchronized entry (no EXP3 updates during it).
    previous_route : ndarray of int, shape (n,)
        Last executed hard route, ``-1`` before the first round.
    rounds_played : ndarray of int, shape (n,)
        Rounds this client has taken part in.
    """

    exp3_log_weights: NDArray[np.float64]
    arm: NDArray[np.int64]
    arm_probability: NDArray[np.float64]
    feedback_sum: NDArray[np.float64]
    feedback_rounds: NDArray[np.int64]
    hysteresis_target: NDArray[np.int64]
    hysteresis_count: NDArray[np.int64]
    forced_episode: NDArray[np.bool_]
    previous_route: NDArray[np.int64]
    rounds_played: NDArray[np.int64]

    @classmethod
    def initial(cls, num_clients: int, settings: RoutingSettings) -> "AgentState":
        """Fresh state: zero log-weights, no arm, no episode, no previous route."""
        minus_one = np.full(num_clients, -1, dtype=np.int64)
        zeros_int = np.zeros(num_clients, dtype=np.int64)
        return cls(
            exp3_log_weights=np.zeros((num_clients, settings.num_arms)),
            arm=minus_one.copy(),
            arm_probability=np.ones(num_clients),
            feedback_sum=np.zeros(num_clients),
            feedback_rounds=zeros_int.copy(),
            hysteresis_target=minus_one.copy(),
            hysteresis_count=zeros_int.copy(),
            forced_episode=np.zeros(num_clients, dtype=bool),
            previous_route=minus_one.copy(),
            rounds_played=zeros_int.copy(),
        )

    def to_arrays(self) -> dict[str, NDArray]:
        """Field name → array (for serialisation)."""
        return {field.name: getattr(self, field.name) for field in fields(self)}

    @classmethod
    def from_arrays(cls, arrays: dict[str, NDArray]) -> "AgentState":
        """Inverse of :meth:`to_arrays`; missing fields raise ``KeyError``."""
        return cls(**{field.name: np.asarray(arrays[field.name]) for field in fields(cls)})

    def select(self, index: NDArray[np.int64]) -> "AgentState":
        """The state of a subset of clients (rows ``index``)."""
        return AgentState(**{name: value[index] for name, value in self.to_arrays().items()})

    def scatter(self, index: NDArray[np.int64], part: "AgentState") -> "AgentState":
        """A copy with rows ``index`` replaced by ``part`` (inverse of :meth:`select`)."""
        merged = {}
        for name, value in self.to_arrays().items():
            value = value.copy()
            value[index] = getattr(part, name)
            merged[name] = value
        return AgentState(**merged)


@dataclass(frozen=True)
class RoundDecision:
    """What a batch of clients decided in one round.

    Attributes
    ----------
    routes : ndarray of int, shape (n,)
        Hard routes ``r``.
    route_distributions : ndarray, shape (n, K)
        ``π``.
    controller : ndarray of int, shape (n,)
        Code (:data:`CONTROLLER_INDEX`) of the controller executed.
    arm : ndarray of int, shape (n,)
        EXP3 arm in force during the round (``-1`` for none).
    feedback : ndarray, shape (n,)
        Expected hard-route loss ``f`` (normalised).
    entered : ndarray of bool, shape (n,)
        Entered a hysteresis episode this round.
    released : ndarray of bool, shape (n,)
        Released from an episode this round.
    exp3_updated : ndarray of bool, shape (n,)
        Made an EXP3 update at the end of this round.
    preferred : ndarray of int, shape (n,)
        The client's Greedy choice: its lowest-loss cluster, ties broken as its Greedy
        breaks them (what the federation estimate counts as the cluster it prefers).
    """

    routes: NDArray[np.int64]
    route_distributions: NDArray[np.float64]
    controller: NDArray[np.int64]
    arm: NDArray[np.int64]
    feedback: NDArray[np.float64]
    entered: NDArray[np.bool_]
    released: NDArray[np.bool_]
    exp3_updated: NDArray[np.bool_]
    preferred: NDArray[np.int64]


def _draw_arms(
    state: AgentState, needs_arm: NDArray[np.bool_], settings: RoutingSettings,
    seed: int | NDArray[np.int64], client_ids: NDArray[np.int64], round_index: int,
) -> AgentState:
    """Draw a fresh arm ``R ~ p`` for the clients in ``needs_arm``; reset their feedback."""
    if not needs_arm.any():
        return state
    probabilities = arm_probabilities(state.exp3_log_weights, settings.exp3_exploration)
    draws = categorical(probabilities, uniform(seed, client_ids, round_index, Purpose.ARM))
    drawn_probability = np.take_along_axis(probabilities, draws[:, None], axis=-1)[:, 0]
    return replace(
        state,
        arm=np.where(needs_arm, draws, state.arm),
        arm_probability=np.where(needs_arm, drawn_probability, state.arm_probability),
        feedback_sum=np.where(needs_arm, 0.0, state.feedback_sum),
        feedback_rounds=np.where(needs_arm, 0, state.feedback_rounds),
    )


def agent_step(
    state: AgentState,
    settings: RoutingSettings,
    losses: NDArray[np.float64],
    previous_masses: Optional[NDArray[np.float64]],
    round_index: int,
    client_ids: NDArray[np.int64],
    seed: int | NDArray[np.int64],
    benefit_fn: Optional[BenefitFunction] = None,
    num_rounds: Optional[int] = None,
    view: Optional[RoutingView] = None,
    held_routes: Optional[NDArray[np.int64]] = None,
) -> tuple[AgentState, RoundDecision]:
    """One routing round for a batch of clients: the phases below, in order (module docstring).

    Parameters
    ----------
    state : AgentState
        Controller state before the round.
    settings : RoutingSettings
        Routing hyper-parameters.
    losses : ndarray, shape (n, K)
        ``ℓ_ik^t``: each client's mean training loss of every cluster model.
    previous_masses : ndarray, shape (K,) or (n, K), or None
        Broadcast masses ``μ^{t-1}`` (provisional masses at a synchronized-entry
        round; one row per client when several runs are batched); ``None``
        before any masses exist.
    round_index : int
        The paper's round ``t`` (0-based).
    client_ids : ndarray of int, shape (n,)
        Global client ids (the randomness coordinates).
    seed : int or ndarray of int, shape (n,)
        Run seed (one per client when several runs are batched).
    benefit_fn : BenefitFunction, optional
        Computes entry benefits; required when an entry test can run
        (synchronized entry or a ``hys`` arm).
    num_rounds : int, optional
        The run's ``T``; required when ``settings.exploitation_fraction > 0``.
    view : RoutingView, optional
        What the server reported after the previous round, one row per client
        (:mod:`fedroute.core.health`): whether exploration is on, and the duplicate
        clusters merged into a twin (skipped by the Greedy choice).  ``None`` before
        any report: under ``explore_on = "collapse"`` the start explores (nothing is known
        yet), no merges.
    held_routes : ndarray of int, shape (n,), optional
        The signature start's holds (:func:`fedroute.core.signature_start.held_routes`): a client with a
        route ``≥ 0`` trains that cluster this round (an exploitation step on it: no arm, no EXP3 update;
        its Greedy choice is still reported); ``-1`` (or None for all): the round as usual.

    Returns
    -------
    new_state : AgentState
    decision : RoundDecision
    """
    losses = _checked_losses(losses, settings)
    client_ids = np.asarray(client_ids, dtype=np.int64)
    tie_uniforms = (uniform(seed, client_ids, round_index, Purpose.TIE)
                    if settings.tie_breaking == "random" else None)
    greedy_choice, preferred = greedy_choices(losses, settings, view, tie_uniforms)
    if held_routes is not None and np.any(np.asarray(held_routes) >= 0):
        return _hold_where(state, settings, losses, previous_masses, round_index, client_ids, seed, benefit_fn,
                           num_rounds, view, np.asarray(held_routes, dtype=np.int64), preferred)
    exploring = exploring_clients(settings, view, len(losses))
    if not exploring.all():
        return _explore_where(state, settings, losses, previous_masses, round_index, client_ids, seed,
                              benefit_fn, num_rounds, view, exploring, greedy_choice, preferred)
    if in_exploitation_phase(settings, round_index, num_rounds):
        greedy_choice = exploitation_greedy(losses, settings, previous_masses, greedy_choice, tie_uniforms)
        return _exploit(state, losses, greedy_choice, preferred)
    entry_round = settings.synchronized_entry and round_index == 0
    state, needs_arm = choose_arms(state, settings, entry_round, seed, client_ids, round_index)
    arm_code = arm_controller_codes(state, settings)
    wants_entry = np.ones(len(losses), dtype=bool) if entry_round else needs_arm & (arm_code == _HYSTERESIS_CODE)
    state, entered = entry_test(state, settings, losses, previous_masses, greedy_choice, wants_entry, entry_round,
                                benefit_fn)
    released, follows_target = episode_releases(state, settings, losses, entered)
    executed = executed_controllers(state.arm >= 0, arm_code, follows_target)
    distributions = route_distributions(executed, state, settings, losses, previous_masses, greedy_choice,
                                        follows_target, tie_uniforms)
    routes = categorical(distributions, uniform(seed, client_ids, round_index, Purpose.ROUTE))
    new_state, feedback, updates = exp3_feedback_step(state, settings, losses, distributions, routes, follows_target)
    return new_state, RoundDecision(
        routes=routes, route_distributions=distributions, controller=executed.astype(np.int64),
        arm=np.where(state.arm >= 0, state.arm, -1), feedback=feedback, entered=entered, released=released,
        exp3_updated=updates, preferred=preferred)


_GREEDY_CODE, _HYSTERESIS_CODE = CONTROLLER_INDEX[ctl.GREEDY], CONTROLLER_INDEX[ctl.HYSTERESIS]


def _checked_losses(losses: NDArray[np.float64], settings: RoutingSettings) -> NDArray[np.float64]:
    """``losses`` as float64, refused when it has not ``settings.num_clusters`` columns."""
    losses = np.asarray(losses, dtype=np.float64)
    num_clusters = losses.shape[1]
    if num_clusters != settings.num_clusters:
        raise ValueError(f"losses has {num_clusters} columns; expected num_clusters = {settings.num_clusters}")
    return losses


def greedy_choices(
    losses: NDArray[np.float64], settings: RoutingSettings, view: Optional[RoutingView],
    tie_uniforms: Optional[NDArray[np.float64]],
) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """Each client's Greedy route and its preferred cluster.

    Parameters
    ----------
    losses : ndarray, shape (n, K)
    settings : RoutingSettings
    view : RoutingView or None
        The server's report: clusters merged into a twin are skipped by the Greedy route.
    tie_uniforms : ndarray, shape (n,), or None
        The round's ``TIE`` draws (``tie_breaking = "random"``).

    Returns
    -------
    greedy_choice : ndarray of int, shape (n,)
        The route Greedy executes (consolidating over merged clusters).
    preferred : ndarray of int, shape (n,)
        The lowest-loss cluster (what the federation estimate counts).
    """
    greedy_choice = preferred = ctl.greedy_routes(losses, tie_uniforms)
    if view is not None and np.any(view.merged_into >= 0):
        greedy_choice = ctl.consolidating_greedy_routes(losses, view.merged_into >= 0, tie_uniforms,
                                                        settings.consolidation_loss_ratio, relative=True,
                                                        not_third=view.spare if settings.restart_idle_spares
                                                        else None)
    return greedy_choice, preferred


def exploring_clients(settings: RoutingSettings, view: Optional[RoutingView], num_clients: int) -> NDArray[np.bool_]:
    """Which clients take an EXP3 step this round (all of them unless ``explore_on = "collapse"``).

    Under exploration on evidence, the server's ``view.explore``; before any report, ``explore_at_start``.
    """
    if not settings.explores_on_evidence:
        return np.ones(num_clients, dtype=bool)
    if view is None:
        return np.full(num_clients, settings.explore_at_start)
    return np.asarray(view.explore, dtype=bool)


def in_exploitation_phase(settings: RoutingSettings, round_index: int, num_rounds: Optional[int]) -> bool:
    """Whether round ``t`` lies in the exploitation phase (``t ≥ settings.exploitation_start(T)``).

    Raises ``ValueError`` when the phase is configured but ``num_rounds`` is not given.
    """
    if settings.exploitation_fraction <= 0:
        return False
    if num_rounds is None:
        raise ValueError("exploitation_fraction > 0 needs num_rounds (the run's T) at every round")
    return round_index >= settings.exploitation_start(num_rounds)


def exploitation_greedy(
    losses: NDArray[np.float64], settings: RoutingSettings, previous_masses: Optional[NDArray[np.float64]],
    greedy_choice: NDArray[np.int64], tie_uniforms: Optional[NDArray[np.float64]],
) -> NDArray[np.int64]:
    """The exploitation phase's Greedy route: with ``exploitation_consolidates`` (and masses known) it skips
    the clusters underused in the previous round; otherwise ``greedy_choice`` itself."""
    if not (settings.exploitation_consolidates and previous_masses is not None):
        return greedy_choice
    spare = underused_clusters(np.broadcast_to(previous_masses, losses.shape), settings.underused_mass,
                               settings.mass_threshold_inclusive)
    return ctl.consolidating_greedy_routes(losses, spare, tie_uniforms, settings.consolidation_loss_ratio)


def choose_arms(
    state: AgentState, settings: RoutingSettings, entry_round: bool, seed: int | NDArray[np.int64],
    client_ids: NDArray[np.int64], round_index: int,
) -> tuple[AgentState, NDArray[np.bool_]]:
    """Phase 1, the controller (arm) choice: who draws a fresh arm this round, and the draw.

    Block mode: blocks start at ``τ ≡ 0 (mod B)`` of the client's own clock ``τ`` = rounds
    played (``τ = t`` when it plays every round); after a synchronized-entry round the first
    block starts at ``τ = 1``; a new block ends any unforced episode.  Action mode: a client
    with no action in force and no episode draws.  Nobody draws at a synchronized-entry round.

    Returns
    -------
    state : AgentState
        With the fresh arms (and the episodes a new block ended).
    needs_arm : ndarray of bool, shape (n,)
        The clients that drew.
    """
    if entry_round:
        needs_arm = np.zeros(len(state.arm), dtype=bool)
    elif settings.exp3_mode == "block":
        played = state.rounds_played
        block_start = (played % settings.block_length == 0) | (settings.synchronized_entry & (played == 1))
        needs_arm = block_start & ~state.forced_episode
        ended = needs_arm & (state.hysteresis_target >= 0)
        state = replace(
            state,
            hysteresis_target=np.where(ended, -1, state.hysteresis_target),
            hysteresis_count=np.where(ended, 0, state.hysteresis_count),
        )
    else:
        needs_arm = (state.arm < 0) & ~state.forced_episode & (state.hysteresis_target < 0)
    return _draw_arms(state, needs_arm, settings, seed, client_ids, round_index), needs_arm


def arm_controller_codes(state: AgentState, settings: RoutingSettings) -> NDArray[np.int64]:
    """The controller code (:data:`CONTROLLER_INDEX`) of each client's arm in force, ``-1`` for none."""
    arm_codes = np.array([CONTROLLER_INDEX[name] for name in settings.controllers], dtype=np.int64)
    return np.where(state.arm >= 0, arm_codes[np.maximum(state.arm, 0)], -1)


def entry_test(
    state: AgentState, settings: RoutingSettings, losses: NDArray[np.float64],
    previous_masses: Optional[NDArray[np.float64]], greedy_choice: NDArray[np.int64],
    wants_entry: NDArray[np.bool_], entry_round: bool, benefit_fn: Optional[BenefitFunction],
) -> tuple[AgentState, NDArray[np.bool_]]:
    """Phase 2, the entry test of the clients in ``wants_entry`` (everyone at a synchronized-entry
    round, else the fresh ``hys`` arms): candidates among the underused clusters, entry where the
    benefit passes ``entry_threshold``.

    Returns
    -------
    state : AgentState
        With the entered episodes (target, count 0; forced at a synchronized-entry round).
    entered : ndarray of bool, shape (n,)
    """
    entered = np.zeros(len(losses), dtype=bool)
    if not wants_entry.any() or previous_masses is None:
        return state, entered
    candidates = entry_candidates(np.asarray(previous_masses, dtype=np.float64), greedy_choice,
                                  settings.underused_mass, settings.mass_threshold_inclusive,
                                  settings.entry_max_candidates, losses) & wants_entry[:, None]
    if not candidates.any():
        return state, entered
    if benefit_fn is None:
        raise ValueError("benefit_fn is required when an entry test runs")
    entered, targets = entry_decision(benefit_fn(candidates, greedy_choice), settings.entry_threshold)
    state = replace(
        state,
        hysteresis_target=np.where(entered, targets, state.hysteresis_target),
        hysteresis_count=np.where(entered, 0, state.hysteresis_count),
        forced_episode=state.forced_episode | (entered & entry_round),
    )
    return state, entered


def episode_releases(
    state: AgentState, settings: RoutingSettings, losses: NDArray[np.float64], entered: NDArray[np.bool_],
) -> tuple[NDArray[np.bool_], NDArray[np.bool_]]:
    """Phase 3, episodes: which are released this round (Greedy this round) and which continue.

    An episode not entered this round may be released after ``hysteresis_min_rounds`` updates, when the
    gap ``G = ℓ_target / min ℓ − 1`` (``+inf`` when only the best loss is 0, 0 when both are) is at most
    ``hysteresis_exit_gap`` or after ``hysteresis_max_rounds`` updates.

    Returns
    -------
    released : ndarray of bool, shape (n,)
    follows_target : ndarray of bool, shape (n,)
        In an episode that continues this round.
    """
    in_episode = state.hysteresis_target >= 0
    target = np.maximum(state.hysteresis_target, 0)
    target_loss = np.take_along_axis(losses, target[:, None], axis=-1)[:, 0]
    best_loss = losses.min(axis=-1)
    gap = np.divide(target_loss, best_loss, out=np.where(target_loss > 0, np.inf, 1.0), where=best_loss > 0) - 1.0
    may_release = in_episode & ~entered & (state.hysteresis_count >= settings.hysteresis_min_rounds)
    released = may_release & ((gap <= settings.hysteresis_exit_gap)
                              | (state.hysteresis_count >= settings.hysteresis_max_rounds))
    return released, in_episode & ~released


def executed_controllers(has_arm: NDArray[np.bool_], arm_code: NDArray[np.int64],
                         follows_target: NDArray[np.bool_]) -> NDArray[np.int64]:
    """The controller each client executes: hysteresis in a continuing episode, else its arm's controller
    (Greedy for a ``hys`` arm outside an episode, and for a client with no arm in force)."""
    executed = np.where(follows_target, _HYSTERESIS_CODE, np.where(has_arm, arm_code, _GREEDY_CODE))
    return np.where((executed == _HYSTERESIS_CODE) & ~follows_target, _GREEDY_CODE, executed)


def route_distributions(
    executed: NDArray[np.int64], state: AgentState, settings: RoutingSettings, losses: NDArray[np.float64],
    previous_masses: Optional[NDArray[np.float64]], greedy_choice: NDArray[np.int64],
    follows_target: NDArray[np.bool_], tie_uniforms: Optional[NDArray[np.float64]],
) -> NDArray[np.float64]:
    """Phase 4, the route distribution ``π`` of each client's executed controller, shape (n, K).

    Greedy: one-hot on ``greedy_choice``; Rank Hedge, Reversal (over ``μ^{t-1}``, zeros before any) and
    Commitment (over the previous route) by :mod:`fedroute.core.controllers`; an episode: its target.
    """
    num_clusters = losses.shape[1]
    distributions = ctl.one_hot(greedy_choice, num_clusters)
    rows = executed == CONTROLLER_INDEX[ctl.RANK_HEDGE]
    if rows.any():
        distributions[rows] = ctl.rank_hedge(losses[rows], settings.rank_hedge_temperature)
    rows = executed == CONTROLLER_INDEX[ctl.REVERSAL]
    if rows.any():
        masses = np.zeros(num_clusters) if previous_masses is None else np.asarray(previous_masses)
        distributions[rows] = ctl.reversal(losses[rows], np.broadcast_to(masses, losses.shape)[rows])
    rows = executed == CONTROLLER_INDEX[ctl.COMMITMENT]
    if rows.any():
        distributions[rows] = ctl.commitment(losses[rows], state.previous_route[rows], settings.commitment_margin,
                                             None if tie_uniforms is None else tie_uniforms[rows])
    if follows_target.any():
        distributions[follows_target] = ctl.one_hot(state.hysteresis_target[follows_target], num_clusters)
    return distributions


def exp3_feedback_step(
    state: AgentState, settings: RoutingSettings, losses: NDArray[np.float64],
    distributions: NDArray[np.float64], routes: NDArray[np.int64], follows_target: NDArray[np.bool_],
) -> tuple[AgentState, NDArray[np.float64], NDArray[np.bool_]]:
    """Phases 5–6: feedback of the executed distribution, block/action completion, the EXP3 update.

    The feedback ``f`` is the expected hard-route loss of ``π``; a client with an arm in force (and
    controller selection on) sums it.  A block completes after ``τ ≡ B-1 (mod B)``, an action when its
    episode (if any) is not continuing; a completed arm with feedback makes an importance-weighted update.

    Returns
    -------
    new_state : AgentState
        The state after the round.
    feedback : ndarray, shape (n,)
    updates : ndarray of bool, shape (n,)
        Made an EXP3 update.
    """
    has_arm = state.arm >= 0
    feedback = expected_route_loss(distributions, losses)
    learns = has_arm & settings.selects_controllers
    feedback_sum = state.feedback_sum + np.where(learns, feedback, 0.0)
    feedback_rounds = state.feedback_rounds + learns.astype(np.int64)
    if settings.exp3_mode == "block":
        completes = has_arm & (state.rounds_played % settings.block_length == settings.block_length - 1)
    else:
        completes = has_arm & ~follows_target
    updates = completes & learns & (feedback_rounds > 0)
    log_weights = importance_weighted_update(
        state.exp3_log_weights, state.arm, feedback_sum / np.maximum(feedback_rounds, 1),
        state.arm_probability, settings.exp3_learning_rate, updates,
    )
    keeps_arm = has_arm & ~(completes & (settings.exp3_mode == "action"))
    new_state = AgentState(
        exp3_log_weights=log_weights, arm=np.where(keeps_arm, state.arm, -1), arm_probability=state.arm_probability,
        feedback_sum=np.where(completes, 0.0, feedback_sum), feedback_rounds=np.where(completes, 0, feedback_rounds),
        hysteresis_target=np.where(follows_target, state.hysteresis_target, -1),
        hysteresis_count=np.where(follows_target, state.hysteresis_count + 1, 0),
        forced_episode=state.forced_episode & follows_target, previous_route=routes,
        rounds_played=state.rounds_played + 1)
    return new_state, feedback, updates


def _explore_where(
    state: AgentState, settings: RoutingSettings, losses: NDArray[np.float64],
    previous_masses: Optional[NDArray[np.float64]], round_index: int, client_ids: NDArray[np.int64],
    seed: int | NDArray[np.int64], benefit_fn: Optional[BenefitFunction], num_rounds: Optional[int],
    view: Optional[RoutingView], exploring: NDArray[np.bool_], greedy_choice: NDArray[np.int64],
    preferred: NDArray[np.int64],
) -> tuple[AgentState, RoundDecision]:
    """``explore_on = "collapse"``: the clients told to explore take an EXP3 step, the others exploit."""
    exploited_state, exploited = _exploit(state, losses, greedy_choice, preferred)
    if not exploring.any():
        return exploited_state, exploited
    rows = np.flatnonzero(exploring)
    part_view = RoutingView(explore=np.ones(len(rows), dtype=bool), merged_into=view.merged_into[rows],
                            spare=view.spare[rows])
    return _step_rows(exploited_state, exploited, rows, part_view, state, settings, losses, previous_masses,
                      round_index, client_ids, seed, benefit_fn, num_rounds)


def _hold_where(
    state: AgentState, settings: RoutingSettings, losses: NDArray[np.float64],
    previous_masses: Optional[NDArray[np.float64]], round_index: int, client_ids: NDArray[np.int64],
    seed: int | NDArray[np.int64], benefit_fn: Optional[BenefitFunction], num_rounds: Optional[int],
    view: Optional[RoutingView], held_routes: NDArray[np.int64], preferred: NDArray[np.int64],
) -> tuple[AgentState, RoundDecision]:
    """The signature start's hold: held clients exploit their held route (reporting their Greedy choice
    ``preferred``), the others take the usual step."""
    if held_routes.shape != (len(losses),) or np.any(held_routes >= losses.shape[1]):
        raise ValueError(f"held_routes must be {len(losses)} routes in [-1, {losses.shape[1] - 1}]; got "
                         f"{held_routes.tolist()[:5]}")
    held = held_routes >= 0
    held_state, decision = _exploit(state, losses, np.where(held, held_routes, 0), preferred)
    if held.all():
        return held_state, decision
    rows = np.flatnonzero(~held)
    part_view = None if view is None else RoutingView(explore=view.explore[rows], merged_into=view.merged_into[rows],
                                                      spare=view.spare[rows])
    return _step_rows(held_state, decision, rows, part_view, state, settings, losses, previous_masses, round_index,
                      client_ids, seed, benefit_fn, num_rounds)


def _step_rows(
    base_state: AgentState, base: RoundDecision, rows: NDArray[np.int64], part_view: Optional[RoutingView],
    state: AgentState, settings: RoutingSettings, losses: NDArray[np.float64],
    previous_masses: Optional[NDArray[np.float64]], round_index: int, client_ids: NDArray[np.int64],
    seed: int | NDArray[np.int64], benefit_fn: Optional[BenefitFunction], num_rounds: Optional[int],
) -> tuple[AgentState, RoundDecision]:
    """``base`` (an exploitation of every client) with the clients ``rows`` taking the usual :func:`agent_step`
    instead, on their own rows of everything (``part_view``: their view)."""
    part_masses = None if previous_masses is None else np.broadcast_to(previous_masses, losses.shape)[rows]
    part_seed = seed if np.ndim(seed) == 0 else np.asarray(seed)[rows]
    part_benefit = None if benefit_fn is None else _rows_benefit(benefit_fn, rows, len(losses))
    part_state, part = agent_step(state.select(rows), settings, losses[rows], part_masses, round_index,
                                  client_ids[rows], part_seed, part_benefit, num_rounds, part_view)
    merged = RoundDecision(**{name: _scatter(getattr(base, name), rows, getattr(part, name))
                              for name in RoundDecision.__dataclass_fields__})
    return base_state.scatter(rows, part_state), merged


def _rows_benefit(benefit_fn: BenefitFunction, rows: NDArray[np.int64], num_clients: int) -> BenefitFunction:
    """A benefit function of a subset of the clients, over the full batch's ``benefit_fn``."""
    def benefits(candidates: NDArray[np.bool_], greedy_choice: NDArray[np.int64]) -> NDArray[np.float64]:
        full_candidates = np.zeros((num_clients, candidates.shape[1]), dtype=bool)
        full_candidates[rows] = candidates
        full_greedy = np.zeros(num_clients, dtype=np.int64)
        full_greedy[rows] = greedy_choice
        return benefit_fn(full_candidates, full_greedy)[rows]
    return benefits


def _scatter(values: NDArray, rows: NDArray[np.int64], part: NDArray) -> NDArray:
    merged = np.array(values, copy=True)
    merged[rows] = part
    return merged


def _exploit(
    state: AgentState, losses: NDArray[np.float64], greedy_choice: NDArray[np.int64], preferred: NDArray[np.int64],
) -> tuple[AgentState, RoundDecision]:
    """A round of the exploitation phase: Greedy for everyone, no arm, no EXP3 update, no episode."""
    num_clients, num_clusters = losses.shape
    distributions = ctl.one_hot(greedy_choice, num_clusters)
    routes = greedy_choice.copy()
    minus_one = np.full(num_clients, -1, dtype=np.int64)
    no = np.zeros(num_clients, dtype=bool)
    new_state = replace(
        state, arm=minus_one, feedback_sum=np.zeros(num_clients), feedback_rounds=np.zeros(num_clients, np.int64),
        hysteresis_target=minus_one.copy(), hysteresis_count=np.zeros(num_clients, np.int64),
        forced_episode=no.copy(), previous_route=routes, rounds_played=state.rounds_played + 1,
    )
    decision = RoundDecision(
        routes=routes, route_distributions=distributions,
        controller=np.full(num_clients, CONTROLLER_INDEX[ctl.GREEDY], dtype=np.int64), arm=minus_one.copy(),
        feedback=expected_route_loss(distributions, losses), entered=no.copy(),
        released=state.hysteresis_target >= 0, exp3_updated=no.copy(), preferred=preferred,
    )
    return new_state, decision
