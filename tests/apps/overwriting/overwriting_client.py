"""A ClientApp for tests that answers like fedroute's, then overwrites everything it received.

``ClusteredRouting`` builds a round's records once and shares them between the
round's messages.  If Flower handed a ClientApp the server's own objects, this
app's writes (huge model values, a changed seed and masses, an extra record)
would reach the clients served after it, and the run would leave the routes of
the batched simulator.
"""

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message
from flwr.clientapp import ClientApp

from fedroute import protocol
from fedroute.client import app as fedroute_app

app = ClientApp()


def _overwrite(message: Message) -> None:
    content = message.content
    for key, record in list(content.array_records.items()):
        for name, array in list(record.items()):
            record[name] = Array(np.full(array.shape, 1e6, dtype=np.dtype(array.dtype)))
    config = content[protocol.CONFIG]
    config[protocol.SEED] = 12345
    if protocol.MASSES in config:  # training messages
        config[protocol.MASSES] = [1.0] + [0.0] * (len(config[protocol.MASSES]) - 1)
    content["overwritten"] = ArrayRecord({"marker": Array(np.ones(1))})


@app.train()
def train(message: Message, context: Context) -> Message:
    reply = fedroute_app.train(message, context)
    _overwrite(message)
    return reply


@app.evaluate()
def evaluate(message: Message, context: Context) -> Message:
    reply = fedroute_app.evaluate(message, context)
    _overwrite(message)
    return reply
