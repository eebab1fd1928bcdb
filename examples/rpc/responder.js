// Answers commands and queries on the channel orders.rpc; stops after COUNT requests.
// Usage: node responder.js [PORT] [COUNT]   (npm install rhea-promise)
const { Connection, ReceiverEvents } = require("rhea-promise");

async function main(port, count) {
  const conn = new Connection({ host: "localhost", port, reconnect: false });
  await conn.open();
  const replies = await conn.createAwaitableSender({ target: {} }); // anonymous
  let left = count;
  const answer = (isCommand) => async (ctx) => {
    const m = ctx.message;
    const reply = { to: m.reply_to, correlation_id: m.correlation_id };
    if (isCommand) {
      reply.application_properties = { "x-opt-kubemq-executed": true };
    } else {
      reply.body = "in stock: " + m.body;
    }
    await replies.send(reply);
    if (--left === 0) { await conn.close(); }
  };
  const commands = await conn.createReceiver({ source: { address: "commands/orders.rpc" } });
  commands.on(ReceiverEvents.message, answer(true));
  const queries = await conn.createReceiver({ source: { address: "queries/orders.rpc" } });
  queries.on(ReceiverEvents.message, answer(false));
  console.log("ready");
}

main(Number(process.argv[2] || 5672), Number(process.argv[3] || -1));
