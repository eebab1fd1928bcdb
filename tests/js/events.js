// rhea and rhea-promise against the real connector: events fan-out, two groups of two, a
// selector in rhea's numeric-descriptor form, events-store start positions and a durable
// subscription. Usage: node events.js SCENARIO PORT. Prints PASS and exits 0.
"use strict";
const rhea = require("rhea");
const { Connection, ReceiverEvents } = require("rhea-promise");

const [scenario, port] = [process.argv[2], Number(process.argv[3])];
const timer = setTimeout(() => { console.error("timeout"); process.exit(3); }, 30000);
function assert(cond, msg) { if (!cond) { throw new Error("assertion failed: " + JSON.stringify(msg)); } }
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const unique = (name) => name + "." + Math.random().toString(16).slice(2, 10);

async function open(containerId) {
  const c = new Connection({ host: "127.0.0.1", port, transport: "tcp", reconnect: false, container_id: containerId || "js-ev-" + scenario });
  await c.open();
  return c;
}

// A receiver collecting message bodies, with credit 100.
async function collect(conn, options) {
  const got = [];
  const receiver = await conn.createReceiver({ credit_window: 100, autoaccept: false, ...options });
  receiver.on(ReceiverEvents.message, (ctx) => {
    assert(ctx.delivery.remote_settled, "EV-5 / ES-4: deliveries are pre-settled");
    got.push(ctx.message.body);
  });
  return { receiver, got };
}

async function publish(conn, address, messages) {
  const sender = await conn.createAwaitableSender({ target: { address } });
  for (const m of messages) {
    const d = await sender.send(m);
    assert(d.remote_state && d.remote_state.constructor.composite_type === "accepted", "accepted");
  }
  await sender.close();
}

async function fanout() {
  const conn = await open();
  const ch = "events/" + unique("js.fan");
  const subs = [];
  for (let i = 0; i < 3; i++) { subs.push(await collect(conn, { name: "s" + i, source: { address: ch } })); }
  const sent = [...Array(10).keys()].map((i) => "e" + i);
  await publish(conn, ch, sent.map((body) => ({ body })));
  await sleep(500);
  for (const s of subs) { assert(s.got.join() === sent.join(), s.got); }
  await conn.close();
}

async function groups() {
  const conn = await open();
  const ch = "events/" + unique("js.grp");
  const member = (g, i) => collect(conn, { name: g + i, source: { address: ch }, properties: { "x-opt-kubemq-group": g } });
  const g1 = [await member("g1", 0), await member("g1", 1)];
  const g2 = [await member("g2", 0), await member("g2", 1)];
  const sent = [...Array(30).keys()].map((i) => "e" + String(i).padStart(2, "0"));
  await publish(conn, ch, sent.map((body) => ({ body })));
  await sleep(500);
  for (const g of [g1, g2]) {
    const all = g[0].got.concat(g[1].got).sort();
    assert(all.join() === sent.join(), "GRP-2: each group gets every event once");
    assert(g[0].got.length > 0 && g[1].got.length > 0, "each member gets a share");
  }
  await conn.close();
}

async function selector() {
  const conn = await open();
  const ch = "events/" + unique("js.sel");
  // rhea's selector filter: key apache.org:selector-filter:string, numeric descriptor.
  const filter = rhea.filter.selector("color = 'red' AND size > 2");
  const s = await collect(conn, { name: "sel", source: { address: ch, filter } });
  const cases = [[{ color: "red", size: 5 }, true], [{ color: "red", size: 3 }, true], [{ color: "blue", size: 9 }, false], [{ color: "red", size: 1 }, false], [{ size: 8 }, false]];
  await publish(conn, ch, cases.map(([application_properties], i) => ({ body: "m" + i, application_properties })));
  await sleep(500);
  assert(s.got.join() === "m0,m1", s.got);
  await conn.close();
}

async function start_positions() {
  const conn = await open();
  const ch = "events-store/" + unique("js.sp");
  const labels = [...Array(6).keys()].map((i) => "es-00" + i);
  await publish(conn, ch, labels.map((body) => ({ body })));
  const at = async (name, position) => {
    const s = await collect(conn, { name, source: { address: ch }, properties: { "x-opt-kubemq-start": position } });
    await sleep(500);
    await s.receiver.close();
    return s.got.join();
  };
  assert(await at("first", "first") === labels.join(), "first");
  assert(await at("seq", "sequence:4") === labels.slice(3).join(), "sequence:4");
  assert(await at("delta", "time-delta:3600") === labels.join(), "time-delta");
  await conn.close();
}

async function durable() {
  const ch = "events-store/" + unique("js.dur");
  const source = { address: ch, durable: 2, expiry_policy: "never" };
  let conn = await open("js-durable");
  let s = await collect(conn, { name: "sub", source });
  await publish(conn, ch, [{ body: "a" }, { body: "b" }]);
  await sleep(500);
  assert(s.got.join() === "a,b", s.got);
  await conn.close();
  conn = await open("js-publisher");
  await publish(conn, ch, [{ body: "c" }, { body: "d" }, { body: "e" }]);
  await conn.close();
  conn = await open("js-durable");
  s = await collect(conn, { name: "sub", source, properties: { "x-opt-kubemq-start": "first" } });
  await sleep(500);
  assert(s.got.join() === "c,d,e", "DUR-4: exactly what was published meanwhile: " + s.got);
  await conn.close();
}

const scenarios = { fanout, groups, selector, start_positions, durable };
scenarios[scenario]().then(() => {
  clearTimeout(timer);
  console.log("PASS " + scenario);
  process.exit(0);
}, (e) => {
  console.error(e);
  process.exit(1);
});
