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
  kubemq-authorizes TOKEN: alice's token; the connector lets every client use every channel
              and KubeMQ's own policy lets alice use channel a only: on queues, events and
              events-store (also durable) alice sends and receives on a; a response is
              refused by KubeMQ; on b every send is rejected and every receiver detached,
              amqp:unauthorized-access
  dynamic     USER TOKEN: a dynamic reply node is not subject to the policy: a message sent to
              it through an anonymous sender arrives
  refused     USER TOKEN: the SASL exchange fails (the connect fails), nothing else happens
  anonymous   ANONYMOUS is refused
  external    CA CERT KEY CHANNEL: an mTLS client authenticated by SASL EXTERNAL sends and
              receives on queues/CHANNEL"""
import sys

from proton import Disposition, Message, SSLDomain, Terminus, Timeout
from proton.reactor import LinkOption
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


class Durable(LinkOption):
    """What a JMS durable consumer sends: expiry-policy never, durable deliveries."""

    def apply(self, link):
        link.source.durability = Terminus.DELIVERIES
        link.source.expiry_policy = Terminus.EXPIRE_NEVER


def denied_by_kubemq(error):
    text = str(error)
    check("amqp:unauthorized-access" in text and "KubeMQ refused" in text, text)


def kubemq_authorizes(port, token):
    """AUTHZ-9: every call made for alice carries her ClientID, so KubeMQ's policy decides."""
    conn = connect(port, "alice", token, container_id="alice-app")
    # Queues: her sends are stored and her Gets served; channel b refuses both.
    sender = conn.create_sender("queues/a")
    for i in range(3):
        sender.send(Message(body=f"q{i}"))
    receiver = conn.create_receiver("queues/a", credit=10)
    got = []
    for _ in range(3):
        got.append(receiver.receive(timeout=TIMEOUT).body)
        receiver.accept()
    check(got == ["q0", "q1", "q2"], f"queues/a gave {got}")
    receiver.close()
    # Events and events-store, plain and durable, on her channel.
    events = conn.create_receiver("events/a", credit=10)
    stored = conn.create_receiver("events-store/a", credit=10)
    durable = conn.create_receiver(
        "events-store/a", credit=10, name="alice-durable", options=Durable()
    )
    conn.create_sender("events/a").send(Message(body="event"))
    conn.create_sender("events-store/a").send(Message(body="stored"))
    check(events.receive(timeout=TIMEOUT).body == "event", "events/a")
    check(stored.receive(timeout=TIMEOUT).body == "stored", "events-store/a")
    check(durable.receive(timeout=TIMEOUT).body == "stored", "durable events-store/a")
    for link in (events, stored, durable):
        link.close()
    # Commands on her channel reach her responder, but such a KubeMQ authorizes a response as
    # resource "responses", which no rule can name: it refuses every response, so the answer
    # is rejected and the requester gets KubeMQ's timeout.
    responder = conn.create_receiver("commands/a", credit=10)
    answers = conn.create_sender(None)
    replies = conn.create_receiver(None, dynamic=True, credit=10)
    reply_to = replies.link.remote_source.address
    conn.create_sender("commands/a").send(Message(body="cmd", reply_to=reply_to, ttl=2))
    request = responder.receive(timeout=TIMEOUT)
    responder.accept()
    check(request.body == "cmd", f"commands/a gave {request.body!r}")
    answer = Message(properties={"x-opt-kubemq-executed": True})
    answer.address = request.reply_to
    outcome = answers.send(answer, error_states=[])
    check(outcome.remote_state == Disposition.REJECTED, f"answer: outcome {outcome.remote_state}")
    denied_by_kubemq(outcome.remote.condition)
    reply = replies.receive(timeout=TIMEOUT)
    check(reply.properties.get("x-opt-kubemq-executed") is False, f"reply {reply.properties}")
    # Channel b: nothing accepted that KubeMQ refuses, every receiver detached.
    for address in ("queues/b", "events/b", "events-store/b"):
        outcome = conn.create_sender(address).send(Message(body="refused"), error_states=[])
        check(outcome.remote_state == Disposition.REJECTED, f"{address}: {outcome.remote_state}")
        denied_by_kubemq(outcome.remote.condition)
        try:
            # The detach may come before the attach is answered, or after.
            conn.create_receiver(address, credit=1).receive(timeout=TIMEOUT)
            raise AssertionError(f"a message arrived from {address}")
        except LinkDetached as e:
            denied_by_kubemq(e)
    conn.close()


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
    elif scenario == "kubemq-authorizes":
        kubemq_authorizes(port, *args)
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
