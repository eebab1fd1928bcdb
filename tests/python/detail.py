"""Holds python-qpid-proton connections and links open while the test reads the connector's
detail endpoints (OBS-2, OBS-3, TLS-6).
Usage: detail.py PORT TLS_PORT CA.

Opens three connections:
  plain   container-id "detail plain/1", SASL ANONYMOUS, OPEN properties product and version;
          a sender on queues/detail-q, a receiver on events/detail-e with credit 7, a receiver on
          a dynamic node with credit 3
  bare    container-id "detail-bare", no SASL layer; nothing attached
  tls     container-id "detail-tls" over TLS; a receiver on queues/detail-q with credit 5 that
          takes one message and does not settle it
then prints READY with the events and dynamic receivers' credit as proton counts it, and waits for a line on stdin; closes "plain", prints CLOSED and waits for a
line; closes the rest and prints DONE."""
import sys

from proton import Message, SSLDomain, symbol
from proton.utils import BlockingConnection

TIMEOUT = 10
HOST = "127.0.0.1"


def main(port, tls_port, ca):
    plain = BlockingConnection(
        "amqp://%s:%d" % (HOST, port),
        timeout=TIMEOUT,
        container_id="detail plain/1",
        allowed_mechs="ANONYMOUS",
        properties={symbol("product"): "detail-test", symbol("version"): "1.2.3"},
    )
    sender = plain.create_sender("queues/detail-q")
    events = plain.create_receiver("events/detail-e", credit=7)
    dynamic = plain.create_receiver(None, dynamic=True, credit=3)
    bare = BlockingConnection(
        "amqp://%s:%d" % (HOST, port),
        timeout=TIMEOUT,
        container_id="detail-bare",
        sasl_enabled=False,
    )
    domain = SSLDomain(SSLDomain.MODE_CLIENT)
    domain.set_trusted_ca_db(ca)
    domain.set_peer_authentication(SSLDomain.VERIFY_PEER_NAME, ca)
    tls = BlockingConnection(
        "amqps://%s:%d" % (HOST, tls_port),
        timeout=TIMEOUT,
        ssl_domain=domain,
        container_id="detail-tls",
        allowed_mechs="ANONYMOUS",
    )
    receiver = tls.create_receiver("queues/detail-q", credit=5)
    sender.send(Message(body="held unsettled"))
    got = receiver.receive(timeout=TIMEOUT)
    if got.body != "held unsettled":
        raise AssertionError("received %r" % got.body)
    # The credit each receiver has granted, as proton counts it (its prefetch adds to what was
    # asked for).
    print(
        "READY %d %d" % (events.link.credit, dynamic.link.credit),
        flush=True,
    )
    sys.stdin.readline()
    plain.close()
    print("CLOSED", flush=True)
    sys.stdin.readline()
    receiver.release()
    tls.close()
    bare.close()
    print("DONE", flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
