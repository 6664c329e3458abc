"""The message schema between :class:`ClusteredRouting` and the fedroute ClientApp.

Server → client (``TRAIN``, ``QUERY``, ``EVALUATE``): one ``ArrayRecord`` per
cluster model under :func:`cluster_key` and one ``ConfigRecord`` under
:data:`CONFIG` (the identification ``QUERY`` of partial participation,
:data:`PHASE_IDENTIFY`, carries the ``ConfigRecord`` only).  Client → server: at most one ``ArrayRecord`` under
:data:`MODEL` (the trained routed model; none in a report-only phase) and one
``MetricRecord`` under :data:`METRICS`.

Flower's ``server-round`` counts from 1; the paper's round is
``t = server-round - 1`` and travels as :data:`ROUND_INDEX`.  The provisional
Greedy report of synchronized entry is a ``QUERY`` exchange before server
round 1; server round 1 (``t = 0``) carries the provisional masses.  Before
either, fedroute's ServerApp may ask the nodes for their node config (a
``QUERY`` of phase :data:`PHASE_NODE_CONFIG`, :mod:`fedroute.server.federation`).

This module imports no Flower: it only names things and converts arrays.
"""

from __future__ import annotations

import math
import re
from typing import Any, Mapping, Sequence

import numpy as np
from numpy.typing import DTypeLike, NDArray

from fedroute.core.methods import ALGORITHM_FEDCAM, ALGORITHM_ROUTING  # noqa: F401  (the values of ALGORITHM)

# Record keys.
CONFIG = "config"
MODEL = "model"
GLOBAL_MODEL = "global-model"
METRICS = "metrics"
TRAIN_METRICS = "train-metrics"
"""Optional MetricRecord of a ``TRAIN`` reply: what the user's ``train_fn`` returned (numbers or lists)."""
EVALUATE_METRICS = "evaluate-metrics"
"""Optional MetricRecord of an ``EVALUATE`` reply: metric name → its value for each of the ``K`` models
(a list of ``K`` numbers: the user's ``metrics_fn``, or a task's accuracy)."""
CLUSTER_PREFIX = "cluster-"

# Config keys (server → client).
SERVER_ROUND = "server-round"
ROUND_INDEX = "round-index"
NUM_ROUNDS = "num-rounds"
PHASE = "phase"
MASSES = "masses"
HAS_MASSES = "has-masses"
EXPLORE = "explore"
"""Whether exploration is on (the server's health view, :mod:`fedroute.core.health`; absent before any round)."""
MERGED_INTO = "merged-into"
"""Per cluster, the twin a duplicate is merged into (``-1``: none)."""
SPARE = "spare"
"""Per cluster, whether it is spare."""
SEED = "seed"
RUN_KEY = "run-key"
ALGORITHM = "algorithm"
ROUTING_PREFIX = "routing."
SAMPLED_FRACTION = "sampled-fraction"
"""The strategy's ``fraction_train``: below 1 a client may play its first round at any ``t``."""
TASK_NUM_CLIENTS = "task.num-clients"
"""The number of clients the ServerApp chose (run-config ``num-clients``, or the federation's size when it is
``"auto"``): the ClientApp builds its data with it, so that every node and the server agree."""

SIGNATURE_ORDERS = "signature-orders"
"""A per-node ``ConfigRecord`` of a ``TRAIN`` message under the signature start (:mod:`fedroute.core.signature_start`):
:data:`HELD_ROUTE` and :data:`SEND_SIGNATURE`."""
HELD_ROUTE = "held-route"
"""The cluster the client trains this round (``-1``: route as the method says)."""
SEND_SIGNATURE = "send-signature"
"""Whether the client sends its signature (:data:`SIGNATURE_MEANS`, :data:`SIGNATURE_COUNTS`) with its reply."""

# Phases.
PHASE_TRAIN = "train"
PHASE_PROVISIONAL = "provisional"
PHASE_EVALUATE = "evaluate"
PHASE_IDENTIFY = "identify"
"""A ``QUERY`` without models, before a node is first sampled under partial participation: the
client answers with its ``client-id`` and ``num-examples`` (the server samples clients, not nodes)."""
PHASE_NODE_CONFIG = "node-config"
"""A ``QUERY`` before anything else: each node reports its ``partition-id`` and ``num-partitions``
(:mod:`fedroute.server.federation`); :data:`UNKNOWN` where its node config has none."""

# Metric keys (client → server).
CLUSTER = "cluster"
NUM_EXAMPLES = "num-examples"
CLIENT_ID = "client-id"
LOSSES = "losses"
ROUTE_DISTRIBUTION = "route-distribution"
CONTROLLER = "controller"
ARM = "arm"
FEEDBACK = "feedback"
ENTERED = "entered"
RELEASED = "released"
ROUNDS_PLAYED = "rounds-played"
PREFERRED = "preferred"
"""The client's Greedy choice of the round (its lowest-loss cluster, ties broken as its Greedy breaks them)."""
EXP3_LOG_WEIGHTS = "exp3-log-weights"
SIGNATURE_MEANS = "signature-means"
"""The signature start: the client's sketched class means, ``C × d`` numbers class-major
(:func:`fedroute.core.signatures.sketched_signatures`), sent when its orders ask for it."""
SIGNATURE_COUNTS = "signature-counts"
"""The signature start: the client's samples of each of the ``C`` classes."""
TRAIN_LOSSES = "train-losses"
TEST_LOSSES = "test-losses"
GROUP = "group"
PARTITION_ID = "partition-id"
NUM_PARTITIONS = "num-partitions"
UNKNOWN = -1
APP_FILES = "app-files"
APP_FINGERPRINT = "app-fingerprint"
"""The node-config reply's ConfigRecord (under :data:`CONFIG`): where the ClientApp's fedroute comes from and
a fingerprint of its code (:mod:`fedroute.app_identity`)."""

# Context.state key prefix of a client's controller state.
STATE_PREFIX = "fedroute-state:"


PATH_NAME = re.compile(r"[A-Za-z0-9._-]{1,128}")
"""Names that become a file or directory name (run keys): letters, digits, ``.``, ``_``, ``-``."""


def check_path_name(name: Any, what: str) -> str:
    """``name`` if it is safe as one path component (:data:`PATH_NAME`, not ``.`` or ``..``), else ``ValueError``."""
    if not isinstance(name, str) or not PATH_NAME.fullmatch(name) or name in (".", ".."):
        shown = repr(name[:40]) + ("…" if len(name) > 40 else "") if isinstance(name, str) else type(name).__name__
        raise ValueError(f"{what} = {shown} is invalid; allowed: 1-128 characters from [A-Za-z0-9._-], "
                         "not '.' or '..' (it names a directory)")
    return name


def cluster_key(cluster: int) -> str:
    """Record key of cluster model ``cluster``."""
    return f"{CLUSTER_PREFIX}{cluster}"


def routing_config(settings_dict: Mapping[str, Any]) -> dict[str, Any]:
    """Prefix routing settings for a ConfigRecord (``routing.<name>``)."""
    return {f"{ROUTING_PREFIX}{name}": value for name, value in settings_dict.items()}


def routing_settings_from_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """Inverse of :func:`routing_config`."""
    return {key[len(ROUTING_PREFIX):]: value for key, value in config.items() if key.startswith(ROUTING_PREFIX)}


def flatten_arrays(arrays: Mapping[str, NDArray]) -> NDArray[np.float64]:
    """Concatenate a model's named arrays (in their order) into one float64 vector."""
    return np.concatenate([np.asarray(value, dtype=np.float64).ravel() for value in arrays.values()]) if arrays \
        else np.zeros(0)


def flat_dtype(template: Mapping[str, NDArray]) -> np.dtype:
    """The dtype a model of this layout keeps when flattened without loss: the arrays' own if they share
    one floating dtype (e.g. float32 throughout), else float64."""
    dtypes = {np.asarray(value).dtype for value in template.values()}
    if len(dtypes) == 1 and (dtype := dtypes.pop()).kind == "f":
        return dtype
    return np.dtype(np.float64)


def stack_flat(models: Sequence[Mapping[str, NDArray]], dtype: DTypeLike = np.float64) -> NDArray:
    """Models (named arrays of one layout) as the rows of one ``(len(models), P)`` array of ``dtype``.

    Each array is copied once, straight into its row (``np.stack`` of
    :func:`flatten_arrays` would copy twice and widen to float64 first).  With
    ``dtype = flat_dtype(template)`` nothing is rounded; the aggregation widens
    the values exactly where it computes in float64.
    """
    if not models:
        return np.zeros((0, 0), dtype=dtype)
    sizes = [int(np.asarray(value).size) for value in models[0].values()]
    rows = np.empty((len(models), sum(sizes)), dtype=dtype)
    for row, arrays in zip(rows, models):
        offset = 0
        for value, size in zip(arrays.values(), sizes):
            row[offset:offset + size] = np.asarray(value).reshape(-1)
            offset += size
    return rows


def unflatten_arrays(vector: NDArray, template: Mapping[str, NDArray]) -> dict[str, NDArray]:
    """Split a flat vector back into arrays shaped and typed like ``template``."""
    arrays, offset = {}, 0
    for name, value in template.items():
        size = math.prod(value.shape)
        arrays[name] = np.asarray(vector[offset:offset + size]).reshape(value.shape).astype(value.dtype)
        offset += size
    if offset != len(vector):
        raise ValueError(f"vector has {len(vector)} entries; the template needs {offset}")
    return arrays
