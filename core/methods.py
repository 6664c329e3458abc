"""Named methods: the generic default for any model, and the paper's configurations as presets.

``method_settings(method, num_clusters=K)`` gives routing meant for a model the
paper never ran (``docs/algorithm.md``, "The generic default", has every value and
the study behind it).  ``method_settings(method, num_clusters=K, preset=name)`` gives
the paper's configuration of one of its tasks (paper B.1–B.3), unchanged: the
experiments use these presets and reproduce the paper's tables bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Optional

from fedroute.core.settings import RoutingSettings
from fedroute.core.validation import invalid

__all__ = ["METHODS", "REFERENCE_METHODS", "ALL_METHODS", "PRESETS", "PRESET_CONTROLLERS", "GENERIC_DEFAULTS", "method_settings",
           "Method", "REGISTRY", "method_spec", "ALGORITHMS", "ALGORITHM_ROUTING", "ALGORITHM_FEDCAM",
           "ALGORITHM_LOCAL", "GREEDY", "EXP3", "SYNC_ENTRY", "FEDCAM", "FEDAVG", "LOCAL"]

GREEDY = "greedy"
EXP3 = "exp3"
SYNC_ENTRY = "sync-entry"
FEDCAM = "fedcam"
FEDAVG = "fedavg"
LOCAL = "local"

ALGORITHM_ROUTING = "routing"
"""Hard routing over ``K`` cluster models (:class:`fedroute.strategies.clustered.ClusteredRouting`)."""
ALGORITHM_FEDCAM = "fedcam"
"""A global part plus cluster parts, Greedy on the combined predictor (:class:`fedroute.strategies.fedcam.FedCAM`)."""
ALGORITHM_LOCAL = "local"
"""Every client trains its own model alone (:class:`fedroute.strategies.local.LocalTraining`)."""
ALGORITHMS = (ALGORITHM_ROUTING, ALGORITHM_FEDCAM, ALGORITHM_LOCAL)


@dataclass(frozen=True)
class Method:
    """One named method: what it runs, and what each runtime must know about it.

    Attributes
    ----------
    name : str
        The run-config value (``method = name``).
    algorithm : str
        One of :data:`ALGORITHMS`: which server algorithm runs it.
    summary : str
        One line for tables, help texts and docs.
    label : str
        The name figures and result tables show.
    color : str
        Its matplotlib colour in figures.
    reference : bool
        A reference every result is read against (``fedavg``, ``local``): not run by ``method = "all"``.
    greedy_routing : bool
        Routes with Greedy whatever the controller set (``greedy``, ``fedcam``; the references with ``K = 1``).
    synchronized_entry : bool
        Starts with a synchronized entry round.
    single_model : bool
        One model whatever ``K`` (``fedavg`` and ``local``: ``K = 1``).
    shared_models : bool
        Its models are shared by clients (``False`` for ``local``, whose models are each client's own: no
        ``R_T``, no checkpoint of cluster models).
    zero_output_start : bool
        Its global part starts from the task's zero-output model (``fedcam``).
    simulator_full_participation : bool
        The batched simulator runs it with every client every round only (it refuses to replay
        ``fraction_train < 1``).
    """

    name: str
    algorithm: str
    summary: str
    label: str
    color: str
    reference: bool = False
    greedy_routing: bool = False
    synchronized_entry: bool = False
    single_model: bool = False
    shared_models: bool = True
    zero_output_start: bool = False
    simulator_full_participation: bool = False


REGISTRY: dict[str, Method] = {method.name: method for method in (
    Method(GREEDY, ALGORITHM_ROUTING, "Greedy IFCA: every client on its lowest-loss model, ties to the lowest index",
           "Greedy IFCA", "tab:red", greedy_routing=True),
    Method(EXP3, ALGORITHM_ROUTING, "autonomous EXP3 over the routing controllers", "EXP3", "tab:blue"),
    Method(SYNC_ENTRY, ALGORITHM_ROUTING, "synchronized entry, then EXP3", "synchronized entry", "tab:purple",
           synchronized_entry=True),
    Method(FEDCAM, ALGORITHM_FEDCAM, "FedCAM: a global part plus cluster parts, Greedy on the combined predictor",
           "FedCAM", "tab:green", greedy_routing=True, zero_output_start=True, simulator_full_participation=True),
    Method(FEDAVG, ALGORITHM_ROUTING, "FedAvg: one global model", "FedAvg", "tab:gray", reference=True,
           greedy_routing=True, single_model=True),
    Method(LOCAL, ALGORITHM_LOCAL, "Local: every client trains its own model alone", "Local", "tab:olive",
           reference=True, greedy_routing=True, single_model=True, shared_models=False,
           simulator_full_participation=True),
)}
"""Every method, by name: the one place a method's name is written (tests aside)."""

METHODS = tuple(name for name, method in REGISTRY.items() if not method.reference)
"""``greedy``: Greedy IFCA (every client on ``gr`` forever, ties to the lowest index).
``fedcam``: the FedCAM baseline (a global part plus cluster parts, Greedy on the
combined predictor; :class:`fedroute.strategies.fedcam.FedCAM`).
``exp3``: autonomous EXP3 over the controllers (fixed blocks, or actions when
the set contains ``hys``).
``sync-entry``: synchronized entry, then EXP3 (the presets: over ``{gr, hys}`` in
action mode; the generic default: over its own controllers)."""

REFERENCE_METHODS = tuple(name for name, method in REGISTRY.items() if method.reference)
"""The references every result is read against: ``fedavg``, one global model (``K = 1`` through the same
strategy, ClientApp and server update: every client routes to the one model, whose update is FedAvg's
sample-weighted mean); ``local``, every client training its own model alone from the same start
(:class:`fedroute.strategies.local.LocalTraining`).  Both are evaluated like the routing methods.
``method = "all"`` runs :data:`METHODS` only; name the references to add them (``"all,fedavg,local"``
is not a value: write the list, e.g. ``"greedy,exp3,fedavg,local"``)."""

ALL_METHODS = METHODS + REFERENCE_METHODS
"""Every method name a run config accepts."""


def method_spec(name: str) -> Method:
    """The registered :class:`Method` called ``name``; a clear error for any other name."""
    try:
        return REGISTRY[name]
    except (KeyError, TypeError):
        raise invalid("method", name, f"one of {ALL_METHODS}") from None


PRESET_CONTROLLERS = {
    "linear": ("gr", "rh"),
    "gmm": ("gr", "rh"),
    "housing": ("gr", "com", "rev"),
    "characters": ("gr", "hys"),
    "femnist": ("gr", "hys"),
}
"""EXP3 controller sets of the paper's presets (paper B.1)."""

PRESETS = tuple(PRESET_CONTROLLERS)
"""The paper's configurations, by task name."""

PRESET_ENTRY_THRESHOLDS = {"characters": 0.221, "femnist": 0.221}
"""Calibrated entry threshold ``τ`` per preset (0.0 in the other presets).  Characters:
midpoint between the groups' benefits at α = 0.70 on calibration data seeds 10–12
(never the evaluation seeds 0–2); see :func:`fedroute.tasks.characters.calibrate_entry_threshold`."""

SYNC_ENTRY_MAX_ROUNDS = 800
AUTONOMOUS_MAX_ROUNDS = 160

GENERIC_DEFAULTS: dict[str, Any] = dict(
    controllers=("gr", "rh"),
    exp3_mode="block",
    block_length=10,
    exp3_learning_rate=2.0,
    exp3_exploration=0.001,
    rank_hedge_temperature=0.0,
    tie_breaking="random",
    explore_on="collapse",
    collapse_patience=10,
    spare_patience=100,
    consolidate_duplicates=True,
    duplicate_patience=20,
    reseed_empty=True,
    reseed_by_structure=True,
    crowded_by_clients=True,
    reseed_by_signature=True,
    merge_by_signature=True,
    split_copies=True,
    split_near_copies=False,
    restart_idle_spares=True,
    split_silhouette=0.25,
    explore_at_start=False,
    starving_needs_reach=True,
    calm_when_stable=True,
    consolidation_loss_ratio=2.0,
    mass_threshold_unit="fair-share",
    reversal_mass_threshold=0.4,
    mass_threshold_inclusive=True,
    entry_max_candidates=2,
    entry_threshold=0.0,
    hysteresis_max_rounds=AUTONOMOUS_MAX_ROUNDS,
    signature_hold_rounds=10,
    signature_start_on="copies-or-skew",
)
"""The generic default's routing (``exp3`` and ``sync-entry`` without a preset); see
``docs/algorithm.md``, "The generic default", for why each value."""


def method_settings(method: str, *, num_clusters: Optional[int] = None,
                    preset: Optional[str] = None, **overrides: Any) -> RoutingSettings:
    """Routing settings of a named method: the generic default, or a paper preset.

    Parameters
    ----------
    method : str
        One of :data:`ALL_METHODS`.  ``fedavg`` and ``local`` are Greedy on one model
        (``K = 1``; ``num_clusters`` and the routing overrides do not apply).
    num_clusters : int, optional
        ``K`` (default 2).
    preset : str, optional
        ``None`` (the default): settings meant for any model — the generic
        default.  Or one of :data:`PRESETS`: the paper's configuration of that
        task (EXP3 controller set, EXP3 mode, calibrated entry threshold), as
        the paper's experiments use it.
    **overrides
        Any :class:`RoutingSettings` field; ``None`` values are ignored
        (they mean "the method's default").

    Returns
    -------
    RoutingSettings
    """
    spec = method_spec(method)
    if preset is not None and preset not in PRESETS:
        raise invalid("preset", preset, f"None (the generic default) or the name of a paper task: one of {PRESETS}")
    if spec.single_model:
        return RoutingSettings(num_clusters=1, controllers=("gr",))
    chosen = {key: value for key, value in overrides.items() if value is not None}
    if num_clusters is not None:
        chosen["num_clusters"] = num_clusters
    if spec.greedy_routing:
        chosen.pop("controllers", None)  # Greedy IFCA is Greedy whatever the controller set
        chosen.pop("synchronized_entry", None)
        base = RoutingSettings(controllers=("gr",))
    else:
        base = _generic(method) if preset is None else _preset(method, preset)
    if preset in PRESET_ENTRY_THRESHOLDS:
        base = replace(base, entry_threshold=PRESET_ENTRY_THRESHOLDS[preset])
    return replace(base, **chosen)


def _generic(method: str) -> RoutingSettings:
    """The generic default of ``exp3`` or ``sync-entry``."""
    return RoutingSettings(**GENERIC_DEFAULTS, synchronized_entry=method_spec(method).synchronized_entry)


def _preset(method: str, preset: str) -> RoutingSettings:
    """The paper's ``exp3`` or ``sync-entry`` on the task ``preset``."""
    if not method_spec(method).synchronized_entry:
        controllers = PRESET_CONTROLLERS[preset]
        base = RoutingSettings(
            controllers=controllers,
            exp3_mode="action" if "hys" in controllers else "block",
            hysteresis_max_rounds=AUTONOMOUS_MAX_ROUNDS,
        )
    else:
        base = RoutingSettings(
            controllers=("gr", "hys"), exp3_mode="action", synchronized_entry=True,
            hysteresis_max_rounds=SYNC_ENTRY_MAX_ROUNDS,
        )
    return base
