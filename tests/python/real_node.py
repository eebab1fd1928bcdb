"""python-qpid-proton against the connector pods of tests/k8s/real-node.sh, through their Service.

  real_node.py roundtrip URL QUEUE        one message there and back
  real_node.py send URL QUEUE N           sends N messages, each accepted before the next; prints
                                          their bodies, one a line
  real_node.py produce URL QUEUE FILE     sends until FILE exists; prints every body the connector
                                          accepted, one a line (at least once: a send that fails
                                          is made again on a new connection)
  real_node.py drain URL QUEUE N          receives and accepts until the queue has been quiet for
                                          5 s; prints every body, one a line; fails with fewer than N
  real_node.py hold URL QUEUE             receives one message and never settles it; prints
                                          `holding <body>`, then, when the connector ends the
                                          connection, its condition (or `disconnected`)
"""
import os
import sys
import time

from proton import Message, Timeout
from proton.utils import BlockingConnection, ConnectionClosed, LinkDetached


def connect(url):
    deadline = time.time() + 60
    while True:
        try:
            return BlockingConnection(url, timeout=10)
        except Exception:
            if time.time() > deadline:
                raise
            time.sleep(0.5)


def roundtrip(url, queue):
    c = connect(url)
    body = "through " + url
    c.create_sender(queue).send(Message(body=body))
    r = c.create_receiver(queue, credit=1)
    m = r.receive(timeout=20)
    r.accept()
    assert m.body == body, m.body
    c.close()


def send(url, queue, count):
    c = connect(url)
    s = c.create_sender(queue)
    for i in range(1, count + 1):
        s.send(Message(body="k-%d" % i, durable=True))
        print("k-%d" % i)
    c.close()


def produce(url, queue, stop):
    n, c, s = 0, None, None
    while not os.path.exists(stop):
        body = "m-%d" % n
        try:
            if c is None:
                c = connect(url)
                s = c.create_sender(queue)
            s.send(Message(body=body, durable=True))
            print(body, flush=True)
            n += 1
        except Exception:
            # The pod went away (a rolling update): the same message again, on a new connection.
            try:
                if c is not None:
                    c.close()
            except Exception:
                pass
            c = None
            time.sleep(0.2)
        time.sleep(0.01)
    if c is not None:
        c.close()


def drain(url, queue, least):
    c = connect(url)
    r = c.create_receiver(queue, credit=100)
    got = []
    while True:
        try:
            m = r.receive(timeout=5)
        except Exception:
            break
        r.accept()
        got.append(m.body)
    c.close()
    for body in got:
        print(body)
    assert len(got) >= least, "%d of %d" % (len(got), least)


def hold(url, queue):
    c = connect(url)
    r = c.create_receiver(queue, credit=1)
    m = r.receive(timeout=20)
    print("holding", m.body, flush=True)
    while True:
        try:
            r.receive(timeout=1)
        except ConnectionClosed as e:
            cond = e.connection.remote_condition
            print(cond.name if cond else "closed without a condition", flush=True)
            return
        except LinkDetached as e:
            cond = e.link.remote_condition
            print("detached", cond.name if cond else "", flush=True)
            return
        except Timeout:
            continue
        except Exception as e:
            print("disconnected:", e, flush=True)
            return


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "roundtrip":
        roundtrip(sys.argv[2], sys.argv[3])
    elif mode == "send":
        send(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    elif mode == "produce":
        produce(sys.argv[2], sys.argv[3], sys.argv[4])
    elif mode == "drain":
        drain(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    elif mode == "hold":
        hold(sys.argv[2], sys.argv[3])
    else:
        sys.exit("unknown mode " + mode)
