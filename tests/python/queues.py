"""The Queues concept page's scenarios (Q-S1 ... Q-S4, Q-32) with python-qpid-proton
against the real connector on its embedded store. Usage: queues.py SCENARIO URL. Prints PASS."""
import sys
import zlib

from proton import Link, Message
from proton.reactor import AtMostOnce, LinkOption
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


if __name__ == "__main__":
    scenario, url = sys.argv[1], sys.argv[2]
    {"q_s1": q_s1, "q_s2": q_s2, "q_s3": q_s3, "q_s4": q_s4, "teardown": teardown, "killed": killed}[scenario](url)
    print("PASS", scenario)
