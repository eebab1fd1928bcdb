// Interop scenarios for rhea / rhea-promise against the connector's test-only in-memory node.
// Usage: node interop.js SCENARIO PORT. Prints PASS and exits 0 on success.
"use strict";
const rhea = require("rhea");
const { Connection, ReceiverEvents } = require("rhea-promise");

const [scenario, port] = [process.argv[2], Number(process.argv[3])];
const timer = setTimeout(() => { console.error("timeout"); process.exit(3); }, 20000);

function assert(cond, msg) { if (!cond) { throw new Error("assertion failed: " + msg); } }

async function open(extra) {
  const c = new Connection({ host: "127.0.0.1", port, transport: "tcp", reconnect: false, container_id: "js-" + scenario, ...extra });
  await c.open();
  return c;
}

async function receiveN(conn, address, n, onEach) {
  const receiver = await conn.createReceiver({ source: { address }, credit_window: 0, autoaccept: false });
  const got = [];
  return new Promise((resolve, reject) => {
    receiver.on(ReceiverEvents.message, (ctx) => {
      try {
        got.push(ctx.message.body);
        onEach(ctx, got.length);
        if (got.length === n) { resolve({ got, receiver }); }
      } catch (e) { reject(e); }
    });
    receiver.addCredit(n);
  });
}

async function basic() {
  const conn = await open();
  const sender = await conn.createAwaitableSender({ target: { address: "queues/js" } });
  for (let i = 0; i < 10; i++) {
    const d = await sender.send({ body: "js " + i });
    assert(d.remote_state && d.remote_state.constructor.composite_type === "accepted", "accepted outcome");
  }
  const { got, receiver } = await receiveN(conn, "queues/js", 10, (ctx) => ctx.delivery.accept());
  assert(JSON.stringify(got) === JSON.stringify([...Array(10).keys()].map((i) => "js " + i)), got);
  await receiver.close();
  await sender.close();
  await conn.close();
}

async function large() {
  const body = Buffer.alloc(300 * 1024);
  for (let i = 0; i < body.length; i++) { body[i] = (i * 31) % 256; }
  const conn = await open({ max_frame_size: 4096 });
  const sender = await conn.createAwaitableSender({ target: { address: "queues/js-large" } });
  await sender.send({ body: rhea.message.data_section(body) });
  const { got, receiver } = await receiveN(conn, "queues/js-large", 1, (ctx) => ctx.delivery.accept());
  const typed = got[0].typecode !== undefined ? got[0].content : got[0];
  assert(Buffer.compare(Buffer.from(typed), body) === 0, "large body differs");
  await receiver.close();
  await sender.close();
  await conn.close();
}

async function releaseRedelivery() {
  const conn = await open();
  const sender = await conn.createAwaitableSender({ target: { address: "queues/js-rel" } });
  await sender.send({ body: "again" });
  let first = true;
  const { got, receiver } = await receiveN(conn, "queues/js-rel", 2, (ctx) => {
    if (first) { first = false; ctx.delivery.release({ delivery_failed: false }); receiver_add(ctx); } else { ctx.delivery.accept(); }
  });
  function receiver_add(ctx) { ctx.receiver.addCredit(1); }
  assert(got[0] === "again" && got[1] === "again", got);
  await receiver.close();
  await sender.close();
  await conn.close();
}

function drain() {
  // FLOW-5 with plain rhea: two messages wait, drain with credit 5 → two arrive, then drained.
  return new Promise((resolve, reject) => {
    const container = rhea.create_container({ id: "js-drain" });
    const conn = container.connect({ host: "127.0.0.1", port, reconnect: false });
    const sender = conn.open_sender("queues/js-drain");
    let sent = 0, accepted = 0, received = 0;
    sender.on("sendable", () => { while (sender.sendable() && sent < 2) { sender.send({ body: "d" + sent++ }); } });
    sender.on("accepted", () => {
      if (++accepted !== 2) { return; }
      const receiver = conn.open_receiver({ source: "queues/js-drain", credit_window: 0, autoaccept: true });
      receiver.on("receiver_open", () => { receiver.drain = true; receiver.add_credit(5); });
      receiver.on("message", () => { received++; });
      receiver.on("receiver_drained", () => {
        try {
          assert(received === 2, "received " + received + " before drained");
          assert(receiver.credit === 0, "credit after drain " + receiver.credit);
          conn.close();
          resolve();
        } catch (e) { reject(e); }
      });
    });
    conn.on("error", reject);
  });
}

const scenarios = { basic, large, release: releaseRedelivery, drain };
scenarios[scenario]().then(() => { clearTimeout(timer); console.log("PASS " + scenario); process.exit(0); })
  .catch((e) => { console.error(e); process.exit(1); });
