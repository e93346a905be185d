#!/usr/bin/env node
// A client of Allot's wire contract written without the Python SDK: plain JSON over NATS.
//
// It proves that a program in another language can submit unallocated work and receive the
// preemption notice that ends it, knowing only the documented subjects and message shapes
// (shared/allot/proto, proto/schema.json). It imports no Allot code.
//
//   node submit_and_wait_notice.mjs --nats URL --client-id ID --gpus N [--timeout-s 60]
//
// Steps, each printed as one line on stdout (`TAG {json}`) so a test can parse them:
//   1. subscribe to allot.v1.preempt.~.> before submitting, so a notice that follows the
//      submission at once cannot be missed (core NATS keeps nothing for late subscribers);
//   2. send a malformed SubmitWorkload and print `REJECTED {...}`: intake must answer
//      WorkloadRejected naming the field at fault (`gpus`);
//   3. submit unallocated filler work and print `REPLY {...}` (WorkloadAccepted);
//   4. wait for the PreemptionNotice on allot.v1.preempt.~.<workload_id>, print
//      `NOTICE {...}`.
//
// Exit codes: 0 notice received; 1 connection or transport error; 2 submission rejected;
// 3 no notice within --timeout-s; 4 the malformed request was not rejected naming `gpus`;
// 5 a reply or notice of an unexpected shape; 64 bad command-line arguments.

import { parseArgs } from "node:util";
import { connect, ErrorCode, StringCodec } from "nats";

const UNALLOCATED = "~"; // the allocation token of unallocated (free, preemptible) work
const SUBMIT_SUBJECT = `allot.v1.submit.${UNALLOCATED}`;
const PREEMPT_WILDCARD = `allot.v1.preempt.${UNALLOCATED}.>`;
const REQUEST_TIMEOUT_MS = 10_000;

const EXIT = {
  notice: 0,
  transport: 1,
  rejected: 2,
  timeout: 3,
  badRejection: 4,
  unexpected: 5,
  usage: 64,
};

class Exit extends Error {
  constructor(code, message) {
    super(message);
    this.code = code;
  }
}

const sc = StringCodec();

function emit(tag, obj) {
  // JSON.stringify of a parsed object never contains a raw newline: one record per line.
  process.stdout.write(`${tag} ${JSON.stringify(obj)}\n`);
}

function parseCli(argv) {
  let values;
  try {
    ({ values } = parseArgs({
      args: argv,
      options: {
        nats: { type: "string" },
        "client-id": { type: "string" },
        gpus: { type: "string" },
        "timeout-s": { type: "string", default: "60" },
      },
      strict: true,
    }));
  } catch (e) {
    throw new Exit(EXIT.usage, e.message);
  }
  for (const name of ["nats", "client-id", "gpus"]) {
    if (!values[name]) throw new Exit(EXIT.usage, `--${name} is required`);
  }
  const gpus = Number(values.gpus);
  if (!Number.isInteger(gpus) || gpus < 1) {
    throw new Exit(EXIT.usage, `--gpus must be a whole number >= 1, got ${values.gpus}`);
  }
  const timeoutS = Number(values["timeout-s"]);
  if (!Number.isFinite(timeoutS) || timeoutS <= 0) {
    throw new Exit(EXIT.usage, `--timeout-s must be a positive number, got ${values["timeout-s"]}`);
  }
  return { url: values.nats, clientId: values["client-id"], gpus, timeoutS };
}

function parseJson(what, data) {
  const text = sc.decode(data);
  try {
    const obj = JSON.parse(text);
    if (obj === null || typeof obj !== "object" || Array.isArray(obj)) throw new Error("not an object");
    return obj;
  } catch (e) {
    throw new Exit(EXIT.unexpected, `${what} is not a JSON object (${e.message}): ${text.slice(0, 200)}`);
  }
}

async function request(nc, body) {
  try {
    const msg = await nc.request(SUBMIT_SUBJECT, sc.encode(JSON.stringify(body)), {
      timeout: REQUEST_TIMEOUT_MS,
    });
    return parseJson("the reply", msg.data);
  } catch (e) {
    if (e instanceof Exit) throw e;
    if (e.code === ErrorCode.NoResponders) {
      throw new Exit(EXIT.transport, `no service answers ${SUBMIT_SUBJECT} (is intake running?)`);
    }
    if (e.code === ErrorCode.Timeout) {
      throw new Exit(EXIT.transport, `no reply on ${SUBMIT_SUBJECT} within ${REQUEST_TIMEOUT_MS} ms`);
    }
    throw new Exit(EXIT.transport, `request on ${SUBMIT_SUBJECT} failed: ${e.message}`);
  }
}

async function checkMalformedIsRejected(nc) {
  // `gpus` must be an integer >= 1; a string is a type error intake must name.
  const reply = await request(nc, { type: "SubmitWorkload", gpus: "lots" });
  emit("REJECTED", reply);
  if (reply.type !== "WorkloadRejected" || reply.field !== "gpus") {
    throw new Exit(
      EXIT.badRejection,
      `expected WorkloadRejected with field "gpus", got type=${reply.type} field=${reply.field}`,
    );
  }
}

async function submit(nc, clientId, gpus) {
  const reply = await request(nc, {
    type: "SubmitWorkload",
    client_id: clientId,
    user: "node",
    gpus,
    min_runtime_s: 0, // no protected window: unallocated work may be preempted at any moment
    resumable: true,
    kind: "filler",
    duration_s: 600, // fake agents only: how long to pretend to run
  });
  emit("REPLY", reply);
  if (reply.type === "WorkloadRejected") {
    throw new Exit(EXIT.rejected, `submission rejected: field ${reply.field}: ${reply.reason}`);
  }
  if (reply.type !== "WorkloadAccepted" || typeof reply.workload_id !== "string") {
    throw new Exit(EXIT.unexpected, `expected WorkloadAccepted with a workload_id, got ${reply.type}`);
  }
  return reply.workload_id;
}

async function waitForNotice(sub, workloadId, timeoutS) {
  const subject = `allot.v1.preempt.${UNALLOCATED}.${workloadId}`;
  // Ending the subscription ends the loop below; that is how the deadline stops the wait.
  let timedOut = false;
  const timer = setTimeout(() => {
    timedOut = true;
    sub.unsubscribe();
  }, timeoutS * 1000);
  try {
    for await (const msg of sub) {
      if (msg.subject !== subject) continue; // another unallocated workload's notice
      const notice = parseJson("the notice", msg.data);
      emit("NOTICE", notice);
      if (notice.type !== "PreemptionNotice" || notice.workload_id !== workloadId) {
        throw new Exit(EXIT.unexpected, `expected a PreemptionNotice for ${workloadId}, got ${notice.type}`);
      }
      return;
    }
  } finally {
    clearTimeout(timer);
  }
  if (timedOut) throw new Exit(EXIT.timeout, `no notice on ${subject} within ${timeoutS} s`);
  throw new Exit(EXIT.transport, `subscription to ${PREEMPT_WILDCARD} closed before a notice arrived`);
}

async function main() {
  const args = parseCli(process.argv.slice(2));
  let nc;
  try {
    nc = await connect({ servers: args.url, name: "allot-node-wire-client" });
  } catch (e) {
    throw new Exit(EXIT.transport, `cannot connect to ${args.url}: ${e.message}`);
  }
  try {
    const sub = nc.subscribe(PREEMPT_WILDCARD);
    await nc.flush(); // the server has the subscription before anything is submitted
    await checkMalformedIsRejected(nc);
    const workloadId = await submit(nc, args.clientId, args.gpus);
    await waitForNotice(sub, workloadId, args.timeoutS);
  } finally {
    await nc.close();
  }
}

try {
  await main();
  process.exitCode = EXIT.notice;
} catch (e) {
  const code = e instanceof Exit ? e.code : EXIT.transport;
  process.stderr.write(`error: ${e.message}\n`);
  process.exitCode = code;
}
