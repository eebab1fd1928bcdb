// rhea-promise against the real connector: commands and queries.
// Usage: node rpc.js MODE PORT CHANNEL. Prints PASS and exits 0.
//   respond  answers two commands and two queries on commands/CHANNEL and queries/CHANNEL
//            ("fail" is refused: executed = false with an error), printing READY once subscribed
//   request  sends commands "reboot" (c1) and "fail" (c2) and queries "q1", "q2" through one
//            anonymous sender, with a dynamic reply node; checks every reply
// The same protocol as tests/python/rpc.py and the fe2o3 side in tests/tests/rpc_pairs.rs.
"use strict";
const { Connection, ReceiverEvents } = require("rhea-promise");

const [mode, port, channel] = [process.argv[2], Number(process.argv[3]), process.argv[4]];
const timer = setTimeout(() => { console.error("timeout"); process.exit(3); }, 30000);
function assert(cond, msg) { if (!cond) { throw new Error("assertion failed: " + JSON.stringify(msg)); } }
const EXECUTED = "x-opt-kubemq-executed";
const ERROR = "x-opt-kubemq-error";

async function open(containerId) {
  const c = new Connection({ host: "127.0.0.1", port, transport: "tcp", reconnect: false, container_id: containerId });
  await c.open();
  return c;
}

// A responder: a receiver per pattern, answers through one anonymous sender.
async function respond() {
  const conn = await open("js-responder");
  const replies = await conn.createAwaitableSender({ target: {} });
  let answered = 0;
  const done = new Promise((resolve, reject) => {
    const answer = (pattern) => async (ctx) => {
      try {
        const m = ctx.message;
        assert(m.reply_to && m.reply_to.startsWith("/responses/"), m.reply_to);
        let reply;
        if (pattern === "commands") {
          const ok = m.body !== "fail";
          const props = { [EXECUTED]: ok };
          if (!ok) { props[ERROR] = "command rejected by handler"; }
          reply = { to: m.reply_to, correlation_id: m.correlation_id, application_properties: props };
        } else {
          reply = { to: m.reply_to, correlation_id: m.correlation_id, body: "result:" + m.body };
        }
        ctx.delivery.accept();
        const d = await replies.send(reply);
        assert(d.remote_state && d.remote_state.constructor.composite_type === "accepted", "RPC-13: the reply is accepted");
        if (++answered === 4) { resolve(); }
      } catch (e) { reject(e); }
    };
    for (const pattern of ["commands", "queries"]) {
      conn.createReceiver({ name: pattern, source: { address: pattern + "/" + channel }, credit_window: 10, autoaccept: false })
        .then((r) => { r.on(ReceiverEvents.message, answer(pattern)); if (pattern === "queries") { console.log("READY"); } })
        .catch(reject);
    }
  });
  await done;
  await conn.close();
}

// A requester: a dynamic reply node and an anonymous sender; one request at a time.
async function request() {
  const conn = await open("js-requester");
  const pending = new Map();
  const replies = await conn.createReceiver({ source: { dynamic: true }, credit_window: 10, autoaccept: true });
  const replyTo = replies.source.address;
  assert(replyTo && replyTo.startsWith("_amqp10.tmp."), replyTo);
  replies.on(ReceiverEvents.message, (ctx) => {
    const resolve = pending.get(ctx.message.correlation_id);
    assert(resolve, "a reply for an unknown correlation-id " + ctx.message.correlation_id);
    pending.delete(ctx.message.correlation_id);
    resolve(ctx.message);
  });
  const sender = await conn.createAwaitableSender({ target: {} });
  const ask = async (to, body, correlationId) => {
    const reply = new Promise((resolve) => pending.set(correlationId, resolve));
    const d = await sender.send({ to, body, reply_to: replyTo, correlation_id: correlationId });
    assert(d.remote_state && d.remote_state.constructor.composite_type === "accepted", "RPC-4");
    return reply;
  };
  for (const [body, id, executed] of [["reboot", "c1", true], ["fail", "c2", false]]) {
    const r = await ask("commands/" + channel, body, id);
    assert(r.application_properties[EXECUTED] === executed, r.application_properties);
    if (!executed) { assert(r.application_properties[ERROR] === "command rejected by handler", r.application_properties); }
  }
  for (const q of ["q1", "q2"]) {
    const r = await ask("queries/" + channel, q, q);
    assert(r.body === "result:" + q, r.body);
    assert(!r.application_properties || r.application_properties[EXECUTED] === undefined, "RPC-8");
  }
  await conn.close();
}

(mode === "respond" ? respond() : request())
  .then(() => { clearTimeout(timer); console.log("PASS " + mode); process.exit(0); })
  .catch((e) => { console.error(e); process.exit(1); });
