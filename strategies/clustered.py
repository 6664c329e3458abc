"""``ClusteredRouting``: a Flower Message-API strategy holding ``K`` cluster models.

Each round it broadcasts all ``K`` models and the previous routing masses,
validates the replies (a malformed reply is logged and dropped), aggregates
them per cluster with the hard update, and records the round.  With
``synchronized_entry`` it first runs the provisional-Greedy ``QUERY`` exchange
(docs/algorithm.md, rules §6) and broadcasts the provisional masses with server round 1.
After the last round it asks every node for the controller-free evaluation.
Greedy IFCA is this strategy with ``RoutingSettings(controllers=("gr",))``.

This module is the constructor only (it checks and stores the parameters, as Flower's ``FedAvg``
does); the strategy's hooks and run loop are :class:`~fedroute.strategies.adapter.RoutingAdapter`'s,
the run's mutable state is one :class:`~fedroute.strategies.state.RunState`, and the server algorithm
is :class:`~fedroute.strategies.algorithms.HardRouting` (:class:`~fedroute.strategies.fedcam.FedCAM` and
:class:`~fedroute.strategies.local.LocalTraining` pass theirs).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Optional

from fedroute import protocol
from fedroute.core.influence import InfluenceBounds
from fedroute.core.participation import Participation
from fedroute.core.settings import RoutingSettings
from fedroute.monitoring.alarms import AlarmSettings
from fedroute.strategies.adapter import RoutingAdapter
from fedroute.strategies.algorithms import Algorithm, HardRouting
from fedroute.strategies.evaluation import check_evaluation, client_records, evaluation_values
from fedroute.strategies.results import MetricsAggregation
from fedroute.strategies.state import RunState
from fedroute.core.validation import invalid

__all__ = ["ClusteredRouting", "check_parameters", "evaluation_values", "client_records"]


def check_parameters(fraction_train: float, min_train_nodes: int, min_available_nodes: int, round_timeout: float,
                     seed: int, run_key: str) -> None:
    """``ValueError`` naming the argument and its range for a bad strategy parameter."""
    if not 0.0 < fraction_train <= 1.0:
        raise invalid("fraction_train", fraction_train, "(0, 1]")
    for name, value in (("min_train_nodes", min_train_nodes), ("min_available_nodes", min_available_nodes)):
        if int(value) != value or value < 1:
            raise invalid(name, value, "an integer ≥ 1")
    if round_timeout <= 0:
        raise invalid("round_timeout", round_timeout, "> 0")
    if seed < 0:
        raise invalid("seed", seed, "an integer ≥ 0")
    protocol.check_path_name(run_key, "run_key")


class ClusteredRouting(RoutingAdapter):
    """Clustered FL with client-side routing control, as a Flower strategy.

    Parameters
    ----------
    routing : RoutingSettings
        Routing rules sent to the clients each round (``K`` = ``routing.num_clusters``).
    fraction_train : float, default 1.0
        Fraction of the connected clients sampled per round, in ``(0, 1]``.  Below 1 the
        strategy samples *clients*, not Flower node ids (:mod:`fedroute.core.participation`:
        the same seed gives the same clients in every run and in the simulator): it asks a
        node once which client it serves (an identification ``QUERY``, answered by
        :func:`fedroute.routing_query`), and the masses the clients receive are estimated
        from every client's latest report (:mod:`fedroute.core.federation`).
    min_train_nodes : int, default 2
        Minimum nodes per round (≥ 1); also the number waited for before a round.
    min_available_nodes : int, default 2
        Nodes that must be connected before the first round (≥ 1).
    round_timeout : float, default 600.0
        Seconds to wait for replies (> 0); late nodes are left out of that round.
    seed : int, default 0
        Run seed: broadcast to clients (routing randomness) and used for node sampling.
    run_key : str, default "default"
        Namespaces the clients' controller state, so one ServerApp can run
        several methods in turn on the same nodes; it names a directory of
        the clients' state files, so it must match ``[A-Za-z0-9._-]+``.
    evaluate_at_end : bool, default True
        Ask every node for the losses of all ``K`` models after the last round.
    client_config : mapping, optional
        Extra ConfigRecord entries sent with every message (e.g. task settings).
    node_wait_timeout : float, default 120.0
        Seconds to wait for ``min_available_nodes`` before failing.
    checkpoint_dir : path, optional
        Write an atomic checkpoint (models, masses, history, round) here after
        every round, and resume from it when :meth:`start` finds one made with
        the same settings.
    label : str, optional
        The run's name in logs, telemetry (``method`` column) and TensorBoard;
        ``run_key`` by default.
    telemetry_dir : path, optional
        Append the per-round and per-client tables (``rounds.csv``,
        ``clients.csv``, Parquet copies at the end) and the alarm events
        (``alarms.jsonl``) here as each round ends (``docs/telemetry.md``).
    tensorboard_dir : path, optional
        Write TensorBoard scalars (masses, routed loss, arm mix, alarms) here;
        needs ``fedroute[tensorboard]``.
    alarm_settings : AlarmSettings, optional
        Thresholds of the collapse alarms (starvation rounds ``S``,
        duplication tolerance, dead-federation rounds ``N``).
    starvation_basin : bool, optional
        Whether the initial models lie in the certified starvation basin, if
        the task can tell (:func:`fedroute.monitoring.alarms.starvation_basin`).
    progress_interval : float or None, default 5.0
        Seconds between progress lines (round, ETA, masses) at INFO; ``None`` for none.
    influence : InfluenceBounds, optional
        How much one reply may move a cluster model and the masses (sample-weight
        cap, update-norm bound, robust rule; :mod:`fedroute.core.influence`).
        Default: ``InfluenceBounds()`` (weights capped at 4 × the round's median).
    report_memory : int, optional
        Rounds a client's latest report counts in the masses (≥ 1); default: 1 with full
        participation, else the rounds within which a client is sampled at least once
        with probability 0.99 (:func:`fedroute.core.participation.report_memory`).
    evaluate_every : int, default 0
        Evaluate the clients during training after every ``evaluate_every``-th round (≥ 0;
        0 = only the final evaluation).  An evaluation is controller-free: the nodes report
        every model's losses and metrics and change no state.
    fraction_evaluate : float, default 1.0
        As in Flower's ``FedAvg``: fraction of the connected nodes asked in an evaluation during
        training, in ``[0, 1]`` (at least ``min_evaluate_nodes``; drawn from the seed and the
        round).  The final evaluation (``evaluate_at_end``) always asks every node.
    min_evaluate_nodes : int, default 2
        As in ``FedAvg``: the fewest nodes an evaluation during training asks (≥ 0).
    train_metrics_aggr_fn : callable, optional
        As in ``FedAvg``: ``(list[RecordDict], "num-examples") -> MetricRecord``, applied to each
        cluster's ``train-metrics`` replies (default: Flower's ``aggregate_metricrecords``).
    evaluate_metrics_aggr_fn : callable, optional
        As in ``FedAvg``: ``(list[RecordDict], "num-examples") -> MetricRecord``, applied to the
        evaluated clients, one RecordDict each with MetricRecord ``metrics`` holding its values at its
        chosen model (``test_loss``, every metric, ``cluster``, ``num-examples``); the result goes to
        ``Result.evaluate_metrics_clientapp``.  Default: :func:`fedroute.core.evaluation.evaluation_metrics`
        (mean, worst decile, per cluster and per group), which :attr:`evaluation` always keeps.
    algorithm : Algorithm, optional
        The server algorithm (:mod:`fedroute.strategies.algorithms`); default
        :class:`~fedroute.strategies.algorithms.HardRouting`.  :class:`~fedroute.strategies.fedcam.FedCAM`
        and :class:`~fedroute.strategies.local.LocalTraining` pass theirs.

    Replies are checked (:mod:`~fedroute.strategies.validation`), and a client id
    is bound to the node that first sent a valid reply for it
    (:mod:`~fedroute.strategies.identity`); rejected replies are logged and kept,
    bounded, in :attr:`rejected` (:mod:`~fedroute.strategies.rejections`).  What a run changes
    (:attr:`cluster_models`, :attr:`history`, :attr:`client_routes`, :attr:`final_evaluation`,
    :attr:`evaluation`, ...) lives in :attr:`state` (:class:`~fedroute.strategies.state.RunState`).
    """

    def __init__(
        self,
        routing: RoutingSettings,
        *,
        fraction_train: float = 1.0,
        min_train_nodes: int = 2,
        min_available_nodes: int = 2,
        round_timeout: float = 600.0,
        seed: int = 0,
        run_key: str = "default",
        evaluate_at_end: bool = True,
        client_config: Optional[Mapping[str, Any]] = None,
        node_wait_timeout: float = 120.0,
        checkpoint_dir: Optional[str | Path] = None,
        label: Optional[str] = None,
        telemetry_dir: Optional[str | Path] = None,
        tensorboard_dir: Optional[str | Path] = None,
        alarm_settings: AlarmSettings = AlarmSettings(),
        starvation_basin: Optional[bool] = None,
        progress_interval: Optional[float] = 5.0,
        influence: Optional[InfluenceBounds] = None,
        report_memory: Optional[int] = None,
        evaluate_every: int = 0,
        fraction_evaluate: float = 1.0,
        min_evaluate_nodes: int = 2,
        train_metrics_aggr_fn: Optional[MetricsAggregation] = None,
        evaluate_metrics_aggr_fn: Optional[MetricsAggregation] = None,
        algorithm: Optional[Algorithm] = None,
    ) -> None:
        check_parameters(fraction_train, min_train_nodes, min_available_nodes, round_timeout, seed, run_key)
        check_evaluation(evaluate_every, fraction_evaluate, min_evaluate_nodes)
        self.routing, self.num_clusters = routing, routing.num_clusters
        self.fraction_train, self.min_train_nodes = fraction_train, int(min_train_nodes)
        self.participation = Participation(fraction_train, int(min_train_nodes), report_memory)
        self.min_available_nodes, self.node_wait_timeout = int(min_available_nodes), node_wait_timeout
        self.round_timeout, self.seed, self.run_key = round_timeout, int(seed), run_key
        self.evaluate_at_end, self.client_config = evaluate_at_end, dict(client_config or {})
        self.evaluate_every, self.fraction_evaluate = int(evaluate_every), float(fraction_evaluate)
        self.min_evaluate_nodes = int(min_evaluate_nodes)
        self.train_metrics_aggr_fn, self.evaluate_metrics_aggr_fn = train_metrics_aggr_fn, evaluate_metrics_aggr_fn
        self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir else None
        self.label = label or run_key
        self.telemetry_dir = Path(telemetry_dir) if telemetry_dir is not None else None
        self.tensorboard_dir = Path(tensorboard_dir) if tensorboard_dir is not None else None
        self.alarm_settings, self.starvation_basin = alarm_settings, starvation_basin
        self.progress_interval = progress_interval
        self.influence = influence if influence is not None else InfluenceBounds()
        self.telemetry_width: Optional[int] = None
        self.algorithm = algorithm if algorithm is not None else HardRouting()
        self.state = RunState.new(routing, self.participation)
