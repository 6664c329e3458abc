"""California Housing, two occupancy regimes (paper Appendix B.5, EXPERIMENTS E6); pure numpy.

Data
    The California Housing table (20,640 census block groups; features
    ``MedInc, HouseAge, AveRooms, AveBedrms, Population, AveOccup, Latitude,
    Longitude``; target ``MedHouseVal``).  The real loader is
    ``sklearn.datasets.fetch_california_housing(as_frame=True)``.  Where its
    download host cannot be reached (and scikit-learn has no cached copy), the
    loader logs a warning and uses the copy shipped inside the package,
    :data:`EMBEDDED_TABLE` (``tasks/data/california_housing.csv.gz``, StatLib /
    Pace & Barry 1997, the same values as the download to 3.3e-7; source,
    licence and sha256 in ``tasks/data/README.md``).  Any other local copy
    (csv, csv.gz or parquet with those nine columns) can be named:
    ``data_file=`` in Python, run-config key ``data-file``, or the environment
    variable ``FEDROUTE_HOUSING_FILE`` (used whenever no file is given; an
    empty ``data-file`` means "not given").  A relative path is resolved
    against the working directory of the process that reads it, so Flower runs
    should pass an absolute path.  Naming a file also skips the download
    attempt (scikit-learn retries 3 times, ≈ 6 s when offline, once per
    process).

Processing (paper B.5)
    1. A seeded random split of the block groups: ``round(test_fraction · N)``
       rows are held out (:func:`split_rows`, ``generator(seed, 0, 0, DATA)``).
    2. Group 1 iff ``AveOccup ≥ q``, ``q`` the 0.75-quantile (numpy's default,
       linear interpolation) of the *training* ``AveOccup``; group 0 otherwise.
       Test rows are labelled with the same ``q``.
    3. The eight features are standardised with the mean and (population,
       ``ddof = 0``) standard deviation of all training rows, and a constant
       ``1`` is appended last: ``x ∈ R^9``, model ``f_w(x) = xᵀw``.
    4. Loss ``L_i(w) = n_i⁻¹ Σ_j (x_ijᵀw − y_ij)²`` (no ½, as the paper's ``L_i``).

Clients (our choice)
    Pure-group clients.  Group 1 gets ``c_1 = clip(round(n · p_1), 2, n − 2)``
    clients, ``p_1`` its share of the training rows; group 0 gets
    ``c_0 = n − c_1``.  Clients ``0 … c_0−1`` are group 0 and ``c_0 … n−1``
    group 1.  A group's training rows, in the order of the seeded split
    permutation (i.e. shuffled), are cut into ``c_g`` contiguous chunks of
    near-equal size (``numpy.array_split``); its test rows likewise.  Client
    sizes therefore differ (by at most one row within a group, a little more
    between groups).  The rows are padded to the largest client with zero rows
    and a sample mask (:class:`HousingSamples`); the mask-weighted loss moments
    of each client's own rows (:class:`HousingClients`, as in the linear task)
    vectorise losses and updates over clients of unequal size and let batches
    of different seeds be concatenated; ``num_examples`` are the true counts.

Oracle and initialisation (paper B.5; jitter is our choice)
    ``β*_g`` is the least-squares fit on group ``g``'s training rows,
    ``Δ_β = ‖β*_0 − β*_1‖``.  Unit directions ``d_0, d_1`` are drawn once from
    ``generator(seed, 0, 0, TASK)``; ``u_g(R) = β*_g + R Δ_β d_g`` and
    ``ū(R) = ½(u_0(R) + u_1(R))``.  Cluster model ``k`` starts at
    ``ū(R) + init_jitter · Δ_β · z_k`` with ``z_k ~ N(0, I_9)`` from
    ``generator(seed, 0, 0, INIT)`` (per-coordinate standard deviation
    ``init_jitter · Δ_β``), so the ``K`` models start close together near
    ``ū(R)``, at a distance from both oracles that grows with ``R``.

Entrance (``entrance``; as the GMM task's, EXPERIMENTS E5/E6)
    The jitter alone decides the round-zero routes: that start (init draw 0,
    ``entrance = "any"``) is a collapsed entrance — every client's
    controller-free greedy choice on its training losses at ``W^0`` the same
    model — in only 8 of E6's 40 starts (seeds 0–9, ``R ∈ {0, 0.5, 1, 2}``).
    ``"collapsed"`` (the default) conditions the start on it: init draw
    ``j = 0, 1, …`` is the same construction with ``z_k`` from
    ``generator(seed, 0, j, INIT)``, and the first draw whose greedy choices
    (ties to the lowest index) leave a model unused (``K^0 < K``; ``K^0 = 1``
    for ``K = 2``) is the start (:meth:`HousingTask.initial_draw`; at most
    ``max_init_draws``).

Defaults (our choice, EXPERIMENTS E6; measured on the real table)
    ``num_clients = 20`` (15 group-0 + 5 group-1 clients of 825–826 training
    rows each), ``test_fraction = 0.2``, ``local_steps = 1``,
    ``init_radius = 1.0``, ``init_jitter = 0.05``.

    ``learning_rate = 0.05`` is set by stability, not speed: a cluster that
    only one client trains does gradient descent on that client's ``L_i``,
    stable iff ``η < 1/λ_max(X_iᵀX_i/n_i)``.  Over seeds 0–59 the smallest
    such limit among the 20 clients is 0.050–0.095 (minimum 0.0504, seed 3),
    set by the client holding the extreme ``AveOccup`` rows (standardised
    values of order 100); the group-level limits are far looser (≈ 0.25 for
    group 1, ≈ 0.41 for group 0).

    Convergence alone (``E = 1``: sample-weighted averaging of the group's
    clients' updates *is* one full-batch gradient step on the group's rows).
    Excess training loss ``L_g(w_T) − L_g(β*_g)`` from ``ū(R)``, seeds 0–19:
    group 1 is within 0.02 by ``T = 1000`` for ``R ≤ 2`` in every seed
    (``R = 4``: 18 of 20, max 0.029).  Group 0 is ill-conditioned
    (``λ_min(XᵀX/n) ≈ 0.001``, along ``AveOccup``, whose within-group spread is
    small in globally standardised units, while that coefficient of ``β*_0``,
    ≈ −8, is nearly all of ``Δ_β ≈ 8``): at ``T = 1000`` the median / max excess
    is 0.014 / 0.034, 0.017 / 0.060, 0.023 / 0.134 and 0.034 / 0.369 for
    ``R = 0.5, 1, 2, 4``, against ``L_0(β*_0) ≈ 0.49`` and a cross-group gap
    ``L_0(β*_1) − L_0(β*_0) ≈ 0.32``.  Hence: ``T ≥ 1000`` and ``R ≤ 2`` keep
    under-training small against the group gap; at ``R = 4`` a group-0 model
    trained alone may still be worse for group 0 than ``β*_1`` after 1000 rounds.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import functools
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Union

import numpy as np
from numpy.typing import NDArray

if TYPE_CHECKING:  # pandas is imported where a table is read: clients never need it
    import pandas as pd

from fedroute.core.randomness import Purpose, generator
from fedroute.core.task import checked_client_ids, validate_task_settings
from fedroute.core.validation import invalid
from fedroute.tasks.entrance import ENTRANCES, conditioned_start

__all__ = [
    "FEATURES",
    "TARGET",
    "COLUMNS",
    "DATA_FILE_ENV",
    "EMBEDDED_TABLE",
    "EMBEDDED_TABLE_SHA256",
    "HousingTask",
    "HousingClients",
    "HousingSamples",
    "load_california_housing",
    "load_california_housing_from",
    "split_rows",
]

FEATURES = ("MedInc", "HouseAge", "AveRooms", "AveBedrms", "Population", "AveOccup", "Latitude", "Longitude")
TARGET = "MedHouseVal"
COLUMNS = FEATURES + (TARGET,)
DATA_FILE_ENV = "FEDROUTE_HOUSING_FILE"
"""Environment variable naming the default local copy of the table."""

OCCUPANCY_QUANTILE = 0.75
DIMENSION = len(FEATURES) + 1

EMBEDDED_TABLE = Path(__file__).resolve().parent / "data" / "california_housing.csv.gz"
"""The table shipped with the package (used when the download host is unreachable)."""
EMBEDDED_TABLE_SHA256 = "b4ef11bee82f828f07f908a28066137f13d292533e31011a70c4e9e51852acfd"
"""sha256 of :data:`EMBEDDED_TABLE` (``tasks/data/README.md``)."""

_OFFLINE_HINT = (
    "pass data_file= (run-config key 'data-file', CLI --data-file) pointing at a local copy of the "
    f"table (csv, csv.gz or parquet), or set the environment variable {DATA_FILE_ENV}"
)

logger = logging.getLogger("fedroute")


def _default_data_file(data_file: Union[str, Path, None]) -> Optional[Path]:
    """The file to read: ``data_file``, else ``$FEDROUTE_HOUSING_FILE``, else None (download)."""
    if data_file is None or str(data_file) == "":
        data_file = os.environ.get(DATA_FILE_ENV) or None
    return None if data_file is None else Path(data_file).expanduser()


def _read_table(path: Path) -> pd.DataFrame:
    import pandas as pd

    name = path.name.lower()
    if not path.is_file():
        raise FileNotFoundError(f"California Housing data file {str(path)!r} does not exist")
    if name.endswith((".csv", ".csv.gz")):
        frame = pd.read_csv(path)
    elif name.endswith((".parquet", ".pq")):
        frame = pd.read_parquet(path)
    else:
        raise ValueError(f"California Housing data file {str(path)!r}: unknown format; "
                         "allowed: .csv, .csv.gz or .parquet")
    missing = [column for column in COLUMNS if column not in frame.columns]
    if missing:
        raise ValueError(f"California Housing data file {str(path)!r} lacks the column(s) {missing}; "
                         f"required: {list(COLUMNS)}")
    return frame


def load_california_housing(data_file: Union[str, Path, None] = None) -> pd.DataFrame:
    """The California Housing table: the 8 features and ``MedHouseVal`` (float64).

    Parameters
    ----------
    data_file : str or Path, optional
        A local copy (csv, csv.gz or parquet) with at least the columns
        :data:`COLUMNS`.  Default: ``$FEDROUTE_HOUSING_FILE`` if set, otherwise
        ``sklearn.datasets.fetch_california_housing(as_frame=True)``.

    Returns
    -------
    pandas.DataFrame
        Columns :data:`COLUMNS`, in that order, one row per block group.

    Raises
    ------
    ValueError
        The file lacks a required column (named), has an unknown format, or
        holds non-finite values.
    FileNotFoundError
        ``data_file`` does not exist.
    RuntimeError
        No file given, the download host of ``fetch_california_housing`` is
        unreachable and the embedded copy is missing (the message says how to
        pass a local copy).
    """
    return load_california_housing_from(data_file)[0]


def load_california_housing_from(data_file: Union[str, Path, None] = None) -> tuple[pd.DataFrame, Optional[Path]]:
    """:func:`load_california_housing` and the file it read (None: the download).

    The file is ``data_file``, ``$FEDROUTE_HOUSING_FILE`` or, when the download
    host is unreachable, :data:`EMBEDDED_TABLE`.
    """
    return _load_from(_default_data_file(data_file))


def _load_from(path: Optional[Path]) -> tuple[pd.DataFrame, Optional[Path]]:
    """Read ``path`` or, if None, the real loader with the embedded fallback (no environment lookup here)."""
    if path is None:
        frame = _fetch()
        if frame is not None:
            return _checked(frame, "fetch_california_housing"), None
        path = EMBEDDED_TABLE
    return _checked(_read_table(path), repr(str(path))), path


def _fetch() -> Optional[pd.DataFrame]:
    """The real loader's table, or None (logged) when its download host is unreachable."""
    from sklearn.datasets import fetch_california_housing

    try:
        return fetch_california_housing(as_frame=True).frame
    except OSError as error:  # URLError, HTTPError, ConnectionError, socket timeouts
        if not EMBEDDED_TABLE.is_file():
            raise RuntimeError(
                "cannot load California Housing: the download host of "
                f"sklearn.datasets.fetch_california_housing is unreachable ({error}) and the embedded copy "
                f"{EMBEDDED_TABLE} is missing; {_OFFLINE_HINT}"
            ) from error
        logger.warning("California Housing: the download host of fetch_california_housing is unreachable (%s); "
                       "using the table shipped with fedroute, %s (same values to 3.3e-7)", error, EMBEDDED_TABLE)
        return None


def _load(path: Optional[Path]) -> pd.DataFrame:
    """The table of :func:`_load_from`."""
    return _load_from(path)[0]


def _checked(frame: pd.DataFrame, source: str) -> pd.DataFrame:
    """The nine columns as float64; every value finite."""
    frame = frame.loc[:, list(COLUMNS)].astype(np.float64).reset_index(drop=True)
    if not np.isfinite(frame.to_numpy()).all():
        raise ValueError(f"California Housing table from {source} holds missing or non-finite values")
    return frame


def split_rows(num_rows: int, test_fraction: float, seed: int) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """The seeded train/test split of row indices: ``(train, test)``, each in shuffled order.

    ``round(test_fraction · num_rows)`` rows are held out; the permutation is
    ``generator(seed, 0, 0, Purpose.DATA).permutation(num_rows)``.
    """
    order = generator(seed, 0, 0, Purpose.DATA).permutation(num_rows).astype(np.int64)
    num_test = int(round(test_fraction * num_rows))
    return order[num_test:], order[:num_test]


@functools.lru_cache(maxsize=4)
def _cached_table(source: Optional[str]) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Features (N, 8) and target (N,) of one source, read once per process (read-only)."""
    frame = _load(None if source is None else Path(source))
    features = frame.loc[:, list(FEATURES)].to_numpy(dtype=np.float64)
    target = frame[TARGET].to_numpy(dtype=np.float64)
    features.flags.writeable = False
    target.flags.writeable = False
    return features, target


def _source_key(data_file: Union[str, Path, None]) -> Optional[str]:
    path = _default_data_file(data_file)
    return None if path is None else str(path.resolve())


@dataclass(frozen=True)
class _Prepared:
    """The processed table of one (source, test_fraction, seed, num_clients)."""

    train_inputs: tuple[NDArray[np.float64], ...]  # per client, (n_i, 9)
    train_targets: tuple[NDArray[np.float64], ...]
    test_inputs: tuple[NDArray[np.float64], ...]
    test_targets: tuple[NDArray[np.float64], ...]
    client_groups: NDArray[np.int64]  # (num_clients,)
    train_moments: tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]  # all clients
    test_moments: tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]
    group_parameters: NDArray[np.float64]  # β*, (2, 9)
    threshold: float
    feature_mean: NDArray[np.float64]
    feature_std: NDArray[np.float64]
    table: pd.DataFrame


def _readonly(array: NDArray) -> NDArray:
    array.flags.writeable = False
    return array


@functools.lru_cache(maxsize=8)
def _prepare(source: Optional[str], test_fraction: float, seed: int, num_clients: int) -> _Prepared:
    raw, target = _cached_table(source)
    train, test = split_rows(len(raw), test_fraction, seed)
    if len(train) < 2 or len(test) < 2:
        raise ValueError(f"housing task: {len(raw)} rows with 'test-fraction' = {test_fraction} leave "
                         f"{len(train)} training and {len(test)} test rows; need ≥ 2 of each")
    occupancy = raw[:, FEATURES.index("AveOccup")]
    threshold = float(np.quantile(occupancy[train], OCCUPANCY_QUANTILE))
    group = (occupancy >= threshold).astype(np.int64)
    mean = raw[train].mean(axis=0)
    std = raw[train].std(axis=0)
    if np.any(std == 0):
        constant = [FEATURES[j] for j in np.flatnonzero(std == 0)]
        raise ValueError(f"housing task: feature(s) {constant} are constant on the training rows")
    inputs = np.concatenate([(raw - mean) / std, np.ones((len(raw), 1))], axis=1)

    train_by_group = [train[group[train] == g] for g in (0, 1)]
    test_by_group = [test[group[test] == g] for g in (0, 1)]
    share = len(train_by_group[1]) / len(train)
    clients_per_group = [0, int(np.clip(round(num_clients * share), 2, num_clients - 2))]
    clients_per_group[0] = num_clients - clients_per_group[1]
    for g in (0, 1):
        for split, rows in (("training", train_by_group[g]), ("test", test_by_group[g])):
            if len(rows) < clients_per_group[g]:
                raise ValueError(
                    f"housing task: group {g} has {len(rows)} {split} rows for {clients_per_group[g]} clients; "
                    "lower 'num-clients' or change 'test-fraction' (every client needs ≥ 1 training and test row)"
                )

    beta = np.empty((2, DIMENSION))
    for g in (0, 1):
        beta[g] = np.linalg.lstsq(inputs[train_by_group[g]], target[train_by_group[g]], rcond=None)[0]

    client_of_row = np.full(len(raw), -1, dtype=np.int64)
    train_parts: list[NDArray[np.int64]] = []
    test_parts: list[NDArray[np.int64]] = []
    first = 0
    for g in (0, 1):
        train_chunks = np.array_split(train_by_group[g], clients_per_group[g])
        test_chunks = np.array_split(test_by_group[g], clients_per_group[g])
        for offset, (train_rows, test_rows) in enumerate(zip(train_chunks, test_chunks)):
            client_of_row[train_rows] = client_of_row[test_rows] = first + offset
            train_parts.append(train_rows)
            test_parts.append(test_rows)
        first += clients_per_group[g]
    client_groups = np.repeat(np.arange(2, dtype=np.int64), clients_per_group)

    import pandas as pd

    split_label = np.full(len(raw), "train", dtype=object)
    split_label[test] = "test"
    table = pd.DataFrame(raw, columns=list(FEATURES))
    table[TARGET] = target
    table["split"] = split_label
    table["group"] = group
    table["client"] = client_of_row
    train_inputs = tuple(_readonly(inputs[rows]) for rows in train_parts)
    train_targets = tuple(_readonly(target[rows]) for rows in train_parts)
    test_inputs = tuple(_readonly(inputs[rows]) for rows in test_parts)
    test_targets = tuple(_readonly(target[rows]) for rows in test_parts)
    return _Prepared(
        train_inputs=train_inputs, train_targets=train_targets,
        test_inputs=test_inputs, test_targets=test_targets,
        client_groups=_readonly(client_groups),
        train_moments=_moments(*_pad(train_inputs, train_targets)),
        test_moments=_moments(*_pad(test_inputs, test_targets)),
        group_parameters=_readonly(beta),
        threshold=threshold,
        feature_mean=_readonly(mean),
        feature_std=_readonly(std),
        table=table,
    )


def _pad(
    inputs: tuple[NDArray[np.float64], ...], targets: tuple[NDArray[np.float64], ...]
) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.bool_]]:
    """Stack per-client rows, zero-padded to the longest client: ``(n, S, 9)``, ``(n, S)``, mask ``(n, S)``."""
    longest = max(len(part) for part in targets)
    stacked_inputs = np.zeros((len(targets), longest, DIMENSION))
    stacked_targets = np.zeros((len(targets), longest))
    mask = np.zeros((len(targets), longest), dtype=bool)
    for row, (x, y) in enumerate(zip(inputs, targets)):
        stacked_inputs[row, : len(y)], stacked_targets[row, : len(y)], mask[row, : len(y)] = x, y, True
    return stacked_inputs, stacked_targets, mask


def _moments(
    inputs: NDArray[np.float64], targets: NDArray[np.float64], mask: NDArray[np.bool_]
) -> tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]:
    """``(XᵀX/n_i, Xᵀy/n_i, yᵀy/n_i)`` per client over its real (masked-in) rows only."""
    weights = mask / mask.sum(axis=1, keepdims=True)
    return (
        _readonly(np.einsum("nsd,nse,ns->nde", inputs, inputs, weights)),
        _readonly(np.einsum("nsd,ns,ns->nd", inputs, targets, weights)),
        _readonly(np.einsum("ns,ns,ns->n", targets, targets, weights)),
    )


@dataclass(frozen=True)
class HousingSamples:
    """The rows of a batch of housing clients, zero-padded to the largest client with a sample mask.

    ``train_inputs`` is ``(n, S, 9)`` with ``S`` the largest client's row count;
    rows with ``train_mask == False`` are padding.  Likewise for the test split.
    """

    client_ids: NDArray[np.int64]
    groups: NDArray[np.int64]
    train_inputs: NDArray[np.float64]
    train_targets: NDArray[np.float64]
    train_mask: NDArray[np.bool_]
    test_inputs: NDArray[np.float64]
    test_targets: NDArray[np.float64]
    test_mask: NDArray[np.bool_]

    @property
    def num_examples(self) -> NDArray[np.int64]:
        """``n_i``: the true number of training rows of each client."""
        return self.train_mask.sum(axis=1).astype(np.int64)


@dataclass(frozen=True)
class HousingClients:
    """Training and held-out data of a batch of housing clients, as loss moments.

    The squared loss needs only each client's moments over its own rows,
    ``Σ̂ = XᵀX/n_i``, ``b = Xᵀy/n_i`` and ``c = yᵀy/n_i`` (computed from the
    padded rows with the sample mask, so padding never enters):
    ``L_i(w) = wᵀΣ̂w − 2bᵀw + c`` and ``∇L_i(w) = 2(Σ̂w − b)``.  Clients of
    unequal size are thus vectorised without padding, batches of different
    seeds concatenate along the client axis (the batched simulator), and a loss
    or update costs ``O(9²)`` per client and model.  The rows themselves are
    :meth:`HousingTask.samples`.
    """

    client_ids: NDArray[np.int64]
    groups: NDArray[np.int64]
    num_examples: NDArray[np.int64]
    """``n_i``: the true number of training rows of each client."""
    num_test_examples: NDArray[np.int64]
    train_moments: tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]
    test_moments: tuple[NDArray[np.float64], NDArray[np.float64], NDArray[np.float64]]
    local_steps: int
    learning_rate: float

    def losses(self, cluster_models: NDArray[np.floating], split: str = "train") -> NDArray[np.float64]:
        """``n_i⁻¹ Σ_j (x_ijᵀw_k − y_ij)²`` for every client and model, shape (n, K).

        ``cluster_models`` is ``(K, 9)`` (shared) or ``(n, K, 9)`` (one set per client).
        """
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        second, cross, target = self.train_moments if split == "train" else self.test_moments
        models = np.asarray(cluster_models, dtype=np.float64)
        if not (models.ndim == 2 or (models.ndim == 3 and models.shape[0] == len(self.client_ids))) \
                or models.shape[-1] != DIMENSION:
            raise ValueError(f"cluster_models must be (K, {DIMENSION}) or ({len(self.client_ids)}, K, "
                             f"{DIMENSION}), got shape {models.shape}")
        if models.ndim == 2:
            models = models[None]
        quadratic = np.sum(models * np.matmul(models, second), axis=-1)
        losses = quadratic - 2.0 * np.sum(models * cross[:, None, :], axis=-1) + target[:, None]
        return np.maximum(losses, 0.0)  # the expansion can round a perfect fit to -1e-16

    def local_update(
        self, models: NDArray[np.floating], client_index: NDArray[np.int64], round_index: int
    ) -> NDArray[np.floating]:
        """``E`` full-batch gradient steps ``w ← w − η·2(Σ̂w − b)`` of model ``j`` on client
        ``client_index[j]``'s own rows (deterministic; ``round_index`` unused)."""
        client_index = np.asarray(client_index, dtype=np.int64)
        second, cross, _ = self.train_moments
        second, cross = second[client_index], cross[client_index]
        parameters = np.array(models, dtype=np.float64, copy=True)
        for _ in range(self.local_steps):
            gradient = 2.0 * (np.matmul(second, parameters[:, :, None])[:, :, 0] - cross)
            parameters -= self.learning_rate * gradient
        return parameters


@dataclass(frozen=True)
class HousingTask:
    """Configuration of the California Housing task (see the module docstring).

    Parameters
    ----------
    num_clients : int
        ``n`` (≥ 4, so that each group has ≥ 2 clients); split over the groups
        in proportion to their training rows.
    test_fraction : float
        Share of block groups held out, in ``(0, 1)``.
    local_steps : int
        ``E`` full-batch gradient steps per local update (≥ 1).
    learning_rate : float
        ``η_loc`` in ``(0, 1]``.
    init_radius : float
        ``R`` (≥ 0) of ``u_g(R) = β*_g + R Δ_β d_g``.
    init_jitter : float
        Per-coordinate noise of each initial cluster model, in units of
        ``Δ_β`` (≥ 0).
    seed : int
        Split, directions and initialisation seed (≥ 0).
    entrance : {"collapsed", "any"}
        ``"collapsed"`` (default): the first init draw with ``K^0 < K``; ``"any"``: draw 0
        (module docstring).
    max_init_draws : int
        Draws ``"collapsed"`` may take before it raises (≥ 1).
    data_file : str, optional
        Local copy of the table (csv, csv.gz, parquet); default
        ``$FEDROUTE_HOUSING_FILE``, else ``fetch_california_housing``.
    """

    num_clients: int = 20
    test_fraction: float = 0.2
    local_steps: int = 1
    learning_rate: float = 0.05
    init_radius: float = 1.0
    init_jitter: float = 0.05
    seed: int = 0
    entrance: str = "collapsed"
    max_init_draws: int = 1000
    data_file: Optional[str] = None
    name: str = "housing"

    def __post_init__(self) -> None:
        validate_task_settings(
            self, "housing", integers=("num_clients", "local_steps", "seed", "max_init_draws"),
            numbers=("test_fraction", "learning_rate", "init_radius", "init_jitter"), checks=lambda: [
            (self.num_clients >= 4, "num-clients", self.num_clients, "an integer ≥ 4 (≥ 2 clients per group)"),
            (0 < self.test_fraction < 1, "test-fraction", self.test_fraction, "a number in (0, 1)"),
            (self.local_steps >= 1, "local-steps", self.local_steps, "an integer ≥ 1"),
            (0 < self.learning_rate <= 1, "learning-rate", self.learning_rate, "(0, 1]"),
            (np.isfinite(self.init_radius) and self.init_radius >= 0, "init-radius", self.init_radius, "≥ 0"),
            (np.isfinite(self.init_jitter) and self.init_jitter >= 0, "init-jitter", self.init_jitter, "≥ 0"),
            (self.seed >= 0, "seed", self.seed, "an integer ≥ 0"),
            (self.entrance in ENTRANCES, "entrance", self.entrance, f"one of {ENTRANCES}"),
            (self.max_init_draws >= 1, "max-init-draws", self.max_init_draws, "an integer ≥ 1"),
        ])
        if self.data_file is not None:
            if not isinstance(self.data_file, (str, Path)):
                raise invalid("housing task setting 'data-file'", self.data_file, "a path")
            object.__setattr__(self, "data_file", str(self.data_file) or None)
        if self.data_file is not None and not Path(self.data_file).expanduser().is_file():
            raise invalid("housing task setting 'data-file'", self.data_file, "an existing csv, csv.gz or parquet "
                          f"file (relative paths are resolved against the working directory {os.getcwd()!r})")

    # -- processed data (read once per process and cached) -------------------------------------
    @property
    def _data(self) -> _Prepared:
        return _prepare(_source_key(self.data_file), float(self.test_fraction), int(self.seed),
                        int(self.num_clients))

    @property
    def table(self) -> pd.DataFrame:
        """The raw table with ``split`` ("train"/"test"), ``group`` and ``client`` columns (a copy)."""
        return self._data.table.copy()

    @property
    def occupancy_threshold(self) -> float:
        """``q``: the 0.75-quantile of the training ``AveOccup``."""
        return self._data.threshold

    @property
    def feature_mean(self) -> NDArray[np.float64]:
        """Training mean of the 8 raw features."""
        return self._data.feature_mean

    @property
    def feature_std(self) -> NDArray[np.float64]:
        """Training (population) standard deviation of the 8 raw features."""
        return self._data.feature_std

    @property
    def group_parameters(self) -> NDArray[np.float64]:
        """``β*_g`` (least squares on group ``g``'s training rows) as a (2, 9) array."""
        return self._data.group_parameters

    @property
    def group_distance(self) -> float:
        """``Δ_β = ‖β*_0 − β*_1‖``."""
        beta = self.group_parameters
        return float(np.linalg.norm(beta[0] - beta[1]))

    @property
    def group_proportions(self) -> NDArray[np.float64]:
        """Share of clients in each group."""
        return np.bincount(self._data.client_groups, minlength=2) / self.num_clients

    @property
    def directions(self) -> NDArray[np.float64]:
        """The fixed unit directions ``d_g``, shape (2, 9) (``generator(seed, 0, 0, TASK)``)."""
        draws = generator(self.seed, 0, 0, Purpose.TASK).standard_normal((2, DIMENSION))
        return draws / np.linalg.norm(draws, axis=1, keepdims=True)

    def displaced_parameters(self, radius: Optional[float] = None) -> NDArray[np.float64]:
        """``u_g(R) = β*_g + R Δ_β d_g``, shape (2, 9) (default ``R = init_radius``)."""
        radius = self.init_radius if radius is None else radius
        return self.group_parameters + radius * self.group_distance * self.directions

    def initial_centre(self, radius: Optional[float] = None) -> NDArray[np.float64]:
        """``ū(R) = ½(u_0(R) + u_1(R))``, shape (9,)."""
        return self.displaced_parameters(radius).mean(axis=0)

    def groups(self, client_ids: NDArray[np.int64]) -> NDArray[np.int64]:
        """Latent group of each client (evaluation only)."""
        client_ids = self._checked(client_ids)
        return self._data.client_groups[client_ids].copy()

    def _checked(self, client_ids: NDArray[np.int64]) -> NDArray[np.int64]:
        client_ids = checked_client_ids(client_ids, self.num_clients)
        return client_ids

    def samples(self, client_ids: NDArray[np.int64]) -> HousingSamples:
        """The given clients' rows (standardised ``x ∈ R^9`` and ``MedHouseVal``), padded to the
        largest of them with a sample mask."""
        client_ids = self._nonempty(client_ids)
        data = self._data
        train_inputs, train_targets, train_mask = _pad(tuple(data.train_inputs[i] for i in client_ids),
                                                       tuple(data.train_targets[i] for i in client_ids))
        test_inputs, test_targets, test_mask = _pad(tuple(data.test_inputs[i] for i in client_ids),
                                                    tuple(data.test_targets[i] for i in client_ids))
        return HousingSamples(
            client_ids=client_ids, groups=data.client_groups[client_ids].copy(),
            train_inputs=train_inputs, train_targets=train_targets, train_mask=train_mask,
            test_inputs=test_inputs, test_targets=test_targets, test_mask=test_mask,
        )

    def clients(self, client_ids: NDArray[np.int64]) -> HousingClients:
        """The given clients' data as loss moments (see :class:`HousingClients`); a client's
        data do not depend on which other clients are in the batch."""
        client_ids = self._nonempty(client_ids)
        data = self._data
        return HousingClients(
            client_ids=client_ids, groups=data.client_groups[client_ids].copy(),
            num_examples=np.array([len(data.train_targets[i]) for i in client_ids], dtype=np.int64),
            num_test_examples=np.array([len(data.test_targets[i]) for i in client_ids], dtype=np.int64),
            train_moments=tuple(moment[client_ids] for moment in data.train_moments),
            test_moments=tuple(moment[client_ids] for moment in data.test_moments),
            local_steps=self.local_steps, learning_rate=self.learning_rate,
        )

    def _nonempty(self, client_ids: NDArray[np.int64]) -> NDArray[np.int64]:
        client_ids = self._checked(client_ids)
        if client_ids.size == 0:
            raise ValueError("need at least one client id")
        return client_ids

    def _init_draw(self, draw: int, num_clusters: int) -> NDArray[np.float64]:
        """Init draw ``draw``: ``ū(R) + init_jitter · Δ_β · z_k``, ``z_k ~ N(0, I_9)`` from
        ``generator(seed, 0, draw, INIT)``, shape (K, 9)."""
        noise = generator(self.seed, 0, draw, Purpose.INIT).standard_normal((num_clusters, DIMENSION))
        return self.initial_centre() + self.init_jitter * self.group_distance * noise

    def initial_draw(self, num_clusters: int) -> tuple[NDArray[np.float64], int]:
        """``(W^0, draws)``: the start of :attr:`entrance` and the number of init draws it took
        (:func:`~fedroute.tasks.entrance.conditioned_start`: ``"any"`` draw 0, ``"collapsed"`` the first
        draw whose greedy choices on the training losses leave a model unused).

        Raises
        ------
        ValueError
            ``num_clusters`` not an integer ≥ 1 (≥ 2 for ``"collapsed"``), or no collapsed draw within
            ``max_init_draws``.
        """
        if isinstance(num_clusters, bool) or int(num_clusters) != num_clusters or num_clusters < 1:
            raise ValueError(f"num_clusters must be an integer ≥ 1, got {num_clusters!r}")
        return conditioned_start(self.entrance, lambda draw: self._init_draw(draw, int(num_clusters)),
                                 lambda: self.clients(np.arange(self.num_clients)), int(num_clusters),
                                 self.max_init_draws, f"housing task (seed {self.seed}, R = {self.init_radius:g})")

    def initial_models(self, num_clusters: int) -> NDArray[np.float64]:
        """``W^0`` of shape (K, 9): ``ū(R) + init_jitter · Δ_β · z_k`` (the draw of :meth:`initial_draw`)."""
        return self.initial_draw(num_clusters)[0]
