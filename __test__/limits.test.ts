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
import { describe, test } from "node:test";
import { assertOk, jsonOut, lit, makeFixtureWithoutSpare as makeFixture, py, show } from "./helpers/sandbox-fixture.ts";
import { skipWithoutSandbox } from "./helpers/sandbox-env.ts";

const CONCURRENCY = 4;
const MiB = 1024 * 1024;

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
});
