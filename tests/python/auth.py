"""python-qpid-proton against a connector with Authentication on (SASL and authorization).
Usage: auth.py SCENARIO PORT [args]. Prints PASS SCENARIO.

  send        USER TOKEN CHANNEL: PLAIN with the token as password; a message sent to
              queues/CHANNEL is accepted and received back
  write-only  USER TOKEN CHANNEL: sending to queues/CHANNEL works; attaching a receiver to it is
              refused amqp:unauthorized-access "not authorized for CHANNEL"
  anonymous-terminus USER TOKEN ALLOWED DENIED: on one anonymous sender a message to
              queues/DENIED is rejected amqp:unauthorized-access and one to queues/ALLOWED is
              accepted (the link stays)
  kubemq-refuses USER TOKEN CHANNEL: the connector accepts the token but KubeMQ refuses it:
              a message to queues/CHANNEL is rejected and a receiver on it is detached, both
              amqp:unauthorized-access
  dynamic     USER TOKEN: a dynamic reply node is not subject to the policy: a message sent to
              it through an anonymous sender arrives
  refused     USER TOKEN: the SASL exchange fails (the connect fails), nothing else happens
  anonymous   ANONYMOUS is refused
  external    CA CERT KEY CHANNEL: an mTLS client authenticated by SASL EXTERNAL sends and
              receives on queues/CHANNEL"""
import sys

from proton import Disposition, Message, SSLDomain, Timeout
from proton.utils import BlockingConnection, LinkDetached, SendException

TIMEOUT = 10
HOST = "127.0.0.1"


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def connect(port, user=None, token=None, mechs="PLAIN", **kw):
    return BlockingConnection(
        f"amqp://{HOST}:{port}",
        timeout=TIMEOUT,
        user=user,
        password=token,
        allowed_mechs=mechs,
        # PLAIN over a plaintext socket: the test's loopback.
        allow_insecure_mechs=True,
        **kw,
    )


def round_trip(conn, channel, body):
    conn.create_sender(f"queues/{channel}").send(Message(body=body))
    got = conn.create_receiver(f"queues/{channel}", credit=1).receive(timeout=TIMEOUT)
    check(got.body == body, f"received {got.body!r}")


def refused(make):
    try:
        conn = make()
    except Exception as e:  # proton raises ConnectionException (or a subclass)
        text = str(e)
        check("unauthorized-access" in text or "Authentication failed" in text, text)
        return
    conn.close()
    raise AssertionError("the connection was accepted")


def unauthorized(exc, channel):
    text = str(exc)
    check("amqp:unauthorized-access" in text, text)
    check(f"not authorized for {channel}" in text, text)


def main():
    scenario, port, args = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    if scenario == "send":
        user, token, channel = args
        conn = connect(port, user, token)
        round_trip(conn, channel, "authenticated")
        conn.close()
    elif scenario == "write-only":
        user, token, channel = args
        conn = connect(port, user, token)
        conn.create_sender(f"queues/{channel}").send(Message(body="write allowed"))
        try:
            conn.create_receiver(f"queues/{channel}", credit=1)
            raise AssertionError("the receiver was attached")
        except LinkDetached as e:
            unauthorized(e, channel)
        conn.close()
    elif scenario == "anonymous-terminus":
        user, token, allowed, denied = args
        conn = connect(port, user, token)
        sender = conn.create_sender(None)
        try:
            sender.send(Message(address=f"queues/{denied}", body="denied"))
            raise AssertionError("the message was accepted")
        except SendException as e:
            # BlockingSender reports the outcome only; rhea (tests/js/auth.js) reads the
            # rejected outcome's condition.
            check(e.state == Disposition.REJECTED, f"outcome {e.state}")
        sender.send(Message(address=f"queues/{allowed}", body="allowed"))
        got = conn.create_receiver(f"queues/{allowed}", credit=1).receive(timeout=TIMEOUT)
        check(got.body == "allowed", f"received {got.body!r}")
        conn.close()
    elif scenario == "kubemq-refuses":
        user, token, channel = args
        conn = connect(port, user, token)
        try:
            conn.create_sender(f"queues/{channel}").send(Message(body="refused"))
            raise AssertionError("the message was accepted")
        except SendException as e:
            check(e.state == Disposition.REJECTED, f"outcome {e.state}")
        try:
            # The detach may come before the attach is processed, or after.
            receiver = conn.create_receiver(f"queues/{channel}", credit=1)
            receiver.receive(timeout=TIMEOUT)
            raise AssertionError("a message arrived")
        except LinkDetached as e:
            check("amqp:unauthorized-access" in str(e), str(e))
            check("KubeMQ refused" in str(e), str(e))
        conn.close()
    elif scenario == "wildcard":
        # AUTHZ-7: alice may read events on sub.<one token> only; app may write sub.anything.
        alice, app = args
        reader = connect(port, "alice", alice)
        writer = connect(port, "app", app)
        sender = writer.create_sender(None)
        for subscription in ("sub.>", "sub.*"):
            receiver = reader.create_receiver(f"events/{subscription}", credit=50)
            for channel in ("sub.x.y", "sub.deep.er.z", "sub.x", "sub.x.y", "sub.z"):
                sender.send(Message(address=f"events/{channel}", body=channel))
            got = []
            while len(got) < 2:
                got.append(receiver.receive(timeout=TIMEOUT).body)
            try:
                extra = receiver.receive(timeout=0.5).body
                raise AssertionError(f"{subscription}: {extra!r} came after {got}")
            except Timeout:
                pass
            check(got == ["sub.x", "sub.z"], f"{subscription} received {got}")
            receiver.close()
        # A subscription string the rule does not match is refused at attach, as any channel.
        for subscription in (">", "*.x", "sub.*.>"):
            try:
                reader.create_receiver(f"events/{subscription}", credit=1)
                raise AssertionError(f"events/{subscription} was attached")
            except LinkDetached as e:
                unauthorized(e, subscription)
        reader.close()
        writer.close()
    elif scenario == "isolated":
        # AUTHZ-8: alice may use queue a, bob queue b; neither reaches the other's, whatever the
        # backend enforces.
        alice, bob = args
        owner = connect(port, "alice", alice)
        sender = owner.create_sender("queues/a")
        for i in range(3):
            sender.send(Message(body=f"alice-{i}"))
        intruder = connect(port, "bob", bob)
        for make in (
            lambda: intruder.create_receiver("queues/a", credit=10),
            lambda: intruder.create_sender("queues/a"),
        ):
            try:
                make()
                raise AssertionError("bob attached to alice's queue")
            except LinkDetached as e:
                unauthorized(e, "a")
        round_trip(intruder, "b", "bob's own")
        intruder.close()
        receiver = owner.create_receiver("queues/a", credit=10)
        got = []
        for _ in range(3):
            message = receiver.receive(timeout=TIMEOUT)
            got.append(message.body)
            receiver.accept()
        check(got == [f"alice-{i}" for i in range(3)], f"alice received {got}")
        owner.close()
    elif scenario == "dynamic":
        user, token = args
        conn = connect(port, user, token)
        receiver = conn.create_receiver(None, dynamic=True, credit=1)
        address = receiver.link.remote_source.address
        check(address, "a dynamic address was minted")
        conn.create_sender(None).send(Message(address=address, body="reply"))
        got = receiver.receive(timeout=TIMEOUT)
        check(got.body == "reply", f"received {got.body!r}")
        conn.close()
    elif scenario == "refused":
        user, token = args
        refused(lambda: connect(port, user, token))
    elif scenario == "anonymous":
        refused(lambda: connect(port, mechs="ANONYMOUS"))
    elif scenario == "external":
        ca, cert, key, channel = args
        domain = SSLDomain(SSLDomain.MODE_CLIENT)
        domain.set_trusted_ca_db(ca)
        domain.set_peer_authentication(SSLDomain.VERIFY_PEER_NAME, ca)
        domain.set_credentials(cert, key, None)
        conn = BlockingConnection(
            f"amqps://{HOST}:{port}",
            timeout=TIMEOUT,
            ssl_domain=domain,
            allowed_mechs="EXTERNAL",
        )
        round_trip(conn, channel, "by certificate")
        conn.close()
    else:
        raise SystemExit(f"unknown scenario {scenario}")
    print(f"PASS {scenario}")


if __name__ == "__main__":
    main()
