"""One client of ``task = "dataset"``: its rows and a torch module as a :class:`~fedroute.core.task.ClientBatch`.

A :class:`~fedroute.client.torch_adapter.TorchClient` whose ``loss_fn`` is a
:class:`~fedroute.client.batched_losses.DataLoss` over the client's training rows
(or ``routing-loss-rows`` of them)
and whose ``train_fn`` is mini-batch SGD (:mod:`fedroute.tasks.dataset`).  The
module and both splits are put on the client's device once, when the client is
built (once per message); the ``K`` models are copied in from the flat vectors.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray
from torch.nn import functional as F

from fedroute.client.batched_losses import DataLoss, batched_or_none, stacked_outputs, stacked_state
from fedroute.client.devices import resolve_device
from fedroute.client.torch_adapter import TorchClient
from fedroute.core.randomness import Purpose, generator
from fedroute.core.validation import invalid
from fedroute.data.models import build_model
from fedroute.data.partitions import ClientData

__all__ = ["DatasetClient"]


class DatasetClient(TorchClient):
    """A dataset-task client (a batch of one); also reports every model's accuracy (:meth:`metrics`).

    Parameters
    ----------
    task : DatasetTask
        The settings (model, training, device).
    data : ClientData
        The client's rows.
    input_shape : tuple of int
        One row's shape.
    num_classes : int
        Classes of the dataset.
    """

    def __init__(self, task: Any, data: ClientData, input_shape: tuple[int, ...], num_classes: int) -> None:
        self.device = resolve_device(task.client_device)
        self.task, self.data = task, data
        model = build_model(task.model, input_shape, num_classes).to(self.device)
        self._train = (torch.from_numpy(data.train_features).to(self.device),
                       torch.from_numpy(data.train_labels).to(self.device))
        self._test = (torch.from_numpy(data.test_features).to(self.device),
                      torch.from_numpy(data.test_labels).to(self.device))
        self._round = 0
        routing_loss = DataLoss(*self._train, max_rows=int(task.routing_loss_rows) or None, seed=int(task.seed),
                                client_id=int(data.partition_id),
                                early_stop=task.early_stop(self.device))
        super().__init__(model, routing_loss, self._sgd, num_examples=data.num_examples,
                         client_id=data.partition_id, group=data.group, test_loss_fn=DataLoss(*self._test),
                         batched=task.batched(self.device))

    def _sgd(self, model: torch.nn.Module) -> float:
        """``local-epochs`` epochs of SGD (momentum 0.9); the batch order from ``(seed, client, round)``."""
        features, labels = self._train
        optimizer = torch.optim.SGD(model.parameters(), lr=float(self.task.learning_rate), momentum=0.9)
        seed = int(generator(self.task.seed, int(self.client_ids[0]), self._round, Purpose.DATA).integers(2**62))
        order = torch.Generator().manual_seed(seed)
        total = 0.0
        for _ in range(int(self.task.local_epochs)):
            total = 0.0
            for batch in torch.randperm(len(labels), generator=order).split(int(self.task.batch_size)):
                batch = batch.to(self.device)
                optimizer.zero_grad()
                loss = F.cross_entropy(model(features[batch]), labels[batch])
                loss.backward()
                optimizer.step()
                total += float(loss.detach()) * len(batch)
        return total / len(labels)

    def local_update(self, models: NDArray[np.floating], client_index: NDArray[np.int64],
                     round_index: int) -> NDArray[np.float64]:
        """:meth:`TorchClient.local_update` with the round's batch order."""
        self._round = int(round_index)
        return super().local_update(models, client_index, round_index)

    def metrics(self, cluster_models: NDArray[np.floating], split: str = "test") -> dict[str, NDArray[np.float64]]:
        """``{"accuracy": (1, K)}``: what the evaluation reports besides the losses (:mod:`fedroute.core.evaluation`)."""
        return {"accuracy": self.accuracies(cluster_models, split)}

    def accuracies(self, cluster_models: NDArray[np.floating], split: str = "test") -> NDArray[np.float64]:
        """Share of correctly classified rows of each of the ``K`` models, shape ``(1, K)``."""
        if split not in ("train", "test"):
            raise invalid("split", split, "'train', 'test'")
        features, labels = self._train if split == "train" else self._test
        models = np.asarray(cluster_models).reshape(-1, self.num_parameters)
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                if self.batched is True:
                    state = self.model.state_dict()
                    layout = [(name, tuple(state[name].shape), state[name].dtype) for name in state]
                    values = batched_or_none(_AccuracyPass(features, labels), self.model, models, layout)
                    if values is not None:
                        return values.reshape(1, -1)
                values = []
                for vector in models:
                    self.load_vector(vector)
                    values.append(float((self.model(features).argmax(1) == labels).double().mean()))
        finally:
            self.model.train(was_training)
        return np.asarray(values, dtype=np.float64).reshape(1, -1)


class _AccuracyPass:
    """The batched accuracy of ``K`` stacked models (the interface :func:`batched_or_none` expects)."""

    def __init__(self, features: torch.Tensor, labels: torch.Tensor) -> None:
        self.features, self.labels = features, labels

    def batched(self, model: torch.nn.Module, vectors: NDArray[np.floating], layout: Any) -> NDArray[np.float64]:
        state = stacked_state(vectors, layout, self.features.device)
        outputs = stacked_outputs(model, state, self.features)
        return (outputs.argmax(-1) == self.labels).double().mean(1).cpu().numpy()
