"""python-qpid-proton against the real connector: events (fan-out, groups, wildcards, selectors,
zero credit, drain) and events-store (start positions, durable subscriptions, a stalled
subscriber, refusals).
Usage: events.py SCENARIO URL [CHANNEL-SUFFIX]. Prints PASS SCENARIO."""
import sys
import time
import uuid

from proton import Link, Message, Terminus, symbol
from proton.reactor import AtMostOnce, DurableSubscription, LinkOption, Selector
from proton.utils import BlockingConnection, LinkDetached

TIMEOUT = 10
# Bodies of messages delivered unsettled (events and events-store deliveries never are).
UNSETTLED = []
# The selector filter's key (SEL-1); proton's Selector names it `selector` unless told.
SELECTOR = "apache.org:selector-filter:string"


def check(cond, what):
    if not cond:
        raise AssertionError(what)


class Props(LinkOption):
    """ATTACH link properties (x-opt-kubemq-group, x-opt-kubemq-start)."""

    def __init__(self, **props):
        self.props = {symbol(k.replace("_", "-")): v for k, v in props.items()}

    def apply(self, link):
        link.properties = self.props


def group(name):
    return Props(x_opt_kubemq_group=name)


def start(position):
    return Props(x_opt_kubemq_start=position)


def receiver(c, address, credit=100, options=None):
    """A receiver with a link name of its own (proton names links after their address)."""
    return c.create_receiver(address, credit=credit, name=uuid.uuid4().hex, options=options)


def fed_until_heard(sender, receiver, body):
    """The bodies `receiver` gets while `body` is published until it hears one: KubeMQ never
    says when a subscription starts, so what is sent before that is not its to hear."""
    got = []
    deadline = time.time() + TIMEOUT
    while not got and time.time() < deadline:
        sender.send(Message(body=body))
        got = drain_all(receiver, seconds=0.3)
    return [m.body for m in got + drain_all(receiver)]


def drain_all(receiver, seconds=1.0):
    """Everything that arrives within `seconds` of the last message."""
    got = []
    while True:
        try:
            m = receiver.receive(timeout=seconds)
        except Exception:
            return got
        got.append(m)
        if receiver.fetcher.unsettled:
            UNSETTLED.append(m.body)
            receiver.accept()


def nothing(receiver, seconds=0.5):
    got = drain_all(receiver, seconds)
    check(got == [], "unexpected %r" % [m.body for m in got])


def unique(name):
    return "%s.%s" % (name, uuid.uuid4().hex[:8])


def fanout(url):
    """EV-1, EV-2, EV-4, EV-7, EV-9: three subscribers each get every event a pre-settled
    publisher sends after their attach completed."""
    ch = unique("ev.fan")
    c = BlockingConnection(url, timeout=TIMEOUT, container_id="ev-fan")
    rs = [receiver(c, "events/" + ch, credit=100) for _ in range(3)]
    s = c.create_sender("events/" + ch, options=AtMostOnce())
    for i in range(10):
        s.send(Message(body="e%d" % i))
    for r in rs:
        got = [m.body for m in drain_all(r)]
        check(got == ["e%d" % i for i in range(10)], got)
    c.close()


def unsettled(url):
    """EV-3: an unsettled publish is accepted once the broker took it; EV-5: deliveries are
    pre-settled whatever the receiver asked."""
    ch = unique("ev.acc")
    c = BlockingConnection(url, timeout=TIMEOUT, container_id="ev-acc")
    r = receiver(c, "events/" + ch, credit=10)
    s = c.create_sender("events/" + ch)
    s.send(Message(body="x", properties={"k": "v"}))  # blocks until accepted
    m = r.receive(timeout=TIMEOUT)
    check(m.body == "x" and m.properties == {"k": "v"}, (m.body, m.properties))
    check(not r.fetcher.unsettled, "EV-5: delivered pre-settled")
    # EV-13: what was published while no subscription existed is never delivered. An event
    # is accepted once it is on its way to KubeMQ (decisions.md, "EV-3 (order)"), so a witness
    # on another connection shows when KubeMQ has fanned "lost" out; and KubeMQ never says
    # when a new subscription starts, so r2 is fed until it hears.
    r.close()
    w = BlockingConnection(url, timeout=TIMEOUT, container_id="ev-acc-witness")
    witness = receiver(w, "events/" + ch)
    fed_until_heard(s, witness, "warm")
    s.send(Message(body="lost"))
    while witness.receive(timeout=TIMEOUT).body != "lost":
        pass  # the last of the warm-up
    w.close()
    r2 = receiver(c, "events/" + ch)
    bodies = fed_until_heard(s, r2, "new")
    check(bodies and set(bodies) == {"new"}, ("EV-13", bodies))
    c.close()


def groups(url):
    """GRP-1, GRP-2: two g1 receivers and one g2 receiver, 30 events: g2 gets 30, the g1 members
    together 30, none twice, each a share; a receiver without a group gets all 30 too."""
    ch = unique("ev.grp")
    c = BlockingConnection(url, timeout=TIMEOUT, container_id="ev-grp")
    g1a = receiver(c, "events/" + ch, credit=100, options=group("g1"))
    g1b = receiver(c, "events/" + ch, credit=100, options=group("g1"))
    g2 = receiver(c, "events/" + ch, credit=100, options=group("g2"))
    solo = receiver(c, "events/" + ch, credit=100)
    s = c.create_sender("events/" + ch, options=AtMostOnce())
    sent = ["e%02d" % i for i in range(30)]
    for b in sent:
        s.send(Message(body=b))
    a = [m.body for m in drain_all(g1a)]
    b = [m.body for m in drain_all(g1b)]
    check(sorted(a + b) == sent, (a, b))
    check(a and b, "each g1 member got a share: %d / %d" % (len(a), len(b)))
    check([m.body for m in drain_all(g2)] == sent, "g2 got every event")
    check([m.body for m in drain_all(solo)] == sent, "the ungrouped receiver got every event")
    # GRP-5: no shared subscriptions are advertised.
    check("SHARED-SUBS" not in str(c.conn.remote_offered_capabilities), "GRP-5")
    c.close()


def wildcard(url):
    """Events subscriptions take KubeMQ's wildcards: `*` one token, `>` the rest."""
    base = unique("ev.wild")
    c = BlockingConnection(url, timeout=TIMEOUT, container_id="ev-wild")
    star = receiver(c, "events/%s.*" % base, credit=100)
    rest = receiver(c, "events/%s.>" % base, credit=100)
    s = c.create_sender(None, options=AtMostOnce())
    for sub in ["a", "b", "a.deep"]:
        m = Message(body=sub, address="events/%s.%s" % (base, sub))
        s.send(m)
    check([m.body for m in drain_all(star)] == ["a", "b"], "star")
    check([m.body for m in drain_all(rest)] == ["a", "b", "a.deep"], "rest")
    c.close()


def selectors(url):
    """SEL-1, SEL-4, SEL-9: the selector filter (described by symbol, as proton sends it) is
    honored and echoed in the reply ATTACH; the specification's vector."""
    ch = unique("ev.sel")
    c = BlockingConnection(url, timeout=TIMEOUT, container_id="ev-sel")
    r = receiver(c, "events/" + ch, options=Selector("color = 'red' AND size > 2", SELECTOR))
    echoed = r.link.remote_source.filter
    echoed.rewind()
    echoed.next()
    check("color = 'red' AND size > 2" in str(echoed.get_object()), "SEL-4: echoed")
    # SEL-1: an entry under another key (proton's default, `selector`) is not a selector.
    plain = receiver(c, "events/" + ch, options=Selector("color = 'red'"))
    s = c.create_sender("events/" + ch, options=AtMostOnce())
    cases = [
        ({"color": "red", "size": 5}, True),
        ({"color": "red", "size": 3}, True),
        ({"color": "blue", "size": 9}, False),
        ({"color": "red", "size": 1}, False),
        ({"size": 8}, False),
    ]
    for i, (props, _) in enumerate(cases):
        s.send(Message(body="m%d" % i, properties=props))
    want = ["m%d" % i for i, (_, ok) in enumerate(cases) if ok]
    check([m.body for m in drain_all(r)] == want, want)
    check(len(drain_all(plain)) == len(cases), "unfiltered")
    c.close()


def bad_selector(url):
    """SEL-5: a malformed selector refuses the attach with invalid-field, naming the token;
    SEL-3: a selector on a queues source is not-implemented."""
    c = BlockingConnection(url, timeout=TIMEOUT, container_id="ev-badsel")
    try:
        c.create_receiver("events/ev.badsel", options=Selector("color == 'red'", SELECTOR))
        raise AssertionError("a malformed selector was accepted")
    except LinkDetached as e:
        check("amqp:invalid-field" in str(e) and "invalid selector" in str(e), str(e))
    c.close()
    c = BlockingConnection(url, timeout=TIMEOUT, container_id="ev-badsel2")
    try:
        c.create_receiver("queues/ev.badsel", options=Selector("a = 1", SELECTOR))
        raise AssertionError("a selector on queues was accepted")
    except LinkDetached as e:
        check("amqp:not-implemented" in str(e), str(e))
    c.close()


def zero_credit(url):
    """EV-6: events reaching a receiver with no credit are dropped, not kept for later credit
    (the test counts the drops from the metrics)."""
    ch = unique("ev.zero")
    c = BlockingConnection(url, timeout=TIMEOUT, container_id="ev-zero")
    r = receiver(c, "events/" + ch, credit=0)
    s = c.create_sender("events/" + ch)
    for i in range(5):
        s.send(Message(body="dropped%d" % i))  # accepted: the broker took them
    time.sleep(0.5)
    r.flow(3)
    nothing(r)
    s.send(Message(body="kept"))
    got = [m.body for m in drain_all(r)]
    check(got == ["kept"], got)
    c.close()
    print("DROPPED 5")


def drain(url):
    """EV-12 / ES-9: a drain completes at once on an events link and on an events-store link
    (its buffered messages first)."""
    c = BlockingConnection(url, timeout=TIMEOUT, container_id="ev-drain")
    ch = unique("es.drain")
    s = c.create_sender("events-store/" + ch)
    for i in range(2):
        s.send(Message(body="s%d" % i))
    for address, opts, want in [
        ("events/" + unique("ev.drain"), None, []),
        ("events-store/" + ch, start("first"), ["s0", "s1"]),
    ]:
        r = c.create_receiver(address, credit=0, name=uuid.uuid4().hex, options=opts)
        # Each drain completes at once with what the link has buffered. A real KubeMQ replays
        # the stored events a moment after the subscription opened (later still under load), so
        # a drain may come before they did: drain again until they are all here.
        deadline = time.time() + TIMEOUT
        while True:
            began = time.time()
            r.link.drain(5)
            c.wait(lambda: r.link.credit == 0, timeout=3)
            check(time.time() - began < 3, "the drain completed promptly")
            got = [m.body for m, _ in r.fetcher.incoming]
            check(got == want[: len(got)], (address, got))
            if len(got) == len(want) or time.time() > deadline:
                break
            time.sleep(0.1)
        check(got == want, (address, got))
        r.close()
    c.close()


def start_positions(url):
    """SP-9 on a fresh channel with es-000 ... es-005 stored (ES-2: accepted once stored)."""
    ch = unique("es.sp")
    c = BlockingConnection(url, timeout=TIMEOUT, container_id="es-sp")
    s = c.create_sender("events-store/" + ch)
    labels = ["es-%03d" % i for i in range(6)]
    for b in labels:
        s.send(Message(body=b))
    for position, want in [
        ("first", labels),
        ("sequence:4", labels[3:]),
        ("time-delta:3600", labels),
        ("last", labels[5:]),
        ("time:%d" % (int(time.time()) - 3600), labels),
    ]:
        r = receiver(c, "events-store/" + ch, credit=100, options=start(position))
        got = [m.body for m in drain_all(r)]
        check(got == want, (position, got))
        r.close()
    r = receiver(c, "events-store/" + ch, credit=100, options=start("new-only"))
    nothing(r)
    s.send(Message(body="after"))
    check([m.body for m in drain_all(r)] == ["after"], "new-only")
    r.close()
    r = receiver(c, "events-store/" + ch, credit=100)
    nothing(r)
    r.close()
    check(UNSETTLED == [], "ES-4: deliveries are pre-settled: %r" % UNSETTLED)
    c.close()


def bad_start(url):
    """SP-7: malformed start positions refuse the attach, naming the value."""
    for value, text in [
        ("sequence:abc", "invalid start sequence: abc"),
        ("sequence:-1", "invalid start sequence: -1"),
        ("time:not-a-time", "invalid start time: not-a-time"),
        ("time-delta:nope", "invalid start time-delta: nope"),
        ("whenever", "unknown start position: whenever"),
    ]:
        c = BlockingConnection(url, timeout=TIMEOUT, container_id="es-badstart")
        try:
            c.create_receiver("events-store/es.badstart", options=start(value))
            raise AssertionError("%s was accepted" % value)
        except LinkDetached as e:
            check("amqp:invalid-field" in str(e) and text in str(e), str(e))
        c.close()
    # EV-11: ignored on events.
    c = BlockingConnection(url, timeout=TIMEOUT, container_id="ev-start")
    c.create_receiver("events/ev.start", options=start("whenever")).close()
    c.close()


class Durable(LinkOption):
    """What a JMS durable consumer sends: expiry-policy never, durable deliveries."""

    def apply(self, link):
        link.source.durability = Terminus.DELIVERIES
        link.source.expiry_policy = Terminus.EXPIRE_NEVER


class NullSource(LinkOption):
    """No source at all, as JMS unsubscribe(name) attaches."""

    def apply(self, link):
        link.source.type = Terminus.UNSPECIFIED


def durable_receiver(c, ch, name, position=None):
    opts = [Durable()]
    if position:
        opts.append(start(position))
    return c.create_receiver("events-store/" + ch, credit=100, name=name, options=opts)


def durable(url, ch):
    """DUR-1, DUR-4, DUR-6, DUR-8, DUR-10: 3 delivered, detach, 5 published, re-attach delivers
    exactly those 5 (its start position ignored); a second live attach is refused."""
    c = BlockingConnection(url, timeout=TIMEOUT, container_id="dur-app")
    s = c.create_sender("events-store/" + ch)
    r = durable_receiver(c, ch, "sub1", "new-only")
    for i in range(3):
        s.send(Message(body="before%d" % i))
    check([m.body for m in drain_all(r)] == ["before0", "before1", "before2"], "first three")
    try:
        c2 = BlockingConnection(url, timeout=TIMEOUT, container_id="dur-app")
        durable_receiver(c2, ch, "sub1")
        raise AssertionError("a second live attach was accepted")
    except LinkDetached as e:
        check("amqp:not-allowed" in str(e) and "durable subscription in use" in str(e), str(e))
    c2.close()
    r.close()  # DUR-8: detach ends the attach, not the subscription
    for i in range(5):
        s.send(Message(body="away%d" % i))
    r = durable_receiver(c, ch, "sub1", "first")
    got = [m.body for m in drain_all(r)]
    check(got == ["away%d" % i for i in range(5)], got)
    r.close()
    c.close()


def durable_other_identity(url, ch):
    """DUR-5: another container-id or link name is another subscription, starting where it asks."""
    c = BlockingConnection(url, timeout=TIMEOUT, container_id="dur-other")
    r = durable_receiver(c, ch, "sub1", "first")
    got = [m.body for m in drain_all(r)]
    check(len(got) == 8, got)
    r.close()
    c.close()


def durable_unsubscribe(url, ch):
    """DUR-9: a null-source receiver with the durable link name deletes the subscription; the
    next attach with that identity starts fresh (from its start position)."""
    c = BlockingConnection(url, timeout=TIMEOUT, container_id="dur-app")
    r = c.create_receiver(None, name="sub1", options=NullSource())
    r.close()
    r = durable_receiver(c, ch, "sub1", "first")
    got = [m.body for m in drain_all(r)]
    check(len(got) == 8, "starts fresh from first: %r" % got)
    r.close()
    c.close()


def durable_all(url):
    ch = unique("es.dur")
    durable(url, ch)
    durable_other_identity(url, ch)
    durable_unsubscribe(url, ch)


def durable_phase(url, phase, ch):
    """Across a connector restart (the test restarts it between phases)."""
    c = BlockingConnection(url, timeout=TIMEOUT, container_id="dur-restart")
    s = c.create_sender("events-store/" + ch)
    if phase == "before":
        r = durable_receiver(c, ch, "sub", "first")
        for i in range(3):
            s.send(Message(body="b%d" % i))
        check([m.body for m in drain_all(r)] == ["b0", "b1", "b2"], "before")
        r.close()
        for i in range(4):
            s.send(Message(body="a%d" % i))
    else:
        r = durable_receiver(c, ch, "sub", "first")
        got = [m.body for m in drain_all(r)]
        check(got == ["a%d" % i for i in range(4)], got)
        r.close()
    c.close()


def stalled(url):
    """ES-7: a subscriber that grants no credit while more than its buffer arrives is detached
    with resource-limit-exceeded `credit stalled` (the test sets MaxUnsettledPerLink to 4)."""
    ch = unique("es.stall")
    c = BlockingConnection(url, timeout=TIMEOUT, container_id="es-stall")
    r = receiver(c, "events-store/" + ch, credit=0, options=start("new-only"))
    s = c.create_sender("events-store/" + ch)
    try:
        for i in range(6):
            s.send(Message(body="m%d" % i))
        c.wait(lambda: not r.link.state & Link.REMOTE_ACTIVE, timeout=TIMEOUT)
        raise AssertionError("the stalled receiver was not detached")
    except LinkDetached as e:
        check("receiver" in str(e), str(e))
        check("amqp:resource-limit-exceeded" in str(e) and "credit stalled" in str(e), str(e))
    c.close()
    print("DROPPED 5")


def store_groups(url):
    """GRP-3, ES-8, SEL-2: on events-store, a group's members share the stream (each event once,
    replayed history included), and a selector applies to replayed history too."""
    ch = unique("es.grp")
    c = BlockingConnection(url, timeout=TIMEOUT, container_id="es-grp")
    s = c.create_sender("events-store/" + ch)
    for i in range(10):
        s.send(Message(body="h%d" % i, properties={"n": i}))
    sel = receiver(c, "events-store/" + ch, options=[start("first"), Selector("n >= 5", SELECTOR)])
    check([m.body for m in drain_all(sel)] == ["h%d" % i for i in range(5, 10)], "selector on replay")
    both = Props(x_opt_kubemq_start="first", x_opt_kubemq_group="g")
    a = receiver(c, "events-store/" + ch, options=both)
    b = receiver(c, "events-store/" + ch, options=both)
    for i in range(10, 20):
        s.send(Message(body="h%d" % i, properties={"n": i}))
    got_a = [m.body for m in drain_all(a)]
    got_b = [m.body for m in drain_all(b)]
    check(sorted(got_a + got_b, key=lambda x: int(x[1:])) == ["h%d" % i for i in range(20)], (got_a, got_b))
    c.close()


def group_zero_credit(url):
    """GRP-4: an event the group assigned to a member without credit is dropped (and counted),
    not given to the other member."""
    ch = unique("ev.gz")
    c = BlockingConnection(url, timeout=TIMEOUT, container_id="ev-gz")
    live = receiver(c, "events/" + ch, credit=100, options=group("g"))
    receiver(c, "events/" + ch, credit=0, options=group("g"))
    s = c.create_sender("events/" + ch)
    for i in range(10):
        s.send(Message(body="e%d" % i))
    got = drain_all(live)
    check(0 < len(got) < 10, "the live member got only its share: %d" % len(got))
    c.close()


SCENARIOS = {
    "store_groups": store_groups,
    "group_zero_credit": group_zero_credit,
    "fanout": fanout,
    "unsettled": unsettled,
    "groups": groups,
    "wildcard": wildcard,
    "selectors": selectors,
    "bad_selector": bad_selector,
    "zero_credit": zero_credit,
    "drain": drain,
    "start_positions": start_positions,
    "bad_start": bad_start,
    "durable": durable_all,
    "stalled": stalled,
}

if __name__ == "__main__":
    scenario, url = sys.argv[1], sys.argv[2]
    if scenario == "durable_phase":
        durable_phase(url, sys.argv[3], sys.argv[4])
    else:
        SCENARIOS[scenario](url)
    print("PASS %s" % scenario)
