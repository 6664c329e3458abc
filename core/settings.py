"""Routing settings shared by the client agent, the strategy and the simulator."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

import numpy as np

from fedroute.core.controllers import CONTROLLER_IDS
from fedroute.core.validation import invalid

__all__ = ["RoutingSettings", "EXP3_MODES", "EXPLORE_ON", "TIE_BREAKING", "MASS_THRESHOLD_UNITS", "INCLUSIVE_SLACK",
           "SIGNATURE_START_ON", "MAX_START_UPDATES", "MAX_SIGNATURE_HOLD_ROUNDS", "MAX_SIGNATURE_DIM"]

EXP3_MODES = ("block", "action")
EXPLORE_ON = ("always", "collapse")
TIE_BREAKING = ("lowest", "random")
MASS_THRESHOLD_UNITS = ("mass", "fair-share")
SIGNATURE_START_ON = ("copies-or-skew", "copies", "always")
MAX_START_UPDATES = 1000
"""Largest ``start_updates``: a probe is a few dozen local updates, not a training run."""
MAX_SIGNATURE_HOLD_ROUNDS = 10_000
"""Largest ``signature_hold_rounds``: a start, not a run."""
MAX_SIGNATURE_DIM = 256
"""Largest ``signature_dim``: a sketch, not the client's inputs."""
INCLUSIVE_SLACK = 1e-9
"""Rounding slack of an inclusive mass threshold: ``μ_k ≤ threshold + slack`` (``3/15 ≤ 0.6/3`` must hold)."""


@dataclass(frozen=True)
class RoutingSettings:
    """Every routing hyper-parameter of docs/algorithm.md, rules §3–§6.

    Parameters
    ----------
    num_clusters : int
        ``K``, the number of cluster models (≥ 1).
    controllers : tuple of str
        The EXP3 arms, controller ids from ``gr, rh, rev, com, hys``.  One
        controller means no selection (``("gr",)`` is Greedy IFCA).
    exp3_mode : {"block", "action"}
        Fixed blocks of ``block_length`` rounds, or one arm per completed action.
    block_length : int
        ``B`` (≥ 1), rounds per block in block mode.
    exp3_learning_rate : float
        ``η_EXP3`` (> 0).
    exp3_exploration : float
        ``γ`` in ``[0, 1]``: uniform mixing of the EXP3 probabilities.
    rank_hedge_temperature : float
        ``β_rh`` (≥ 0); 0 makes Rank Hedge uniform.
    commitment_margin : float
        ``δ_com`` in ``[0, 1)``.
    reversal_mass_threshold : float
        ``μ_rev``, the *underused* threshold (the paper's name; the Reversal
        controller does not read it: it routes to the lightest cluster whatever
        its mass).  Read as :attr:`underused_mass` by (1) the entry test: a
        cluster whose broadcast mass is below it is an entry candidate
        (synchronized entry and the ``hys`` arm, :mod:`fedroute.core.entry`);
        (2) the exploitation phase's consolidation (``exploitation_consolidates``),
        which skips the clusters underused in the previous round; (3) the
        collapse signs of ``explore_on = "collapse"`` (:mod:`fedroute.core.health`):
        a cluster whose preferred share is underused so is unwanted.  In ``[0, 1]``
        with ``mass_threshold_unit = "mass"``; in ``[0, K]`` with ``"fair-share"``,
        where it counts fair shares ``1/K`` (``0.4`` means ``0.4/K``).
    mass_threshold_unit : {"mass", "fair-share"}
        Unit of ``reversal_mass_threshold``: an absolute mass (paper presets),
        or a multiple of the fair share ``1/K`` (scales with ``K``).
    mass_threshold_inclusive : bool
        ``True``: underused means ``μ_k ≤ threshold`` (with a rounding slack of
        :data:`INCLUSIVE_SLACK`); ``False`` (paper presets): ``μ_k < threshold``.
    entry_max_candidates : int
        At most this many candidates per entry test (≥ 0; ``0`` = every
        underused cluster, the paper presets): the lightest clusters, ties to
        the lower training loss, then the lower index.
    entry_threshold : float
        ``τ`` in ``[-1, 1]``: a client enters if its smallest benefit is ``≤ τ``.
    hysteresis_min_rounds : int
        ``H_min`` (≥ 1).
    hysteresis_exit_gap : float
        ``ε_exit`` (≥ 0).
    hysteresis_max_rounds : int
        ``H_max`` (≥ ``H_min``).
    synchronized_entry : bool
        Run the synchronized entry of §6 before the first training round.
    tie_breaking : {"lowest", "random"}
        Greedy choice among exactly equal losses: the lowest index (paper
        presets, ``np.argmin``), or uniformly at random from the client's
        ``(seed, client, round, TIE)`` draw (identical models split the clients).
    exploitation_fraction : float
        In ``[0, 1)``: the last ``round(exploitation_fraction · T)`` of the run's
        ``T`` rounds are an exploitation phase — every client executes Greedy,
        draws no arm, makes no EXP3 update and leaves any episode.  ``0`` (paper
        presets) = none.  Needs ``T`` (``num_rounds``) at every round.
    exploitation_consolidates : bool
        In the exploitation phase, Greedy skips the clusters that were underused
        in the previous round (the entry rule: ``underused_mass``,
        ``mass_threshold_inclusive``) unless every cluster was: a handful of
        clients left on a spare model joins the model its group trains.
        ``False`` in the presets (which have no exploitation phase).
    consolidation_loss_ratio : float
        ``ρ ≥ 1``: consolidation moves a client off an underused cluster only if its
        best other cluster's training loss is at most ``ρ ×`` its best loss (a spare
        copy of its group's model, not the only model that serves it).  ``2.0``;
        ``inf`` = no guard.  Also the closeness ``ρ`` of the duplicate test
        (``consolidate_duplicates``; ``inf`` turns that off).
    explore_on : {"always", "collapse"}
        ``"always"`` (paper presets): EXP3 selects controllers every round.
        ``"collapse"`` (generic default): EXP3 runs only while the server reports a
        collapse sign (:mod:`fedroute.core.health`: a cluster nobody needs that is not
        spare); otherwise every client executes Greedy (no arm, no EXP3 update).
    collapse_patience : int
        Rounds (≥ 1) a cluster must be unwanted (preferred share ``≤`` the underused
        threshold) in a row before it is a collapse sign.
    spare_patience : int
        Rounds (≥ 1) of exploration an unwanted cluster may trigger before it is
        declared spare.
    consolidate_duplicates : bool
        Merge a cluster into its twin when both serve the same clients (each side's
        clients find the other within ``consolidation_loss_ratio``, no third cluster
        does): the clients skip the smaller one in their Greedy choice.
    duplicate_patience : int
        Rounds (≥ 1) two clusters must stay duplicates before they are merged (at once
        when the smaller one is spare); under partial participation, rounds of the clients'
        reports (``⌈duplicate_patience / f⌉`` federation rounds,
        :func:`fedroute.core.server_step.evidence_settings`).
    reseed_empty : bool
        A collapse sign that no client prefers gets a copy of the most crowded cluster's
        model (with random tie-breaking; :func:`fedroute.core.health.reseeding`).
    reseed_split : bool
        Re-seed by splitting instead of copying: the crowded cluster's replies of the round are split
        in two by the direction of their updates, and the crowded and the re-seeded cluster get one
        half each (:mod:`fedroute.core.split`); a copy when fewer than two replies reached it.
    reseed_unwanted : bool
        Re-seed every collapse sign, not only one that no client prefers: a few stragglers on an
        otherwise empty cluster (within the others' reach, so not a small group's own model) no
        longer block its re-seeding; they choose again among the new models.
    crowded_by_clients : bool
        A cluster is *crowded* (a re-seed's source; :func:`fedroute.core.health.crowded`) when it holds two fair
        shares of the preferred mass, or — with this — ``1.5 ×`` the clients of the median cluster some client
        prefers, whatever their sample counts (two groups of log-normal sample counts, or seen through stale
        reports under partial participation, can weigh less than ``2/K``).
    reseed_by_signature : bool
        A cluster whose signed own clients show two groups on their class signatures is a re-seed's source
        (:mod:`fedroute.core.signature_structure`: a minority sharing a majority's model, which no count of
        clients shows).  When a re-seed copies a crowded cluster or such a one, the clients that prefer it and
        sent a class signature (the signature start's, :mod:`fedroute.core.signature_start`) are parted in two on
        the classes they share;
        if the parts show two groups (mean silhouette ≥ ``split_silhouette``) each is held on one of the two
        copies for ``signature_hold_rounds`` of its rounds (``⌈h/f⌉`` server rounds).  Two copies of one
        model tie for every client, and under partial participation too few of their clients play a round
        for ``split_copies`` to part them by update direction.
    merge_by_signature : bool
        A group split over two clusters is merged by its clients' class signatures (the signature start's,
        :mod:`fedroute.core.signature_twins`): two clusters whose signed own clients are one group — together at
        least three, no two groups among them, and the two clusters do not separate them (silhouette under
        ``split_silhouette``) — are *signature twins*, and the signed clients of the one fewer clients prefer are
        held on the other for as long as they are (after ``collapse_patience`` rounds in a row).  A model trained
        on a few clients memorises them, so their losses cannot show it.  It reads the signatures the clients sent
        in the signature start's collect rounds (those it declines too); with ``signature_hold_rounds = 0`` there
        are none and it does nothing.
    starving_needs_reach : bool
        A cluster with a small preferred share is a collapse sign only if nobody prefers it or some
        client that prefers another cluster finds it within ``consolidation_loss_ratio`` of its best
        loss (:func:`fedroute.core.health.within_reach`): a small group's own model is not starving.
    explore_at_start : bool
        Under ``explore_on = "collapse"``: explore from round 0 until the federation has
        been calm for ``collapse_patience`` rounds (``True``), or only on collapse signs.
    calm_when_stable : bool
        A round also counts as calm for the end of the start when the routes are stable and
        healthy: every client's Greedy choice as in the round before (``p̂`` unchanged), no
        collapse sign, and every cluster that is not spare some client's best
        (:func:`fedroute.core.health.update_health`).  Without it only a round with no unwanted
        cluster is calm, and a small group's model whose reach flickers keeps the start exploring.
    split_near_copies : bool
        ``split_copies`` also pools models closer to each other than the round's median update (a warm start with
        a little noise), not only equal ones.  Off in the generic default: near copies already differ for the
        clients' losses, Greedy's routes among them part the groups where they can, and re-routing the round's
        replies there only changes which run of the training lottery is drawn (development seeds 100–109, noisy
        starts: no harm 11 → 16 / 16 of Greedy's successes, recovered 31 / 34 both; ``docs/algorithm.md``).
    restart_idle_spares : bool
        A spare cluster (:func:`fedroute.core.health.update_health`) on which no known client's latest route
        lies — every client that trained it has left it — is returned to its start model (the run's initial
        model of that cluster) at the end of the round (:func:`fedroute.core.health.idle_spares`), and a spare
        is not the duplicate test's third cluster while another cluster is (:func:`fedroute.core.health.
        duplicate_twins`, :func:`fedroute.core.controllers.consolidating_greedy_routes`): a start model, or a
        stale piece of a group, says nothing about how far another group is.  A model trained by a group that
        has since left is a worse start for the next group that needs a cluster (one that joins late) than
        the start itself; restarted beside a group split over two copies of a warm start, the warm model
        looked like a near third and kept the split apart until spares stopped counting as thirds
        (``docs/algorithm.md``, "Idle spares restart").
    start_updates : int
        Local updates (≥ 1) a client chains in round 0 when its routed model has a copy among the
        broadcast models — another model closer to it than the client's first update moved it (a
        warm start, ``K`` copies of one model): the *start probe* (:func:`fedroute.core.client_step.
        local_training`).  ``split_copies`` parts those copies' replies by update direction; after one
        update a client's direction can follow its own label mix more than its group, after a longer
        run from the shared start the group's direction builds up.  ``1`` (presets): no probe.
    signature_hold_rounds : int
        The *signature start* (``≥ 0``; ``0``, every preset and the default: off).  The clients send a
        sketch of their class-conditional input means with their first replies
        (:mod:`fedroute.core.signatures`); once the first ``⌈1/f⌉`` rounds' signatures are in (``f``: the
        participation fraction), the server parts the clients on the classes they share and holds each part
        on one cluster for this many of its clients' rounds (``⌈h/f⌉`` server rounds); a client that first
        replies later joins the part it is most similar to (:mod:`fedroute.core.signature_start`).  A client
        that sends one reveals its class counts and ``signature_dim`` random projections of each class's mean
        input; a client that cannot (no class labels, a torch client without ``signature_data``) sends none and
        is not held.  Presets: ``0``; the generic default: ``10``, on copy starts and under label skew
        (``signature_start_on``).
    signature_dim : int
        Dimensions of the signature's random projection (``≥ 1``; shared by every client, drawn from the seed).
    signature_start_on : {"copies-or-skew", "copies", "always"}
        Which runs the signature start parts: ``"copies-or-skew"`` (the default) the runs whose ``K`` start
        models are exact copies of one model (a warm start: no client's loss can tell the clusters apart, so the
        routing has no signal to part the groups on), and the others whose clients' class counts, sent with
        their signatures in the collect rounds, show label skew (:mod:`fedroute.core.label_skew`: there the
        losses follow each client's label mix more than its group); a run it declines asks nobody again.
        ``"copies"``: copy starts only (clients of other runs are never asked for a signature); ``"always"``:
        every run.
    """

    num_clusters: int = 2
    controllers: tuple[str, ...] = ("gr", "rh")
    exp3_mode: str = "block"
    block_length: int = 10
    exp3_learning_rate: float = 2.0
    exp3_exploration: float = 0.001
    rank_hedge_temperature: float = 0.0
    commitment_margin: float = 0.05
    reversal_mass_threshold: float = 0.20
    entry_threshold: float = 0.0
    hysteresis_min_rounds: int = 5
    hysteresis_exit_gap: float = 0.005
    hysteresis_max_rounds: int = 160
    synchronized_entry: bool = False
    tie_breaking: str = "lowest"
    mass_threshold_unit: str = "mass"
    mass_threshold_inclusive: bool = False
    entry_max_candidates: int = 0
    exploitation_fraction: float = 0.0
    exploitation_consolidates: bool = False
    consolidation_loss_ratio: float = 2.0
    explore_on: str = "always"
    collapse_patience: int = 10
    spare_patience: int = 100
    consolidate_duplicates: bool = False
    duplicate_patience: int = 100
    reseed_empty: bool = False
    reseed_split: bool = False
    reseed_unwanted: bool = False
    explore_at_start: bool = True
    starving_needs_reach: bool = False
    calm_when_stable: bool = False
    split_copies: bool = False
    split_near_copies: bool = False
    restart_idle_spares: bool = False
    reseed_by_structure: bool = False
    crowded_by_clients: bool = False
    reseed_by_signature: bool = False
    merge_by_signature: bool = False
    split_silhouette: float = 0.25
    start_updates: int = 1
    signature_hold_rounds: int = 0
    signature_dim: int = 16
    signature_start_on: str = "copies-or-skew"

    def __post_init__(self) -> None:
        object.__setattr__(self, "controllers", tuple(self.controllers))
        for name in ("num_clusters", "block_length", "hysteresis_min_rounds", "hysteresis_max_rounds",
                     "entry_max_candidates", "collapse_patience", "spare_patience", "duplicate_patience",
                     "start_updates", "signature_hold_rounds", "signature_dim"):
            value = getattr(self, name)
            _check(isinstance(value, (int, np.integer)) and not isinstance(value, bool), name, value, "an integer")
        for name in ("exp3_learning_rate", "exp3_exploration", "rank_hedge_temperature", "commitment_margin",
                     "reversal_mass_threshold", "entry_threshold", "hysteresis_exit_gap", "exploitation_fraction",
                     "split_silhouette"):
            value = getattr(self, name)
            _check(isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)
                   and bool(np.isfinite(value)), name, value, "a finite number")
        for name in ("synchronized_entry", "mass_threshold_inclusive", "exploitation_consolidates",
                     "consolidate_duplicates", "reseed_empty", "reseed_split", "reseed_unwanted", "explore_at_start",
                     "starving_needs_reach", "calm_when_stable", "split_copies", "split_near_copies",
                     "restart_idle_spares", "reseed_by_structure", "crowded_by_clients", "reseed_by_signature",
                     "merge_by_signature"):
            _check(isinstance(getattr(self, name), (bool, np.bool_)), name, getattr(self, name), "true or false")
        _check(self.num_clusters >= 1, "num_clusters", self.num_clusters, "an integer ≥ 1")
        _check(len(self.controllers) >= 1, "controllers", self.controllers,
               f"a non-empty subset of {sorted(CONTROLLER_IDS)}")
        for name in self.controllers:
            _check(name in CONTROLLER_IDS, "controllers", name, f"one of {sorted(CONTROLLER_IDS)}")
        _check(len(set(self.controllers)) == len(self.controllers), "controllers",
               self.controllers, "distinct controller ids")
        _check(self.exp3_mode in EXP3_MODES, "exp3_mode", self.exp3_mode, f"one of {EXP3_MODES}")
        _check(self.block_length >= 1, "block_length", self.block_length, "an integer ≥ 1")
        _check(self.exp3_learning_rate > 0, "exp3_learning_rate", self.exp3_learning_rate, "> 0")
        _check(0.0 <= self.exp3_exploration <= 1.0, "exp3_exploration", self.exp3_exploration, "[0, 1]")
        _check(self.rank_hedge_temperature >= 0, "rank_hedge_temperature",
               self.rank_hedge_temperature, "≥ 0")
        _check(0.0 <= self.commitment_margin < 1.0, "commitment_margin", self.commitment_margin, "[0, 1)")
        _check(self.mass_threshold_unit in MASS_THRESHOLD_UNITS, "mass_threshold_unit", self.mass_threshold_unit,
               f"one of {MASS_THRESHOLD_UNITS}")
        mass_limit = 1.0 if self.mass_threshold_unit == "mass" else float(self.num_clusters)
        _check(0.0 <= self.reversal_mass_threshold <= mass_limit, "reversal_mass_threshold",
               self.reversal_mass_threshold, f"[0, {mass_limit:g}] (mass_threshold_unit = "
               f"{self.mass_threshold_unit!r})")
        _check(self.entry_max_candidates >= 0, "entry_max_candidates", self.entry_max_candidates,
               "an integer ≥ 0 (0 = every underused cluster)")
        _check(self.tie_breaking in TIE_BREAKING, "tie_breaking", self.tie_breaking, f"one of {TIE_BREAKING}")
        _check(0.0 <= self.exploitation_fraction < 1.0, "exploitation_fraction", self.exploitation_fraction, "[0, 1)")
        _check(isinstance(self.consolidation_loss_ratio, (int, float, np.integer, np.floating))
               and not isinstance(self.consolidation_loss_ratio, bool) and self.consolidation_loss_ratio >= 1.0,
               "consolidation_loss_ratio", self.consolidation_loss_ratio, "a number ≥ 1 (inf: no guard)")
        _check(-1.0 <= self.entry_threshold <= 1.0, "entry_threshold", self.entry_threshold, "[-1, 1]")
        _check(1 <= self.start_updates <= MAX_START_UPDATES, "start_updates", self.start_updates,
               f"an integer in [1, {MAX_START_UPDATES}] (1: no start probe)")
        _check(0 <= self.signature_hold_rounds <= MAX_SIGNATURE_HOLD_ROUNDS, "signature_hold_rounds",
               self.signature_hold_rounds, f"an integer in [0, {MAX_SIGNATURE_HOLD_ROUNDS}] (0: no signature start)")
        _check(1 <= self.signature_dim <= MAX_SIGNATURE_DIM, "signature_dim", self.signature_dim,
               f"an integer in [1, {MAX_SIGNATURE_DIM}]")
        _check(self.signature_start_on in SIGNATURE_START_ON, "signature_start_on", self.signature_start_on,
               f"one of {SIGNATURE_START_ON}")
        _check(0.0 <= self.split_silhouette <= 1.0, "split_silhouette", self.split_silhouette, "[0, 1]")
        _check(self.explore_on in EXPLORE_ON, "explore_on", self.explore_on, f"one of {EXPLORE_ON}")
        _check(self.collapse_patience >= 1, "collapse_patience", self.collapse_patience, "an integer ≥ 1")
        _check(self.spare_patience >= 1, "spare_patience", self.spare_patience, "an integer ≥ 1")
        _check(self.duplicate_patience >= 1, "duplicate_patience", self.duplicate_patience, "an integer ≥ 1")
        _check(self.hysteresis_min_rounds >= 1, "hysteresis_min_rounds",
               self.hysteresis_min_rounds, "an integer ≥ 1")
        _check(self.hysteresis_exit_gap >= 0, "hysteresis_exit_gap", self.hysteresis_exit_gap, "≥ 0")
        _check(self.hysteresis_max_rounds >= self.hysteresis_min_rounds, "hysteresis_max_rounds",
               self.hysteresis_max_rounds, f"an integer ≥ hysteresis_min_rounds ({self.hysteresis_min_rounds})")
        if self.synchronized_entry or "hys" in self.controllers:
            _check(self.num_clusters >= 2, "num_clusters", self.num_clusters,
                   "≥ 2 when entry or hysteresis is used")

    @property
    def explores_on_evidence(self) -> bool:
        """Whether EXP3 runs only while the server reports a collapse sign (``explore_on = "collapse"``)."""
        return self.explore_on == "collapse" and self.selects_controllers

    @property
    def num_arms(self) -> int:
        """Number of EXP3 arms ``|Π|``."""
        return len(self.controllers)

    @property
    def selects_controllers(self) -> bool:
        """Whether EXP3 chooses among several controllers."""
        return len(self.controllers) > 1

    @property
    def underused_mass(self) -> float:
        """The entry candidates' mass threshold as a mass: ``μ_rev``, or ``μ_rev / K`` in fair shares."""
        if self.mass_threshold_unit == "fair-share":
            return float(self.reversal_mass_threshold) / self.num_clusters
        return float(self.reversal_mass_threshold)

    def exploitation_start(self, num_rounds: int) -> int:
        """First round ``t`` of the exploitation phase of a ``T = num_rounds`` run (``T`` if none)."""
        return int(num_rounds) - int(np.floor(self.exploitation_fraction * int(num_rounds) + 0.5))

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form (controllers as a comma-separated string)."""
        values = asdict(self)
        values["controllers"] = ",".join(self.controllers)
        return values

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "RoutingSettings":
        """Inverse of :meth:`to_dict`; unknown keys raise ``ValueError``."""
        known = {field.name for field in fields(cls)}
        unknown = set(values) - known
        if unknown:
            raise ValueError(f"unknown routing settings {sorted(unknown)}; allowed: {sorted(known)}")
        values = dict(values)
        if isinstance(values.get("controllers"), str):
            values["controllers"] = tuple(c.strip() for c in values["controllers"].split(",") if c.strip())
        return cls(**values)


def _check(condition: bool, name: str, value: Any, allowed: str) -> None:
    if not condition:
        raise invalid(f"routing setting '{name}'", value, allowed)
