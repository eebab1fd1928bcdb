// Sends a command and a query to orders.rpc and prints their replies.
// Usage: node requester.js [PORT]   (npm install rhea-promise)
const { Connection, ReceiverEvents } = require("rhea-promise");

async function main(port) {
  const conn = new Connection({ host: "localhost", port, reconnect: false });
  await conn.open();
  const waiting = new Map();
  const replies = await conn.createReceiver({ source: { dynamic: true } }); // a private reply node
  replies.on(ReceiverEvents.message, (ctx) => waiting.get(ctx.message.correlation_id)(ctx.message));
  const requests = await conn.createAwaitableSender({ target: {} }); // anonymous
  const ask = async (to, body, id) => {
    const reply = new Promise((resolve) => waiting.set(id, resolve));
    await requests.send({ to, body, reply_to: replies.source.address, correlation_id: id, ttl: 5000 });
    return reply;
  };
  const c = await ask("commands/orders.rpc", "cancel 42", "c-1");
  console.log(c.correlation_id, "executed:", c.application_properties["x-opt-kubemq-executed"]);
  const q = await ask("queries/orders.rpc", "sku-7", "q-1");
  console.log(q.correlation_id, "answer:", q.body);
  await conn.close();
}

main(Number(process.argv[2] || 5672));
