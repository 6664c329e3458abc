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


def test_partial_participation_is_deterministic() -> None:
    nodes = list(range(10, 30))
    first = _strategy(fraction_train=0.25, seed=3)._sample_nodes(FakeGrid(nodes), 5)
    again = _strategy(fraction_train=0.25, seed=3)._sample_nodes(FakeGrid(list(reversed(nodes))), 5)
    other_round = _strategy(fraction_train=0.25, seed=3)._sample_nodes(FakeGrid(nodes), 6)
    assert first == again and len(first) == 5 and set(first) <= set(nodes)
    assert other_round != first


def test_sampled_ids_are_exact_64_bit_node_ids() -> None:
    nodes = [2**62 + 12345 + 7 * i for i in range(40)]  # Flower's node ids are 64-bit integers
    sampled = _strategy(fraction_train=0.1, seed=1)._sample_nodes(FakeGrid(nodes), 2)
    assert len(sampled) == 4 and set(sampled) <= set(nodes)
    assert all(isinstance(node, int) for node in sampled)
