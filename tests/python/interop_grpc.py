"""GEN-4 / Q-38: `queues/<ch>` over AMQP and `<ch>` over KubeMQ's gRPC API are the same queue,
both ways, with KubeMQ's own Python SDK on the gRPC side. Usage: interop_grpc.py AMQP_URL GRPC_ADDR."""
import json
import sys

from kubemq.queues import Client, QueueMessage
from proton import Message
from proton.utils import BlockingConnection

amqp_url, grpc_addr = sys.argv[1], sys.argv[2]
sdk = Client(address=grpc_addr, client_id="interop")
conn = BlockingConnection(amqp_url, timeout=10, container_id="interop-amqp")


def check(cond, what):
    if not cond:
        raise AssertionError(what)


# gRPC → AMQP: body as one Data section, Tags as application properties, plain Metadata as the
# x-opt-kubemq-metadata annotation (OP-ENV-6).
r = sdk.send_queue_message(QueueMessage(channel="interop.in", body=b"from-grpc", metadata="plain", tags={"k": "v"}))
check(not r.is_error, r.error)
rx = conn.create_receiver("queues/interop.in", credit=1)
m = rx.receive(timeout=10)
rx.accept()
check(bytes(m.body) == b"from-grpc", m.body)
check(m.properties == {"k": "v"}, m.properties)
check(m.annotations.get("x-opt-kubemq-metadata") == "plain", m.annotations)

# AMQP → gRPC: the Data body as is, the AMQP context in the amqp10 envelope (ENV-1).
out = Message(body=b"from-amqp", subject="hello", properties={"color": "red"})
out.inferred = True  # a Data section, not an AmqpValue
conn.create_sender("queues/interop.out").send(out)
got = sdk.receive_queue_messages(channel="interop.out", max_messages=1, wait_timeout_in_seconds=2)
check(len(got.messages) == 1, "nothing on the gRPC side")
g = got.messages[0]
check(g.body == b"from-amqp", g.body)
env = json.loads(g.metadata)["amqp10"]
check(env["props"]["subject"] == "hello" and env["app"]["color"] == "red" and env["body_section"] == "data", env)
g.ack()
conn.close()
sdk.close()
print("PASS interop_grpc")
