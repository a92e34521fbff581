/**
 * Integration tests of the PythonSandbox addon against the real bubblewrap + seccomp sandbox:
 * resource limits (rlimits) inside the sandbox and its subprocesses.
 * Run: node --import tsx --test __test__/limits.test.ts
 *
 * One named test per behaviour. Every test skips loudly (never under CI=true) where bwrap cannot
 * run, and owns its project directory, runtime root and sandboxes (cleaned up in t.after).
 * Independent tests run concurrently inside each suite. Its sandboxes keep no spare
 * (makeFixtureWithoutSpare): what a test finds on the host is its own sandbox alone.
 */
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { describe, test } from "node:test";
import { assertOk, jsonOut, lit, makeFixtureWithoutSpare as makeFixture, py, show } from "./helpers/sandbox-fixture.ts";
import { skipWithoutSandbox } from "./helpers/sandbox-env.ts";

const CONCURRENCY = 4;
const MiB = 1024 * 1024;
const ROOT = process.getuid?.() === 0;

/** This process's soft and hard limit of `name` (prlimit's resource name: `rtprio`, `nice`, `msgqueue`). */
function ownLimit(name: string): [number, number] {
  const r = spawnSync("prlimit", ["--pid", String(process.pid), `--${name}`, "--raw", "--noheadings", "--output", "SOFT,HARD"], {
    encoding: "utf8",
  });
  assert.equal(r.status, 0, r.stderr);
  const [soft, hard] = r.stdout.trim().split(/\s+/).map((v) => (v === "unlimited" ? Infinity : Number(v)));
  return [soft, hard];
}

/** `s` as one word for sh. */
const shellQuote = (s: string) => `'${s.replaceAll("'", `'\\''`)}'`;

/** Set this process's limit `name` (prlimit's resource name); false when the kernel refuses. */
function setOwnLimit(name: string, [soft, hard]: [number, number]): boolean {
  const v = (n: number) => (n === Infinity ? "unlimited" : String(n));
  return spawnSync("prlimit", ["--pid", String(process.pid), `--${name}=${v(soft)}:${v(hard)}`]).status === 0;
}

/**
 * Run by python3 in either tool: the real-time and nice priority limits, an attempt at each (a
 * real-time policy, a nice value below 0), and the message-queue limit, which the sandbox leaves
 * as pi has it.
 */
const PRIORITY_PROBE = [
  "import json, os, resource",
  "out = {'rtprio': resource.getrlimit(resource.RLIMIT_RTPRIO), 'nice': resource.getrlimit(resource.RLIMIT_NICE), 'msgqueue': resource.getrlimit(resource.RLIMIT_MSGQUEUE)[0]}",
  "try:\n    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1)); out['fifo'] = 'taken'; os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))\nexcept OSError as e:\n    out['fifo'] = e.errno",
  "try:\n    os.nice(-1); out['lower_nice'] = 'taken'\nexcept OSError as e:\n    out['lower_nice'] = e.errno",
  "print(json.dumps(out))",
].join("\n");

// ---------------------------------------------------------------------------------------------
describe("resource limits", { concurrency: CONCURRENCY }, () => {
  test("a 600 MiB allocation fails with MemoryError and the interpreter keeps working", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    assertOk(await sb.execute("kept = 1"));
    const r = await sb.execute("big = bytearray(600 * 1024 * 1024)");
    assert.equal(r.status, "runtime_error", show(r));
    assert.equal(r.exception?.type, "MemoryError");
    const after = await sb.execute("small = bytearray(50 * 1024 * 1024)\n(kept, len(small))");
    assertOk(after);
    assert.equal(after.repr, `(1, ${50 * MiB})`);
    assert.equal(after.generation, 1);
  });

  test("a 17 MiB scratch file stops at 16 MiB with EFBIG", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    const r = await sb.execute(py`
      import json, os
      try:
          with open("/scratch/big.bin", "wb") as f:
              f.write(b"\0" * (17 * 1024 * 1024))
          outcome = "written"
      except OSError as e:
          outcome = e.errno
      print(json.dumps([outcome, os.path.getsize("/scratch/big.bin")]))
    `);
    assert.deepEqual(jsonOut(r), [27, 16 * MiB]); // EFBIG
  });

  test("opening /dev/null 200 times fails with EMFILE", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    const r = await sb.execute(py`
      import json
      files = []
      try:
          for _ in range(200):
              files.append(open("/dev/null"))
          outcome = "opened all"
      except OSError as e:
          outcome = e.errno
      count = len(files)
      for f in files:
          f.close()
      print(json.dumps([outcome, count]))
    `);
    const [outcome, count] = jsonOut(r);
    assert.equal(outcome, 24); // EMFILE
    assert.ok(count < 128, `${count} files opened`);
  });

  test("rlimits inside and in subprocesses are the documented values", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    const probe = "import json, resource; print(json.dumps([resource.getrlimit(getattr(resource, n)) for n in ('RLIMIT_AS', 'RLIMIT_FSIZE', 'RLIMIT_NOFILE', 'RLIMIT_CORE')]))";
    const own = jsonOut(await sb.execute(probe));
    const child = jsonOut(await sb.execute(`import subprocess\nsubprocess.run(["python3", "-c", ${lit(probe)}])`));
    const { limits } = sb.status();
    const expected = [
      [512 * MiB, 512 * MiB],
      [16 * MiB, 16 * MiB],
      [128, 128],
      [0, 0],
    ];
    assert.deepEqual(own, expected);
    assert.deepEqual(child, expected);
    assert.equal(limits.rlimitAsBytes, 512 * MiB);
    assert.equal(limits.rlimitFsizeBytes, 16 * MiB);
    assert.equal(limits.rlimitNofile, 128);
    assert.equal(limits.coreDumps, "disabled");
  });

  test("real-time and nice priority limits are 0 in both tools, whatever pi has", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const before = { rtprio: ownLimit("rtprio"), nice: ownLimit("nice"), msgqueue: ownLimit("msgqueue") };
    t.after(() => {
      for (const [name, value] of Object.entries(before)) setOwnLimit(name, value);
    });
    // Pi's limits raised where the host lets this process raise them (CAP_SYS_RESOURCE); the
    // message-queue limit, which no sandbox sets, lowered (a soft limit: always allowed).
    const raised = ROOT && setOwnLimit("rtprio", [10, 10]) && setOwnLimit("nice", [30, 30]);
    const msgqueue = Math.min(before.msgqueue[1], 12_345);
    assert.ok(setOwnLimit("msgqueue", [msgqueue, before.msgqueue[1]]), "the test lowers its own message-queue limit");
    // Baseline: a host child gets pi's limits, and as nobody takes a real-time policy and a
    // negative nice value with them.
    const hostChild = spawnSync("/usr/bin/python3", ["-c", PRIORITY_PROBE], { encoding: "utf8", ...(ROOT ? { uid: 65534, gid: 65534 } : {}) });
    const base = JSON.parse(hostChild.stdout) as Record<string, unknown>;
    assert.equal(base.msgqueue, msgqueue, `baseline: a child gets pi's message-queue limit (${hostChild.stdout}${hostChild.stderr})`);
    if (raised) {
      assert.deepEqual([base.rtprio, base.nice], [[10, 10], [30, 30]], `baseline: ${hostChild.stdout}`);
      assert.deepEqual([base.fifo, base.lower_nice], ["taken", "taken"], `baseline: nobody with pi's limits (${hostChild.stdout})`);
    } else {
      // This host keeps every process at 0 (no CAP_SYS_RESOURCE to raise a hard limit): what
      // pi would pass on is shown by the message-queue limit, which reaches inside below.
      t.diagnostic(`pi's real-time and nice limits cannot be raised here (they are ${JSON.stringify([before.rtprio, before.nice])})`);
    }
    const { sb, project } = await makeFixture(t);
    const inPython = jsonOut(await sb.execute(PRIORITY_PROBE));
    const inChild = jsonOut(await sb.execute(`import subprocess\nsubprocess.run(["python3", "-c", ${lit(PRIORITY_PROBE)}])`));
    let shellOut = "";
    const shell = await sb.execShell(1, `ulimit -Hr; ulimit -Sr; ulimit -He; ulimit -Se; /usr/bin/python3 -c ${shellQuote(PRIORITY_PROBE)}`, { cwd: project, timeoutSeconds: 30 }, (s: string) => {
      shellOut += s;
    });
    assert.equal(shell.exitCode, 0, shellOut);
    const [hr, sr, he, se, probe] = shellOut.trim().split("\n");
    assert.deepEqual([hr, sr, he, se], ["0", "0", "0", "0"], `the bash tool's shell: ${shellOut}`);
    const EPERM = 1;
    const expected = { rtprio: [0, 0], nice: [0, 0], msgqueue, fifo: EPERM, lower_nice: EPERM };
    assert.deepEqual(inPython, expected, "the python tool");
    assert.deepEqual(inChild, expected, "a subprocess of the python tool");
    assert.deepEqual(JSON.parse(probe), expected, `a process of the bash tool: ${shellOut}`);
  });
});
