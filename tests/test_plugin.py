"""The plugin API: a user's torch model, loss and training loop under ClusteredRouting.

Most tests run the real strategy in this process: :class:`InProcessGrid`
hands every message the strategy sends to the user's ClientApp handlers (one
``Context`` per node, kept across rounds, as Flower keeps it) and returns
their replies.  The routing must be exactly the project's: a torch linear
model whose ``loss_fn``/``train_fn`` restate the linear task gives the same
routes every round and the same models as the batched simulator.
"""

from __future__ import annotations

import ast
import subprocess
import sys

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, MessageType, RecordDict

import fedroute
from fedroute import (
    ClusteredRouting,
    FedCAM,
    RoutingSettings,
    cluster_models_from_torch,
    method_settings,
    routing_train,
)
from fedroute import protocol
from fedroute.client.torch_adapter import TorchClient
from fedroute.simulation.fedcam import simulate_fedcam_batch
from fedroute.simulation.simulator import simulate
from fedroute.strategies.records import pack_cluster_models
from fedroute.strategies.validation import (
    validate_evaluate_reply,
    validate_provisional_reply,
    validate_train_reply,
)
from fedroute.tasks.linear import LinearTask
from support.grid import InProcessGrid
from support.linear_app import TASK, LinearModel, linear_initial_models, linear_user_app

PUBLIC_API = {"ClusteredRouting", "FedCAM", "RoutingSettings", "method_settings", "cluster_models_from_torch",
              "cluster_models_to_torch", "unpack_cluster_models", "AlarmSettings",
              "routing_train", "routing_evaluate", "routing_query", "__version__"}


pytestmark = pytest.mark.usefixtures("task_identity")  # Flower messages need a task identity


# ------------------------------------------------------------------------------- tests
def test_import_fedroute_is_cheap_and_exports_only_the_public_api() -> None:
    probe = """
import sys
import fedroute
assert "torch" not in sys.modules and "flwr" not in sys.modules, "import fedroute must stay cheap"
print(sorted(fedroute.__all__))
import fedroute.client.app, fedroute.server.app
assert "torch" not in sys.modules, "the linear app must not import torch"
from fedroute import ClusteredRouting, RoutingSettings, method_settings
assert "torch" not in sys.modules
"""
    completed = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert completed.returncode == 0, completed.stderr
    assert set(ast.literal_eval(completed.stdout)) == PUBLIC_API
    for name in PUBLIC_API - {"__version__"}:
        assert getattr(fedroute, name).__doc__, name
    assert set(dir(fedroute)) >= PUBLIC_API
    with pytest.raises(AttributeError):
        fedroute.TorchClient  # noqa: B018 - internal, not exported


def test_torch_client_keeps_names_shapes_dtypes_and_buffers() -> None:
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Conv2d(1, 3, 3), torch.nn.BatchNorm2d(3), torch.nn.Flatten(),
                                 torch.nn.Linear(12, 2))
    module(torch.randn(4, 1, 4, 4))  # moves the BatchNorm running statistics and its int64 counter
    client = TorchClient(module, lambda m: 0.0, num_examples=4, client_id=3)
    vector = client.to_vector()
    assert vector.dtype == np.float64 and vector.shape == (client.num_parameters,)
    (record,) = cluster_models_from_torch([module])
    reference = ArrayRecord.from_torch_state_dict(module.state_dict())
    assert list(record) == list(reference)
    for name in record:
        np.testing.assert_array_equal(record[name].numpy(), reference[name].numpy())
        assert record[name].numpy().dtype == reference[name].numpy().dtype
    assert record["1.num_batches_tracked"].numpy().dtype == np.int64
    copy = torch.nn.Sequential(torch.nn.Conv2d(1, 3, 3), torch.nn.BatchNorm2d(3), torch.nn.Flatten(),
                               torch.nn.Linear(12, 2))
    TorchClient(copy, lambda m: 0.0, num_examples=4).load_vector(vector)
    for name, tensor in module.state_dict().items():
        assert torch.equal(copy.state_dict()[name], tensor), name


def test_torch_client_losses_in_eval_mode_without_gradients() -> None:
    seen = []

    def loss_fn(model: torch.nn.Module) -> torch.Tensor:
        seen.append((model.training, torch.is_grad_enabled()))
        return model.weight.sum()

    module = LinearModel(3)
    client = TorchClient(module, loss_fn, num_examples=1)
    losses = client.losses(np.array([[1.0, 2.0, 3.0], [0.0, 0.0, -1.0]]))
    np.testing.assert_allclose(losses, [[6.0, -1.0]])
    assert seen == [(False, False), (False, False)] and module.training


@pytest.mark.parametrize("value", [
    np.arange(12, dtype=np.float32).reshape(3, 4), np.array(2.5), np.zeros((0, 3)), np.arange(5, dtype=np.int64),
    np.array([True, False]), np.arange(4, dtype=">f4"), np.asfortranarray(np.arange(6.0).reshape(2, 3)),
])
def test_received_arrays_decode_like_flower(value: np.ndarray) -> None:
    """The plugin reads Array payloads in place (no np.load); the result equals ``Array.numpy()``."""
    from fedroute.strategies.records import decode_array

    array = Array(value)
    decoded, reference = decode_array(array), array.numpy()
    assert decoded.dtype == reference.dtype and decoded.shape == reference.shape
    np.testing.assert_array_equal(decoded, reference)


def test_cluster_models_of_different_architectures_are_refused() -> None:
    with pytest.raises(ValueError, match="one architecture"):
        cluster_models_from_torch([LinearModel(3), LinearModel(4)])
    with pytest.raises(ValueError, match="at least one"):
        cluster_models_from_torch([])


def test_routing_train_reply_has_the_builtin_schema_and_is_accepted() -> None:
    task = LinearTask(num_clients=4, seed=1)
    strategy = ClusteredRouting(method_settings("exp3", preset="linear"), min_available_nodes=4, seed=5)
    initial = linear_initial_models(task, 2)
    strategy.cluster_models = [{name: a.numpy() for name, a in record.items()} for record in initial]
    grid = InProcessGrid(linear_user_app(task), 4)
    (message, *_) = strategy.configure_train(1, pack_cluster_models(strategy.cluster_models), ConfigRecord(), grid)
    context = grid.contexts[message.metadata.dst_node_id]
    reply = grid.handlers[MessageType.TRAIN](message, context)
    assert set(reply.content) == {protocol.METRICS, protocol.MODEL}
    validated = validate_train_reply(reply.content, 2, strategy.cluster_models[0])
    assert validated.client_id == 0 and validated.num_examples == task.samples_per_client
    # the same keys as the built-in ClientApp's reply (client/app.py) to the same message
    from fedroute.client.app import train as builtin_train

    run_config = {"task": "linear", "num-clients": 4, "seed": 1}
    builtin_context = Context(run_id=1, node_id=1000, node_config={"partition-id": 0, "num-partitions": 4},
                              state=RecordDict(), run_config=run_config)
    builtin = builtin_train(message, builtin_context)
    assert set(reply.content[protocol.METRICS]) == set(builtin.content[protocol.METRICS])
    for key, value in builtin.content[protocol.METRICS].items():
        assert type(reply.content[protocol.METRICS][key]) is type(value), key
    # the controller state lives in Context.state, under the run key
    assert [key for key in context.state if key.startswith(protocol.STATE_PREFIX)] == \
        [f"{protocol.STATE_PREFIX}{strategy.run_key}@0"]


@pytest.mark.parametrize("method", ["exp3", "sync-entry"])
def test_plugin_client_makes_the_simulator_routes_and_models(method: str) -> None:
    """The user's torch ClientApp + ClusteredRouting == the batched simulator (same routes, same models)."""
    num_rounds = 12
    overrides = {"entry_threshold": 1.0, "hysteresis_min_rounds": 3, "block_length": 3} if method == "sync-entry" \
        else {"block_length": 3}
    routing = method_settings(method, preset="linear", **overrides)
    calls: dict[str, int] = {}
    grid = InProcessGrid(linear_user_app(TASK, calls), TASK.num_clients)
    strategy = ClusteredRouting(routing, min_available_nodes=TASK.num_clients, seed=7, run_key=method)
    strategy.start(grid, linear_initial_models(TASK, routing.num_clusters), num_rounds=num_rounds)
    history = simulate(TASK, routing, num_rounds, 7)
    routes = np.array([[strategy.client_routes[t][c] for c in range(TASK.num_clients)] for t in range(num_rounds)])
    np.testing.assert_array_equal(routes, history.routes)
    final = np.stack([model["weight"] for model in strategy.cluster_models])
    np.testing.assert_allclose(final, history.cluster_models[-1], atol=1e-9, rtol=0)
    assert not strategy.rejected
    assert sorted(r.client_id for r in strategy.final_evaluation) == list(range(TASK.num_clients))
    assert all(r.group == r.client_id % 2 for r in strategy.final_evaluation)
    if method == "sync-entry":
        assert history.entered.any(), "the configuration must exercise synchronized entry"
        assert any(m.metadata.message_type == MessageType.QUERY for m in grid.sent)
        # entry tests probe candidate clusters with the user's train_fn (probe updates are discarded)
        assert calls["train_fn"] > num_rounds * TASK.num_clients


def test_plugin_client_under_fedcam_makes_the_simulator_models() -> None:
    routing = method_settings("fedcam", preset="linear")
    grid = InProcessGrid(linear_user_app(TASK), TASK.num_clients)
    strategy = FedCAM(routing, min_available_nodes=TASK.num_clients, seed=3)
    strategy.start(grid, linear_initial_models(TASK, 2), num_rounds=6)
    batch = simulate_fedcam_batch([TASK], routing, 6, [3])
    routes = np.array([[strategy.client_routes[t][c] for c in range(TASK.num_clients)] for t in range(6)])
    np.testing.assert_array_equal(routes, batch.routes[:, 0])
    # the simulator records the combined predictors Θ_glob + Θ_k
    np.testing.assert_allclose(np.stack([m["weight"] for m in strategy.combined_models()]),
                               batch.cluster_models[-1, 0], atol=1e-9, rtol=0)
    assert not strategy.rejected


def test_evaluate_and_query_replies() -> None:
    task = LinearTask(num_clients=2, seed=4)
    handlers = linear_user_app(task)
    strategy = ClusteredRouting(method_settings("sync-entry", preset="linear"), min_available_nodes=2)
    strategy.cluster_models = [{name: a.numpy() for name, a in r.items()} for r in linear_initial_models(task, 2)]
    strategy._num_rounds = 3
    grid = InProcessGrid(handlers, 2)
    packed = pack_cluster_models(strategy.cluster_models)
    (message, _) = strategy.configure_evaluate(3, packed, ConfigRecord(), grid)
    reply = handlers[MessageType.EVALUATE](message, grid.contexts[message.metadata.dst_node_id])
    evaluated = validate_evaluate_reply(reply.content, 2)
    clients = task.clients(np.array([0]))
    models = np.stack([m["weight"] for m in strategy.cluster_models])
    np.testing.assert_allclose(evaluated.train_losses, clients.losses(models, "train")[0], rtol=1e-12)
    np.testing.assert_allclose(evaluated.test_losses, clients.losses(models, "test")[0], rtol=1e-12)
    assert evaluated.group == 0 and not reply.content.array_records
    (query, _) = strategy._messages([1000, 1001], MessageType.QUERY, {protocol.PHASE: protocol.PHASE_PROVISIONAL,
                                                                      protocol.SERVER_ROUND: 0,
                                                                      protocol.ROUND_INDEX: 0})
    report = validate_provisional_reply(
        handlers[MessageType.QUERY](query, grid.contexts[1000]).content, 2)
    assert report.cluster == int(np.argmin(clients.losses(models)[0])) and report.client_id == 0
    assert not list(grid.contexts[1000].state), "a provisional report changes no state"


def _metrics_of_both_apps(message: Message, kind: str, task: LinearTask) -> tuple[dict, dict]:
    """The ``metrics`` record of the plugin user's reply and of the built-in ClientApp's to one message."""
    from fedroute.client import app as builtin

    builtin_handler = {MessageType.QUERY: builtin.provisional, MessageType.EVALUATE: builtin.evaluate}[kind]
    replies = []
    for handler, run_config in ((linear_user_app(task)[kind], {}),
                                (builtin_handler, {"task": "linear", "num-clients": task.num_clients, "seed": 4})):
        context = Context(run_id=1, node_id=1000, node_config={"partition-id": 0, "num-partitions": 2},
                          state=RecordDict(), run_config=run_config)
        replies.append(dict(handler(message, context).content[protocol.METRICS].items()))
    return replies[0], replies[1]


def test_the_builtin_clientapp_and_the_plugin_send_the_same_replies() -> None:
    """One message handling behind both (client/handlers.py): to the same QUERY (provisional and
    identification) and EVALUATE messages, the same keys, value types and values (losses to 1e-12: torch
    against the task's numpy), ``num-examples`` an int in every reply (the one rule, ``num_examples_metric``)."""
    task = LinearTask(num_clients=2, seed=4)
    strategy = ClusteredRouting(method_settings("sync-entry", preset="linear"), min_available_nodes=2, seed=3)
    strategy.cluster_models = [{name: a.numpy() for name, a in r.items()} for r in linear_initial_models(task, 2)]
    strategy._num_rounds = 3
    grid = InProcessGrid({}, 2)
    (evaluate, _) = strategy.configure_evaluate(3, pack_cluster_models(strategy.cluster_models), ConfigRecord(), grid)
    (provisional, _) = strategy._messages([1000, 1001], MessageType.QUERY, {
        protocol.PHASE: protocol.PHASE_PROVISIONAL, protocol.SERVER_ROUND: 0, protocol.ROUND_INDEX: 0})
    identify = Message(content=RecordDict({protocol.CONFIG: ConfigRecord({
        protocol.PHASE: protocol.PHASE_IDENTIFY, protocol.RUN_KEY: strategy.run_key})}),
        message_type=MessageType.QUERY, dst_node_id=1000)
    for message in (evaluate, provisional, identify):
        user, builtin = _metrics_of_both_apps(message, message.metadata.message_type, task)
        assert set(user) == set(builtin) and {type(v) for v in user.values()} >= {int}
        for key, value in builtin.items():
            assert type(user[key]) is type(value), key
            np.testing.assert_allclose(user[key], value, rtol=1e-12, atol=0, err_msg=key)
        assert builtin[protocol.NUM_EXAMPLES] == task.samples_per_client and builtin[protocol.CLIENT_ID] == 0


def test_num_examples_is_an_int_when_whole_and_never_truncated() -> None:
    from fedroute.client.handlers import num_examples_metric

    assert type(num_examples_metric(np.int64(12))) is int and num_examples_metric(np.float64(12.0)) == 12
    assert type(num_examples_metric(12.0)) is int
    assert num_examples_metric(2.5) == 2.5 and type(num_examples_metric(2.5)) is float


def test_an_unknown_algorithm_is_refused_naming_the_allowed_ones() -> None:
    """The client dispatches by ``protocol.ALGORITHM`` in one table, keyed by the registry's algorithm values."""
    from fedroute.client.handlers import ALGORITHM_HANDLING
    from fedroute.core.methods import ALGORITHMS, REGISTRY

    assert set(ALGORITHM_HANDLING) == set(ALGORITHMS) == {method.algorithm for method in REGISTRY.values()}
    task = LinearTask(num_clients=2, seed=4)
    strategy = ClusteredRouting(RoutingSettings(num_clusters=2), min_available_nodes=2,
                                client_config={protocol.ALGORITHM: "no-such-algorithm"})
    strategy.cluster_models = [{name: a.numpy() for name, a in r.items()} for r in linear_initial_models(task, 2)]
    grid = InProcessGrid({}, 2)
    (message, _) = strategy.configure_train(1, pack_cluster_models(strategy.cluster_models), ConfigRecord(), grid)
    with pytest.raises(ValueError, match=r"'algorithm' = 'no-such-algorithm' is invalid; allowed: one of "
                                         r"\('routing', 'fedcam', 'local'\)"):
        linear_user_app(task)[MessageType.TRAIN](message, grid.contexts[1000])


def test_routing_train_explains_what_is_wrong() -> None:
    task = LinearTask(num_clients=2, seed=4)
    strategy = ClusteredRouting(RoutingSettings(num_clusters=2), min_available_nodes=2)
    strategy.cluster_models = [{name: a.numpy() for name, a in r.items()} for r in linear_initial_models(task, 2)]
    grid = InProcessGrid({}, 2)
    (message, _) = strategy.configure_train(1, pack_cluster_models(strategy.cluster_models), ConfigRecord(), grid)
    context = grid.contexts[1000]
    loss = lambda model: 0.0  # noqa: E731
    with pytest.raises(ValueError, match="cluster_models_from_torch"):
        routing_train(message, context, LinearModel(task.dimension + 1), lambda m: None, loss, 10)
    no_id = Context(run_id=1, node_id=5, node_config={}, state=RecordDict(), run_config={})
    with pytest.raises(ValueError, match="client_id"):
        routing_train(message, no_id, LinearModel(task.dimension), lambda m: None, loss, 10)
    reply = routing_train(message, no_id, LinearModel(task.dimension), lambda m: None, loss, 10, client_id=42)
    assert reply.content[protocol.METRICS][protocol.CLIENT_ID] == 42
    fedavg_like = Message(content=RecordDict({"arrays": ArrayRecord(), "config": ConfigRecord({"lr": 0.1})}),
                          dst_node_id=1000, message_type=MessageType.TRAIN)
    with pytest.raises(ValueError, match="ClusteredRouting"):
        routing_train(fedavg_like, context, LinearModel(task.dimension), lambda m: None, loss, 10)
    with pytest.raises(ValueError, match="num_examples"):
        routing_train(message, context, LinearModel(task.dimension), lambda m: None, loss, 0)


# ----------------------------------------------------------------------------- results API
def test_results_api_train_metrics_per_cluster_evaluate_fn_and_final_models() -> None:
    """train_fn metrics are averaged per cluster like FedAvg's; evaluate_fn runs per cluster from round 0."""
    from flwr.app import MetricRecord

    from fedroute import cluster_models_to_torch, unpack_cluster_models

    samples = TASK.samples(np.arange(TASK.num_clients))
    base = linear_user_app(TASK)

    def train(message: Message, context: Context) -> Message:
        i = int(context.node_config["partition-id"])
        x, y = (torch.from_numpy(np.ascontiguousarray(a[i])) for a in (samples.train_inputs, samples.train_targets))

        def train_fn(model: torch.nn.Module) -> dict:
            optimizer = torch.optim.SGD(model.parameters(), lr=TASK.learning_rate)
            optimizer.zero_grad()
            loss = 0.5 * torch.mean((model(x) - y) ** 2)
            loss.backward()
            optimizer.step()
            return {"train_loss": loss.detach(), "client": [float(i), 1.0]}  # a 0-d tensor and a list

        return routing_train(message, context, LinearModel(TASK.dimension), train_fn,
                             lambda model: float(0.5 * torch.mean((model(x) - y) ** 2)), num_examples=len(y))

    evaluated: list[tuple[int, float]] = []

    def evaluate_fn(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        weight = arrays["weight"].numpy()  # one cluster's model, as FedAvg's evaluate_fn gets it
        evaluated.append((server_round, float(weight[0])))
        return MetricRecord({"norm": float(np.linalg.norm(weight))})

    num_rounds = 4
    routing = method_settings("exp3", preset="linear", block_length=2)
    strategy = ClusteredRouting(routing, min_available_nodes=TASK.num_clients, seed=1, progress_interval=None)
    initial = linear_initial_models(TASK, 2)
    result = strategy.start(InProcessGrid({**base, MessageType.TRAIN: train}, TASK.num_clients), initial,
                            num_rounds=num_rounds, evaluate_fn=evaluate_fn)
    for server_round in range(1, num_rounds + 1):
        routes = strategy.client_routes[server_round - 1]
        for cluster, record in strategy.cluster_train_metrics[server_round].items():
            members = [client for client, routed in routes.items() if routed == cluster]
            assert record["client"] == pytest.approx([np.mean(members), 1.0])  # equal num-examples: the mean
            assert set(record) == {"train_loss", "client"}  # num-examples is the weight, not a metric
            assert result.train_metrics_clientapp[server_round][f"cluster-{cluster}/client"] == record["client"]
        assert set(strategy.cluster_train_metrics[server_round]) == set(routes.values())
    # evaluate_fn: each cluster, on the initial models (round 0) and after every round
    assert [r for r, _ in evaluated] == [r for r in range(num_rounds + 1) for _ in range(2)]
    initial_models = [record["weight"].numpy() for record in initial]
    assert [w for r, w in evaluated if r == 0] == [float(m[0]) for m in initial_models]
    assert strategy.server_evaluation[0][1]["norm"] == pytest.approx(np.linalg.norm(initial_models[1]))
    assert set(result.evaluate_metrics_serverapp[0]) == {"cluster-0/norm", "cluster-1/norm"}
    # the final packed record back as numpy and torch
    unpacked = unpack_cluster_models(result.arrays)  # K inferred from the keys
    states = cluster_models_to_torch(result.arrays)
    assert len(unpacked) == len(states) == 2
    for k, state in enumerate(states):
        module = LinearModel(TASK.dimension)
        module.load_state_dict(state)
        np.testing.assert_array_equal(module.weight.detach().numpy(), strategy.cluster_models[k]["weight"])
        np.testing.assert_array_equal(unpacked[k]["weight"], strategy.cluster_models[k]["weight"])
    assert [alarm.kind for alarm in strategy.alarms][:1] == ["collapsed-entrance"]  # TASK starts collapsed


def test_train_fn_metrics_are_checked_on_both_sides() -> None:
    from fedroute.client.torch_adapter import train_metrics_of
    from fedroute.strategies.validation import ReplyRejected, validate_train_metrics

    assert train_metrics_of(None) is None
    assert train_metrics_of({"a": np.float32(0.5), "b": (1, 2)}) == {"a": 0.5, "b": [1.0, 2.0]}
    with pytest.raises(TypeError, match="'loss'"):
        train_metrics_of({"loss": "low"})
    # a training loop that returns its loss (Flower's quickstart) reports it as train_loss
    assert train_metrics_of(0.5) == {"train_loss": 0.5}
    assert train_metrics_of(torch.tensor(0.25)) == {"train_loss": 0.25}
    assert train_metrics_of(np.float32(2.0)) == {"train_loss": 2.0} and train_metrics_of(3) == {"train_loss": 3.0}
    for other in (True, "0.5", (0.5, 0.9), torch.tensor([0.5, 0.9])):
        with pytest.raises(TypeError, match="return None, a number"):
            train_metrics_of(other)
    from flwr.app import MetricRecord

    assert validate_train_metrics({"metrics": MetricRecord({})}) is None  # optional
    with pytest.raises(ReplyRejected, match="'train-metrics' metric 'loss'"):
        validate_train_metrics({"train-metrics": MetricRecord({"loss": float("nan")})})
    with pytest.raises(ReplyRejected, match="at most 64"):
        validate_train_metrics({"train-metrics": MetricRecord({f"m{i}": 1.0 for i in range(65)})})
