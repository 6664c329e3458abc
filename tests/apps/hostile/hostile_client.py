"""A ClientApp for tests: the real fedroute client, except that partitions 0–3 lie.

Partition 0 returns NaN weights, 1 a cluster id out of range, 2 no
``num-examples``, 3 a model of the wrong shape.  Every other partition is the
real client, so the run must finish with these replies rejected and the rest
aggregated.
"""

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message
from flwr.clientapp import ClientApp

from fedroute import protocol
from fedroute.client import app as real

app = ClientApp()


@app.train()
def train(message: Message, context: Context) -> Message:
    reply = real.train(message, context)
    partition = int(context.node_config["partition-id"])
    metrics = reply.content[protocol.METRICS]
    if partition == 0:
        reply.content[protocol.MODEL] = ArrayRecord({"weights": Array(np.full(5, np.nan))})
        metrics[protocol.CLUSTER] = 1
    elif partition == 1:
        metrics[protocol.CLUSTER] = 7
    elif partition == 2:
        del metrics[protocol.NUM_EXAMPLES]
    elif partition == 3:
        reply.content[protocol.MODEL] = ArrayRecord({"weights": Array(np.ones(9))})
    return reply


app.query()(real.provisional)
app.evaluate()(real.evaluate)
