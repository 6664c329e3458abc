"""docs/plugin.md as written: its "before" and "after" snippets run, and its API table matches the code.

Each snippet's ``# client.py`` part is executed first (it registers handlers on a
real Flower ``ClientApp``), then its ``# server.py`` part against nodes in this
process (:class:`~test_errors.FlowerClientGrid`).  The names a snippet leaves to
the user — ``Net``, ``trainloader``, ``testloader``, ``n``, ``my_training_loop``
(returns its mean loss, as Flower's quickstart does) and ``my_mean_loss`` — are
defined here; the data loaders are each node's own while its handler runs.
"""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from flwr.app import Message
from flwr.clientapp import ClientApp

import fedroute
from fedroute.strategies.records import unpack_cluster_models
from support.flower_client import FlowerClientGrid

pytestmark = pytest.mark.usefixtures("task_identity", "one_torch_thread")  # Flower messages need a task identity

PLUGIN_DOC = Path(__file__).resolve().parents[1] / "docs" / "plugin.md"
NUM_NODES = 4


def python_blocks(markdown: str, section: str) -> list[str]:
    """The ```python blocks of the ``## section`` of a markdown text."""
    start = markdown.index(f"## {section}\n")
    end = markdown.find("\n## ", start + 1)
    return re.findall(r"```python\n(.*?)```", markdown[start:end if end >= 0 else None], flags=re.S)


def split_server_client(block: str) -> tuple[str, str]:
    """A snippet's ``# server.py`` and ``# client.py`` parts."""
    server, client = re.split(r"^# client\.py.*$", block, maxsplit=1, flags=re.M)
    assert server.lstrip().startswith("# server.py"), server[:80]
    return server, client


class UserCode:
    """What the snippets leave to the user: a small ``Net``, per-node loaders and a training loop."""

    def __init__(self) -> None:
        self.learning_rates: list[float] = []
        self.loaders = [self._data(node) for node in range(NUM_NODES)]

    @staticmethod
    def _data(node: int) -> tuple[list, list]:
        """Node ``i``'s train and test batches: 2-D points labelled by a boundary that depends on ``i mod 2``."""
        rng = np.random.default_rng([7, node])
        points = torch.from_numpy(rng.standard_normal((96, 2)).astype(np.float32))
        labels = ((points[:, 0] > 0) if node % 2 == 0 else (points[:, 1] > 0)).long()
        batches = [(points[i:i + 16], labels[i:i + 16]) for i in range(0, 96, 16)]
        return batches[:4], batches[4:]

    def namespace(self) -> dict[str, Any]:
        class Net(torch.nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.fc1, self.fc2 = torch.nn.Linear(2, 8), torch.nn.Linear(8, 2)

            def forward(self, x: torch.Tensor) -> torch.Tensor:
                return self.fc2(torch.relu(self.fc1(x)))

        def my_training_loop(model: torch.nn.Module, loader: list, lr: float) -> float:
            self.learning_rates.append(lr)
            optimizer = torch.optim.SGD(model.parameters(), lr=lr)
            losses = []
            for x, y in loader:
                optimizer.zero_grad()
                loss = torch.nn.functional.cross_entropy(model(x), y)
                loss.backward()
                optimizer.step()
                losses.append(loss.item())
            return float(np.mean(losses))

        def my_mean_loss(model: torch.nn.Module, loader: list) -> float:
            return float(np.mean([torch.nn.functional.cross_entropy(model(x), y).item() for x, y in loader]))

        def my_accuracy(model: torch.nn.Module, loader: list) -> float:
            return float(np.mean([(model(x).argmax(1) == y).float().mean().item() for x, y in loader]))

        return {"Net": Net, "my_training_loop": my_training_loop, "my_mean_loss": my_mean_loss,
                "my_accuracy": my_accuracy, "n": 64, "app": ClientApp()}


class SnippetNodes(FlowerClientGrid):
    """Nodes running the snippet's ClientApp; while node ``i`` handles a message, the snippet's
    ``trainloader``/``testloader`` are node ``i``'s."""

    def __init__(self, namespace: dict[str, Any], user: UserCode) -> None:
        super().__init__(namespace["app"], NUM_NODES)
        self.namespace, self.user = namespace, user

    def send_and_receive(self, messages: Any, timeout: float | None = None) -> list[Message]:
        replies = []
        for message in messages:
            node = int(self.contexts[message.metadata.dst_node_id].node_config["partition-id"])
            self.namespace["trainloader"], self.namespace["testloader"] = self.user.loaders[node]
            self.namespace["my_group"] = node % 2  # the boundary node i's labels follow
            replies += super().send_and_receive([message], timeout)
        return replies


def run_snippet(block: str) -> tuple[dict[str, Any], UserCode, SnippetNodes]:
    """Execute a snippet as written: its client part, then its server part; return its namespace."""
    server, client = split_server_client(block)
    user = UserCode()
    namespace = user.namespace()
    exec(compile(client, "docs/plugin.md (client)", "exec"), namespace)  # noqa: S102 - the docs' own code
    namespace["grid"] = grid = SnippetNodes(namespace, user)
    torch.manual_seed(0)
    exec(compile(server, "docs/plugin.md (server)", "exec"), namespace)  # noqa: S102
    return namespace, user, grid


def test_the_before_snippet_runs_a_fedavg_app() -> None:
    (before, _) = python_blocks(PLUGIN_DOC.read_text(), "Before and after")
    namespace, user, _ = run_snippet(before)
    result = namespace["result"]
    assert sorted(result.train_metrics_clientapp) == list(range(1, 21))
    assert result.train_metrics_clientapp[20]["train_loss"] < result.train_metrics_clientapp[1]["train_loss"]
    assert set(user.learning_rates) == {0.01} and len(user.learning_rates) == 20 * NUM_NODES


def test_the_after_snippet_runs_clustered_routing_with_train_config_and_a_loss_returning_loop() -> None:
    (_, after) = python_blocks(PLUGIN_DOC.read_text(), "Before and after")
    namespace, user, grid = run_snippet(after)
    strategy, result = namespace["strategy"], namespace["result"]
    assert not strategy.rejected and len(strategy.history) == 20
    assert [row["num_replies"] for row in strategy.history] == [NUM_NODES] * 20
    assert len(unpack_cluster_models(result.arrays)) == namespace["K"] == 4
    assert sorted(reply.client_id for reply in strategy.final_evaluation) == list(range(NUM_NODES))
    assert set(user.learning_rates) == {0.01}  # train_config's lr reached every train_fn call
    assert len(user.learning_rates) >= 20 * NUM_NODES  # the routed model's, plus any entry-test probes
    # the loop's returned loss is each cluster's train_loss metric
    assert all(list(record) == ["train_loss"] for rounds in strategy.cluster_train_metrics.values()
               for record in rounds.values())
    assert sorted(strategy.cluster_train_metrics) == list(range(1, 21))
    # evaluation during training and accuracy per group, through the public API
    assert sorted(strategy.evaluation) == [5, 10, 15, 20]
    final = strategy.evaluation[20]
    assert final["num_clients"] == NUM_NODES and 0.5 < final["accuracy"] <= 1.0
    assert {"accuracy_group_0", "accuracy_group_1", "accuracy_worst_decile"} <= set(final)
    assert result.evaluate_metrics_clientapp[5]["accuracy"] == strategy.evaluation[5]["accuracy"]
    evaluations = [m for m in grid.sent if m.metadata.message_type == "evaluate"]
    assert len(evaluations) == 4 * NUM_NODES and all(m.content["config"]["batch"] == 32 for m in evaluations)


# --------------------------------------------------------------------------------- the API table
def api_rows(markdown: str) -> list[str]:
    """The signatures in the first column of the "Public API" table."""
    section = markdown[markdown.index("## Public API\n"):]
    section = section[:section.index("\n### ")]
    return [match.group(1) for match in re.finditer(r"^\| `([A-Za-z_.]+\(.*?\))` \|", section, flags=re.M)]


def documented_parameters(signature: str) -> tuple[str, ast.arguments]:
    """``name(a, b=1, *, c=None)`` → ``("name", its parsed arguments)``."""
    name, _, arguments = signature.partition("(")
    parsed = ast.parse(f"def _({arguments[:-1]}): pass").body[0]
    assert isinstance(parsed, ast.FunctionDef)
    return name, parsed.args


def resolve(name: str) -> Any:
    target: Any = fedroute
    for part in name.split("."):
        target = getattr(target, part)
    return target


def check_signature(name: str, documented: ast.arguments) -> None:
    """A call written from the table binds to the code: same parameters in order, same defaults."""
    real = [parameter for parameter in inspect.signature(resolve(name)).parameters.values()
            if parameter.name != "self"]
    by_name = {parameter.name: parameter for parameter in real}
    positional = [argument.arg for argument in documented.posonlyargs + documented.args]
    keyword_only = [argument.arg for argument in documented.kwonlyargs]
    for position, argument in enumerate(positional):
        assert argument in by_name, f"{name}: the table's {argument!r} is not a parameter"
        assert real[position].name == argument, f"{name}: {argument!r} is not positional parameter {position}"
    for argument in keyword_only:
        assert argument in by_name and by_name[argument].kind is not inspect.Parameter.POSITIONAL_ONLY, \
            f"{name}: {argument!r}"
    required = [p.name for p in real if p.default is inspect.Parameter.empty
                and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)]
    assert set(required) <= set(positional + keyword_only), f"{name}: the table omits required {required}"
    defaults = dict(zip(positional[len(positional) - len(documented.defaults):], documented.defaults))
    defaults.update({argument.arg: default for argument, default in zip(documented.kwonlyargs,
                                                                         documented.kw_defaults) if default})
    names = {"AlarmSettings": fedroute.AlarmSettings}
    for argument, default in defaults.items():
        value = eval(compile(ast.Expression(default), "plugin.md", "eval"), names)  # noqa: S307 - the docs' table
        code = by_name[argument].default
        # a code default of None means "the function's own default", which the table may spell out
        assert code == value or (code is None and value is not None), f"{name}: {argument}={value!r}, code {code!r}"
    if documented.kwarg is not None:
        assert any(p.kind is inspect.Parameter.VAR_KEYWORD for p in real), f"{name}: **{documented.kwarg.arg}"


def test_the_api_table_signatures_are_the_code_s() -> None:
    rows = api_rows(PLUGIN_DOC.read_text())
    checked = []
    for row in rows:
        if "..." in row:  # "FedCAM(routing, ...)", "RoutingSettings(...)": described, not spelled out
            continue
        name, documented = documented_parameters(row)
        check_signature(name, documented)
        checked.append(name)
    assert {"ClusteredRouting", "ClusteredRouting.start", "method_settings", "cluster_models_from_torch",
            "routing_train", "routing_evaluate", "routing_query", "AlarmSettings"} <= set(checked), checked
    start = next(row for row in rows if row.startswith("ClusteredRouting.start("))
    assert "train_config=None" in start and "evaluate_config=None" in start


@pytest.mark.parametrize("row", ["routing_train(message, context, model, loss_fn, train_fn, num_examples)",
                                 "routing_query(message, context, model, loss_fn, num_examples, *, group=-1)",
                                 "AlarmSettings(starvation_rounds=5)"])
def test_a_wrong_table_row_is_caught(row: str) -> None:
    with pytest.raises(AssertionError):
        check_signature(*documented_parameters(row))
