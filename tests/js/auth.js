// rhea-promise against a connector with Authentication on: SASL PLAIN with a KubeMQ JWT as the
// password, then one anonymous sender (null target) whose message to a channel the policy does
// not let the client write is rejected amqp:unauthorized-access while the link stays, and whose
// next message, to a channel it may write, is accepted (AUTHZ-4).
// With MODE kubemq-refuses, the connector accepts the token and KubeMQ refuses it: a message to
// ALLOWED is rejected amqp:unauthorized-access.
// Usage: node auth.js PORT USER TOKEN ALLOWED DENIED [MODE]. Prints PASS auth and exits 0.
"use strict";
const { Connection } = require("rhea-promise");

const [port, user, token, allowed, denied, mode] = [Number(process.argv[2]), ...process.argv.slice(3, 8)];
const timer = setTimeout(() => { console.error("timeout"); process.exit(3); }, 30000);
function assert(cond, msg) { if (!cond) { throw new Error("assertion failed: " + JSON.stringify(msg)); } }
const outcome = (d) => d.remote_state && d.remote_state.constructor.composite_type;

async function main() {
  const conn = new Connection({
    host: "127.0.0.1", port, reconnect: false, container_id: "js-auth", username: user, password: token,
  });
  await conn.open();
  const sender = await conn.createAwaitableSender({ target: {} });
  let rejected;
  try {
    await sender.send({ to: `queues/${mode === "kubemq-refuses" ? allowed : denied}`, body: "denied" });
  } catch (e) {
    rejected = e;
  }
  assert(rejected, "the message to the denied channel was refused");
  const state = rejected.outcome || (rejected.innerError && rejected.innerError.outcome) || rejected;
  const text = JSON.stringify(state) + String(rejected);
  assert(text.includes("amqp:unauthorized-access"), text);
  if (mode === "kubemq-refuses") {
    assert(text.includes("KubeMQ refused"), text);
    await conn.close();
    return;
  }
  const ok = await sender.send({ to: `queues/${allowed}`, body: "allowed" });
  assert(outcome(ok) === "accepted", "accepted on the same link");
  assert(sender.isOpen(), "the link stays attached");
  await sender.close();
  await conn.close();
}

main().then(() => { clearTimeout(timer); console.log("PASS auth"); process.exit(0); },
  (e) => { console.error(e); process.exit(1); });
