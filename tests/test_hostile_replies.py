"""Hostile training replies: property tests of ``ClusteredRouting`` and ``FedCAM`` aggregation.

Hypothesis generates rounds of reply ``Message`` objects built the way Flower
builds them (``Message(content, reply_to=instruction)``, error replies as
``Message(error=Error(...), reply_to=instruction)``) that mix good replies
(what ``client/app.py`` sends, sometimes with extra unknown records) with bad
ones of every kind: missing or mistyped records, missing metric keys, wrong
shapes and dtypes, NaN/Inf, out-of-range or non-integer clusters and client
ids, bad ``num-examples``, bool values, wrong-length loss vectors, error
replies and duplicate client ids.  For every round:

1. no exception escapes ``aggregate_train``;
2. the cluster models equal ``hard_update`` of the good replies alone (first
   valid reply per client id, sorted by client id), computed here
   independently from the generated replies;
3. the rejected replies recorded for the round are exactly the bad ones plus
   the duplicates, each with a reason naming the offending field;
4. the masses are the routing masses of the good replies;
5. a cluster no good reply routed to is unchanged bit for bit.

Validation runs before de-duplication, so a bad first reply of a client id
followed by a good one keeps the good one; a good first reply wins over any
later reply of the same client id.

Inputs that once crashed the code under test are pinned by their own tests at
the end of the file.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import numpy as np
import pytest
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Error,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.common.constant import SUPERLINK_NODE_ID
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from fedroute import protocol
from fedroute.core.controllers import CONTROLLER_IDS
from fedroute.core.settings import EXP3_MODES, RoutingSettings
from fedroute.server.run_config import parse_run_config
from fedroute.strategies.clustered import ClusteredRouting
from fedroute.strategies.fedcam import FedCAM
from fedroute.core.influence import InfluenceBounds
from fedroute.core.methods import METHODS
from fedroute.strategies.records import unpack_cluster_models
from fedroute.strategies.validation import MIN_NUM_EXAMPLES
from support.app_config import app_defaults
from support.replies import train_instruction

# --------------------------------------------------------------------------- fixtures of the model
TEMPLATE_SHAPES = {"weights": (2, 3), "bias": (2,)}
"""Array names (in order), shapes; dtype float64 — the cluster-model template."""

CLIENT_POOL = 10
"""Most client ids come from ``0..CLIENT_POOL-1`` so that duplicates are frequent."""

MIN_BAD_PER_EXAMPLE = 18
MAX_EXAMPLES = 60
REQUIRED_BAD_REPLIES = 1000

PROPERTY_SETTINGS = settings(
    max_examples=MAX_EXAMPLES,
    deadline=None,
    database=None,  # keep the repository free of a .hypothesis directory
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    # No shrinking of these large rounds (it takes minutes); a failure names the bad-reply kind, and
    # test_each_bad_kind (which does shrink) finds the same bugs with small examples.
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
)

STATS: Counter = Counter()
"""What the reply generators produced in the current property run (checked by the wrapper tests)."""


def _model_from_seed(seed: int, scale: float = 100.0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {name: rng.uniform(-scale, scale, shape) for name, shape in TEMPLATE_SHAPES.items()}


# --------------------------------------------------------------------------- reply specs and messages
@dataclass
class Spec:
    """A reply as plain data (readable when Hypothesis prints a failing example)."""

    kind: str
    client_id: int
    cluster: int
    num_examples: float
    metrics: dict[str, Any]
    model: dict[str, np.ndarray]
    global_part: Optional[dict[str, np.ndarray]] = None
    metrics_record: str = "metric"  # metric | config | array | absent
    model_record: str = "array"  # array | metric | config | absent
    global_record: str = "array"  # array | metric | absent
    extras: tuple[str, ...] = ()
    error: Optional[tuple[int, str]] = None

    @property
    def good(self) -> bool:
        return self.kind == "good"


def _record(kind: str, values: dict[str, Any]):
    if kind == "metric":
        return MetricRecord(values)
    if kind == "config":
        return ConfigRecord(values)
    if kind == "array":
        return ArrayRecord({name: Array(np.asarray(value)) for name, value in values.items()})
    raise AssertionError(kind)


def _model_record(kind: str, arrays: dict[str, np.ndarray]):
    if kind == "array":
        return ArrayRecord({name: Array(np.asarray(value)) for name, value in arrays.items()})
    if kind == "metric":  # right names, but plain numbers instead of arrays
        return MetricRecord({name: float(np.ravel(value)[0]) for name, value in arrays.items()})
    if kind == "config":
        return ConfigRecord({name: str(np.ravel(value).tolist()) for name, value in arrays.items()})
    raise AssertionError(kind)


def _message(spec: Spec, node_id: int, server_round: int) -> Message:
    instruction = train_instruction(node_id, server_round)
    if spec.error is not None:
        return Message(error=Error(code=spec.error[0], reason=spec.error[1]), reply_to=instruction)
    content = RecordDict()
    if spec.metrics_record != "absent":
        content[protocol.METRICS] = _record(spec.metrics_record, spec.metrics)
    if spec.model_record != "absent":
        content[protocol.MODEL] = _model_record(spec.model_record, spec.model)
    if spec.global_part is not None and spec.global_record != "absent":
        content[protocol.GLOBAL_MODEL] = _model_record(spec.global_record, spec.global_part)
    for extra in spec.extras:  # unknown records are ignored by the server
        if extra == "array":
            content["diagnostics"] = ArrayRecord({"anything": Array(np.arange(5, dtype=np.int32))})
        elif extra == "config":
            content["notes"] = ConfigRecord({"text": "hello", "flag": True, "values": ["a", "b"]})
        elif extra == "metric":
            content["timing"] = MetricRecord({"seconds": 1.5, "steps": [1, 2, 3]})
        elif extra == "junk-global":  # malformed, but ClusteredRouting has no global part
            content[protocol.GLOBAL_MODEL] = ArrayRecord({"w": Array(np.full(3, np.nan, dtype=np.float32))})
    return Message(content=content, reply_to=instruction)


# --------------------------------------------------------------------------- generators
# Strategies built once (building them per draw dominates the run time).
_CLIENT_IDS = st.one_of(*[st.integers(0, CLIENT_POOL - 1)] * 4, st.integers(0, 2**62))
_GOOD_NUM_EXAMPLES = st.one_of(st.integers(1, 10**9), st.floats(1e-3, 1e9), st.sampled_from([1, 10**9, 1e9, 0.5]))
_SEEDS = st.integers(0, 2**32 - 1)
_CLUSTERS = {k: st.integers(0, k - 1) for k in range(1, 5)}
_EXTRAS = {fedcam: st.lists(st.sampled_from(["array", "config", "metric"] + ([] if fedcam else ["junk-global"])),
                            max_size=2, unique=True)
           for fedcam in (False, True)}


@st.composite
def good_specs(draw: st.DrawFn, num_clusters: int, fedcam: bool) -> Spec:
    """A reply like ``client/app.py`` sends (the FedCAM one with a global part)."""
    client_id = draw(_CLIENT_IDS)
    cluster = draw(_CLUSTERS[num_clusters])
    num_examples = draw(_GOOD_NUM_EXAMPLES)
    seed = draw(_SEEDS)
    rng = np.random.default_rng(seed)
    losses: list = [float(v) for v in rng.uniform(0.0, 10.0, num_clusters)]
    if draw(st.booleans()):
        losses = [int(v) for v in losses]  # list[int] is a valid MetricRecord value too
    route = [0.0] * num_clusters
    route[cluster] = 1.0
    metrics: dict[str, Any] = {
        protocol.CLUSTER: float(cluster) if draw(st.booleans()) else cluster,  # 2.0 is accepted as 2
        protocol.NUM_EXAMPLES: num_examples,
        protocol.CLIENT_ID: client_id,
        protocol.LOSSES: losses,
        protocol.ROUTE_DISTRIBUTION: route,
    }
    if not fedcam and draw(st.booleans()):  # the routing client's further metrics, well formed
        arms = int(rng.integers(1, 4))
        metrics.update({
            protocol.CONTROLLER: int(rng.integers(0, 5)),
            protocol.ARM: int(rng.integers(0, arms)),
            protocol.FEEDBACK: float(rng.normal()),
            protocol.ENTERED: int(rng.integers(0, 2)),
            protocol.RELEASED: int(rng.integers(0, 2)),
            protocol.ROUNDS_PLAYED: int(rng.integers(0, 1000)),
            protocol.EXP3_LOG_WEIGHTS: [float(v) for v in rng.normal(size=arms)],
        })
    extras = tuple(draw(_EXTRAS[fedcam]))
    return Spec(
        kind="good", client_id=client_id, cluster=cluster, num_examples=float(num_examples), metrics=metrics,
        model=_model_from_seed(seed), global_part=_model_from_seed(seed + 1) if fedcam else None, extras=extras,
    )


@dataclass(frozen=True)
class Mutation:
    """One way to spoil a good reply, and what the rejection reason must say."""

    name: str
    apply: Callable[[st.DrawFn, Spec, int], None]
    reason: str  # regular expression searched in the recorded reason
    fedcam_only: bool = False


def _set_metric(key: str, values: st.SearchStrategy, record: str = "metric") -> Callable:
    def apply(draw: st.DrawFn, spec: Spec, num_clusters: int) -> None:
        spec.metrics[key] = draw(values)
        spec.metrics_record = record
    return apply


def _drop_metric(key: str) -> Callable:
    def apply(draw: st.DrawFn, spec: Spec, num_clusters: int) -> None:
        del spec.metrics[key]
    return apply


def _set(attribute: str, value: str) -> Callable:
    def apply(draw: st.DrawFn, spec: Spec, num_clusters: int) -> None:
        setattr(spec, attribute, value)
    return apply


def _cluster_too_large(draw: st.DrawFn, spec: Spec, num_clusters: int) -> None:
    spec.metrics[protocol.CLUSTER] = draw(st.integers(num_clusters, num_clusters + 10))


def _cluster_fraction(draw: st.DrawFn, spec: Spec, num_clusters: int) -> None:
    spec.metrics[protocol.CLUSTER] = spec.cluster + draw(st.sampled_from([0.5, 0.25, 1e-6, 0.999]))


def _vector_length(key: str) -> Callable:
    def apply(draw: st.DrawFn, spec: Spec, num_clusters: int) -> None:
        length = draw(st.sampled_from([n for n in (0, num_clusters - 1, num_clusters + 1, num_clusters + 4)
                                       if n >= 0 and n != num_clusters]))
        spec.metrics[key] = [0.25] * length
    return apply


def _vector_nonfinite(key: str) -> Callable:
    def apply(draw: st.DrawFn, spec: Spec, num_clusters: int) -> None:
        vector = [float(v) for v in spec.metrics[key]]
        vector[draw(st.integers(0, num_clusters - 1))] = draw(st.sampled_from([math.nan, math.inf, -math.inf]))
        spec.metrics[key] = vector
    return apply


def _vector_scalar(key: str) -> Callable:
    def apply(draw: st.DrawFn, spec: Spec, num_clusters: int) -> None:
        spec.metrics[key] = draw(st.sampled_from([0.5, 1, 0.0]))
    return apply


def _vector_string(key: str) -> Callable:
    def apply(draw: st.DrawFn, spec: Spec, num_clusters: int) -> None:
        spec.metrics[key] = ",".join(str(v) for v in spec.metrics[key])
        spec.metrics_record = "config"
    return apply


def _arrays_of(spec: Spec, target: str) -> dict[str, np.ndarray]:
    return spec.model if target == "model" else spec.global_part


def _replace_arrays(spec: Spec, target: str, arrays: dict[str, np.ndarray]) -> None:
    if target == "model":
        spec.model = arrays
    else:
        spec.global_part = arrays


def _wrong_shape(target: str) -> Callable:
    def apply(draw: st.DrawFn, spec: Spec, num_clusters: int) -> None:
        arrays = dict(_arrays_of(spec, target))
        name = draw(st.sampled_from(list(TEMPLATE_SHAPES)))
        shapes = {"weights": [(3, 2), (2, 3, 1), (6,), (1, 3), (), (2, 4)],
                  "bias": [(3,), (2, 1), (1,), (), (0,)]}[name]
        shape = draw(st.sampled_from(shapes))
        arrays[name] = np.resize(arrays[name], shape).astype(np.float64)
        _replace_arrays(spec, target, arrays)
    return apply


def _wrong_dtype(target: str) -> Callable:
    def apply(draw: st.DrawFn, spec: Spec, num_clusters: int) -> None:
        arrays = dict(_arrays_of(spec, target))
        name = draw(st.sampled_from(list(TEMPLATE_SHAPES)))
        dtype = draw(st.sampled_from([np.float32, np.float16, np.int64, np.int32, np.complex128, np.bool_]))
        arrays[name] = arrays[name].astype(dtype)
        _replace_arrays(spec, target, arrays)
    return apply


def _nonfinite(target: str) -> Callable:
    def apply(draw: st.DrawFn, spec: Spec, num_clusters: int) -> None:
        arrays = {name: value.copy() for name, value in _arrays_of(spec, target).items()}
        name = draw(st.sampled_from(list(TEMPLATE_SHAPES)))
        flat = arrays[name].reshape(-1)
        flat[draw(st.integers(0, flat.size - 1))] = draw(st.sampled_from([math.nan, math.inf, -math.inf]))
        _replace_arrays(spec, target, arrays)
    return apply


def _names(target: str) -> Callable:
    def apply(draw: st.DrawFn, spec: Spec, num_clusters: int) -> None:
        arrays = dict(_arrays_of(spec, target))
        how = draw(st.sampled_from(["missing", "extra", "renamed", "reordered", "empty"]))
        if how == "missing":
            del arrays[draw(st.sampled_from(list(TEMPLATE_SHAPES)))]
        elif how == "extra":
            arrays["extra"] = np.zeros(2)
        elif how == "renamed":
            arrays = {("b" if name == "bias" else name): value for name, value in arrays.items()}
        elif how == "reordered":
            arrays = dict(reversed(list(arrays.items())))
        else:
            arrays = {}
        _replace_arrays(spec, target, arrays)
    return apply


def _error_reply(draw: st.DrawFn, spec: Spec, num_clusters: int) -> None:
    spec.error = (draw(st.integers(0, 10)), draw(st.text(max_size=20)))


_NOT_METRIC_RECORD = rf"'{protocol.METRICS}' must be a MetricRecord"
_CLUSTER_RE = rf"'{protocol.CLUSTER}'"
_CLIENT_RE = rf"'{protocol.CLIENT_ID}'"
_EXAMPLES_RE = rf"'{protocol.NUM_EXAMPLES}'"
_NONFINITE = st.sampled_from([math.nan, math.inf, -math.inf])
_HUGE_INTS = st.sampled_from([2**31, 2**62, 2**63 - 1, 10**18])
_HUGE_FLOATS = st.floats(1e10, 1e300)


def _mutations() -> list[Mutation]:
    mutations = [
        # records
        Mutation("no-metrics-record", _set("metrics_record", "absent"), rf"missing MetricRecord '{protocol.METRICS}'"),
        Mutation("no-model-record", _set("model_record", "absent"), rf"missing ArrayRecord '{protocol.MODEL}'"),
        Mutation("metrics-as-array-record", _set("metrics_record", "array"), _NOT_METRIC_RECORD),
        Mutation("model-as-metric-record", _set("model_record", "metric"), r"^model array '\w+' cannot be decoded"),
        Mutation("model-as-config-record", _set("model_record", "config"), r"^model array '\w+' cannot be decoded"),
        # missing metric keys
        *(Mutation(f"missing-{key}", _drop_metric(key), rf"'{key}'")
          for key in (protocol.CLUSTER, protocol.CLIENT_ID, protocol.NUM_EXAMPLES, protocol.LOSSES,
                      protocol.ROUTE_DISTRIBUTION)),
        # cluster id
        Mutation("cluster-negative", _set_metric(protocol.CLUSTER, st.integers(-2**62, -1)), _CLUSTER_RE),
        Mutation("cluster-too-large", _cluster_too_large, _CLUSTER_RE),
        Mutation("cluster-huge", _set_metric(protocol.CLUSTER, st.one_of(_HUGE_INTS, _HUGE_FLOATS)), _CLUSTER_RE),
        Mutation("cluster-not-integer", _cluster_fraction, _CLUSTER_RE),
        Mutation("cluster-not-finite", _set_metric(protocol.CLUSTER, _NONFINITE), _CLUSTER_RE),
        Mutation("cluster-bool", _set_metric(protocol.CLUSTER, st.booleans(), "config"), _NOT_METRIC_RECORD),
        Mutation("cluster-string", _set_metric(protocol.CLUSTER, st.sampled_from(["0", "1", "zero"]), "config"),
                 _NOT_METRIC_RECORD),
        Mutation("cluster-list", _set_metric(protocol.CLUSTER, st.just([0])), _CLUSTER_RE),
        # client id
        Mutation("client-id-negative", _set_metric(protocol.CLIENT_ID, st.integers(-2**62, -1)), _CLIENT_RE),
        Mutation("client-id-huge", _set_metric(protocol.CLIENT_ID, st.one_of(
            st.integers(2**62 + 1, 2**63 - 1), st.floats(1e19, 1e300))), _CLIENT_RE),
        Mutation("client-id-not-integer", _set_metric(protocol.CLIENT_ID, st.sampled_from([0.5, 3.25, 7.000001])),
                 _CLIENT_RE),
        Mutation("client-id-not-finite", _set_metric(protocol.CLIENT_ID, _NONFINITE), _CLIENT_RE),
        Mutation("client-id-bool", _set_metric(protocol.CLIENT_ID, st.booleans(), "config"), _NOT_METRIC_RECORD),
        Mutation("client-id-string", _set_metric(protocol.CLIENT_ID, st.just("7"), "config"), _NOT_METRIC_RECORD),
        # num-examples
        Mutation("num-examples-zero", _set_metric(protocol.NUM_EXAMPLES, st.sampled_from([0, 0.0, -0.0])),
                 _EXAMPLES_RE),
        Mutation("num-examples-negative", _set_metric(protocol.NUM_EXAMPLES, st.one_of(
            st.integers(-2**62, -1), st.floats(-1e300, -1e-300))), _EXAMPLES_RE),
        Mutation("num-examples-huge", _set_metric(protocol.NUM_EXAMPLES, st.one_of(
            st.integers(10**9 + 1, 2**63 - 1), st.floats(1e9, 1e300, exclude_min=True))), _EXAMPLES_RE),
        Mutation("num-examples-not-finite", _set_metric(protocol.NUM_EXAMPLES, _NONFINITE), _EXAMPLES_RE),
        Mutation("num-examples-bool", _set_metric(protocol.NUM_EXAMPLES, st.booleans(), "config"), _NOT_METRIC_RECORD),
        Mutation("num-examples-string", _set_metric(protocol.NUM_EXAMPLES, st.just("40"), "config"), _NOT_METRIC_RECORD),
        Mutation("num-examples-list", _set_metric(protocol.NUM_EXAMPLES, st.just([40])), _EXAMPLES_RE),
        # loss / route vectors
        *(mutation
          for key in (protocol.LOSSES, protocol.ROUTE_DISTRIBUTION)
          for mutation in (
              Mutation(f"{key}-wrong-length", _vector_length(key), rf"'{key}'"),
              Mutation(f"{key}-not-finite", _vector_nonfinite(key), rf"'{key}' has non-finite"),
              Mutation(f"{key}-scalar", _vector_scalar(key), rf"'{key}'"),
              Mutation(f"{key}-string", _vector_string(key), _NOT_METRIC_RECORD),
          )),
        # error reply
        Mutation("error-reply", _error_reply, r"^error reply"),
    ]
    for target, fedcam_only in ((protocol.MODEL, False), (protocol.GLOBAL_MODEL, True)):
        prefix = rf"^{re.escape(target)} array"
        mutations += [
            Mutation(f"{target}-wrong-shape", _wrong_shape(target), prefix + r" '\w+' has shape", fedcam_only),
            Mutation(f"{target}-wrong-dtype", _wrong_dtype(target), prefix + r" '\w+' has shape", fedcam_only),
            Mutation(f"{target}-not-finite", _nonfinite(target), prefix + r" '\w+' has NaN or Inf", fedcam_only),
            Mutation(f"{target}-wrong-names", _names(target), prefix + r"s \[", fedcam_only),
        ]
    mutations += [
        Mutation("no-global-model-record", _set("global_record", "absent"),
                 rf"missing ArrayRecord '{protocol.GLOBAL_MODEL}'", True),
        Mutation("global-model-as-metric-record", _set("global_record", "metric"),
                 rf"^{protocol.GLOBAL_MODEL} array '\w+' cannot be decoded", True),
    ]
    return mutations


MUTATIONS = _mutations()
MUTATIONS_BY_NAME = {mutation.name: mutation for mutation in MUTATIONS}


def _applicable(fedcam: bool) -> list[Mutation]:
    return [mutation for mutation in MUTATIONS if fedcam or not mutation.fedcam_only]


@st.composite
def bad_specs(draw: st.DrawFn, num_clusters: int, fedcam: bool, mutation: Mutation) -> Spec:
    """A good reply spoiled in exactly one way (so the first failing check is that one)."""
    spec = draw(good_specs(num_clusters, fedcam))
    spec.kind = mutation.name
    spec.metrics = dict(spec.metrics)
    mutation.apply(draw, spec, num_clusters)
    return spec


@dataclass
class Case:
    num_clusters: int
    initial_models: list[dict[str, np.ndarray]]
    initial_masses: Optional[np.ndarray]
    initial_global: Optional[dict[str, np.ndarray]]
    first_round: int
    rounds: list[list[Spec]] = field(default_factory=list)


@st.composite
def cases(draw: st.DrawFn, fedcam: bool, only: Optional[Mutation] = None) -> Case:
    """One or two consecutive rounds; the first holds at least MIN_BAD_PER_EXAMPLE bad replies.

    With ``only``, every bad reply is of that kind and there are 1–4 of them per round.
    """
    num_clusters = draw(st.integers(1, 4))
    initial = [_model_from_seed(draw(st.integers(0, 2**32 - 1)), scale=10.0) for _ in range(num_clusters)]
    masses = None
    if draw(st.booleans()):
        raw = np.random.default_rng(draw(st.integers(0, 2**32 - 1))).uniform(0, 1, num_clusters)
        masses = raw / raw.sum()
    initial_global = None
    if fedcam and draw(st.booleans()):
        initial_global = _model_from_seed(draw(st.integers(0, 2**32 - 1)), scale=10.0)
    mutations = _applicable(fedcam) if only is None else [only]
    # Hypothesis draws within one example are correlated, so free choices alone leave some kinds rare:
    # the bad replies of an example walk the catalogue from a drawn start, some kinds drawn freely.
    start = draw(st.integers(0, len(mutations) - 1))
    rounds = []
    for index in range(draw(st.integers(1, 2))):
        if only is not None:
            num_bad = draw(st.integers(1, 4))
        else:
            num_bad = draw(st.integers(MIN_BAD_PER_EXAMPLE, 24) if index == 0 else st.integers(0, 6))
        num_good = draw(st.integers(0, 8))
        specs = [draw(good_specs(num_clusters, fedcam)) for _ in range(num_good)]
        for j in range(num_bad):
            free = draw(st.booleans())
            mutation = draw(st.sampled_from(mutations)) if free else mutations[(start + j) % len(mutations)]
            specs.append(draw(bad_specs(num_clusters, fedcam, mutation)))
        start += num_bad
        order = draw(st.permutations(range(len(specs))))
        specs = [specs[i] for i in order]
        # Re-sends: a good reply claiming the client id of an earlier reply (good: a duplicate that
        # must lose; bad: the good one must be kept, since validation runs before de-duplication).
        for _ in range(draw(st.integers(0, 3)) if specs else 0):
            earlier = draw(st.integers(0, len(specs) - 1))
            resend = draw(good_specs(num_clusters, fedcam))
            resend.client_id = specs[earlier].client_id
            resend.metrics[protocol.CLIENT_ID] = resend.client_id
            specs.insert(draw(st.integers(earlier + 1, len(specs))), resend)
        rounds.append(specs)
    return Case(num_clusters, initial, masses, initial_global, draw(st.integers(1, 5)), rounds)


# --------------------------------------------------------------------------- the independent expectation
@dataclass
class Expected:
    kept: list[Spec]  # first valid reply per client id, sorted by client id
    bad: list[Spec]  # in arrival order
    duplicates: list[Spec]
    models: list[dict[str, np.ndarray]]
    masses: Optional[np.ndarray]
    global_part: Optional[dict[str, np.ndarray]]
    good_after_bad_same_id: int


def _weighted_average(previous: dict[str, np.ndarray], replies: list[tuple[float, dict[str, np.ndarray]]]):
    """``Σ n_i w_i / Σ n_i`` in float64, summed in the given order; ``previous`` when empty."""
    if not replies:
        return previous
    total = 0.0
    sums = {name: np.zeros(value.shape) for name, value in previous.items()}
    for weight, arrays in replies:
        total += weight
        for name in sums:
            sums[name] = sums[name] + weight * arrays[name]
    return {name: (value / total).astype(previous[name].dtype) for name, value in sums.items()}


def expected_round(specs: list[Spec], num_clusters: int, models: list[dict[str, np.ndarray]],
                   masses: Optional[np.ndarray], global_part: Optional[dict[str, np.ndarray]],
                   fedcam: bool) -> Expected:
    seen: set[int] = set()
    bad_ids: set[int] = set()
    kept, bad, duplicates, good_after_bad = [], [], [], 0
    for spec in specs:
        if not spec.good:
            bad.append(spec)
            bad_ids.add(spec.client_id)
        elif spec.client_id in seen:
            duplicates.append(spec)
        else:
            seen.add(spec.client_id)
            kept.append(spec)
            good_after_bad += spec.client_id in bad_ids
    kept.sort(key=lambda spec: spec.client_id)
    new_models = [_weighted_average(model, [(s.num_examples, s.model) for s in kept if s.cluster == k])
                  for k, model in enumerate(models)]
    if kept:
        totals = np.zeros(num_clusters)
        for spec in kept:
            totals[spec.cluster] += spec.num_examples
        masses = totals / totals.sum()
        if fedcam:
            start = global_part if global_part is not None else {n: np.zeros(s) for n, s in TEMPLATE_SHAPES.items()}
            global_part = _weighted_average(start, [(s.num_examples, s.global_part) for s in kept])
    return Expected(kept, bad, duplicates, new_models, masses, global_part, good_after_bad)


# --------------------------------------------------------------------------- running a case
def _strategy(case: Case, fedcam: bool) -> ClusteredRouting:
    # Three controllers: good replies carry 1-3 EXP3 log-weights (at most one per arm is accepted).
    routing = RoutingSettings(num_clusters=case.num_clusters, controllers=("gr", "rh", "com"))
    # Plain weighted means (no sample-weight cap): the expectation here is FedAvg of the good replies.
    # The influence bounds have their own property tests (tests/test_identity_and_influence.py).
    strategy = (FedCAM if fedcam else ClusteredRouting)(routing, influence=InfluenceBounds(max_weight_ratio=math.inf))
    strategy.cluster_models = [{name: value.copy() for name, value in model.items()} for model in case.initial_models]
    strategy.routing_masses = None if case.initial_masses is None else case.initial_masses.copy()
    strategy._num_rounds = case.first_round + len(case.rounds) + 1
    if fedcam and case.initial_global is not None:
        strategy.global_model = {name: value.copy() for name, value in case.initial_global.items()}
    return strategy


def _snapshot(models: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
    return [{name: value.copy() for name, value in model.items()} for model in models]


def _node_of(client_id: int) -> int:
    """The Flower node a client's replies come from (a client id is bound to its node)."""
    return 10**6 + client_id


def check_case(case: Case, fedcam: bool) -> None:
    strategy = _strategy(case, fedcam)
    num_clusters = case.num_clusters
    for offset, specs in enumerate(case.rounds):
        server_round = case.first_round + offset
        before = _snapshot(strategy.cluster_models)
        before_masses = None if strategy.routing_masses is None else strategy.routing_masses.copy()
        before_global = (None if not fedcam or strategy.global_model is None
                         else {name: value.copy() for name, value in strategy.global_model.items()})
        node_ids = [_node_of(spec.client_id) for spec in specs]  # one node per client id, every round
        messages = [_message(spec, node_id, server_round) for spec, node_id in zip(specs, node_ids)]
        expected = expected_round(specs, num_clusters, before, before_masses, before_global, fedcam)
        rejected_before = len(strategy.rejected)

        # (1) no exception escapes
        packed, metrics = strategy.aggregate_train(server_round, messages)

        # (2) the models are the hard update of the good replies alone
        assert len(strategy.cluster_models) == num_clusters
        for k in range(num_clusters):
            assert list(strategy.cluster_models[k]) == list(TEMPLATE_SHAPES)
            for name, shape in TEMPLATE_SHAPES.items():
                actual = strategy.cluster_models[k][name]
                assert actual.shape == shape and actual.dtype == np.float64
                np.testing.assert_allclose(actual, expected.models[k][name], rtol=0, atol=1e-12,
                                           err_msg=f"cluster {k}, array {name}")
        unpacked = unpack_cluster_models(packed, num_clusters)
        for k in range(num_clusters):
            for name in TEMPLATE_SHAPES:
                np.testing.assert_array_equal(unpacked[k][name], strategy.cluster_models[k][name])
        assert metrics["num-valid-replies"] == len(expected.kept)
        routes = strategy.client_routes[server_round - 1]
        assert routes == {s.client_id: s.cluster for s in expected.kept}
        assert list(routes) == [s.client_id for s in expected.kept]  # aggregated in client-id order
        record = strategy.history[-1]
        assert record["server_round"] == server_round and record["num_replies"] == len(expected.kept)

        # (3) every bad reply and every duplicate is recorded as rejected, with the field named
        this_round = [r for r in strategy.rejected if r["server_round"] == server_round and r["phase"] == "train"]
        assert len(this_round) == len(expected.bad) + len(expected.duplicates)
        assert record["rejected"] == len(this_round)
        new = strategy.rejected[rejected_before:]
        assert len(new) == len(this_round)
        invalid = [r for r in new if not r["reason"].startswith("duplicate reply")]
        duplicate_reasons = [r for r in new if r["reason"].startswith("duplicate reply")]
        assert len(invalid) == len(expected.bad) and len(duplicate_reasons) == len(expected.duplicates)
        bad_node_ids = [node for spec, node in zip(specs, node_ids) if not spec.good]
        for spec, node_id, entry in zip(expected.bad, bad_node_ids, invalid):
            assert entry["node_id"] == node_id
            assert re.search(MUTATIONS_BY_NAME[spec.kind].reason, entry["reason"]), (spec.kind, entry["reason"])
        for spec, entry in zip(expected.duplicates, duplicate_reasons):
            assert entry["reason"] == f"duplicate reply for client {spec.client_id}"

        # (4) masses are the routing masses of the good replies (unchanged without any)
        reported = np.asarray(metrics["masses"], dtype=np.float64)
        if expected.kept:
            np.testing.assert_allclose(strategy.routing_masses, expected.masses, rtol=0, atol=1e-12)
            np.testing.assert_allclose(reported, expected.masses, rtol=0, atol=1e-12)
        elif before_masses is None:
            assert strategy.routing_masses is None
            np.testing.assert_array_equal(reported, np.zeros(num_clusters))
        else:
            np.testing.assert_array_equal(strategy.routing_masses, before_masses)
            np.testing.assert_array_equal(reported, before_masses)
        for k in range(num_clusters):
            assert record[f"routed_{k}"] == sum(1 for s in expected.kept if s.cluster == k)

        # (5) a cluster no good reply routed to is unchanged bit for bit
        routed = {spec.cluster for spec in expected.kept}
        for k in set(range(num_clusters)) - routed:
            for name in TEMPLATE_SHAPES:
                assert strategy.cluster_models[k][name].tobytes() == before[k][name].tobytes()
                assert unpacked[k][name].tobytes() == before[k][name].tobytes()
            assert record[f"changed_{k}"] is False

        if fedcam:  # Θ_glob: average over every kept reply, unchanged without any
            if expected.global_part is None:
                assert strategy.global_model is None
            else:
                for name in TEMPLATE_SHAPES:
                    np.testing.assert_allclose(strategy.global_model[name], expected.global_part[name],
                                               rtol=0, atol=1e-12)
                    if not expected.kept:
                        assert strategy.global_model[name].tobytes() == before_global[name].tobytes()

        STATS["bad"] += len(expected.bad)
        STATS["good"] += len(expected.kept)
        STATS["duplicate"] += len(expected.duplicates)
        STATS["good-after-bad-same-id"] += expected.good_after_bad_same_id
        STATS["rounds-without-valid-reply"] += not expected.kept
        STATS.update(f"kind:{spec.kind}" for spec in expected.bad)
    STATS["examples"] += 1


def _property(fedcam: bool) -> Callable[[], None]:
    @PROPERTY_SETTINGS
    @given(case=cases(fedcam))
    def run(case: Case) -> None:
        check_case(case, fedcam)

    return run


def _check_stats() -> None:
    # Kinds are drawn freely here (some may be rare in one run); test_each_bad_kind covers each one.
    assert STATS["bad"] >= REQUIRED_BAD_REPLIES, dict(STATS)
    for scenario in ("good", "duplicate", "good-after-bad-same-id", "rounds-without-valid-reply"):
        assert STATS[scenario] > 0, f"scenario {scenario!r} never generated: {dict(STATS)}"


def test_clustered_routing_survives_hostile_replies() -> None:
    """Properties (1)–(5) for ClusteredRouting over ≥ 1,000 generated bad replies."""
    STATS.clear()
    _property(fedcam=False)()
    _check_stats()


def test_fedcam_survives_hostile_replies() -> None:
    """Properties (1)–(5) for FedCAM (global part checked and averaged too) over ≥ 1,000 bad replies."""
    STATS.clear()
    _property(fedcam=True)()
    _check_stats()


@pytest.mark.parametrize(("fedcam", "kind"), [(fedcam, mutation.name) for fedcam in (False, True)
                                              for mutation in _applicable(fedcam)])
def test_each_bad_kind(fedcam: bool, kind: str) -> None:
    """Properties (1)–(5) with every bad reply of one kind (so each kind is surely exercised)."""
    STATS.clear()

    @settings(PROPERTY_SETTINGS, max_examples=2, phases=list(Phase))
    @given(case=cases(fedcam, only=MUTATIONS_BY_NAME[kind]))
    def run(case: Case) -> None:
        check_case(case, fedcam)

    run()
    assert STATS[f"kind:{kind}"] > 0


# --------------------------------------------------------------------------- deterministic scenarios
def _simple_spec(client_id: int, cluster: int, value: float, *, fedcam: bool = False, kind: str = "good",
                 num_examples: Any = 10) -> Spec:
    model = {name: np.full(shape, value) for name, shape in TEMPLATE_SHAPES.items()}
    metrics = {protocol.CLUSTER: cluster, protocol.CLIENT_ID: client_id, protocol.NUM_EXAMPLES: num_examples,
               protocol.LOSSES: [0.5, 0.25], protocol.ROUTE_DISTRIBUTION: [0.0, 1.0]}
    return Spec(kind=kind, client_id=client_id, cluster=cluster, num_examples=num_examples, metrics=metrics,
                model=model, global_part=dict(model) if fedcam else None)


def _simple_strategy(fedcam: bool = False) -> ClusteredRouting:
    case = Case(2, [{name: np.full(shape, float(k)) for name, shape in TEMPLATE_SHAPES.items()} for k in range(2)],
                None, None, 1, [])
    return _strategy(case, fedcam)


def test_replies_are_built_the_flower_way() -> None:
    reply = _message(_simple_spec(3, 1, 0.5), 4242, 1)
    assert reply.metadata.src_node_id == 4242 and reply.metadata.dst_node_id == SUPERLINK_NODE_ID
    assert reply.metadata.message_type == MessageType.TRAIN and not reply.has_error()
    assert reply.metadata.reply_to_message_id.startswith("instruction-")
    spec = _simple_spec(3, 1, 0.5)
    spec.error = (2, "client crashed")
    failed = _message(spec, 4243, 1)
    assert failed.has_error() and failed.error.reason == "client crashed" and not failed.has_content()


@pytest.mark.parametrize("fedcam", [False, True])
@pytest.mark.parametrize(
    ("first", "second", "kept_value", "reasons"),
    [
        ("good", "good", 0.25, ["duplicate reply for client 7"]),
        ("bad", "good", 0.75, [rf"'{protocol.CLUSTER}'"]),  # validation before de-duplication
        ("good", "bad", 0.25, [rf"'{protocol.CLUSTER}'"]),  # a later bad reply is reported as bad
    ],
)
def test_first_valid_reply_of_a_client_wins(fedcam: bool, first: str, second: str, kept_value: float,
                                            reasons: list[str]) -> None:
    specs = [_simple_spec(7, 1, 0.25, fedcam=fedcam), _simple_spec(7, 1, 0.75, fedcam=fedcam)]
    for spec, quality in zip(specs, (first, second)):
        if quality == "bad":
            spec.kind = "cluster-too-large"
            spec.metrics[protocol.CLUSTER] = 2
    strategy = _simple_strategy(fedcam)
    # Both from client 7's node (a re-sent reply); another node's claim is an identity conflict
    # (tests/test_identity_and_influence.py).
    strategy.aggregate_train(1, [_message(spec, 10, 1) for spec in specs])
    for name in TEMPLATE_SHAPES:
        np.testing.assert_array_equal(strategy.cluster_models[1][name], kept_value)
        np.testing.assert_array_equal(strategy.cluster_models[0][name], 0.0)
    assert [r["reason"] for r in strategy.rejected] and len(strategy.rejected) == len(reasons)
    for entry, reason in zip(strategy.rejected, reasons):
        assert re.search(reason, entry["reason"])
    assert strategy.history[-1]["rejected"] == 1


# --------------------------------------------------------------------------- RoutingSettings
@st.composite
def routing_kwargs(draw: st.DrawFn) -> dict[str, Any]:
    controllers = tuple(draw(st.lists(st.sampled_from(CONTROLLER_IDS), min_size=1, max_size=5, unique=True)))
    synchronized = draw(st.booleans())
    min_clusters = 2 if synchronized or "hys" in controllers else 1
    h_min = draw(st.integers(1, 1000))
    return {
        "num_clusters": draw(st.integers(min_clusters, 64)),
        "controllers": controllers,
        "exp3_mode": draw(st.sampled_from(EXP3_MODES)),
        "block_length": draw(st.integers(1, 10**6)),
        "exp3_learning_rate": draw(st.floats(0.0, 1e6, exclude_min=True)),
        "exp3_exploration": draw(st.floats(0.0, 1.0)),
        "rank_hedge_temperature": draw(st.floats(0.0, 1e6)),
        "commitment_margin": draw(st.floats(0.0, 1.0, exclude_max=True)),
        "reversal_mass_threshold": draw(st.floats(0.0, 1.0)),
        "entry_threshold": draw(st.floats(-1.0, 1.0)),
        "hysteresis_min_rounds": h_min,
        "hysteresis_exit_gap": draw(st.floats(0.0, 1e6)),
        "hysteresis_max_rounds": draw(st.integers(h_min, 10**6)),
        "synchronized_entry": synchronized,
    }


@settings(max_examples=150, deadline=None, database=None)
@given(kwargs=routing_kwargs())
def test_routing_settings_accept_good_values(kwargs: dict[str, Any]) -> None:
    routing = RoutingSettings(**kwargs)
    assert RoutingSettings.from_dict(routing.to_dict()) == routing
    assert routing.num_arms == len(kwargs["controllers"])


def _outside(low: float, high: float, *, include_high: bool = True) -> st.SearchStrategy[float]:
    return st.floats(allow_nan=True).filter(
        lambda x: not (low <= x <= high if include_high else low <= x < high))


_NON_INTEGERS = st.one_of(st.floats(allow_nan=True), st.text(max_size=3), st.booleans(), st.none())
_BAD_ROUTING = st.one_of(
    st.tuples(st.just("num_clusters"), st.one_of(st.integers(max_value=0), _NON_INTEGERS)),
    st.tuples(st.just("exp3_exploration"), _outside(0.0, 1.0)),
    st.tuples(st.just("exp3_mode"), st.text(max_size=8).filter(lambda mode: mode not in EXP3_MODES)),
    st.tuples(st.just("block_length"), st.one_of(st.integers(max_value=0), _NON_INTEGERS)),
    st.tuples(st.just("controllers"), st.one_of(
        st.just(()),
        st.lists(st.text(min_size=1, max_size=4), min_size=1, max_size=3).filter(
            lambda ids: any(i not in CONTROLLER_IDS for i in ids)),
        st.sampled_from(CONTROLLER_IDS).map(lambda i: (i, i)))),
    st.tuples(st.just("exp3_learning_rate"), st.one_of(st.floats(max_value=0.0), st.just(math.nan))),
    st.tuples(st.just("rank_hedge_temperature"), st.one_of(st.floats(max_value=-1e-300), st.just(math.nan))),
    st.tuples(st.just("commitment_margin"), _outside(0.0, 1.0, include_high=False)),
    st.tuples(st.just("reversal_mass_threshold"), _outside(0.0, 1.0)),
    st.tuples(st.just("entry_threshold"), _outside(-1.0, 1.0)),
    st.tuples(st.just("hysteresis_min_rounds"), st.one_of(st.integers(max_value=0), _NON_INTEGERS)),
    st.tuples(st.just("hysteresis_exit_gap"), st.one_of(st.floats(max_value=-1e-300), st.just(math.nan))),
    st.tuples(st.just("hysteresis_max_rounds"), st.one_of(st.integers(max_value=4), _NON_INTEGERS)),
)


@settings(max_examples=200, deadline=None, database=None)
@given(bad=_BAD_ROUTING)
def test_routing_settings_reject_bad_values_naming_the_field(bad: tuple[str, Any]) -> None:
    name, value = bad
    with pytest.raises(ValueError, match=f"'{name}'"):
        RoutingSettings(**{name: value})  # every other field at its (valid) default; H_min = 5


# --------------------------------------------------------------------------- parse_run_config
DEFAULTS = app_defaults()


@st.composite
def good_run_overrides(draw: st.DrawFn) -> dict[str, Any]:
    method = draw(st.sampled_from(("all",) + METHODS))
    min_clusters = 2 if method in ("all", "sync-entry") else 1
    overrides: dict[str, Any] = {"method": method}
    if draw(st.booleans()):
        overrides["num-clusters"] = draw(st.one_of(st.integers(min_clusters, 50),
                                                   st.integers(min_clusters, 50).map(float), st.just("auto")))
    if draw(st.booleans()):
        overrides["exp3-exploration"] = draw(st.one_of(st.floats(0.0, 1.0), st.sampled_from([0, 1, "auto"])))
    if draw(st.booleans()):
        overrides["block-length"] = draw(st.one_of(st.integers(1, 10**6), st.integers(1, 1000).map(float),
                                                   st.just("auto")))
    if draw(st.booleans()):
        overrides["num-server-rounds"] = draw(st.one_of(st.integers(1, 10**6), st.integers(1, 1000).map(float)))
    return overrides


@settings(max_examples=100, deadline=None, database=None)
@given(overrides=good_run_overrides())
def test_run_config_accepts_good_values(overrides: dict[str, Any]) -> None:
    run = parse_run_config({**DEFAULTS, **overrides})
    method = overrides["method"]
    assert run.methods == (METHODS if method == "all" else (method,))
    for routing in run.routing.values():
        clusters = overrides.get("num-clusters", "auto")
        assert routing.num_clusters == (DEFAULTS["num-clusters"] if clusters == "auto" else clusters)
        exploration = overrides.get("exp3-exploration", "auto")
        if exploration != "auto":
            assert routing.exp3_exploration == exploration
    assert run.num_rounds == overrides.get("num-server-rounds", DEFAULTS["num-server-rounds"])


_NOT_A_NUMBER = st.one_of(st.text(max_size=4).filter(lambda s: s != "auto"), st.booleans())
_BAD_RUN = st.one_of(
    st.tuples(st.just("num-clusters"), st.one_of(
        st.integers(max_value=0), st.floats(-1e6, 1e6).filter(lambda x: not x.is_integer()), _NOT_A_NUMBER,
        st.just(1))),  # K = 1 is invalid for sync-entry, which method "all" includes
    st.tuples(st.just("exp3-exploration"), st.one_of(
        st.floats(allow_nan=True).filter(lambda g: not 0.0 <= g <= 1.0),
        st.integers().filter(lambda g: g not in (0, 1)), _NOT_A_NUMBER)),
    st.tuples(st.just("method"), st.text(max_size=12).filter(lambda m: m != "all" and m not in METHODS)),
    st.tuples(st.just("num-server-rounds"), st.one_of(
        st.integers(max_value=0), st.floats(-1e6, 1e6).filter(lambda x: not x.is_integer() or x < 1),
        _NOT_A_NUMBER)),
    st.tuples(st.just("block-length"), st.one_of(
        st.floats(-1e6, 1e6).filter(lambda x: not x.is_integer()), st.integers(max_value=0), _NOT_A_NUMBER)),
)


@settings(max_examples=200, deadline=None, database=None)
@given(bad=_BAD_RUN)
def test_run_config_rejects_bad_values_naming_the_key(bad: tuple[str, Any]) -> None:
    key, value = bad
    with pytest.raises(ValueError, match=f"'{re.escape(key)}'"):
        parse_run_config({**DEFAULTS, key: value})


# --------------------------------------------------------------------------- inputs that once crashed the server
def _aggregate_one(spec: Spec) -> ClusteredRouting:
    strategy = _simple_strategy()
    strategy.aggregate_train(1, [_message(spec, 11, 1)])
    return strategy


@pytest.mark.parametrize(("key", "value"), [
    (protocol.EXP3_LOG_WEIGHTS, []),  # np.ptp of an empty list
    (protocol.ROUNDS_PLAYED, math.nan),  # int(nan)
    (protocol.ROUNDS_PLAYED, [1, 2]),  # min() over list and int / int(list)
    (protocol.FEEDBACK, [1.0, 2.0]),  # np.mean over a ragged list
])
def test_unvalidated_optional_metric_does_not_crash(key: str, value: Any) -> None:
    specs = [_simple_spec(1, 1, 0.5), _simple_spec(2, 1, 0.5)]
    specs[0].metrics[key] = value
    specs[1].metrics[key] = {protocol.EXP3_LOG_WEIGHTS: [0.0, -0.5], protocol.ROUNDS_PLAYED: 3,
                             protocol.FEEDBACK: 0.25}[key]  # a well-formed value from another client
    strategy = _simple_strategy()
    strategy.aggregate_train(1, [_message(spec, 10 + i, 1) for i, spec in enumerate(specs)])
    assert [entry["node_id"] for entry in strategy.rejected] == [10]  # rejected, and only that reply
    assert f"'{key}'" in strategy.rejected[0]["reason"]


def test_string_losses_in_a_config_record_are_rejected() -> None:
    spec = _simple_spec(1, 1, 0.5)
    spec.metrics[protocol.LOSSES] = ["0.5", "0.25"]
    spec.metrics_record = "config"
    assert len(_aggregate_one(spec).rejected) == 1


@pytest.mark.parametrize("key", [protocol.CLUSTER, protocol.CLIENT_ID, protocol.NUM_EXAMPLES])
def test_int_beyond_float_range_is_rejected(key: str) -> None:
    spec = _simple_spec(1, 1, 0.5)
    spec.metrics[key] = 10**400
    assert len(_aggregate_one(spec).rejected) == 1


def test_subnormal_num_examples_is_rejected_and_the_smallest_allowed_weight_counts() -> None:
    # 5e-324 (a subnormal float) lies below MIN_NUM_EXAMPLES: rejected, naming the metric; cluster 1 keeps W^t.
    strategy = _aggregate_one(_simple_spec(1, 1, 0.3, num_examples=5e-324))
    assert len(strategy.rejected) == 1 and f"'{protocol.NUM_EXAMPLES}'" in strategy.rejected[0]["reason"]
    assert "out of range" in strategy.rejected[0]["reason"]
    for name in TEMPLATE_SHAPES:
        np.testing.assert_array_equal(strategy.cluster_models[1][name], 1.0)
    assert strategy.history[-1]["routed_1"] == 0 and not strategy.history[-1]["changed_1"]
    # MIN_NUM_EXAMPLES itself is accepted and weighs in: (m·0.3 + 10·0.9) / (m + 10).
    smallest = MIN_NUM_EXAMPLES
    strategy = _simple_strategy()
    strategy.aggregate_train(1, [_message(_simple_spec(1, 1, 0.3, num_examples=smallest), 11, 1),
                                 _message(_simple_spec(2, 1, 0.9, num_examples=10), 12, 1)])
    assert strategy.rejected == []
    expected = (smallest * 0.3 + 10 * 0.9) / (smallest + 10)
    assert expected != 0.9  # the tiny weight is visible in float64
    for name in TEMPLATE_SHAPES:
        np.testing.assert_allclose(strategy.cluster_models[1][name], expected, rtol=0, atol=1e-15)


@pytest.mark.parametrize("key", ["num-clusters", "block-length", "num-server-rounds", "min-train-nodes"])
@pytest.mark.parametrize("value", [math.inf, math.nan])
def test_run_config_non_finite_integer_names_the_key(key: str, value: float) -> None:
    try:
        parse_run_config({**DEFAULTS, key: value})
    except ValueError as error:
        assert f"'{key}'" in str(error)
    else:
        pytest.fail("accepted")


@pytest.mark.parametrize("name", ["exp3_exploration", "exp3_learning_rate", "commitment_margin"])
def test_routing_settings_non_number_names_the_field(name: str) -> None:
    with pytest.raises(ValueError, match=f"'{name}'"):
        RoutingSettings(**{name: "0.5"})
