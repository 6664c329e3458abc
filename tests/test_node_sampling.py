"""Node sampling: wait for every node once, then go on with the nodes that are there."""

from __future__ import annotations

import pytest

from fedroute.strategies.clustered import ClusteredRouting
from fedroute.core.methods import method_settings


class FakeGrid:
    def __init__(self, node_ids: list[int]) -> None:
        self.node_ids = node_ids

    def get_node_ids(self) -> list[int]:
        return list(self.node_ids)


def _strategy(**kwargs) -> ClusteredRouting:
    return ClusteredRouting(method_settings("exp3", preset="linear"), min_available_nodes=4, min_train_nodes=2,
                            node_wait_timeout=0.6, **kwargs)


def test_first_exchange_waits_for_min_available_nodes() -> None:
    with pytest.raises(RuntimeError, match="only 3 nodes connected"):
        _strategy()._sample_nodes(FakeGrid([1, 2, 3]), 1)


def test_a_lost_node_does_not_block_later_rounds() -> None:
    strategy = _strategy()
    assert strategy._sample_nodes(FakeGrid([4, 3, 2, 1]), 1) == [1, 2, 3, 4]
    assert strategy._sample_nodes(FakeGrid([1, 2, 4]), 2) == [1, 2, 4]  # node 3 is gone
    with pytest.raises(RuntimeError, match="require 2"):
        strategy._sample_nodes(FakeGrid([1]), 3)  # below min_train_nodes


class IdentifyingGrid(FakeGrid):
    """Nodes that answer the identification QUERY: node ``node_ids[i]`` serves client ``i``."""

    def send_and_receive(self, messages, timeout=None):
        from flwr.app import Message, MetricRecord, RecordDict

        from fedroute import protocol

        client_of = {node: i for i, node in enumerate(self.node_ids)}
        self.asked = getattr(self, "asked", 0) + len(list(messages))
        return [Message(content=RecordDict({protocol.METRICS: MetricRecord({
                    protocol.CLIENT_ID: client_of[m.metadata.dst_node_id], protocol.NUM_EXAMPLES: 10})}),
                        reply_to=m) for m in messages]


@pytest.mark.usefixtures("task_identity")
def test_partial_participation_samples_clients_not_node_ids() -> None:
    """The same clients are sampled whatever node ids Flower drew for them (and in whatever order)."""
    first_nodes, other_nodes = list(range(10, 30)), [2**62 + 7 * i for i in range(20)][::-1]
    first_grid, other_grid = IdentifyingGrid(first_nodes), IdentifyingGrid(other_nodes[::-1])
    first = _strategy(fraction_train=0.25, seed=3)
    other = _strategy(fraction_train=0.25, seed=3)
    picked = first._sample_nodes(first_grid, 5)
    clients = sorted(first.bindings.client_of_node[node] for node in picked)
    assert len(picked) == 5 and set(picked) <= set(first_nodes)
    again = other._sample_nodes(other_grid, 5)
    assert sorted(other.bindings.client_of_node[node] for node in again) == clients
    assert first._sample_nodes(first_grid, 6) != picked                       # another round, another sample
    assert first_grid.asked == 20                                             # each node is asked once only


@pytest.mark.usefixtures("task_identity")
def test_sampled_ids_are_exact_64_bit_node_ids() -> None:
    nodes = [2**62 + 12345 + 7 * i for i in range(40)]  # Flower's node ids are 64-bit integers
    sampled = _strategy(fraction_train=0.1, seed=1)._sample_nodes(IdentifyingGrid(nodes), 2)
    assert len(sampled) == 4 and set(sampled) <= set(nodes)
    assert all(isinstance(node, int) for node in sampled)
