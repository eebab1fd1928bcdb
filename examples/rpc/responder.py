"""Answers commands and queries on the channel orders.rpc; stops after COUNT requests.
Usage: python3 responder.py [URL] [COUNT]"""
import sys

from proton import Message
from proton.handlers import MessagingHandler
from proton.reactor import Container


class Responder(MessagingHandler):
    def __init__(self, url, count):
        super().__init__()
        self.url, self.left, self.opened = url, count, 0

    def on_start(self, event):
        conn = event.container.connect(self.url)
        event.container.create_receiver(conn, "commands/orders.rpc")
        event.container.create_receiver(conn, "queries/orders.rpc")
        self.replies = event.container.create_sender(conn, None)  # anonymous: replies name their address

    def on_link_opened(self, event):
        self.opened += 1
        if self.opened == 3:
            print("ready", flush=True)

    def on_message(self, event):
        request = event.message
        reply = Message(address=request.reply_to, correlation_id=request.correlation_id)
        if event.link.source.address.startswith("commands/"):
            reply.properties = {"x-opt-kubemq-executed": True}  # or False, with x-opt-kubemq-error
        else:
            reply.body = "in stock: %s" % request.body
        self.replies.send(reply)
        self.left -= 1
        if self.left == 0:
            event.connection.close()


url = sys.argv[1] if len(sys.argv) > 1 else "amqp://localhost:5672"
Container(Responder(url, int(sys.argv[2]) if len(sys.argv) > 2 else -1)).run()
