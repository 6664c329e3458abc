"""E4 — Figure 2(e–h) and Appendix B.3: transformed handwritten characters.

The task is :class:`~fedroute.tasks.characters.CharactersTask` (the embedded stand-in for FEMNIST:
scikit-learn's 8×8 digits, 20 clients, 10 clean and 10 whose 6s and 9s are rotated by 180°; width-64 ReLU
MLP; one full-batch SGD step of 0.003 per executed update; ``w_0^0 = w_mix``,
``w_1^0 = (1−α) ξ + α w_trans``).  Nothing here changes the task's settings.

Grid (paper B.3): six ``α`` × data seeds ``{0, 1, 2}``.  Greedy IFCA and FedCAM run once per cell (they
draw nothing: ``selector_seed = −1``); autonomous EXP3 and synchronized entry with selector seeds
``{0, 1, 2}`` (the routing seed of the simulator) → 144 runs, ``T = 800``.  Routing (the ``characters``
preset): ``H_min = 5``, ``ε_exit = 0.005``, ``μ_rev = 0.20``, ``η_EXP3 = 2``, ``γ = 0.001``, EXP3 in action
mode over ``{gr, hys}``; ``H_max`` 800 (synchronized entry) / 160 (EXP3); the entry threshold is the
calibrated ``τ = 0.221`` (data seeds 10–12, never the evaluation seeds; the paper's ``τ = −0.7`` belongs to
its own benefit statistic).  FedCAM is CAM's output-sum predictor ``h(x; Θ_glob) + f(x; Θ_k)``
(:data:`FEDCAM_FORM`).  ``--config long``: the same grid at ``T = 2400``.

Tables (columns: docs/experiments.md): ``runs`` (controller-free at ``W^T``, the recovery levels of B.3,
round-zero facts; only ``W^0`` and ``W^{T−19} … W^T`` are kept from the sweep: the full trajectory of the
grid would be ≈ 4.4 GB), ``recovery`` (per method and α), ``round_zero`` (the audit per α and data seed)
and ``rounds`` (the representative run, α = 0.60, data seed 1, selector seed 0, re-simulated alone per
method with every state kept).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np
import pandas as pd
from numpy.typing import NDArray

from fedroute.simulation.experiments.kit import (
    Experiment, ExperimentConfig, Results, RunLosses, Sweep, Variant, by_value, claim, not_run, number,
    register, simulate_fedcam, task_settings)
from fedroute.simulation.fedcam import FedCAMTask
from fedroute.core.metrics import (
    assignment_accuracy, femnist_recovery_levels, group_routing_matrix, usable_models)
from fedroute.simulation.experiments.references import reference_panel, reference_runs, reference_table
from fedroute.simulation.plotting import Panel
from fedroute.simulation.simulator import BatchHistory, concatenate_clients, simulate_batch
from fedroute.simulation.sweep import SweepSpec
from fedroute.core.methods import EXP3, FEDCAM, GREEDY, SYNC_ENTRY, method_settings
from fedroute.tasks.characters import ALPHAS, AUDIT_SEEDS, ENTRY_THRESHOLD, CharactersTask, round_zero_audit

__all__ = ["CharactersExperimentConfig", "METHODS", "RUNS_COLUMNS", "RECOVERY_COLUMNS", "ROUNDS_COLUMNS",
           "make_characters_task", "reduce_characters", "method_spec", "horizon_check", "characters_claims",
           "EXPERIMENT"]

LONG_HORIZON_FACTOR = 3
"""``--config long``: ``T`` (and the hysteresis caps) times this factor."""
METHODS = (GREEDY, FEDCAM, EXP3, SYNC_ENTRY)
"""The four methods of E4; ``greedy`` and ``fedcam`` have no selector seed."""
BASELINES = (GREEDY, FEDCAM)
NO_SELECTOR = -1
"""``selector_seed`` of the baselines (they draw nothing)."""
RUNS_COLUMNS = (
    "method", "alpha", "data_seed", "selector_seed", "k_train", "k_test", "accuracy_train", "accuracy_test",
    "training", "joint", "sustained", "exact", "two_usable_test", "rounds_both_routed", "clusters_updated",
    "round0_clusters", "round0_k_test", "round0_attraction", "round0_entrants_clean", "round0_entrants_transformed",
    "episodes_entered", "last_to_cluster1_clean", "last_to_cluster1_transformed", "final_gr_probability",
    "eval_train_loss", "eval_test_loss")
RECOVERY_COLUMNS = ("method", "alpha", "runs", "pr_two_usable_test", "training", "joint", "sustained", "exact",
                    "mean_accuracy_train", "mean_accuracy_test", "mean_rounds_both_routed")

ROUNDS_COLUMNS = (
    "method", "alpha", "data_seed", "selector_seed", "round", "route_clusters",
    "k_train", "k_test", "accuracy_train", "accuracy_test", "to_cluster1_clean", "to_cluster1_transformed",
)
"""Columns of ``rounds.*``: the representative run, one row per (method, ``t = 0..T``)."""


@dataclass(frozen=True)
class CharactersExperimentConfig(ExperimentConfig):
    """Settings of E4; every default is the paper's (B.3) or the task's own.  ``representative``: the run of
    panels (f–h) as ``(α, data seed, selector seed)``; ``task``: overrides of :class:`CharactersTask`'s
    defaults (``alpha``/``seed`` come from the grid); ``sustained_window``: the states ``W^{T−w+1} … W^T``
    of the sustained level; ``sync_entry_max_rounds`` / ``exp3_max_rounds``: ``H_max``; ``chunk_sizes``:
    runs simulated together per method (results do not depend on it)."""

    LABEL = "characters"
    QUICK = dict(alphas=(0.55, 0.70), data_seeds=(0,), selector_seeds=(0,), rounds=60, representative=(0.70, 0, 0),
                 name="E4-characters-quick")
    RULES = dict(alphas="[0, 1] distinct", data_seeds="≥ 0 distinct", selector_seeds="≥ 0 distinct", rounds="≥ 2",
                 sustained_window="≥ 1", sync_entry_max_rounds="", exp3_max_rounds="", methods=METHODS)

    alphas: tuple[float, ...] = ALPHAS
    data_seeds: tuple[int, ...] = AUDIT_SEEDS
    selector_seeds: tuple[int, ...] = (0, 1, 2)
    rounds: int = 800
    sustained_window: int = 20
    representative: tuple[float, int, int] = (0.60, 1, 0)
    task: Mapping[str, Any] = field(default_factory=dict)
    hysteresis_min_rounds: int = 5
    hysteresis_exit_gap: float = 0.005
    reversal_mass_threshold: float = 0.20
    entry_threshold: float = ENTRY_THRESHOLD
    exp3_learning_rate: float = 2.0
    exp3_exploration: float = 0.001
    sync_entry_max_rounds: int = 800
    exp3_max_rounds: int = 160
    methods: tuple[str, ...] = METHODS
    chunk_sizes: tuple[tuple[str, int], ...] = ((GREEDY, 18), (FEDCAM, 18), (EXP3, 27), (SYNC_ENTRY, 27))
    name: str = "E4-characters"
    version: str = "1"

    def validate(self) -> None:
        try:
            alpha, data_seed, selector_seed = self.representative
            object.__setattr__(self, "representative", (float(alpha), int(data_seed), int(selector_seed)))
            object.__setattr__(self, "chunk_sizes", tuple((str(m), int(c)) for m, c in self.chunk_sizes))
        except (TypeError, ValueError):
            self.fail("representative/chunk_sizes", (self.representative, self.chunk_sizes),
                      "(alpha, data seed, selector seed) and (method, size) pairs")
        chunks = dict(self.chunk_sizes)
        self.check([
            (self.sustained_window <= self.rounds + 1, "sustained_window", self.sustained_window,
             f"1..{self.rounds + 1}"),
            (all(chunks.get(m, 0) >= 1 for m in self.methods), "chunk_sizes", self.chunk_sizes,
             "a size ≥ 1 for every method"),
        ])
        CharactersTask(**self.task)  # the task validates its own settings
        for method in self.methods:
            self.routing(method)

    def cells(self, method: str) -> list[dict[str, Any]]:
        """The cells of a method, α-major then data seed then selector seed; ``seed`` is the routing seed
        (the selector seed; 0 for the baselines, which draw nothing)."""
        selectors = (NO_SELECTOR,) if method in BASELINES else self.selector_seeds
        return [{"alpha": alpha, "data_seed": data_seed, "selector_seed": selector, "seed": max(selector, 0)}
                for alpha in self.alphas for data_seed in self.data_seeds for selector in selectors]

    def routing(self, method: str):
        """The method's :class:`RoutingSettings` on the characters task, with this config's values."""
        overrides: dict[str, Any] = dict(
            num_clusters=2, hysteresis_min_rounds=self.hysteresis_min_rounds,
            hysteresis_exit_gap=self.hysteresis_exit_gap, reversal_mass_threshold=self.reversal_mass_threshold,
            entry_threshold=self.entry_threshold, exp3_learning_rate=self.exp3_learning_rate,
            exp3_exploration=self.exp3_exploration)
        if method in (SYNC_ENTRY, EXP3):
            overrides["hysteresis_max_rounds"] = (self.sync_entry_max_rounds if method == SYNC_ENTRY
                                                  else self.exp3_max_rounds)
        return method_settings(method, preset="characters", **overrides)

    def kept_rounds(self) -> list[int]:
        """States kept from the sweep: ``W^0`` and the sustained window ``W^{T−w+1} … W^T``."""
        return sorted({0, *range(self.rounds - self.sustained_window + 1, self.rounds + 1)})

    def derived(self) -> dict[str, Any]:
        return {"runs": {m: len(self.cells(m)) for m in self.methods},
                "task_settings": task_settings(partial(make_characters_task, **self.task), self.cells(self.methods[0])),
                "total_runs": sum(len(self.cells(m)) for m in self.methods),
                "routing": {m: self.routing(m).to_dict() for m in self.methods}, "kept_model_rounds": self.kept_rounds(),
                FEDCAM: FEDCAM_FORM, "data": "embedded: scikit-learn load_digits (8x8, 1,797 images) for FEMNIST"}


def long_horizon(config: CharactersExperimentConfig) -> CharactersExperimentConfig:
    """``--config long``: the same grid at ``LONG_HORIZON_FACTOR`` × ``T`` (paper: 2400) with both hysteresis
    caps scaled alike, keeping the paper's ratios to ``T``: synchronized entry ``H_max = T`` (the round-0 entry
    episode can only end by the competitiveness exit within the horizon, as at 800/800) and autonomous EXP3
    ``H_max = T/5`` (160 of 800).  Every other setting, the sustained window and the representative run stay."""
    factor = LONG_HORIZON_FACTOR
    return replace(config, rounds=factor * config.rounds, sync_entry_max_rounds=factor * config.sync_entry_max_rounds,
                   exp3_max_rounds=factor * config.exp3_max_rounds, name=f"{config.name}-long")


FEDCAM_FORM = (
    "FedCAM with CAM's output-sum predictor h(x; Theta_glob) + f(x; Theta_k): the logits of a global MLP and of "
    "the client's cluster MLP are added; Greedy assignment on the combined predictor; each client takes one joint "
    "SGD step on both parts (learning rate 0.003 / 2 per part: for a predictor linear in its parameters this is the "
    "additive form's step); Theta_glob averaged over all clients, Theta_k over its cluster; Theta_glob starts at "
    "zero output (xi's hidden layer, zero output layer), so W^0 is the other methods' start."
)


def make_characters_task(cell: dict[str, Any], **task_settings: Any) -> CharactersTask:
    """The task of a cell: ``alpha = cell["alpha"]``, data seed ``cell["data_seed"]``."""
    return CharactersTask(alpha=float(cell["alpha"]), seed=int(cell["data_seed"]), **task_settings)


def _state_losses(clients: Any, states: NDArray[np.floating], split: str, per_call: int = 64) -> NDArray[np.float64]:
    """Losses of every client at every state: ``states`` (S, K, P) → (S, n, K).

    States are scored ``per_call`` at a time on copies of the client batch (the
    per-client-models kernel of the task)."""
    states = np.asarray(states)
    num_states, num_clients = len(states), len(clients.client_ids)
    out = np.empty((num_states, num_clients, states.shape[1]))
    replicated: dict[int, Any] = {}
    for start in range(0, num_states, per_call):
        chunk = states[start:start + per_call]
        size = len(chunk)
        if size not in replicated:
            replicated[size] = concatenate_clients([clients] * size)
        models = np.repeat(chunk, num_clients, axis=0)                 # (size·n, K, P)
        out[start:start + size] = replicated[size].losses(models, split).reshape(size, num_clients, -1)
    return out


def reduce_characters(history: BatchHistory, tasks: Sequence[CharactersTask], cells: Sequence[dict[str, Any]], *,
                      num_rounds: int, window: int) -> pd.DataFrame:
    """One row per cell of a simulated chunk (:data:`RUNS_COLUMNS` without ``method``).

    ``history.cluster_models`` holds ``W^0`` and the window ``W^{T−window+1} … W^T``
    (or every state; the needed ones are picked either way)."""
    kept = sorted({0, *range(num_rounds - window + 1, num_rounds + 1)})
    models = history.cluster_models
    if len(models) == num_rounds + 1 and len(kept) != num_rounds + 1:
        models = models[kept]
    if len(models) != len(kept):
        raise ValueError(f"expected the states {kept[0]}, {kept[1]}..{kept[-1]} (or all {num_rounds + 1}), "
                         f"got {len(models)} states")
    final_window = models[-window:]                                   # (w, R, K, P)
    num_clusters = models.shape[2]
    losses = RunLosses(tasks)
    initial_train, initial_test = losses(models[0], "train"), losses(models[0], "test")
    train = np.stack([losses(state, "train") for state in final_window])   # (w, R, n, K)
    test = np.stack([losses(state, "test") for state in final_window])
    counts = history.route_counts                                     # (T, R, K)
    routed_clusters = (counts > 0).sum(axis=2)                       # (T, R)
    routes = history.routes.astype(np.int64)                          # (T, R, n)
    arms = history.mean_arm_probabilities
    rows = []
    for r, cell in enumerate(cells):
        groups = history.groups[r]
        k_train = np.asarray(usable_models(train[:, r]))              # (w,)
        k_test = np.asarray(usable_models(test[:, r]))
        accuracy_train = assignment_accuracy(train[-1, r], groups, num_clusters, 2)
        accuracy_test = assignment_accuracy(test[-1, r], groups, num_clusters, 2)
        levels = femnist_recovery_levels(k_train, k_test, accuracy_train, accuracy_test, window=window)
        greedy0 = np.argmin(initial_train[r], axis=1)
        attraction = group_routing_matrix(greedy0, groups, num_clusters, 2)
        off_greedy = routes[0, r] != greedy0
        last = group_routing_matrix(routes[-1, r], groups, num_clusters, 2)
        rows.append({
            "alpha": float(cell["alpha"]), "data_seed": int(cell["data_seed"]),
            "selector_seed": int(cell["selector_seed"]),
            "k_train": int(k_train[-1]), "k_test": int(k_test[-1]),
            "accuracy_train": float(accuracy_train), "accuracy_test": float(accuracy_test),
            **levels, "two_usable_test": bool(k_test[-1] == 2),
            "rounds_both_routed": int((routed_clusters[:, r] == num_clusters).sum()),
            "clusters_updated": int((counts[:, r].sum(axis=0) > 0).sum()),
            "round0_clusters": int(len(np.unique(greedy0))),
            "round0_k_test": int(usable_models(initial_test[r])),
            "round0_attraction": json.dumps(np.round(attraction, 6).tolist()),
            "round0_entrants_clean": int((off_greedy & (groups == 0)).sum()),
            "round0_entrants_transformed": int((off_greedy & (groups == 1)).sum()),
            "episodes_entered": int(history.entered[:, r].sum()),
            "last_to_cluster1_clean": float(last[0, 1]), "last_to_cluster1_transformed": float(last[1, 1]),
            "final_gr_probability": float(arms[-1, r, 0]) if arms.shape[-1] else float("nan"),
            "eval_train_loss": float(train[-1, r].min(axis=1).mean()),
            "eval_test_loss": float(test[-1, r].min(axis=1).mean()),
        })
    return pd.DataFrame(rows)


def make_fedcam_task(cell: dict[str, Any], **task_settings: Any) -> FedCAMTask:
    """FedCAM's view of a cell's task: models are the pairs ``[Θ_glob | Θ_k]`` (:class:`FedCAMTask`)."""
    return FedCAMTask(make_characters_task(cell, **task_settings))


def method_spec(method: str, config: CharactersExperimentConfig, model_rounds: Optional[Sequence[int]] = None,
                ) -> SweepSpec:
    """A method of E4 as a sweep spec (FedCAM with its own simulator); ``model_rounds`` defaults to the kept states."""
    kept = config.kept_rounds() if model_rounds is None else list(model_rounds)
    fedcam = method == FEDCAM
    return SweepSpec(
        method=method,
        settings=config.routing(method),
        num_rounds=config.rounds,
        make_task=partial(make_fedcam_task if fedcam else make_characters_task, **config.task),
        reduce=partial(reduce_characters, num_rounds=config.rounds, window=config.sustained_window),
        seed_key="seed",
        simulate=partial(simulate_fedcam if fedcam else simulate_batch, model_rounds=kept),
    )



def _recovery(runs: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for (method, alpha), cell in runs.groupby(["method", "alpha"], sort=False):
        rows.append({
            "method": method, "alpha": alpha, "runs": len(cell),
            "pr_two_usable_test": float(cell["two_usable_test"].mean()),
            **{level: int(cell[level].sum()) for level in ("training", "joint", "sustained", "exact")},
            "mean_accuracy_train": cell["accuracy_train"].mean(), "mean_accuracy_test": cell["accuracy_test"].mean(),
            "mean_rounds_both_routed": cell["rounds_both_routed"].mean(),
        })
    return pd.DataFrame(rows, columns=list(RECOVERY_COLUMNS))


def trajectories(config: CharactersExperimentConfig, method: str, cells: Sequence[dict[str, Any]],
                 kept: Sequence[int], selector_seed: int) -> pd.DataFrame:
    """Re-simulate ``cells`` of a method (one batch, routing seed ``selector_seed``; 0 for the baselines) keeping
    the states ``kept``: per cell and kept ``t``, ``k_train``/``k_test`` and the assignment accuracies of
    ``W^t``, the transformed group's mean training loss of each model, and of round ``t`` (NaN at ``t = T``)
    the clusters updated (``route_clusters``) and each group's executed share routed to cluster 1."""
    spec = method_spec(method, config, model_rounds=kept)
    tasks = [spec.make_task(cell) for cell in cells]
    history = spec.simulate(tasks, spec.settings, config.rounds, [0 if method in BASELINES else selector_seed] * len(tasks))
    routed = [t for t in kept if t < config.rounds]
    frames = []
    for r, (cell, task) in enumerate(zip(cells, tasks)):
        clients = task.clients(np.arange(task.num_clients))
        groups, states = clients.groups, history.cluster_models[:, r]             # (S, K, P)
        train, test = _state_losses(clients, states, "train"), _state_losses(clients, states, "test")
        to_one = np.stack([group_routing_matrix(history.routes[t, r].astype(np.int64), groups, 2, 2)[:, 1]
                           for t in routed])                                          # (S', 2)
        pad = np.full(len(kept) - len(routed), np.nan)
        frames.append(pd.DataFrame({
            "method": method, "alpha": cell["alpha"], "data_seed": cell["data_seed"],
            "selector_seed": NO_SELECTOR if method in BASELINES else selector_seed, "round": list(kept),
            "route_clusters": np.concatenate([(history.route_counts[routed, r] > 0).sum(axis=1).astype(float), pad]),
            "k_train": np.asarray(usable_models(train)), "k_test": np.asarray(usable_models(test)),
            "accuracy_train": np.array([assignment_accuracy(losses, groups, 2, 2) for losses in train]),
            "accuracy_test": np.array([assignment_accuracy(losses, groups, 2, 2) for losses in test]),
            "loss_transformed_w0": train[:, groups == 1, 0].mean(axis=1),
            "loss_transformed_w1": train[:, groups == 1, 1].mean(axis=1),
            "to_cluster1_clean": np.concatenate([to_one[:, 0], pad]),
            "to_cluster1_transformed": np.concatenate([to_one[:, 1], pad]),
        }))
    return pd.concat(frames, ignore_index=True)


def _representative_rounds(config: CharactersExperimentConfig, runs: pd.DataFrame
                           ) -> tuple[pd.DataFrame, dict[str, Any]]:
    """The representative run re-simulated alone per method with every state kept, and whether it ends as the
    sweep's run of that cell did."""
    alpha, data_seed, selector_seed = config.representative
    table = pd.concat([trajectories(config, method, [{"alpha": alpha, "data_seed": data_seed}],
                                    list(range(config.rounds + 1)), selector_seed) for method in config.methods],
                      ignore_index=True)
    matches = {}
    for method, series in table.groupby("method", sort=False):
        final = series.iloc[-1]
        row = runs[(runs["method"] == method) & (runs["alpha"] == alpha) & (runs["data_seed"] == data_seed)
                   & (runs["selector_seed"] == final["selector_seed"])]
        matches[method] = None if len(row) != 1 else bool(all(
            row[key].iloc[0] == final[key] for key in ("k_train", "k_test", "accuracy_train", "accuracy_test")))
    facts = {"alpha": alpha, "data_seed": data_seed, "selector_seed": selector_seed,
             "rerun_matches_sweep": matches, "in_grid": any(v is not None for v in matches.values())}
    return table[list(ROUNDS_COLUMNS)], facts


def horizon_check(config: Optional[CharactersExperimentConfig] = None, methods: Sequence[str] = (SYNC_ENTRY, EXP3),
                  alphas: Optional[Sequence[float]] = None, data_seed: int = 1, selector_seed: int = 0,
                  rounds: int = 2400, every: int = 50) -> pd.DataFrame:
    """Diagnostic (not part of the reproduction): the runs of one data and selector seed (at ``alphas``, default
    the config's) continued past ``T`` with every other setting ``config``'s (synchronized entry's
    ``H_max = 800`` then releases its round-0 entrants at round 800); :func:`trajectories` at
    ``t = 0, every, …, rounds``."""
    config = replace(config or CharactersExperimentConfig(), rounds=rounds, sustained_window=1)
    kept = list(range(0, rounds + 1, every)) + ([rounds] if rounds % every else [])
    cells = [{"alpha": float(a), "data_seed": data_seed} for a in (config.alphas if alphas is None else alphas)]
    table = pd.concat([trajectories(config, method, cells, kept, selector_seed) for method in methods],
                      ignore_index=True)
    return table.drop(columns=["route_clusters", "to_cluster1_clean"])


PAPER_JOINT = (42, 54)
"""Synchronized-entry runs with two usable models on both splits at W^800 (paper)."""
PAPER_FINAL_ACCURACY = 0.95
ACCURACY_TOLERANCE = 0.05


def _levels(runs: pd.DataFrame, method: str) -> dict[str, int]:
    part = runs[runs["method"] == method]
    return {"runs": int(len(part)), **{level: int(part[level].sum())
                                       for level in ("training", "joint", "sustained", "exact")},
            "two_usable_test": int(part["two_usable_test"].sum())}


def _stretch_start(values: NDArray, level: int) -> Optional[int]:
    """First ``t`` from which ``values[t:] == level`` throughout (None if the last value differs)."""
    values = np.asarray(values)
    if values[-1] != level:
        return None
    differ = np.nonzero(values != level)[0]
    return int(differ[-1] + 1) if differ.size else 0


Claim = dict[str, Any]
_REPRESENTATIVE_PAPER = ("Panel (h): synchronized entry raises the assignment accuracy from 1/2 to 0.95 at the final "
                         "plotted state W^799, while autonomous EXP3 remains at 1/2.")


def _stays_one_model(results: Results, config: CharactersExperimentConfig, method: str, name: str) -> Claim:
    """A baseline ends with one held-out-usable model in every run."""
    runs, recovery = results.runs, results.recovery
    paper = "Panel (e): Greedy IFCA and FedCAM remain at zero (one usable model at W^800)."
    text = f"{name} stays at one usable model: K_te(W^{config.rounds}) = 1 in every run"
    if method not in set(runs["method"]):
        return not_run(text, paper, method)
    part = runs[runs["method"] == method]
    measured: dict[str, Any] = {
        "pr_two_usable_test_by_alpha": by_value(recovery, method, "alpha", "pr_two_usable_test"),
        "k_test_histogram": {str(k): int(c) for k, c in part["k_test"].value_counts().sort_index().items()},
        "k_train_histogram": {str(k): int(c) for k, c in part["k_train"].value_counts().sort_index().items()},
        "runs_with_both_clusters_ever_updated": int((part["clusters_updated"] == 2).sum()),
        "k_test_2_already_at_W0": int(((part["k_test"] == 2) & (part["round0_k_test"] == 2)).sum()),
    }
    if method == FEDCAM:
        measured["form"] = FEDCAM_FORM
    return claim(text, paper, measured, bool((part["k_test"] == 1).all()))


def _sync_entry_recovers_from(results: Results, config: CharactersExperimentConfig) -> Claim:
    """Synchronized entry has two usable models in every run from α = 0.55."""
    recovery = results.recovery
    paper = "Synchronized entry reaches a recovery fraction of one from alpha = 0.55 onward."
    text = "Synchronized entry: fraction of runs with K_te(W^T) = 2 equals 1 at every alpha >= 0.55"
    if SYNC_ENTRY not in set(results.runs["method"]):
        return not_run(text, paper, SYNC_ENTRY)
    rates = recovery[recovery["method"] == SYNC_ENTRY].set_index("alpha")["pr_two_usable_test"]
    upper = rates[rates.index >= 0.55 - 1e-9]
    return claim(text, paper, {
        "pr_two_usable_test_by_alpha": by_value(recovery, SYNC_ENTRY, "alpha", "pr_two_usable_test"),
        "smallest_alpha_from_which_all_recover": next(
            (float(a) for a in sorted(rates.index) if (rates[rates.index >= a] == 1).all()), None),
    }, bool(len(upper) and (upper == 1).all()))


def _exp3_improves_with_alpha(results: Results, config: CharactersExperimentConfig) -> Claim:
    """Autonomous EXP3 recovers more often at the largest α than at the smallest."""
    recovery = results.recovery
    paper = "Autonomous EXP3 improves with alpha (panel e)."
    text = "Autonomous EXP3: fraction with K_te(W^T) = 2 is larger at the largest alpha than at the smallest"
    if EXP3 not in set(results.runs["method"]):
        return not_run(text, paper, EXP3)
    rates = recovery[recovery["method"] == EXP3].set_index("alpha")["pr_two_usable_test"].sort_index()
    return claim(text, paper, {
        "pr_two_usable_test_by_alpha": by_value(recovery, EXP3, "alpha", "pr_two_usable_test"),
        "non_decreasing_in_alpha": bool(np.all(np.diff(rates.to_numpy()) >= 0)),
        "levels": _levels(results.runs, EXP3),
    }, bool(len(rates) > 1 and rates.iloc[-1] > rates.iloc[0]))


def _sync_entry_joint(results: Results, config: CharactersExperimentConfig) -> Claim:
    """Synchronized entry's joint recoveries reach the paper's share; the four levels are reported."""
    runs, methods = results.runs, set(results.runs["method"])
    paper = (f"At W^800, {PAPER_JOINT[0]} of the {PAPER_JOINT[1]} synchronized-entry configurations have two usable "
             "models on both training and held-out data.")
    text = (f"Synchronized entry: at least {PAPER_JOINT[0]}/{PAPER_JOINT[1]} of runs have two usable models on both "
            "splits at W^T (joint recovery); the four recovery levels are reported")
    if SYNC_ENTRY not in methods:
        return not_run(text, paper, SYNC_ENTRY)
    levels = _levels(runs, SYNC_ENTRY)
    part = results.recovery[results.recovery["method"] == SYNC_ENTRY].set_index("alpha")
    return claim(text, paper, {
        **levels, "paper_joint": f"{PAPER_JOINT[0]} of {PAPER_JOINT[1]}",
        "mean_round0_entrants_by_alpha": {
            f"{a:g}": {"clean": number(t["round0_entrants_clean"].mean()),
                       "transformed": number(t["round0_entrants_transformed"].mean())}
            for a, t in runs[runs["method"] == SYNC_ENTRY].groupby("alpha")},
        "by_alpha": {f"{a:g}": {level: int(part.loc[a, level]) for level in
                                ("runs", "training", "joint", "sustained", "exact")} for a in part.index},
        "other_methods": {m: _levels(runs, m) for m in config.methods if m != SYNC_ENTRY and m in methods},
    }, bool(levels["runs"] and levels["joint"] / levels["runs"] >= PAPER_JOINT[0] / PAPER_JOINT[1]))


def _round_zero_pattern(results: Results, config: CharactersExperimentConfig) -> Claim:
    """Both groups prefer cluster 0 at ``W^0`` in every (α, data seed) cell."""
    audit = results.round_zero
    return claim(
        f"Round-zero audit: A^0 = [[1,0],[1,0]] (both groups prefer cluster 0 on training losses at W^0) in all "
        f"{len(audit)} (alpha, data seed) cells",
        "In all 18 cells both groups prefer cluster 0, so A^0 = [[1,0],[1,0]], K_0 = 1.",
        {"cells": int(len(audit)), "paper_pattern": int(audit["paper_pattern"].sum()),
         "K0_histogram": {str(k): int(c) for k, c in audit["K0"].value_counts().sort_index().items()},
         "cells_not_matching": audit.loc[~audit["paper_pattern"], ["alpha", "data_seed"]].to_dict("records")},
        audit["paper_pattern"].all())


def _representative(results: Results) -> tuple[str, dict[str, pd.DataFrame]]:
    """The representative run's description and its per-round table by method."""
    rep = results.representative_run
    where = (f"representative run (alpha = {rep['alpha']:g}, data seed {rep['data_seed']}, selector seed "
             f"{rep['selector_seed']})")
    return where, {m: t.sort_values("round") for m, t in results.rounds.groupby("method")}


def _routed_both(series: dict[str, pd.DataFrame]) -> dict[str, int]:
    return {m: int((t["route_clusters"].iloc[:-1] == 2).sum()) for m, t in series.items()}


def _sync_entry_routes_both(results: Results, config: CharactersExperimentConfig) -> Claim:
    """The representative run: synchronized entry updates both models in every round."""
    (where, series), T = _representative(results), config.rounds
    paper = ("Panel (f): synchronized entry routes updates to both models throughout the 800 rounds, autonomous "
             "EXP3 does so in 798 rounds, and the baselines use one model.")
    text = f"{where}: synchronized entry routes to both models in every round t = 0..{T - 1}"
    if SYNC_ENTRY not in series:
        return not_run(text, paper, SYNC_ENTRY)
    routed = _routed_both(series)
    return claim(text, paper, {"rounds_both_routed": routed, "rounds": T}, bool(routed[SYNC_ENTRY] == T))


def _sync_entry_keeps_two(results: Results, config: CharactersExperimentConfig) -> Claim:
    """The representative run: synchronized entry reaches two training-usable models and keeps them."""
    where, series = _representative(results)
    paper = ("Panel (g): autonomous EXP3 remains at one usable model, whereas synchronized entry reaches two at "
             "W^612 and retains both through the plotted horizon.")
    text = f"{where}: synchronized entry reaches K_tr(W^t) = 2 at some t and keeps it through W^{config.rounds}"
    if SYNC_ENTRY not in series:
        return not_run(text, paper, SYNC_ENTRY)
    measured = {}
    for method, table in series.items():
        k = table["k_train"].to_numpy()
        reached = np.nonzero(k == 2)[0]
        measured[method] = {"first_t_with_k_train_2": int(reached[0]) if reached.size else None,
                            "kept_from_t": _stretch_start(k, 2), "max_k_train": int(k.max()),
                            "k_train_final": int(k[-1]), "k_test_final": int(table["k_test"].iloc[-1])}
    return claim(text, paper, measured, measured[SYNC_ENTRY]["kept_from_t"] is not None)


def _sync_entry_accuracy(results: Results, config: CharactersExperimentConfig) -> Claim:
    """The representative run: synchronized entry's final training-split assignment accuracy."""
    (where, series), T = _representative(results), config.rounds
    text = (f"{where}: synchronized entry's training-split assignment accuracy at W^{T - 1} is "
            f"{PAPER_FINAL_ACCURACY} ± {ACCURACY_TOLERANCE} (from 1/2 at W^0)")
    if SYNC_ENTRY not in series:
        return not_run(text, _REPRESENTATIVE_PAPER, SYNC_ENTRY)
    measured = {method: {"A_0": number(t["accuracy_train"].iloc[0]),
                         f"A_{T - 1}": number(t["accuracy_train"].iloc[-2]),
                         f"A_{T}": number(t["accuracy_train"].iloc[-1]),
                         f"A_test_{T}": number(t["accuracy_test"].iloc[-1]),
                         "max_A": number(t["accuracy_train"].max())} for method, t in series.items()}
    final = float(series[SYNC_ENTRY]["accuracy_train"].iloc[-2])
    return claim(text, _REPRESENTATIVE_PAPER, measured,
                 bool(abs(final - PAPER_FINAL_ACCURACY) <= ACCURACY_TOLERANCE + 1e-12))


def _exp3_stays_one_model(results: Results, config: CharactersExperimentConfig) -> Claim:
    """The representative run: autonomous EXP3 never has two training-usable models."""
    where, series = _representative(results)
    text = f"{where}: autonomous EXP3 stays at one usable model (K_tr(W^t) = 1 for every t) and A_t = 1/2"
    paper = _REPRESENTATIVE_PAPER.replace("Panel (h)", "Panels (g, h)")
    if EXP3 not in series:
        return not_run(text, _REPRESENTATIVE_PAPER, EXP3)
    table = series[EXP3]
    return claim(text, paper, {
        "max_k_train": int(table["k_train"].max()), "rounds_with_k_train_2": int((table["k_train"] == 2).sum()),
        "max_accuracy_train": number(table["accuracy_train"].max()),
        "rounds_both_routed": _routed_both(series)[EXP3],
    }, bool((table["k_train"] == 1).all() and (table["accuracy_train"] == 0.5).all()))


CHARACTERS_CLAIMS: tuple[Callable[[Results, CharactersExperimentConfig], Claim], ...] = (
    partial(_stays_one_model, method=GREEDY, name="Greedy IFCA"), partial(_stays_one_model, method=FEDCAM, name="FedCAM"),
    _sync_entry_recovers_from, _exp3_improves_with_alpha, _sync_entry_joint, _round_zero_pattern,
    _sync_entry_routes_both, _sync_entry_keeps_two, _sync_entry_accuracy, _exp3_stays_one_model)
"""The E4 claims, in the order of ``claims.json``."""


def characters_claims(results: Results, config: CharactersExperimentConfig) -> list[Claim]:
    """The E4 claims (``holds`` None: the method was not run)."""
    return [check(results, config) for check in CHARACTERS_CLAIMS]


def _run(config: CharactersExperimentConfig, sweep: Sweep) -> Results:
    """The sweep of every method, the round-zero audit and the representative run."""
    tables = sweep.many([([method_spec(method, config)], config.cells(method), dict(config.chunk_sizes)[method])
                         for method in config.methods])
    runs = pd.concat(tables, ignore_index=True)[list(RUNS_COLUMNS)]
    audit = round_zero_audit(config.alphas, config.data_seeds, task=CharactersTask(**config.task))
    rounds, representative = _representative_rounds(config, runs)
    references = reference_runs(sweep, partial(make_characters_task, **config.task), config.rounds, 2,
                                config.cells(BASELINES[0]), ("alpha", "data_seed"), dict(config.chunk_sizes)[GREEDY])
    return Results({"runs": runs, "recovery": _recovery(runs), "round_zero": audit, "rounds": rounds,
                    "references": references}, representative_run=representative)


def _panel_e_table(results: Results) -> pd.DataFrame:
    """Panel (e) per α and method, the joint recoveries of the adaptive methods and synchronized entry's mean
    round-0 entrants (transformed clients)."""
    recovery, runs = results.recovery, results.runs
    table = recovery.pivot(index="alpha", columns="method", values="pr_two_usable_test")
    table = table[[m for m in dict.fromkeys(recovery["method"])]]
    for method in (EXP3, SYNC_ENTRY):
        part = recovery[recovery["method"] == method].set_index("alpha")
        if len(part):
            table[f"{method} joint"] = [f"{j}/{n}" for j, n in zip(part["joint"], part["runs"])]
    sync = runs[runs["method"] == SYNC_ENTRY]
    if len(sync):
        table["sync-entry entrants"] = sync.groupby("alpha")["round0_entrants_transformed"].mean()
    return table.reset_index()


def _levels_table(results: Results) -> pd.DataFrame:
    runs = results.runs
    totals = runs.groupby("method", sort=False)[["training", "joint", "sustained", "exact", "two_usable_test"]].sum()
    totals.insert(0, "runs", runs.groupby("method", sort=False).size())
    return totals.reset_index()


_STYLES = {EXP3: {"label": "autonomous EXP3 {gr, hys}", "offset": 0.015}, GREEDY: {"offset": -0.045},
           FEDCAM: {"offset": -0.015}, SYNC_ENTRY: {"offset": 0.045}}


def _where(tag: str, offset: bool = True) -> Any:
    def title(results: Results, config: CharactersExperimentConfig) -> str:
        rep = results.representative_run
        return (f"{tag} α = {rep['alpha']:g}, data seed {rep['data_seed']}, selector seed {rep['selector_seed']}"
                + (" (lines offset)" if offset else ""))
    return title


def _trajectory(results: Results) -> pd.DataFrame:
    """The representative run's pre-update trajectory ``W^0 … W^{T−1}``."""
    return results.rounds[results.rounds["round"] < results.rounds["round"].max()]


_ROUNDS = dict(data=_trajectory, x="round", xlabel="round $t$", step=True, marker=None)
EXPERIMENT = register(Experiment(
    name="characters", title="E4, Figures 2(e-h) and B.3: transformed handwritten characters",
    config=CharactersExperimentConfig, run=_run, claims=characters_claims,
    panels=[
        Panel("fig2e", "recovery", "alpha", "pr_two_usable_test", r"interpolation $\alpha$ of the unused model",
              r"fraction with $K^{\mathrm{eval}}_T = 2$ (held-out)", xticks=True, ylim=(-0.06, 1.06),
              styles={m: {**style, "offset": style["offset"] / 2} for m, style in _STYLES.items()},
              title=lambda results, config: f"(e) controller-free usability at $W^{{{config.rounds}}}$ (offset ±0.02)"),
        Panel("fig2f", y="route_clusters", ylabel=r"$K^{\mathrm{route}}_t$ (clusters updated)", title=_where("(f)"),
              styles=_STYLES, ylim=(-0.2, 2.3), **_ROUNDS),
        Panel("fig2g", y="k_train", ylabel=r"$K_{\mathrm{tr}}(W^t)$ (training-loss usability)", title=_where("(g)"),
              styles=_STYLES, ylim=(-0.2, 2.3), **_ROUNDS),
        Panel("fig2h", y="accuracy_train", ylabel=r"assignment accuracy $A_t$ (training)",
              title=_where("(h)", offset=False), styles={EXP3: _STYLES[EXP3] | {"offset": 0.0}},
              ylim=(0.4, 1.03), **_ROUNDS),
        reference_panel("fig2_references", "alpha", "eval_test_loss", r"interpolation $\alpha$ of the unused model",
                        r"mean held-out loss at $W^T$ (each client at its best model)", xticks=True,
                        styles={EXP3: _STYLES[EXP3] | {"offset": 0.0}},
                        title=lambda results, config: f"held-out loss at $W^{{{config.rounds}}}$ against FedAvg and "
                                                      "Local"),
    ],
    show=lambda results: [_panel_e_table(results), _levels_table(results),
                          reference_table(results.runs, results.references, "alpha", "eval_test_loss")],
    variants={"long": Variant("T = 2400, H_max 2400 / 480 (the grid of the paper's T = 800)", long_horizon)},
))
