"""A ClientApp for tests whose every handler fails, as a broken deployment would.

The server must notice that no valid reply arrives, stop after ``dead-rounds``
rounds with an error naming the reasons, and exit non-zero.
"""

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

app = ClientApp()


@app.train()
def train(message: Message, context: Context) -> Message:
    raise RuntimeError("disk full on this node")


@app.evaluate()
def evaluate(message: Message, context: Context) -> Message:
    raise RuntimeError("disk full on this node")


@app.query()
def query(message: Message, context: Context) -> Message:
    raise RuntimeError("disk full on this node")
