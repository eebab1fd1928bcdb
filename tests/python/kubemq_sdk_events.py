"""KubeMQ's own Python SDK (PyPI `kubemq` 4.1.5) and events.
Usage: kubemq_sdk_events.py facade HOST:PORT — events and events-store through the store's gRPC
facade alone; kubemq_sdk_events.py interop HOST:PORT AMQP-URL — an SDK publisher with an AMQP
subscriber and an AMQP publisher with an SDK subscriber, on one store. Prints PASS."""
import json
import sys
import threading
import time
import uuid

from kubemq.pubsub import (Client, EventMessage, EventStoreMessage, EventStoreStartPosition,
                           EventsStoreSubscription, EventsSubscription)

TIMEOUT = 10


def check(cond, what):
    if not cond:
        raise AssertionError(what)


class Inbox:
    def __init__(self):
        self.items = []
        self.errors = []
        self.lock = threading.Lock()

    def on(self, item):
        with self.lock:
            self.items.append(item)

    def err(self, e):
        with self.lock:
            self.errors.append(e)

    def wait(self, n):
        deadline = time.time() + TIMEOUT
        while time.time() < deadline:
            with self.lock:
                if len(self.items) >= n:
                    return list(self.items)
            time.sleep(0.05)
        raise AssertionError("got %d of %d" % (len(self.items), n))


def facade(addr):
    client = Client(address=addr, client_id="sdk-events")
    ch = "sdk.ev." + uuid.uuid4().hex[:8]
    inbox = Inbox()
    client.subscribe_to_events(EventsSubscription(channel=ch, on_receive_event_callback=inbox.on,
                                                  on_error_callback=inbox.err))
    time.sleep(1)
    for i in range(3):
        client.send_events_message(EventMessage(channel=ch, body=b"e%d" % i, metadata="m", tags={"k": "v"}))
    got = inbox.wait(3)
    check([e.body for e in got] == [b"e0", b"e1", b"e2"], [e.body for e in got])
    check(got[0].metadata == "m" and got[0].channel == ch, got[0].to_dict())

    st = "sdk.es." + uuid.uuid4().hex[:8]
    for i in range(3):
        r = client.send_events_store_message(EventStoreMessage(channel=st, body=b"s%d" % i))
        check(r.sent, "stored: %r" % r.error)
    first = Inbox()
    client.subscribe_to_events_store(EventsStoreSubscription(
        channel=st, on_receive_event_callback=first.on, on_error_callback=first.err,
        events_store_type=EventStoreStartPosition.StartFromFirst))
    got = first.wait(3)
    check([(e.body, e.sequence) for e in got] == [(b"s0", 1), (b"s1", 2), (b"s2", 3)],
          [(e.body, e.sequence) for e in got])
    # One live events-store subscription per ClientID, as on KubeMQ.
    taken = Inbox()
    client.subscribe_to_events_store(EventsStoreSubscription(
        channel=st, on_receive_event_callback=taken.on, on_error_callback=taken.err,
        events_store_type=EventStoreStartPosition.StartFromFirst))
    deadline = time.time() + TIMEOUT
    while not taken.errors and time.time() < deadline:
        time.sleep(0.05)
    check(any("clientID already registered" in str(e) for e in taken.errors), taken.errors)
    other = Client(address=addr, client_id="sdk-events-2")
    at2 = Inbox()
    other.subscribe_to_events_store(EventsStoreSubscription(
        channel=st, on_receive_event_callback=at2.on, on_error_callback=at2.err,
        events_store_type=EventStoreStartPosition.StartAtSequence, events_store_sequence_value=2))
    check([e.sequence for e in at2.wait(2)] == [2, 3], "from sequence 2")
    other.close()
    client.close()


def interop(addr, url):
    from proton import Message
    from proton.utils import BlockingConnection

    client = Client(address=addr, client_id="sdk-interop")
    ch = "interop.ev." + uuid.uuid4().hex[:8]

    # SDK publisher → AMQP subscriber: body bytes, the SDK's Metadata as an annotation, its
    # tags as application properties.
    conn = BlockingConnection(url, timeout=TIMEOUT, container_id="interop")
    r = conn.create_receiver("events/" + ch, name="amqp-sub", credit=10)
    client.send_events_message(EventMessage(channel=ch, body=b"from-sdk", metadata="plain", tags={"k": "v"}))
    m = r.receive(timeout=TIMEOUT)
    check(bytes(m.body) == b"from-sdk", m.body)
    check(m.properties == {"k": "v"}, m.properties)
    check(m.annotations.get("x-opt-kubemq-metadata") == "plain", m.annotations)

    # AMQP publisher → SDK subscriber: the body as sent, the envelope in Metadata.
    st = "interop.es." + uuid.uuid4().hex[:8]
    inbox = Inbox()
    client.subscribe_to_events_store(EventsStoreSubscription(
        channel=st, on_receive_event_callback=inbox.on, on_error_callback=inbox.err,
        events_store_type=EventStoreStartPosition.StartFromFirst))
    s = conn.create_sender("events-store/" + st)
    # inferred: the bytes go as a Data section, the KubeMQ body bit for bit (ENV-8).
    s.send(Message(body=b"from-amqp", inferred=True, properties={"color": "red"}, subject="order"))
    got = inbox.wait(1)[0]
    check(got.body == b"from-amqp" and got.sequence == 1, got.to_dict())
    env = json.loads(got.metadata)["amqp10"]
    check(env["app"] == {"color": "red"} and env["props"]["subject"] == "order", env)
    conn.close()
    client.close()


if __name__ == "__main__":
    if sys.argv[1] == "facade":
        facade(sys.argv[2])
    else:
        interop(sys.argv[2], sys.argv[3])
    print("PASS kubemq_sdk_events")
