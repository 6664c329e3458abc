"""A real Flower ``ClientApp`` on in-process nodes: what it raises comes back as Flower's error reply."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flwr.app import Context, Error, Message
from flwr.clientapp import ClientApp

from support.grid import InProcessGrid


def deployment_reason(error: Exception) -> str:
    """An error reply's reason from a SuperNode (``flwr/supernode/runtime/run_clientapp.py``)."""
    return str(type(error)) + ":<'" + str(error) + "'>"


def simulation_reason(error: Exception) -> str:
    """An error reply's reason in Flower's Ray simulation: Ray's traceback, the message on its last line."""
    return ("<class 'ray.exceptions.RayTaskError(ClientAppException)'>:<'\x1b[36mray::ClientAppActor.run()\x1b[39m "
            "(pid=27511, ip=192.0.2.2)\n  File \"flwr/simulation/ray_transport/ray_actor.py\", line 65, in run\n"
            "    raise ClientAppException(str(ex)) from ex\nflwr.clientapp.client_app.ClientAppException: \n"
            f"Exception ClientAppException occurred. Message: {error}'>")


class FlowerClientGrid(InProcessGrid):
    """Nodes that run a real ``ClientApp``; what it raises comes back as Flower's error reply."""

    def __init__(self, app: ClientApp, num_nodes: int, reason: Callable[[Exception], str] = deployment_reason):
        super().__init__({}, num_nodes)
        self.app, self.reason = app, reason

    def send_and_receive(self, messages: Any, timeout: float | None = None) -> list[Message]:
        replies = []
        for message in messages:
            self.sent.append(message)
            try:
                replies.append(self.app(message, self.contexts[message.metadata.dst_node_id]))
            except Exception as error:  # noqa: BLE001 - Flower turns any exception into an error reply
                replies.append(Message(Error(code=2, reason=self.reason(error)), reply_to=message))
        return replies


def client_app(handlers: dict[str, Callable[[Message, Context], Message]], kinds: tuple[str, ...]) -> ClientApp:
    """A ClientApp registering only the handlers of ``kinds`` (``train``, ``evaluate``, ``query``)."""
    app = ClientApp()
    for kind in kinds:
        getattr(app, kind)()(handlers[kind])
    return app


