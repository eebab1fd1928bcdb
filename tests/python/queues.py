"""python-qpid-proton against the real connector: the Queues concept page's scenarios
(Q-S1 ... Q-S4, Q-32), then drain, many links, SASL PLAIN and heartbeats.
Usage: queues.py SCENARIO URL. Prints PASS."""
import sys
import time
import zlib

from proton import Link, Message
from proton.handlers import MessagingHandler
from proton.reactor import AtMostOnce, Container, LinkOption
from proton.utils import BlockingConnection, LinkDetached

TIMEOUT = 10


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def empty(receiver, seconds):
    try:
        m = receiver.receive(timeout=seconds)
    except Exception:
        return True
    raise AssertionError("unexpected message %r" % m.body)


def q_s1(url):
    """Q-S1: 10 unsettled sends each complete on accepted; credit 10 receives and accepts all;
    a further receive with a 2 s deadline gets nothing."""
    c = BlockingConnection(url, timeout=TIMEOUT, container_id="q-s1")
    s = c.create_sender("queues/q-s1")
    for i in range(10):
        s.send(Message(body="order %d" % i))  # blocks until accepted
    r = c.create_receiver("queues/q-s1", credit=10)
    got = []
    for _ in range(10):
        m = r.receive(timeout=TIMEOUT)
        got.append(m.body)
        r.accept()
    check(got == ["order %d" % i for i in range(10)], got)
    empty(r, 2)
    c.close()


def q_s2(url):
    """Q-S2 / Q-17 / Q-20 ... Q-22: first deliveries show delivery-count 0 and first-acquirer;
    a released message returns with delivery-count >= 1; a rejected one never returns."""
    c = BlockingConnection(url, timeout=TIMEOUT, container_id="q-s2")
    s = c.create_sender("queues/q-s2")
    for b in ["release-me", "reject-me", "accept-me"]:
        s.send(Message(body=b))
    r = c.create_receiver("queues/q-s2", credit=3)
    for _ in range(3):
        m = r.receive(timeout=TIMEOUT)
        check(m.delivery_count == 0 and m.first_acquirer, (m.body, m.delivery_count, m.first_acquirer))
        {"release-me": r.release, "reject-me": r.reject, "accept-me": r.accept}[m.body]()
    m = r.receive(timeout=TIMEOUT)
    check(m.body == "release-me" and m.delivery_count >= 1 and not m.first_acquirer, (m.body, m.delivery_count, m.first_acquirer))
    r.accept()
    empty(r, 1.5)
    c.close()


class SecondMode(LinkOption):
    def apply(self, link):
        link.rcv_settle_mode = Link.RCV_SECOND


def q_s3(url):
    """Q-S3 / Q-7 / Q-31: 10 pre-settled plus 10 unsettled messages are all drained by one
    receiver; a receiver asking for rcv-settle-mode second is refused with not-implemented."""
    c = BlockingConnection(url, timeout=TIMEOUT, container_id="q-s3")
    pre = c.create_sender("queues/q-s3", name="pre", options=AtMostOnce())
    for i in range(10):
        pre.send(Message(body="pre %d" % i))
    s = c.create_sender("queues/q-s3", name="unsettled")
    for i in range(10):
        s.send(Message(body="unsettled %d" % i))
    r = c.create_receiver("queues/q-s3", credit=20)
    got = set()
    for _ in range(20):
        got.add(r.receive(timeout=TIMEOUT).body)
        r.accept()
    check(len(got) == 20, sorted(got))
    try:
        c.create_receiver("queues/q-s3", name="second", options=SecondMode())
        raise AssertionError("second was not refused")
    except LinkDetached as e:
        check("amqp:not-implemented" in str(e), str(e))
    c.close()


def q_s4(url):
    """Q-S4: a 1 MiB body at max-frame-size 4096 is stored after the last fragment, answered with
    one accepted, and received as one message with the same length and CRC32."""
    body = bytes((i * 7 + 3) % 256 for i in range(1048576))
    c = BlockingConnection(url, timeout=TIMEOUT, container_id="q-s4", max_frame_size=4096)
    c.create_sender("queues/q-s4").send(Message(body=body))
    r = c.create_receiver("queues/q-s4", credit=1)
    m = r.receive(timeout=TIMEOUT)
    r.accept()
    check(len(m.body) == len(body) and zlib.crc32(m.body) == zlib.crc32(body), "body differs")
    c.close()


def teardown(url):
    """Q-32 / Q-34: a consumer that disconnects with unsettled deliveries loses nothing: a fresh
    consumer receives them, as redeliveries."""
    c = BlockingConnection(url, timeout=TIMEOUT, container_id="td-producer")
    s = c.create_sender("queues/teardown")
    for i in range(3):
        s.send(Message(body="t%d" % i))
    worker = BlockingConnection(url, timeout=TIMEOUT, container_id="td-worker")
    r = worker.create_receiver("queues/teardown", credit=3)
    for _ in range(3):
        r.receive(timeout=TIMEOUT)  # never settled
    worker.close()
    r2 = c.create_receiver("queues/teardown", credit=3)
    got = []
    for _ in range(3):
        m = r2.receive(timeout=TIMEOUT)
        check(m.delivery_count >= 1, (m.body, m.delivery_count))
        got.append(m.body)
        r2.accept()
    check(sorted(got) == ["t0", "t1", "t2"], got)
    c.close()


def killed(url):
    """Produces 3 messages, takes them unsettled on another connection, then dies by SIGKILL: the
    caller checks that a fresh consumer gets all three, as redeliveries (Q-32, Q-34)."""
    import os
    import signal
    c = BlockingConnection(url, timeout=TIMEOUT, container_id="killed-producer")
    s = c.create_sender("queues/killed")
    for i in range(3):
        s.send(Message(body="k%d" % i))
    r = c.create_receiver("queues/killed", credit=3)
    for _ in range(3):
        r.receive(timeout=TIMEOUT)  # never settled
    print("HELD", flush=True)
    os.kill(os.getpid(), signal.SIGKILL)


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
    {"q_s1": q_s1, "q_s2": q_s2, "q_s3": q_s3, "q_s4": q_s4, "teardown": teardown, "killed": killed,
     "drain": drain, "many_links": many_links, "plain": plain, "heartbeat": heartbeat}[scenario](url)
    print("PASS", scenario)
