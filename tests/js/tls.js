// rhea-promise against the connector's TLS listener: a send and a receive over amqps, as a TLS
// client (server certificate checked against CA) or, with CERT and KEY, as an mTLS client.
// Usage: node tls.js PORT CA [CERT KEY]. Prints PASS tls and exits 0.
"use strict";
const fs = require("fs");
const { Connection, ReceiverEvents } = require("rhea-promise");

const [port, ca, cert, key] = [Number(process.argv[2]), process.argv[3], process.argv[4], process.argv[5]];
const timer = setTimeout(() => { console.error("timeout"); process.exit(3); }, 30000);
function assert(cond, msg) { if (!cond) { throw new Error("assertion failed: " + JSON.stringify(msg)); } }

async function main() {
  const options = {
    host: "127.0.0.1", port, transport: "tls", reconnect: false, container_id: "js-tls",
    ca: [fs.readFileSync(ca)], servername: "localhost", rejectUnauthorized: true,
  };
  if (cert) { options.cert = fs.readFileSync(cert); options.key = fs.readFileSync(key); }
  const conn = new Connection(options);
  await conn.open();
  const sender = await conn.createAwaitableSender({ target: { address: "queues/js-tls" } });
  const bodies = ["rhea over tls 0", "rhea over tls 1", "rhea over tls 2"];
  for (const body of bodies) {
    const d = await sender.send({ body });
    assert(d.remote_state && d.remote_state.constructor.composite_type === "accepted", "accepted");
  }
  const receiver = await conn.createReceiver({ source: { address: "queues/js-tls" }, credit_window: 0, autoaccept: false });
  const got = [];
  await new Promise((resolve) => {
    receiver.on(ReceiverEvents.message, (ctx) => {
      got.push(ctx.message.body);
      ctx.delivery.accept();
      if (got.length === bodies.length) { resolve(); }
    });
    receiver.addCredit(bodies.length);
  });
  assert(got.join(",") === bodies.join(","), got);
  await receiver.close();
  await sender.close();
  await conn.close();
}

main().then(() => { clearTimeout(timer); console.log("PASS tls"); process.exit(0); },
  (e) => { console.error(e); process.exit(1); });
