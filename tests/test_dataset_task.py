"""task = "dataset": flwr-datasets partitions of local datasets, group transforms, models, devices, batched losses.

Small local datasets (scikit-learn's digits as Parquet, as an image folder, as CSV) go through every
partitioner and transform at unit level, then through the real ServerApp and ClientApp in this process
(one short run per partitioner), and once through ``fedroute flower`` (Flower's Ray simulation) with the
issue's configuration.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch import nn

from fedroute.cli import main as cli_main
from fedroute.cli.flower import checked_num_gpus
from fedroute.client.batched_losses import LOSS_ATOL, LOSS_RTOL, DataLoss
from fedroute.client.devices import check_device_name, resolve_device
from fedroute.client.torch_adapter import TorchClient
from fedroute.data import grouped_partition, grouped_partitions, standins
from fedroute.data.models import SmallCNN, SmallMLP, build_model
from fedroute.data.sources import load_source
from fedroute.data.transforms import apply_group_transform, label_permutation
from fedroute.deployment.flwr_config import load_run_config_file, resolve_run_config
from fedroute.deployment.launcher import flwr_run_command
from fedroute.server.run_config import parse_run_config
from support.app_config import app_run_config
from support.dataset_files import NUM_WRITERS, digit_images, write_csv, write_image_folder, write_parquet
from support.grid import SERVER_RUN_ID, builtin_grid, server_main

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # small tensors: one torch thread


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("datasets")
    return {"parquet": write_parquet(root / "digits.parquet"), "folder": write_image_folder(root / "folder", 200),
            "csv": write_csv(root / "digits.csv", 400)}


def _vector(module: nn.Module) -> np.ndarray:
    return np.concatenate([t.detach().reshape(-1).double().numpy() for t in module.state_dict().values()])


# ------------------------------------------------------------------------------------------ sources
def test_parquet_image_folder_and_csv_load_with_their_shapes_and_classes(files: dict[str, Path]) -> None:
    images, labels = digit_images()
    parquet = grouped_partitions(str(files["parquet"]), 4, partitioner="iid")
    folder = grouped_partitions(str(files["folder"]), 2, partitioner="iid", num_groups=1)
    table = grouped_partitions(str(files["csv"]), 2, partitioner="iid", group_transform="permute-labels")
    assert (parquet.schema.input_shape, parquet.schema.num_classes, parquet.schema.num_rows) == ((1, 8, 8), 10, 1797)
    assert (folder.schema.input_shape, folder.schema.num_classes, folder.schema.num_rows) == ((1, 8, 8), 10, 200)
    assert (table.schema.input_shape, table.schema.num_classes) == ((64,), 10)
    # The image folder's pixels are the digits' own (PNG is lossless), whatever the folder order.
    rows = load_source(str(files["folder"]))
    first = np.asarray(rows.cast_column("image", rows.features["image"].__class__(decode=True))[0]["image"])
    index = int(Path(rows.cast_column("image", rows.features["image"].__class__(decode=False))[0]["image"]["path"]).stem)
    assert np.array_equal(first, images[index]) and rows[0]["label"] == labels[index]


def test_the_task_and_the_data_package_import_no_heavy_library() -> None:
    code = ("import json, sys\nimport fedroute.data, fedroute.tasks.dataset, fedroute.server.run_config\n"
            "from fedroute.tasks.registry import task_from_config\n"
            "task_from_config({'task': 'dataset', 'dataset': 'x.parquet', 'num-clients': 4})\n"
            "print(json.dumps(sorted(sys.modules)))")
    loaded = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                       timeout=120).stdout.strip().splitlines()[-1])
    assert not {name.split(".")[0] for name in loaded} & {"torch", "torchvision", "datasets", "flwr_datasets",
                                                          "pyarrow", "PIL"}


def test_a_hub_name_offline_names_the_dataset_and_how_to_use_a_local_copy() -> None:
    code = ("from fedroute.data.sources import load_source\n"
            "try:\n    load_source('ylecun/mnist')\nexcept ConnectionError as error:\n    print('ERROR', error)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"})
    message = result.stdout
    assert "ERROR could not load the dataset 'ylecun/mnist'" in message, result.stderr[-2000:]
    assert "to_parquet('ylecun_mnist.parquet')" in message and 'dataset = "/path/to/ylecun_mnist.parquet"' in message


def test_a_missing_local_path_is_a_clear_error() -> None:
    with pytest.raises(FileNotFoundError, match=r"run-config 'dataset' = '/no/such/digits.parquet': no such file"):
        load_source("/no/such/digits.parquet")


# -------------------------------------------------------------------------------------- partitioners
def _labels(parts) -> list[np.ndarray]:
    return [np.concatenate([parts[i].train_labels, parts[i].test_labels]) for i in range(len(parts))]


def test_iid_partitions_cover_the_data_once_in_near_equal_parts(files: dict[str, Path]) -> None:
    parts = grouped_partitions(str(files["parquet"]), 6, partitioner="iid", group_transform="none")
    sizes = [parts[i].num_examples + len(parts[i].test_labels) for i in range(6)]
    assert sum(sizes) == 1797 and max(sizes) - min(sizes) <= 1
    held_out = [len(parts[i].test_labels) / sizes[i] for i in range(6)]
    assert all(abs(share - 0.2) < 0.01 for share in held_out)


def test_dirichlet_skews_the_label_mix_and_a_small_alpha_skews_it_more(files: dict[str, Path]) -> None:
    def skew(alpha: float) -> float:
        parts = grouped_partitions(str(files["parquet"]), 10, partitioner="dirichlet", dirichlet_alpha=alpha,
                                   group_transform="none")
        shares = [np.bincount(labels, minlength=10) / len(labels) for labels in _labels(parts)]
        return float(np.mean([np.abs(share - 0.1).sum() for share in shares]))

    assert skew(0.1) > skew(100.0) + 0.5 and skew(100.0) < 0.35


def test_pathological_gives_each_client_its_classes_per_client(files: dict[str, Path]) -> None:
    parts = grouped_partitions(str(files["parquet"]), 10, partitioner="pathological", classes_per_client=2,
                               group_transform="none")
    classes = [set(labels.tolist()) for labels in _labels(parts)]
    assert all(1 <= len(c) <= 2 for c in classes) and len(set().union(*classes)) >= 8


def test_natural_id_gives_each_client_one_writer_and_checks_the_number_of_clients(files: dict[str, Path]) -> None:
    parts = grouped_partitions(str(files["parquet"]), NUM_WRITERS, partitioner="natural-id", partition_by="writer",
                               group_transform="none")
    sizes = [parts[i].num_examples + len(parts[i].test_labels) for i in range(NUM_WRITERS)]
    assert sum(sizes) == 1797 and {parts[i].group for i in range(NUM_WRITERS)} == {0}
    assert parts[0].train_features.shape[1:] == (1, 8, 8)  # the writer column is not a feature
    with pytest.raises(ValueError, match=r"'num-clients' = 8 is invalid; allowed: at most 7 .*column 'writer'"):
        grouped_partitions(str(files["parquet"]), 8, partitioner="natural-id", partition_by="writer")[0]


# ---------------------------------------------------------------------------------------- transforms
def test_rotate_turns_group_g_by_360_g_over_G_degrees(files: dict[str, Path]) -> None:
    plain = grouped_partitions(str(files["parquet"]), 8, partitioner="iid", group_transform="none")
    rotated = grouped_partitions(str(files["parquet"]), 8, partitioner="iid", group_transform="rotate", num_groups=4)
    for client in range(8):
        group = client % 4
        assert rotated[client].group == group
        expected = np.rot90(plain[client].train_features, k=group, axes=(2, 3))
        assert np.array_equal(rotated[client].train_features, expected)
        assert np.array_equal(rotated[client].train_labels, plain[client].train_labels)
    assert not np.array_equal(rotated[1].train_features, plain[1].train_features)


def test_permute_labels_relabels_every_group_but_the_first(files: dict[str, Path]) -> None:
    plain = grouped_partitions(str(files["csv"]), 4, partitioner="iid", group_transform="none", seed=3)
    permuted = grouped_partitions(str(files["csv"]), 4, partitioner="iid", group_transform="permute-labels",
                                  num_groups=2, seed=3)
    assert np.array_equal(permuted[0].train_labels, plain[0].train_labels)
    permutation = label_permutation(1, 10, 3)
    assert sorted(permutation) == list(range(10)) and not np.array_equal(permutation, np.arange(10))
    assert np.array_equal(permuted[1].train_labels, permutation[plain[1].train_labels])
    assert np.array_equal(permuted[1].train_features, plain[1].train_features)


def test_without_torchvision_quarter_turns_fall_back_to_rot90_and_other_angles_ask_for_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    images = np.random.default_rng(0).random((3, 1, 8, 8), dtype=np.float32)
    labels = np.arange(3)
    with_torchvision = apply_group_transform(images, labels, "rotate", 1, 4, 10, 0)[0]
    for name in [name for name in sys.modules if name.split(".")[0] == "torchvision"] + ["torchvision"]:
        monkeypatch.setitem(sys.modules, name, None)  # the CPU-only install: import torchvision fails
    without = apply_group_transform(images, labels, "rotate", 1, 4, 10, 0)[0]
    assert np.array_equal(without, with_torchvision) and np.array_equal(without, np.rot90(images, 1, axes=(2, 3)))
    with pytest.raises(ImportError, match=r"rotate' by 45° needs torchvision: pip install \"fedroute\[vision\]\""):
        apply_group_transform(images, labels, "rotate", 1, 8, 10, 0)


def test_rotate_needs_images(files: dict[str, Path]) -> None:
    with pytest.raises(ValueError, match=r"'group-transform' = 'rotate' needs an image dataset"):
        grouped_partitions(str(files["csv"]), 2, partitioner="iid", group_transform="rotate")[1]


# --------------------------------------------------------------------------------- settings and models
@pytest.mark.parametrize("key, value, expected", [
    ("partitioner", "shards", r"'partitioner' = 'shards' is invalid; allowed: one of \('iid', 'dirichlet'"),
    ("dirichlet-alpha", 0, r"'dirichlet-alpha' = 0.0 is invalid; allowed: a number > 0"),
    ("num-groups", 0, r"'num-groups' = 0 is invalid; allowed: an integer in \[1, 64\]"),
    ("group-transform", "flip", r"'group-transform' = 'flip' is invalid; allowed: one of \('rotate'"),
    ("client-device", "gpu", r"'client-device' = 'gpu' is invalid; allowed: 'auto', 'cpu', 'cuda' or 'cuda:N'"),
    ("partitioner", "natural-id", r"'partition-by' = 'auto' is invalid; allowed: under partitioner 'natural-id'"),
    ("batched-losses", "sometimes", r"'batched-losses' = 'sometimes' is invalid"),
    ("dataset", "auto", r"'dataset' = 'auto' is invalid; allowed: a Hugging Face hub name"),
])
def test_bad_settings_fail_before_any_data_is_read(key: str, value, expected: str) -> None:
    config = app_run_config({"task": "dataset", "dataset": "/not/read.parquet", "num-clients": 4, key: value})
    with pytest.raises(ValueError, match=expected):
        parse_run_config(config)


def test_models_by_input_shape_and_a_users_factory() -> None:
    assert isinstance(build_model("auto", (1, 8, 8), 10), SmallCNN)
    assert isinstance(build_model("auto", (64,), 10), SmallMLP)
    assert sum(p.numel() for p in build_model("cnn", (1, 8, 8), 10).parameters()) == 38_282
    user = build_model("support.dataset_files:small_factory", (64,), 3)
    assert user(torch.zeros(2, 64)).shape == (2, 3)
    with pytest.raises(ValueError, match=r"run-config 'model' = 'no_such_module:f' cannot be imported"):
        build_model("no_such_module:f", (64,), 3)
    with pytest.raises(ValueError, match=r"'model' = 'cnn' needs image rows"):
        build_model("cnn", (64,), 3)


# ------------------------------------------------------------------------------------------- devices
def test_device_selection(monkeypatch: pytest.MonkeyPatch) -> None:
    assert check_device_name("CUDA:1") == "cuda:1" and resolve_device("cpu") == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    with pytest.raises(ValueError, match=r"'client-device' = 'cuda', but torch sees 0 GPU\(s\) here"):
        resolve_device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert resolve_device("auto") == torch.device("cuda") and resolve_device("cuda:1") == torch.device("cuda:1")
    with pytest.raises(ValueError, match=r"'cuda:2', but torch sees 2 GPU"):
        resolve_device("cuda:2")


def test_num_gpus_becomes_rays_client_resources_and_needs_a_gpu() -> None:
    command = flwr_run_command("flwr", ".", {}, 4, 1.0, None, 0.25)
    assert command[command.index("--federation-config") + 1] == \
        "num-supernodes=4 client-resources-num-cpus=1 client-resources-num-gpus=0.25"
    assert "gpus" not in " ".join(flwr_run_command("flwr", ".", {}, 4))
    assert "torch sees no GPU" in checked_num_gpus(0.5, lambda: 0)
    assert checked_num_gpus(0.5, lambda: 1) is None and checked_num_gpus(0.0) is None
    assert "allowed: a number in [0, 64]" in checked_num_gpus(-1.0, lambda: 1)


def test_fedroute_flower_starts_one_supernode_per_client_and_passes_the_gpu_share(
        repository: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import fedroute.deployment.launcher as launcher

    seen: dict = {}

    def fake_run(app_dir, overrides, num_supernodes, **options):
        seen.update(supernodes=num_supernodes, clients=overrides["num-clients"], gpus=options["gpus_per_client"])
        return SimpleNamespace(completed=True)

    monkeypatch.setattr(launcher, "run_flower_app", fake_run)
    assert cli_main(["flower", "--app-dir", str(repository), "--run-config", "num-clients=20"]) == 0
    assert seen == {"supernodes": 20, "clients": 20, "gpus": 0.0}
    assert cli_main(["flower", "--app-dir", str(repository)]) == 0 and seen["supernodes"] == 80
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cli_main(["flower", "--app-dir", str(repository), "--num-gpus", "0.5"]) == 2
    assert "torch sees no GPU" in capsys.readouterr().err


# ---------------------------------------------------------------------------------- batched losses
class _NeedsItem(nn.Module):
    """A module vmap cannot run (``.item()`` in forward): the batched pass must fall back to the loop."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        outputs = self.layer(x.flatten(1))
        return outputs * (1.0 + 0.0 * outputs.sum().item())


def _with_batchnorm() -> nn.Module:
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(),
                         nn.Linear(256, 10))


@pytest.mark.parametrize("make", [lambda: SmallCNN((1, 8, 8), 10), _with_batchnorm, _NeedsItem],
                         ids=["cnn", "batchnorm-buffers", "fallback"])
def test_batched_losses_equal_the_loop(make) -> None:
    images, labels = digit_images()
    inputs, targets = torch.from_numpy(images[:150, None] / np.float32(255)), torch.from_numpy(labels[:150])
    vectors = []
    for k in range(4):
        torch.manual_seed(k)
        module = make()
        if isinstance(module, nn.Sequential):  # non-trivial running statistics
            module[1].running_mean.uniform_(-0.5, 0.5)
            module[1].running_var.uniform_(0.5, 2.0)
        vectors.append(_vector(module))
    vectors = np.stack(vectors)
    loss = DataLoss(inputs, targets, batch_size=64)
    batched = TorchClient(make(), loss, num_examples=150, batched=True).losses(vectors)
    looped = TorchClient(make(), DataLoss(inputs, targets, batch_size=64), num_examples=150,
                         batched=False).losses(vectors)
    np.testing.assert_allclose(batched, looped, rtol=LOSS_RTOL, atol=LOSS_ATOL)
    assert len(np.unique(np.round(looped, 4))) == 4  # four different models
    assert getattr(loss, "batched_failed", False) == (make is _NeedsItem)


# ------------------------------------------------------------------ the ServerApp and ClientApp, in process
IN_PROCESS = {
    "iid-folder-rotate": {"dataset": "folder", "partitioner": "iid", "group-transform": "rotate", "model": "mlp"},
    "dirichlet-permute": {"dataset": "parquet", "partitioner": "dirichlet", "dirichlet-alpha": 0.5,
                          "group-transform": "permute-labels", "batched-losses": True},
    "pathological-rotate": {"dataset": "parquet", "partitioner": "pathological", "classes-per-client": 3,
                            "group-transform": "rotate", "model": "mlp"},
    "natural-id-none": {"dataset": "parquet", "partitioner": "natural-id", "partition-by": "writer",
                        "group-transform": "none", "model": "mlp"},
    "csv-permute-user-model": {"dataset": "csv", "partitioner": "iid", "group-transform": "permute-labels",
                               "model": "support.dataset_files:small_factory"},
}


@pytest.mark.parametrize("case", list(IN_PROCESS))
def test_every_partitioner_and_transform_runs_through_the_apps(case: str, files: dict[str, Path], tmp_path: Path,
                                                                task_identity) -> None:
    settings = {**IN_PROCESS[case]}
    settings["dataset"] = str(files[settings["dataset"]])
    num_clients = NUM_WRITERS if settings["partitioner"] == "natural-id" else 4
    config = app_run_config({"task": "dataset", "method": "exp3", "num-clients": num_clients, "num-clusters": 2,
                             "num-server-rounds": 2, "num-groups": 2, "min-train-nodes": 2, "local-epochs": 1,
                             "results-dir": str(tmp_path), "progress-interval": 0.0, **settings})
    server_main(builtin_grid(num_clients, config), config)
    summary = json.loads((tmp_path / str(SERVER_RUN_ID) / "summary.json").read_text())["exp3"]
    assert summary["evaluation"] == "complete" and summary["evaluated_clients"] == num_clients
    accuracy = summary["evaluation_metrics"]
    assert 0.0 <= accuracy["accuracy_worst_decile"] <= accuracy["accuracy"] <= 1.0
    models = np.load(tmp_path / str(SERVER_RUN_ID) / "cluster_models.npz")
    assert all(np.isfinite(models[name]).all() for name in models.files)


# --------------------------------------------------------------------------------- standard benchmarks
BENCHMARKS = Path(__file__).resolve().parents[1] / "conf" / "benchmarks"


def test_the_benchmark_configs_name_the_hub_data_and_run_on_the_offline_standin(tmp_path: Path, repository: Path,
                                                                                 task_identity) -> None:
    mnist = resolve_run_config(repository, load_run_config_file(BENCHMARKS / "rotated-mnist.toml"))
    task = parse_run_config({**mnist, "num-clients": 40}).task
    assert (task.dataset, task.partitioner, task.num_groups, task.group_transform) == \
        ("ylecun/mnist", "iid", 4, "rotate")
    femnist = resolve_run_config(repository, load_run_config_file(BENCHMARKS / "femnist.toml"))
    assert (femnist["dataset"], femnist["partitioner"], femnist["partition-by"], femnist["label-column"]) == \
        ("flwrlabs/femnist", "natural-id", "writer_id", "character")
    standin = tmp_path / "femnist.parquet"
    assert standins.main(["femnist", str(standin)]) == 0
    config = {**femnist, "dataset": str(standin), "num-clients": 4, "num-server-rounds": 2, "method": "exp3",
              "local-epochs": 1,
              "results-dir": str(tmp_path), "progress-interval": 0.0}
    server_main(builtin_grid(4, config), config)
    summary = json.loads((tmp_path / str(SERVER_RUN_ID) / "summary.json").read_text())["exp3"]
    assert summary["evaluated_clients"] == 4 and 0.0 <= summary["evaluation_metrics"]["accuracy"] <= 1.0
    clients = parse_run_config(config).task.partition_settings
    sizes = [grouped_partition(clients, i).num_examples for i in range(4)]
    assert all(size > 30 for size in sizes)  # ≈ 45 digits per stand-in writer (1,797 / 40)


# ------------------------------------------------------------------------------- fedroute flower (Ray)
@pytest.mark.process
def test_the_issues_command_runs_in_flowers_simulation_and_reports_accuracy(files: dict[str, Path],
                                                                            tmp_path: Path, flower_app: Path) -> None:
    command = [sys.executable, "-m", "fedroute", "flower", "--app-dir", str(flower_app),
               "--results-dir", str(tmp_path), "--timeout", "600", "--run-config", "task=dataset",
               f"dataset={files['parquet']}", "partitioner=dirichlet", "dirichlet-alpha=0.5", "num-groups=4",
               "group-transform=rotate", "num-clusters=4", "num-clients=20", "num-server-rounds=10",
               "client-device=cpu", "method=exp3"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    (directory,) = [path for path in tmp_path.iterdir() if path.is_dir()]
    summary = json.loads((directory / "summary.json").read_text())["exp3"]
    assert summary["evaluated_clients"] == 20 and summary["rounds"] == 10
    assert 0.5 < summary["evaluation_metrics"]["accuracy"] <= 1.0  # 0.85 on the reference machine (chance: 0.1)
    header = next(line for line in result.stdout.splitlines() if line.startswith("method"))
    row = next(line for line in result.stdout.splitlines() if line.startswith("exp3 "))
    assert "accuracy" in header and f"{summary['evaluation_metrics']['accuracy']:.3f}" in row
