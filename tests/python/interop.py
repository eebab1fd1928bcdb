"""Interop scenarios for python-qpid-proton against the connector's test-only in-memory node.

Usage: interop.py SCENARIO URL. Prints PASS and exits 0 on success; any failure raises.
"""
import sys
import time

from proton import Message
from proton.handlers import MessagingHandler
from proton.reactor import Container
from proton.utils import BlockingConnection

TIMEOUT = 20


def basic(url):
    """Send, receive with credit, accept; release then redelivery; nothing left (XFER-1, FLOW-1/3)."""
    conn = BlockingConnection(url, timeout=TIMEOUT, container_id="py-basic")
    sender = conn.create_sender("queues/py")
    for i in range(10):
        sender.send(Message(body="py %d" % i))
    receiver = conn.create_receiver("queues/py", credit=10)
    got = []
    for i in range(10):
        m = receiver.receive(timeout=TIMEOUT)
        got.append(m.body)
        if i == 3:
            receiver.release()
        else:
            receiver.accept()
    again = receiver.receive(timeout=TIMEOUT)
    assert again.body == "py 3", again.body
    receiver.accept()
    assert got == ["py %d" % i for i in range(10)], got
    conn.close()


def large(url):
    """A 300 KiB message across many frames at max-frame-size 4096, both directions."""
    body = bytes((i * 31) % 256 for i in range(300 * 1024))
    conn = BlockingConnection(url, timeout=TIMEOUT, container_id="py-large", max_frame_size=4096)
    sender = conn.create_sender("queues/py-large")
    sender.send(Message(body=body))
    receiver = conn.create_receiver("queues/py-large", credit=1)
    m = receiver.receive(timeout=TIMEOUT)
    receiver.accept()
    assert m.body == body, "body differs"
    conn.close()


def presettled(url):
    """Pre-settled sends arrive; a pre-settled (at-most-once) receiver gets them settled."""
    from proton.reactor import AtMostOnce
    conn = BlockingConnection(url, timeout=TIMEOUT, container_id="py-presettled")
    sender = conn.create_sender("queues/py-ps", options=AtMostOnce())
    for i in range(5):
        sender.send(Message(body=i))
    receiver = conn.create_receiver("queues/py-ps", credit=5, options=AtMostOnce())
    got = [receiver.receive(timeout=TIMEOUT).body for _ in range(5)]
    assert sorted(got) == list(range(5)), got
    conn.close()


class Drain(MessagingHandler):
    """FLOW-5: drain with credit 5 while 2 messages wait: 2 arrive, then credit 0 and drain ends."""

    def __init__(self, url):
        super().__init__(prefetch=0, auto_accept=True)
        self.url = url
        self.sent = 0
        self.received = 0
        self.done = False
        self.receiver = None

    def on_start(self, event):
        self.conn = event.container.connect(self.url, container_id="py-drain")
        self.sender = event.container.create_sender(self.conn, "queues/py-drain")

    def on_sendable(self, event):
        while event.sender.credit and self.sent < 2:
            event.sender.send(Message(body="d%d" % self.sent))
            self.sent += 1

    def on_accepted(self, event):
        if event.delivery.link.is_sender and self.receiver is None and self.sent == 2:
            self.receiver = event.container.create_receiver(self.conn, "queues/py-drain")

    def on_link_opened(self, event):
        if event.link.is_receiver:
            event.link.drain(5)

    def on_message(self, event):
        self.received += 1

    def on_link_flow(self, event):
        link = event.link
        if link.is_receiver and self.receiver is not None and not link.draining() and self.received == 2:
            assert link.credit == 0, link.credit
            self.done = True
            event.connection.close()


def drain(url):
    h = Drain(url)
    c = Container(h)
    c.timeout = TIMEOUT
    deadline = time.time() + TIMEOUT
    c.start()
    while c.process() and time.time() < deadline:
        if h.done and not c.process():
            break
    assert h.done, "drain did not complete (received %d)" % h.received


def many_links(url):
    """200 links on one session (senders and receivers), each used once."""
    conn = BlockingConnection(url, timeout=TIMEOUT, container_id="py-links")
    senders = [conn.create_sender("queues/pyl%d" % i) for i in range(100)]
    receivers = [conn.create_receiver("queues/pyl%d" % i, credit=1) for i in range(100)]
    for i, s in enumerate(senders):
        s.send(Message(body=i))
    for i, r in enumerate(receivers):
        assert r.receive(timeout=TIMEOUT).body == i
        r.accept()
    conn.close()


def plain(url):
    """SASL PLAIN with a username and password (authentication disabled: any password, SASL-4)."""
    conn = BlockingConnection(url, timeout=TIMEOUT, container_id="py-plain", user="alice", password="secret",
                              allowed_mechs="PLAIN", allow_insecure_mechs=True)
    conn.create_sender("queues/py-plain").send(Message(body="authenticated"))
    r = conn.create_receiver("queues/py-plain", credit=1)
    assert r.receive(timeout=TIMEOUT).body == "authenticated"
    r.accept()
    conn.close()


class Heartbeat(MessagingHandler):
    """CONN-12: with a 1 s idle-time-out and no traffic of its own for 3 s, the client stays
    connected only because the server sends empty frames at half its interval."""

    def __init__(self, url):
        super().__init__()
        self.url = url
        self.ok = False
        self.error = None

    def on_start(self, event):
        self.conn = event.container.connect(self.url, container_id="py-heartbeat", heartbeat=1)
        event.container.schedule(3.0, self)

    def on_timer_task(self, event):
        self.sender = event.container.create_sender(self.conn, "queues/py-hb")

    def on_sendable(self, event):
        if not self.ok:
            event.sender.send(Message(body="still here"))

    def on_accepted(self, event):
        self.ok = True
        event.connection.close()

    def on_transport_error(self, event):
        self.error = event.transport.condition


def heartbeat(url):
    h = Heartbeat(url)
    Container(h).run()
    assert h.ok and h.error is None, h.error


if __name__ == "__main__":
    scenario, url = sys.argv[1], sys.argv[2]
    {"basic": basic, "large": large, "presettled": presettled, "drain": drain, "many_links": many_links,
     "plain": plain, "heartbeat": heartbeat}[scenario](url)
    print("PASS", scenario)
