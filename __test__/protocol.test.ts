/**
 * Integration tests of the PythonSandbox addon against the real bubblewrap + seccomp sandbox:
 * protocol violations, from user code (a broken reply channel, forged frames) and from a worker
 * that is starting (garbage, a wrong protocol, bad or unasked bytecode).
 * Run: node --import tsx --test __test__/protocol.test.ts
 *
 * One named test per behaviour. Every test skips loudly (never under CI=true) where bwrap cannot
 * run, and owns its project directory, runtime root and sandboxes (cleaned up in t.after).
 * Independent tests run concurrently inside each suite. Its sandboxes keep no spare
 * (makeFixtureWithoutSpare): what a test finds on the host is its own sandbox alone; those of
 * "forged and malformed frames" keep one.
 */
import assert from "node:assert/strict";
import { chmodSync, readdirSync, statSync } from "node:fs";
import { join } from "node:path";
import { describe, type TestContext, test } from "node:test";
import {
  assertFailedCallState,
  assertOk,
  assertRecovers,
  fakeInterpreter,
  makeFixture as makeFixtureWithSpare,
  makeFixtureWithoutSpare as makeFixture,
  show,
  waitUntil,
} from "./helpers/sandbox-fixture.ts";
import { assertNoProcess, interpreterPids, workerPids } from "./helpers/host-procs.ts";
import { ROLLBACK, skipWithoutSandbox } from "./helpers/sandbox-env.ts";

const CONCURRENCY = 4;

// ---------------------------------------------------------------------------------------------
describe("protocol violations from user code", { concurrency: CONCURRENCY }, () => {
  async function violation(t: TestContext, code: string, diagnostic: RegExp | null): Promise<void> {
    const { sb } = await makeFixture(t);
    assertOk(await sb.execute("kept = 1"));
    const started = Date.now();
    const r = await sb.execute(code, 30);
    assert.ok(Date.now() - started < 6000, `took ${Date.now() - started} ms`);
    assert.equal(r.status, "worker_error", show(r));
    assertFailedCallState(r);
    if (diagnostic) assert.match(r.diagnostic ?? "", diagnostic);
    await assertRecovers(sb, r);
  }

  test("a malformed reply frame is a protocol violation", async (t) => {
    if (skipWithoutSandbox(t)) return;
    await violation(t, 'import os\nos.write(4, b"\\x00\\x00\\x00\\x05hello")', /Protocol violation/);
  });

  test("an oversize reply frame length is a protocol violation", async (t) => {
    if (skipWithoutSandbox(t)) return;
    await violation(t, "import os\nos.write(4, (10**7).to_bytes(4, 'big'))", /Protocol violation.*exceeds/);
  });

  test("closing the reply fd (4) is a worker_error, not a hang", async (t) => {
    if (skipWithoutSandbox(t)) return;
    await violation(t, "import os\nos.close(4)", null);
  });

  test("closing the request fd (3) ends the interpreter after its result; the next call says so", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb, runtimeRoot } = await makeFixture(t);
    assertOk(await sb.execute("kept = 1"));
    const started = Date.now();
    const r = await sb.execute("import os\nos.close(3)", 30);
    assert.ok(Date.now() - started < 6000, `took ${Date.now() - started} ms`);
    assertOk(r); // the code itself ran to completion; the worker dies when it reads the next request
    if (ROLLBACK) {
      // The sandbox stays (its PID 1 is not the interpreter); the interpreter is gone.
      assert.ok(await waitUntil(() => interpreterPids(runtimeRoot).length === 0, 5000), "the interpreter is gone");
      assert.equal(workerPids(runtimeRoot).length, 1, "the sandbox's PID 1 stays");
    } else {
      await assertNoProcess(runtimeRoot);
    }
    const next = await sb.execute("'kept' in globals()");
    assertOk(next);
    assert.equal(next.repr, "False");
    assert.equal(next.stateLost, true);
    assert.match(next.stateLostReason ?? "", /died while idle/);
    assert.equal(next.generation, r.generation + 1);
  });

  test("a forged result that claims end marks it never wrote and pipes that do not wait ends the call; a fresh interpreter runs the next calls", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    assertOk(await sb.execute("kept = 1"));
    // The result may carry the call's end marks: this one says both were written and the next
    // call's pipes wait, and none of it is true. The interpreter then ends.
    const code = [
      "import json, os, sys",
      "f = sys._getframe()",
      "while 'req_id' not in f.f_locals:",
      "    f = f.f_back",
      "print('before', flush=True)",
      "marks = {'stdout': True, 'stderr': True, 'streams': True}",
      "body = json.dumps({'type': 'result', 'id': f.f_locals['req_id'], 'status': 'ok', 'repr': \"'forged'\", 'exception': None, 'drained': marks}).encode()",
      "os.write(4, len(body).to_bytes(4, 'big') + body)",
      "os._exit(0)",
    ].join("\n");
    const started = Date.now();
    const r = await sb.execute(code, 30);
    assert.ok(Date.now() - started < 6000, `took ${Date.now() - started} ms`);
    assert.equal(r.status, "ok", show(r));
    assert.equal(r.repr, "'forged'");
    assert.equal(r.stdout, "before\n");
    // The claims bought nothing: the call ended when its streams did, at the interpreter's exit.
    // The state is lost, and a fresh interpreter runs the calls after it.
    const next = await sb.execute("'kept' in globals()");
    assert.equal(next.stateLost, true, show(next));
    const after = await sb.execute("print('after')\n'kept' in globals()");
    assertOk(after);
    assert.equal(after.stdout, "after\n", show(after));
    assert.equal(after.repr, "False");
  });
});

// ---------------------------------------------------------------------------------------------
/** A frame (length prefix and body) as bytes. */
function frameBytes(body: string): Buffer {
  const b = Buffer.from(body);
  const len = Buffer.alloc(4);
  len.writeUInt32BE(b.length);
  return Buffer.concat([len, b]);
}

/** Bytes as a printf(1) format of octal escapes. */
const octal = (bytes: Buffer) => [...bytes].map((b) => `\\${b.toString(8).padStart(3, "0")}`).join("");

describe("forged and malformed frames", { concurrency: CONCURRENCY }, () => {
  // These sandboxes keep a spare, as in faults.test.ts: each violation is met with one waiting.
  const makeFixture = makeFixtureWithSpare;

  /** Code that breaks the reply channel: a worker_error within seconds, then a fresh start. */
  async function violation(t: TestContext, code: string, diagnostic: RegExp): Promise<void> {
    const { sb } = await makeFixture(t);
    assertOk(await sb.execute("kept = 1"));
    const started = Date.now();
    const r = await sb.execute(code, 30);
    assert.ok(Date.now() - started < 6000, `took ${Date.now() - started} ms`);
    assert.equal(r.status, "worker_error", show(r));
    assertFailedCallState(r);
    assert.match(r.diagnostic ?? "", diagnostic);
    await assertRecovers(sb, r);
  }

  test("a reply frame cut short (header, part of a body, fd 4 closed) is a protocol violation", async (t) => {
    if (skipWithoutSandbox(t)) return;
    await violation(t, "import os\nos.write(4, (100).to_bytes(4, 'big') + b'{\"type\"')\nos.close(4)", /Protocol violation.*inside a frame \(7 of 100/);
  });

  test("an unexpected frame mid-execution (a second ready) is a protocol violation", async (t) => {
    if (skipWithoutSandbox(t)) return;
    await violation(
      t,
      'import json, os\nb = json.dumps({"type": "ready", "protocol": 1, "runtimeVersion": "9.9.9"}).encode()\nos.write(4, len(b).to_bytes(4, "big") + b)\nimport time\ntime.sleep(5)',
      /Protocol violation: unexpected ready frame/,
    );
  });

  test("a code frame mid-execution (code that forges the worker's bytecode) is a protocol violation", async (t) => {
    if (skipWithoutSandbox(t)) return;
    await violation(
      t,
      'import json, os\nb = json.dumps({"type": "code", "pyc": "QUINCgAAAAAAAAAAAAAAAAAAAA=="}).encode()\nos.write(4, len(b).to_bytes(4, "big") + b)\nimport time\ntime.sleep(5)',
      /Protocol violation: unexpected code frame/,
    );
  });

  test("a result frame for another execution id is a protocol violation", async (t) => {
    if (skipWithoutSandbox(t)) return;
    await violation(
      t,
      'import json, os\nb = json.dumps({"type": "result", "id": 999999, "status": "ok", "repr": "\'forged\'", "exception": None}).encode()\nos.write(4, len(b).to_bytes(4, "big") + b)\nimport time\ntime.sleep(5)',
      /Protocol violation: unexpected result frame/,
    );
  });

  test("garbage or an oversize frame from a worker before it is ready is a worker_error at once", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const fx = await makeFixture(t);
    const ready7 = JSON.stringify({ type: "ready", protocol: 7, runtimeVersion: "x" });
    const cases: [string, string, RegExp][] = [
      ["garbage", `printf '${octal(frameBytes("hello"))}' >&4; exec sleep 30`, /did not start: bad frame: frame is not a valid message/],
      ["oversize", "printf '\\377\\377\\377\\377' >&4; exec sleep 30", /did not start: bad frame: frame of 4294967295 bytes exceeds/],
      ["wrong-protocol", `printf '${octal(frameBytes(ready7))}' >&4; exec sleep 30`, /speaks protocol 7, not 4/],
      ["code-not-base64", `printf '${octal(frameBytes('{"type":"code","pyc":"%%%"}'))}' >&4; exec sleep 30`, /did not start: the worker's code is not base64/],
      ["code-not-pyc", `printf '${octal(frameBytes(`{"type":"code","pyc":"${Buffer.alloc(64, 35).toString("base64")}"}`))}' >&4; exec sleep 30`, /did not start: the worker's code does not start with a \.pyc magic number/],
      // Pieces that never end: the host stops collecting at its bound.
      ["code-endless", `while :; do printf '${octal(frameBytes(`{"type":"code","pyc":"${"A".repeat(4096)}","more":true}`))}'; done >&4; exec sleep 30`, /did not start: the worker's code is over 1048576 bytes of base64/],
    ];
    for (const [name, script, diagnostic] of cases) {
      const sb = fx.open({ interpreter: await fakeInterpreter(fx, name, script) });
      const started = Date.now();
      const r = await sb.execute("1");
      assert.ok(Date.now() - started < 5000, `${name}: took ${Date.now() - started} ms`);
      assert.equal(r.status, "worker_error", `${name}: ${show(r)}`);
      assert.match(r.diagnostic ?? "", diagnostic, name);
      assert.equal(sb.status().workerRunning, false);
      await sb.dispose();
    }
    await assertNoProcess(fx.runtimeRoot);
  });

  test("stored bytecode whose worker sends its code unasked is refused, deleted, and the start made from source", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const fx = await makeFixture(t);
    // Asked (started from source with --emit-code), this interpreter sends a well-formed image and
    // becomes ready but never answers a request; started as /worker.pyc it sends the image unasked.
    const image = Buffer.concat([Buffer.from("AB\r\n"), Buffer.alloc(20)]).toString("base64");
    const code = frameBytes(JSON.stringify({ type: "code", pyc: image }));
    const ready = frameBytes(JSON.stringify({ type: "ready", protocol: 4, runtimeVersion: "0.0.0" }));
    const interpreter = await fakeInterpreter(
      fx,
      "emitter",
      `case "$*" in\n  *--emit-code*) printf '${octal(Buffer.concat([code, ready]))}' >&4 ;;\n  *) printf '${octal(code)}' >&4 ;;\nesac\nexec sleep 30`,
    );
    const sb = fx.open({ interpreter, prewarm: false });
    const first = await sb.execute("1", 1);
    assert.equal(first.status, "timeout", show(first));
    const store = join(fx.runtimeRoot, ".worker-code");
    const [stored] = readdirSync(store);
    assert.match(stored ?? "", /^worker-[0-9a-f]{16}\.pyc$/, "the image was stored once the sandbox was ready");
    // Mark the stored file (its mode) to tell it from a new one.
    chmodSync(join(store, stored), 0o600);
    // The bytecode start fails at once (had the frame been ignored, it would wait 10 s for ready),
    // the image is deleted, and the source start that follows gets as far as the first one did.
    const started = Date.now();
    const second = await sb.execute("1", 1);
    assert.equal(second.status, "timeout", show(second));
    assert.ok(Date.now() - started < 8000, `took ${Date.now() - started} ms`);
    assert.deepEqual(readdirSync(store), [stored], "stored again by the source start");
    assert.equal(statSync(join(store, stored)).mode & 0o777, 0o400, "the refused image was replaced");
  });
});
