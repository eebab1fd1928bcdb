"""KubeMQ's own Python SDK (PyPI `kubemq` 4.1.5) and commands / queries.
Usage: kubemq_sdk_rpc.py facade HOST:PORT — an SDK requester and an SDK responder through the
store's gRPC facade alone (answers, refusals, a timeout); kubemq_sdk_rpc.py interop HOST:PORT
AMQP-URL — an SDK requester with a python-qpid-proton responder, and a proton requester with an
SDK responder, on one store. Prints PASS."""
import sys
import threading
import time
import uuid

from kubemq.cq import (Client, CommandMessage, CommandResponse, CommandsSubscription,
                       QueriesSubscription, QueryMessage, QueryResponse)
from proton import Message
from proton.utils import BlockingConnection

TIMEOUT = 10
EXECUTED = "x-opt-kubemq-executed"
ERROR = "x-opt-kubemq-error"


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def sdk_responder(client, ch):
    """Answers commands ("fail" refused) and queries ("result:<body>") on ch."""
    def on_command(cmd):
        ok = cmd.body != b"fail"
        client.send_response_message(CommandResponse(
            command_received=cmd, is_executed=ok, error="" if ok else "command rejected by handler"))

    def on_query(q):
        client.send_response_message(QueryResponse(
            query_received=q, is_executed=True, body=b"result:" + q.body, metadata="answered"))

    client.subscribe_to_commands(CommandsSubscription(channel=ch, on_receive_command_callback=on_command))
    client.subscribe_to_queries(QueriesSubscription(channel=ch, on_receive_query_callback=on_query))
    time.sleep(0.5)  # the subscriptions are open before the first request


def sdk_requests(client, ch):
    """The SDK requester's side, against any responder following sdk_responder's rules."""
    r = client.send_command(CommandMessage(channel=ch, body=b"reboot", timeout_in_seconds=5))
    check(r.is_executed and r.error == "", "executed %r" % r)
    r = client.send_command(CommandMessage(channel=ch, body=b"fail", timeout_in_seconds=5))
    check(not r.is_executed and r.error == "command rejected by handler", "refused %r" % r)
    r = client.send_query(QueryMessage(channel=ch, body=b"q1", timeout_in_seconds=5))
    check(r.body == b"result:q1", "query answer %r" % r.body)


def facade(addr):
    ch = "sdk.rpc." + uuid.uuid4().hex[:8]
    responder = Client(address=addr, client_id="sdk-responder")
    requester = Client(address=addr, client_id="sdk-requester")
    sdk_responder(responder, ch)
    sdk_requests(requester, ch)
    started = time.time()
    try:
        requester.send_command(CommandMessage(channel="sdk.rpc.nobody", body=b"x", timeout_in_seconds=1))
        raise AssertionError("a command nobody answers succeeded")
    except AssertionError:
        raise
    except Exception as e:
        check("timeout" in str(e).lower(), "KubeMQ's timeout: %s" % e)
    check(time.time() - started >= 0.9, "after the full timeout")
    requester.close()
    responder.close()


def proton_responder(url, ch, ready, failures):
    """python-qpid-proton answering two commands and one query through an anonymous sender."""
    try:
        c = BlockingConnection(url, timeout=TIMEOUT, container_id="amqp-responder")
        commands = c.create_receiver("commands/" + ch, credit=10, name="c")
        queries = c.create_receiver("queries/" + ch, credit=10, name="q")
        replies = c.create_sender(None, name="replies")
        ready.set()
        for receiver, n in ((commands, 2), (queries, 1)):
            for _ in range(n):
                m = receiver.receive(timeout=TIMEOUT)
                receiver.accept()
                # The SDK's bytes arrive as a Data body (ENV-8).
                body = bytes(m.body)
                if receiver is commands:
                    ok = body != b"fail"
                    props = {EXECUTED: ok}
                    if not ok:
                        props[ERROR] = "command rejected by handler"
                    reply = Message(properties=props, correlation_id=m.correlation_id)
                else:
                    # A Data body, so that the SDK gets these very bytes.
                    reply = Message(body=b"result:" + body, inferred=True, correlation_id=m.correlation_id)
                reply.address = m.reply_to
                replies.send(reply)
        c.close()
    except Exception as e:  # reported by the main thread
        failures.append(e)
        ready.set()


def interop(addr, url):
    # An SDK requester, a proton responder.
    ch = "sdk.amqp.rpc." + uuid.uuid4().hex[:8]
    ready, failures = threading.Event(), []
    t = threading.Thread(target=proton_responder, args=(url, ch, ready, failures))
    t.start()
    ready.wait(TIMEOUT)
    requester = Client(address=addr, client_id="sdk-requester")
    try:
        sdk_requests(requester, ch)
    finally:
        t.join(TIMEOUT)
    check(not failures, "the proton responder: %r" % failures)
    # A proton requester, an SDK responder.
    ch = "amqp.sdk.rpc." + uuid.uuid4().hex[:8]
    responder = Client(address=addr, client_id="sdk-responder")
    sdk_responder(responder, ch)
    c = BlockingConnection(url, timeout=TIMEOUT, container_id="amqp-requester")
    replies = c.create_receiver(None, dynamic=True, credit=10, name="replies")
    reply_to = replies.link.remote_source.address
    for address, body, corr in (("commands/", b"reboot", "c1"), ("commands/", b"fail", "c2"), ("queries/", b"q1", "q1")):
        s = c.create_sender(address + ch, name=address + corr)
        s.send(Message(body=body, inferred=True, reply_to=reply_to, correlation_id=corr))
        r = replies.receive(timeout=TIMEOUT)
        replies.accept()
        check(r.correlation_id == corr, "correlation %r" % r.correlation_id)
        if address == "commands/":
            check(r.properties[EXECUTED] is (body != b"fail"), "executed %r" % r.properties)
            if body == b"fail":
                check(r.properties[ERROR] == "command rejected by handler", "%r" % r.properties)
        else:
            check(bytes(r.body) == b"result:q1", "answer %r" % r.body)
            # A native responder's Metadata arrives as the x-opt-kubemq-metadata annotation.
            check(r.annotations.get("x-opt-kubemq-metadata") == "answered", "%r" % r.annotations)
        s.close()
    c.close()
    requester.close()
    responder.close()


if __name__ == "__main__":
    if sys.argv[1] == "facade":
        facade(sys.argv[2])
    else:
        interop(sys.argv[2], sys.argv[3])
    print("PASS " + sys.argv[1])
