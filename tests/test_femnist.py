"""Tests of the FEMNIST path (:mod:`fedroute.tasks.femnist`) on a small local parquet file, offline."""

import numpy as np
import pytest

from fedroute.core.randomness import Purpose, generator
from fedroute.tasks.characters import mlp_num_parameters
from fedroute.tasks import femnist
from fedroute.tasks.femnist import FemnistTask, load_writers

# Writer ids deliberately out of order: the partitioner numbers writers in sorted order.
WRITERS = ("f0102_33", "f0007_41", "f0051_02", "f0033_18")
SAMPLES = 14


def _images(seed: int, count: int) -> np.ndarray:
    """Random 28×28 uint8 images (no 180° symmetry, so rotation is visible)."""
    return np.random.default_rng(seed).integers(0, 256, (count, 28, 28), dtype=np.uint8)


@pytest.fixture(scope="module")
def source():
    """Per writer: images and labels as stored (labels 0…11 then 40, 61 → with num_classes=10 two are dropped)."""
    labels = np.array(list(range(12)) + [40, 61])
    return {writer: (_images(index, SAMPLES), labels.copy()) for index, writer in enumerate(WRITERS)}


@pytest.fixture(scope="module")
def parquet(tmp_path_factory, source):
    """A FEMNIST-shaped parquet file written by ``datasets`` (``image`` is the ``datasets.Image`` feature)."""
    import datasets
    from PIL import Image

    columns = {"image": [], "writer_id": [], "hsf_id": [], "character": []}
    for writer, (images, labels) in source.items():
        for image, label in zip(images, labels):
            columns["image"].append(Image.fromarray(image, mode="L"))
            columns["writer_id"].append(writer)
            columns["hsf_id"].append(4)
            columns["character"].append(int(label))
    features = datasets.Features({"image": datasets.Image(), "writer_id": datasets.Value("string"),
                                  "hsf_id": datasets.Value("int64"),
                                  "character": datasets.ClassLabel(num_classes=62)})
    path = tmp_path_factory.mktemp("femnist") / "femnist.parquet"
    datasets.Dataset.from_dict(columns, features=features).to_parquet(str(path))
    return str(path)


def test_writers_become_clients_in_sorted_order(parquet, source):
    task = FemnistTask(data_file=parquet, num_clients=4, pretrain_epochs=2, seed=3)
    writers = task.writers()
    assert [writer for writer, _, _ in writers] == sorted(WRITERS)
    clients = task.clients(np.arange(4))
    held_out = round(0.2 * SAMPLES)
    assert clients.train_inputs.shape == (4, SAMPLES - held_out, 784) and clients.test_inputs.shape[:2] == (4, held_out)
    np.testing.assert_array_equal(clients.num_examples, [SAMPLES - held_out] * 4)
    np.testing.assert_array_equal(clients.groups, [0, 0, 1, 1])
    assert task.num_parameters == mlp_num_parameters(784, 64, 62)
    models = task.initial_models(2)
    assert models.shape == (2, task.num_parameters) and models.dtype == np.float32
    losses = clients.losses(models)
    assert losses.shape == (4, 2) and np.all(np.isfinite(losses))
    assert clients.local_update(models[[0, 1]], np.array([0, 3]), 0).shape == (2, task.num_parameters)
    # A second writer window: partition ids first_writer … first_writer + n − 1.
    shifted = FemnistTask(data_file=parquet, num_clients=2, first_writer=2, pretrain_epochs=2)
    assert [writer for writer, _, _ in shifted.writers()] == sorted(WRITERS)[2:]


def test_transform_rotates_sixes_and_nines_of_the_second_half_only(parquet, source):
    task = FemnistTask(data_file=parquet, num_clients=4, num_classes=10, pretrain_epochs=2, seed=5)
    clients = task.clients(np.arange(4))
    for client, writer in enumerate(sorted(WRITERS)):
        images, labels = source[writer]
        keep = labels < 10  # num_classes = 10 drops characters 10, 11, 40, 61
        images, labels = images[keep], labels[keep]
        order = generator(5, client, 0, Purpose.DATA).permutation(len(labels))
        held_out = round(0.2 * len(labels))
        count = len(labels) - held_out
        x = np.concatenate([clients.test_inputs[client][:held_out], clients.train_inputs[client][:count]])
        y = np.concatenate([clients.test_labels[client][:held_out], clients.train_labels[client][:count]])
        np.testing.assert_array_equal(y, labels[order])  # labels unchanged
        expected = images[order].astype(np.float32) / 255.0
        rotate = (client >= 2) & np.isin(labels[order], (6, 9))
        expected[rotate] = expected[rotate][:, ::-1, ::-1]
        np.testing.assert_allclose(x.reshape(-1, 28, 28), expected, rtol=0, atol=1e-7)
        assert rotate.sum() == (2 if client >= 2 else 0)  # one 6 and one 9 per transformed writer
        sixes_and_nines = np.isin(labels[order], (6, 9))
        changed = [not np.allclose(a, b / 255.0) for a, b in zip(x.reshape(-1, 28, 28)[sixes_and_nines],
                                                                 images[order][sixes_and_nines])]
        assert changed == [client >= 2] * 2


def test_offline_hub_raises_a_clear_error(monkeypatch):
    import flwr_datasets

    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'flwrlabs/femnist' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(flwr_datasets, "FederatedDataset", offline)
    load_writers.cache_clear()
    with pytest.raises(ConnectionError) as caught:
        FemnistTask(num_clients=4, pretrain_epochs=2).clients(np.arange(4))
    message = str(caught.value)
    assert "flwrlabs/femnist" in message and "Hugging Face Hub" in message
    assert "'characters'" in message and "data-file" in message and "parquet" in message


def test_missing_file_and_bad_settings(tmp_path, parquet):
    with pytest.raises(FileNotFoundError, match="data-file"):
        FemnistTask(data_file=str(tmp_path / "absent.parquet"), num_clients=2).clients(np.arange(2))
    with pytest.raises(ValueError, match="writers"):
        FemnistTask(data_file=parquet, num_clients=6, pretrain_epochs=2).clients(np.arange(6))
    with pytest.raises(ValueError, match="image-size"):
        FemnistTask(data_file=parquet, num_clients=2, image_size=8, pretrain_epochs=2).clients(np.arange(2))
    with pytest.raises(ValueError, match="num-classes"):
        FemnistTask(num_classes=5)
    assert femnist.FEMNIST_DATASET == "flwrlabs/femnist"
