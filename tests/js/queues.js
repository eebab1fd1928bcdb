// rhea and rhea-promise against the real connector: the Queues concept page's scenarios
// (Q-S1 ... Q-S4) and drain (FLOW-5). Usage: node queues.js SCENARIO PORT. Prints PASS and
// exits 0.
"use strict";
const rhea = require("rhea");
const { Connection, ReceiverEvents } = require("rhea-promise");

const [scenario, port] = [process.argv[2], Number(process.argv[3])];
const timer = setTimeout(() => { console.error("timeout"); process.exit(3); }, 30000);
function assert(cond, msg) { if (!cond) { throw new Error("assertion failed: " + JSON.stringify(msg)); } }
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function open(extra) {
  const c = new Connection({ host: "127.0.0.1", port, transport: "tcp", reconnect: false, container_id: "js-" + scenario, ...extra });
  await c.open();
  return c;
}

// Receives exactly n messages with credit n, calling settle(ctx) on each; then checks that no
// further message arrives within quietMs.
async function receive(conn, address, n, settle, quietMs, afterAll) {
  const receiver = await conn.createReceiver({ source: { address }, credit_window: 0, autoaccept: false });
  const got = [];
  await new Promise((resolve, reject) => {
    receiver.on(ReceiverEvents.message, (ctx) => {
      try {
        got.push(ctx);
        settle(ctx);
        if (got.length > n) { reject(new Error("more than " + n + " messages")); }
        if (got.length === n) { resolve(); }
      } catch (e) { reject(e); }
    });
    receiver.addCredit(n);
  });
  if (afterAll) { await afterAll(got); }
  if (quietMs) {
    receiver.addCredit(1);
    await sleep(quietMs);
    assert(got.length === n, "a message arrived after the last expected one: " + got.map((c) => c.message.body + "/" + c.message.delivery_count).join(","));
  }
  await receiver.close();
  return got;
}

async function q_s1() {
  const conn = await open();
  const sender = await conn.createAwaitableSender({ target: { address: "queues/js-q-s1" } });
  for (let i = 0; i < 10; i++) {
    const d = await sender.send({ body: "order " + i });
    assert(d.remote_state && d.remote_state.constructor.composite_type === "accepted", "accepted only once stored");
  }
  const got = await receive(conn, "queues/js-q-s1", 10, (ctx) => ctx.delivery.accept(), 2000);
  assert(got.map((c) => c.message.body).join(",") === [...Array(10).keys()].map((i) => "order " + i).join(","), "order");
  await conn.close();
}

async function q_s2() {
  const conn = await open();
  const sender = await conn.createAwaitableSender({ target: { address: "queues/js-q-s2" } });
  for (const b of ["release-me", "reject-me", "accept-me"]) { await sender.send({ body: b }); }
  const first = await receive(conn, "queues/js-q-s2", 3, (ctx) => {
    const m = ctx.message;
    assert((m.delivery_count || 0) === 0 && m.first_acquirer === true, [m.body, m.delivery_count, m.first_acquirer]);
  }, 0, async (got) => {
    // One settlement per write: rhea merges dispositions of adjacent deliveries written
    // together into one range with the first one's state (write_dispositions in its session.js).
    for (const ctx of got) {
      const b = ctx.message.body;
      if (b === "release-me") { ctx.delivery.release(); } else if (b === "reject-me") { ctx.delivery.reject(); } else { ctx.delivery.accept(); }
      await sleep(50);
    }
  });
  assert(first.length === 3, "three first deliveries");
  const again = await receive(conn, "queues/js-q-s2", 1, (ctx) => ctx.delivery.accept(), 1500);
  const m = again[0].message;
  assert(m.body === "release-me" && m.delivery_count >= 1 && !m.first_acquirer, [m.body, m.delivery_count, m.first_acquirer]);
  await conn.close();
}

async function q_s3() {
  const conn = await open();
  const pre = await conn.createSender({ name: "pre", target: { address: "queues/js-q-s3" }, snd_settle_mode: 1 });
  for (let i = 0; i < 10; i++) { pre.send({ body: "pre " + i }); }
  const sender = await conn.createAwaitableSender({ name: "unsettled", target: { address: "queues/js-q-s3" } });
  for (let i = 0; i < 10; i++) { await sender.send({ body: "unsettled " + i }); }
  await sleep(200);
  const got = await receive(conn, "queues/js-q-s3", 20, (ctx) => ctx.delivery.accept());
  assert(new Set(got.map((c) => c.message.body)).size === 20, "twenty distinct messages");
  // The refusal is an ATTACH with a null source followed by DETACH(not-implemented) (LINK-5).
  const refused = await new Promise((resolve) => {
    conn.createReceiver({ name: "second", source: { address: "queues/js-q-s3" }, rcv_settle_mode: 1,
      onSessionError: () => {} })
      .then((r) => {
        r.on(ReceiverEvents.receiverError, (ctx) => resolve(ctx.receiver && ctx.receiver.error));
        setTimeout(() => resolve(r.error || null), 2000);
      })
      .catch((e) => resolve(e));
  });
  const text = JSON.stringify(refused && (refused.condition || refused));
  assert(text && text.includes("not-implemented"), text);
  await conn.close();
}

async function q_s4() {
  const body = Buffer.alloc(1048576);
  for (let i = 0; i < body.length; i++) { body[i] = (i * 7 + 3) % 256; }
  const conn = await open({ max_frame_size: 4096 });
  const sender = await conn.createAwaitableSender({ target: { address: "queues/js-q-s4" } });
  await sender.send({ body: rhea.message.data_section(body) });
  const got = await receive(conn, "queues/js-q-s4", 1, (ctx) => ctx.delivery.accept());
  const b = got[0].message.body;
  const bytes = Buffer.from(b.typecode !== undefined ? b.content : b);
  assert(Buffer.compare(bytes, body) === 0, "1 MiB body differs");
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

const scenarios = { q_s1, q_s2, q_s3, q_s4, drain };
scenarios[scenario]().then(() => { clearTimeout(timer); console.log("PASS " + scenario); process.exit(0); })
  .catch((e) => { console.error(e); process.exit(1); });
