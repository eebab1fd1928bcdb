"""Sends a command and a query to orders.rpc and prints their replies.
Usage: python3 requester.py [URL]"""
import sys

from proton import Message
from proton.utils import BlockingConnection

conn = BlockingConnection(sys.argv[1] if len(sys.argv) > 1 else "amqp://localhost:5672")
replies = conn.create_receiver(None, dynamic=True, credit=10)  # a private reply node
reply_to = replies.link.remote_source.address
requests = conn.create_sender(None)  # anonymous: each request names its address

requests.send(Message(address="commands/orders.rpc", body="cancel 42",
                      reply_to=reply_to, correlation_id="c-1", ttl=5))
r = replies.receive(timeout=10)
replies.accept()
print(r.correlation_id, "executed:", r.properties["x-opt-kubemq-executed"])

requests.send(Message(address="queries/orders.rpc", body="sku-7",
                      reply_to=reply_to, correlation_id="q-1", ttl=5))
r = replies.receive(timeout=10)
replies.accept()
print(r.correlation_id, "answer:", r.body)
conn.close()
