"""KubeMQ's own Python SDK (PyPI `kubemq`) against the embedded store's gRPC facade: an
independent client checking wire compatibility. Usage: kubemq_sdk.py HOST:PORT. Prints PASS.
Failures print the SDK's error."""
import sys
import time
import uuid

from kubemq.queues import Client, QueueMessage

addr = sys.argv[1]
client = Client(address=addr, client_id="sdk-test")
q = "sdk-" + uuid.uuid4().hex[:8]


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def send(channel, body, **policy):
    r = client.send_queue_message(QueueMessage(channel=channel, body=body, **policy))
    check(not r.is_error, "send failed: %s" % r.error)
    return r


def receive(channel, n, wait=1):
    r = client.receive_queue_messages(channel=channel, max_messages=n, wait_timeout_in_seconds=wait)
    check(not r.is_error, "receive failed: %s" % r.error)
    return r


info = client.ping()
check(info.version == "v2.4.0", "ping version %r" % info.version)

# send, receive, ack
for i in range(3):
    send(q, b"m%d" % i)
r = receive(q, 3)
check([m.body for m in r.messages] == [b"m0", b"m1", b"m2"], [m.body for m in r.messages])
check([m.receive_count for m in r.messages] == [1, 1, 1], "first delivery count")
seqs = [m.sequence for m in r.messages]
check(seqs == sorted(seqs) and seqs[0] >= 1, seqs)
for m in r.messages:
    m.ack()
time.sleep(0.3)
check(len(receive(q, 1).messages) == 0, "queue empty after ack")

# nack → redelivered with count 2 and a new sequence
send(q, b"again")
m = receive(q, 1).messages[0]
first_seq = m.sequence
m.nack()
time.sleep(0.3)
m = receive(q, 1).messages[0]
check(m.body == b"again" and m.receive_count == 2 and m.sequence > first_seq, (m.body, m.receive_count, m.sequence))
m.ack()

# requeue to another queue
other = q + "-other"
send(q, b"move")
receive(q, 1).messages[0].re_queue(other)
time.sleep(0.3)
m = receive(other, 1).messages[0]
check(m.body == b"move", m.body)
m.ack()

# MaxReceiveCount → dead-letter queue
dlq = q + "-dlq"
send(q, b"poison", max_receive_count=2, max_receive_queue=dlq)
for attempt in range(2):
    m = receive(q, 1).messages[0]
    check(m.body == b"poison", m.body)
    m.nack()
    time.sleep(0.3)
r = receive(q, 1)
check(len(r.messages) == 0, "poison message still in the source queue")
m = receive(dlq, 1).messages[0]
check(m.body == b"poison" and m.is_re_routed and m.re_route_from_queue == q, (m.body, m.is_re_routed, m.re_route_from_queue))
m.ack()

# a validation error the SDK does not pre-check comes back in-band with KubeMQ's code
bad = client.send_queue_message(QueueMessage(channel="orders/eu", body=b"x"))
check(bad.is_error and "Error 120" in bad.error, bad.error)

client.close()
print("PASS kubemq_sdk")
