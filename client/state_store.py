"""A client's controller state in Flower's ``Context.state`` (one ArrayRecord per run key)."""

from __future__ import annotations

import numpy as np
from flwr.app import Array, ArrayRecord, Context

from fedroute import protocol
from fedroute.client.agent import AgentState
from fedroute.client.settings import RoutingSettings

__all__ = ["load_agent_state", "save_agent_state"]


def load_agent_state(context: Context, run_key: str, settings: RoutingSettings) -> AgentState:
    """The stored state for ``run_key``, or a fresh one (batch of one client).

    A stored state whose arm count differs from ``settings`` (a changed
    controller set) is discarded rather than misread.
    """
    key = protocol.STATE_PREFIX + run_key
    if key in context.state:
        stored = {name: array.numpy() for name, array in context.state[key].items()}
        state = AgentState.from_arrays(stored)
        if state.exp3_log_weights.shape == (1, settings.num_arms):
            return state
    return AgentState.initial(1, settings)


def save_agent_state(context: Context, run_key: str, state: AgentState) -> None:
    """Store ``state`` under ``run_key`` in ``context.state``."""
    context.state[protocol.STATE_PREFIX + run_key] = ArrayRecord(
        {name: Array(np.ascontiguousarray(value)) for name, value in state.to_arrays().items()}
    )
