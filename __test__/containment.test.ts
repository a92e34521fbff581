/**
 * Containment of one sandbox as a whole (src/contain.rs, src/scratch.rs): the cap on its tasks and
 * on its memory, the mechanism `status` names, the cgroups gone after dispose and after a crash of
 * the host process, and the /scratch growth note.
 * Run: node --import tsx --test __test__/containment.test.ts
 *
 * The caps are set for this whole file through the environment (each sandbox start reads them):
 * 64 tasks, 256 MiB, a 1 MiB scratch note. Every attempt is bounded by the test itself, so that a
 * regression fails the test instead of taking the machine down, and has an unfiltered baseline
 * showing that it works without the defence. The engine tests (tests/sandbox.rs) run the default
 * caps as root and as nobody.
 *
 * The suite runs with either setting of PI_PYTHON_TOOL_ROLLBACK (scripts/test.mjs runs it with
 * both): a test whose outcome depends on it asserts the setting in force (`ROLLBACK`), and the
 * "under rollback" tests ask for rollback themselves (and the last one for none as its
 * baseline), where the sandbox, its cgroups and its task count outlive each interpreter: PID 1,
 * the interpreter and the rollback copy of each call are counted, and the copy's copy-on-write
 * pages are charged to the memory cap.
 */
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { accessSync, constants, existsSync, readdirSync, readFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, test } from "node:test";
import { ROLLBACK, skipWithoutSandbox } from "./helpers/sandbox-env.ts";
import {
  assertFailedCallState,
  assertOk,
  assertRecovers,
  INDEX_CJS,
  jsonOut,
  makeFixtureWithoutSpare as makeFixture,
  py,
  show,
  sleep,
  waitUntil,
} from "./helpers/sandbox-fixture.ts";
import { unfiltered } from "./helpers/unfiltered.ts";

const MAX_TASKS = 64;
process.env.PI_PYTHON_TOOL_MAX_TASKS = String(MAX_TASKS);
process.env.PI_PYTHON_TOOL_MAX_MEMORY = "256M";
process.env.PI_PYTHON_TOOL_SCRATCH_NOTE = "1M";

const uid = process.getuid?.() ?? -1;

/** What this host should use, judged apart from the addon: these machines mount cgroup v1. */
function expectedTasks(): string {
  const v1 = readFileSync("/proc/self/cgroup", "utf8").split("\n").some((l) => /^\d+:pids:/.test(l));
  const writable = (p: string) => {
    try {
      accessSync(p, constants.W_OK);
      return true;
    } catch {
      return false;
    }
  };
  if (v1 && writable("/sys/fs/cgroup/pids")) return "cgroup-v1";
  return uid === 0 ? "none" : "rlimit-nproc";
}

/** Forks at most `bound` children that wait on a pipe; reports tasks before, forks, errno. With
 * `wait: false` the children stay when the code goes on. */
const forkBomb = (bound: number, { wait = true } = {}) => py`
  import os, json
  def tasks():
      n = 0
      for p in os.listdir("/proc"):
          if p.isdigit():
              try:
                  n += len(os.listdir("/proc/%s/task" % p))
              except OSError:
                  pass
      return n
  r, w = os.pipe()
  before = tasks()
  kids, refused = [], None
  for i in range(${bound}):
      try:
          pid = os.fork()
      except OSError as e:
          refused = e.errno
          break
      if pid == 0:
          os.close(w)
          os.read(r, 1)
          os._exit(0)
      kids.append(pid)
  if ${wait ? "True" : "False"}:
      os.close(w)
      os.close(r)
      for k in kids:
          os.waitpid(k, 0)
  print(json.dumps({"before": before, "forked": len(kids), "refused": refused}), flush=True)
`;

const ledgerDir = () => join(tmpdir(), `pi-python-sandbox-${uid}`, ".cgroups");

/** The cgroups the ledger of host process `pid` lists (see src/contain.rs), or null. */
function ledgerOf(pid: number): string[] | null {
  if (!existsSync(ledgerDir())) return null;
  for (const name of readdirSync(ledgerDir())) {
    const lines = readFileSync(join(ledgerDir(), name), "utf8").trim().split("\n");
    if (lines[0].split(" ")[0] === String(pid)) return lines.slice(1);
  }
  return null;
}

/** A Node process that starts one sandbox, runs `print(1)`, then does `end`. */
function hostProcess(project: string, runtimeRoot: string, end: "crash" | "dispose") {
  const script = `
    const { PythonSandbox } = require(${JSON.stringify(INDEX_CJS)});
    (async () => {
      const sb = new PythonSandbox({ projectDir: ${JSON.stringify(project)}, runtimeRoot: ${JSON.stringify(runtimeRoot)}, prewarm: false });
      const r = await sb.execute("print(1)");
      console.log(JSON.stringify({ pid: process.pid, status: r.status }));
      if (${JSON.stringify(end)} === "crash") process.kill(process.pid, "SIGKILL");
      await sb.dispose("done");
    })();`;
  const r = spawnSync(process.execPath, ["-e", script], { encoding: "utf8", timeout: 60_000, env: process.env });
  const line = r.stdout.trim().split("\n").pop() ?? "";
  return { out: JSON.parse(line) as { pid: number; status: string }, signal: r.signal, stderr: r.stderr };
}

describe("containment", { concurrency: 1 }, () => {
  test("status names the mechanism that caps tasks and memory on this host, and why no better one", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    const c = sb.status().containment;
    const expected = expectedTasks();
    console.log(`# uid ${uid}: tasks by ${c.tasks}, memory by ${c.memory}`);
    assert.equal(c.tasks, expected, c.text);
    assert.equal(c.maxTasks, MAX_TASKS);
    assert.equal(c.maxMemoryBytes, 256 * 1024 * 1024);
    assert.ok(sb.status().text.includes(c.text), "the model sees the same line");
    if (expected === "cgroup-v1") {
      assert.equal(c.memory, "cgroup-v1", c.text);
      assert.match(c.text, /at most 64 tasks .* by cgroup-v1 pids under \/sys\/fs\/cgroup\/pids/);
      assert.match(c.text, /at most 256 MiB of memory in all, swap not counted in its favour, by cgroup-v1 memory/);
      // Why not cgroup v2: said, not silently passed over.
      assert.ok(c.notUsed.some((w) => w.startsWith("cgroup v2: ")), c.notUsed.join("; "));
    } else {
      assert.match(c.text, /memory NOT contained/);
    }
  });

  test("a fork bomb stops at PI_PYTHON_TOOL_MAX_TASKS with EAGAIN and the interpreter lives on", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const bomb = forkBomb(MAX_TASKS + 32);
    const baseline = JSON.parse(await unfiltered(bomb, { capabilities: false }));
    assert.deepEqual([baseline.forked, baseline.refused], [MAX_TASKS + 32, null], "the baseline forks every time");
    const { sb } = await makeFixture(t);
    const c = sb.status().containment;
    if (c.tasks === "none") {
      assert.match(c.text, /tasks NOT contained/);
      assert.ok(c.notUsed.some((w) => w.includes("exempts")), c.notUsed.join("; "));
      return;
    }
    const got = jsonOut(await sb.execute(bomb));
    assert.equal(got.refused, 11, `a refused fork is EAGAIN: ${JSON.stringify(got)}`);
    // bubblewrap's own process is in the cgroup but outside the sandbox's /proc.
    const outside = c.tasks === "rlimit-nproc" ? 0 : 1;
    assert.equal(got.before + got.forked + outside, MAX_TASKS, `${JSON.stringify(got)} under ${c.tasks}`);
    assert.equal(jsonOut(await sb.execute(forkBomb(4))).forked, 4);
  });

  test("an interpreter the memory cap kills is reported as out of memory, and the next call recovers", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const grab = "block = b'\\x01' * (400 << 20)\nprint('held')";
    assert.equal((await unfiltered(grab, { capabilities: false })).trim(), "held", "the baseline holds 400 MiB");
    const { sb } = await makeFixture(t);
    const c = sb.status().containment;
    if (c.memory === "none") {
      assert.match(c.text, /memory NOT contained/);
      return;
    }
    assert.equal(sb.status().rollback, ROLLBACK, "the addon reads the setting as the test does");
    assertOk(await sb.execute("kept = 1"));
    const r = await sb.execute(grab);
    assert.equal(r.status, "worker_error", show(r));
    const reason =
      /^out of memory: the kernel's OOM killer ended the interpreter: the sandbox's memory cap of 256 MiB \(cgroup-v\d memory\) was reached$/;
    if (ROLLBACK) {
      // The copy taken before the call killed every other process of the sandbox and took over.
      const died = /^The interpreter died \((.*)\); every process of the sandbox was killed\. /.exec(r.diagnostic ?? "");
      assert.match(died?.[1] ?? "", reason, show(r));
    } else {
      assert.match(r.stateLostReason ?? "", reason, show(r));
    }
    assertFailedCallState(r);
    assert.match(r.text, /out of memory/);
    await assertRecovers(sb, r);
  });

  test("no cgroup is left after dispose, nor after the host process is killed", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const fx = await makeFixture(t);
    if (fx.sb.status().containment.tasks !== "cgroup-v1" && fx.sb.status().containment.tasks !== "cgroup-v2") {
      const crashed = hostProcess(fx.project, fx.runtimeRoot, "crash");
      assert.equal(ledgerOf(crashed.out.pid), null, "no cgroup, no ledger");
      return;
    }
    // A host process killed with SIGKILL leaves its (empty) cgroups behind...
    const crashed = hostProcess(fx.project, fx.runtimeRoot, "crash");
    assert.equal(crashed.signal, "SIGKILL", crashed.stderr);
    assert.equal(crashed.out.status, "ok");
    const left = ledgerOf(crashed.out.pid) ?? [];
    assert.equal(left.length, 2, `pids and memory cgroups recorded: ${left}`);
    assert.ok(left.every((d) => existsSync(d)), `a crash leaves ${left}`);
    // ...which the next process's first sandbox removes; its own go at dispose and exit.
    const next = hostProcess(fx.project, fx.runtimeRoot, "dispose");
    assert.equal(next.out.status, "ok", next.stderr);
    assert.ok(await waitUntil(() => left.every((d) => !existsSync(d)), 2000), `still there: ${left}`);
    assert.equal(ledgerOf(next.out.pid), null, "a process that exits normally removes its ledger");
    // In this process: the sandbox's cgroups exist while it runs and are gone once disposed.
    await fx.sb.execute("print(1)");
    const mine = (ledgerOf(process.pid) ?? []).filter((d) => existsSync(d));
    assert.equal(mine.length, 2, `${ledgerOf(process.pid)}`);
    await fx.sb.dispose("test");
    assert.deepEqual(mine.filter((d) => existsSync(d)), [], "left after dispose");
  });

  test("under rollback, a fork bomb at the cap is rolled back, and the next calls fork and roll back again", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t, { rollback: true });
    const c = sb.status().containment;
    if (c.tasks === "none") {
      assert.match(c.text, /tasks NOT contained/);
      return;
    }
    assertOk(await sb.execute("kept = 1"));
    assertOk(await sb.execute("warm = True")); // the first call with a rollback point is the second
    // The bomb's children stay: the call times out with the cap still reached.
    const r = await sb.execute(
      forkBomb(MAX_TASKS + 32, { wait: false }) + "\nkept = 2\nimport time\ntime.sleep(60)",
      3,
    );
    assert.equal(r.status, "timeout", show(r));
    assert.equal(r.rolledBack, true, show(r));
    const got = JSON.parse(r.stdout.trim());
    assert.equal(got.refused, 11, `a refused fork is EAGAIN: ${r.stdout}`);
    const outside = c.tasks === "rlimit-nproc" ? 0 : 1;
    // PID 1, the interpreter and this call's rollback copy were there before the bomb.
    assert.ok(got.before >= 3, r.stdout);
    assert.equal(got.before + got.forked + outside, MAX_TASKS, `${r.stdout} under ${c.tasks}`);
    // The rollback needed no fork; afterwards the cap is free again, a new copy is taken, and a
    // second failure rolls back too.
    const next = await sb.execute(forkBomb(4) + "\nprint(kept)");
    assert.match(next.stdout, /"forked": 4, "refused": null\}\n1\n$/, show(next));
    const again = await sb.execute("kept = 3\nwhile True: pass", 1);
    assert.equal(again.rolledBack, true, show(again));
    assert.equal((await sb.execute("print(kept)")).stdout, "1\n");
  });

  test("under rollback, an interpreter the memory cap kills is reported as out of memory and rolled back", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t, { rollback: true });
    const c = sb.status().containment;
    if (c.memory === "none") {
      assert.match(c.text, /memory NOT contained/);
      return;
    }
    assertOk(await sb.execute("kept = 1"));
    assertOk(await sb.execute("warm = True"));
    const r = await sb.execute("block = b'\\x01' * (400 << 20)\nkept = 2");
    assert.equal(r.status, "worker_error", show(r));
    assert.equal(r.rolledBack, true, show(r));
    assert.equal(r.stateLost, false, show(r));
    assert.match(
      r.diagnostic ?? "",
      /^The interpreter died \(out of memory: the kernel's OOM killer ended the interpreter: the sandbox's memory cap of 256 MiB \(cgroup-v\d memory\) was reached\); every process of the sandbox was killed\. The interpreter was rolled back to its state before this call/,
      show(r),
    );
    assert.match(r.text, /out of memory/);
    const next = await sb.execute("print(kept)");
    assert.equal(next.stdout, "1\n", show(next));
    assert.equal(next.generation, r.generation, "a rollback keeps the generation");
  });

  test("under rollback, the copy's copy-on-write pages count: rewriting 150 MiB of state needs 300 MiB", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const state = "big = bytearray(150 << 20)\nfor i in range(0, len(big), 4096): big[i] = 1\nkept = 1";
    const rewrite = "for i in range(0, len(big), 4096): big[i] = 2\nkept = 2";
    // Baseline: without rollback there is no copy, and the rewrite fits in the 256 MiB cap.
    const { sb, open } = await makeFixture(t, { rollback: false });
    if (sb.status().containment.memory === "none") {
      assert.match(sb.status().containment.text, /memory NOT contained/);
      return;
    }
    assertOk(await sb.execute(state));
    assertOk(await sb.execute(rewrite));
    await sb.dispose("baseline done");
    const rolling = open({ rollback: true });
    assertOk(await rolling.execute(state));
    const r = await rolling.execute(rewrite);
    assert.equal(r.status, "worker_error", show(r));
    assert.match(r.diagnostic ?? "", /out of memory/, show(r));
    assert.equal(r.rolledBack, true, show(r));
    assert.equal((await rolling.execute("print(kept)")).stdout, "1\n");
  });

  test("under rollback, the cgroups live as long as the sandbox: kept across interpreters, gone after a mode change and dispose", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t, { rollback: true });
    const c = sb.status().containment;
    if (c.tasks !== "cgroup-v1" && c.tasks !== "cgroup-v2") return;
    const live = () => (ledgerOf(process.pid) ?? []).filter((d) => existsSync(d));
    const before = new Set(live());
    const fresh = () => live().filter((d) => !before.has(d));
    assertOk(await sb.execute("print(1)"));
    const first = fresh();
    assert.equal(first.length, c.tasks === "cgroup-v2" ? 1 : 2, `${ledgerOf(process.pid)}`);
    // A rollback and a reset replace the interpreter, not the sandbox.
    assert.equal((await sb.execute("while True: pass", 1)).rolledBack, true);
    await sb.reset();
    assertOk(await sb.execute("print(2)"));
    assert.deepEqual(fresh(), first, "the same cgroups after a rollback and a reset");
    // A mode change made in place keeps the sandbox and its cgroups.
    const inPlace = sb.applyModeEvent({ mode: "edits", readRoots: [] });
    assert.ok(inPlace.changed && !inPlace.discarded, JSON.stringify(inPlace));
    assertOk(await sb.execute("print(3)"));
    assert.deepEqual(fresh(), first, "the same cgroups after a mode change made in place");
    // One that kills the sandbox (the live path off): the next call's sandbox has cgroups of its own.
    const saved = process.env.PI_SANDBOX_LIVE_GRANTS;
    process.env.PI_SANDBOX_LIVE_GRANTS = "0";
    let changed;
    try {
      changed = sb.applyModeEvent({ mode: "manual", readRoots: [] });
    } finally {
      if (saved === undefined) delete process.env.PI_SANDBOX_LIVE_GRANTS;
      else process.env.PI_SANDBOX_LIVE_GRANTS = saved;
    }
    assert.ok(changed.changed && changed.discarded, JSON.stringify(changed));
    assertOk(await sb.execute("print(4)"));
    const second = fresh();
    assert.equal(second.length, first.length, `${second}`);
    assert.ok(first.every((d) => !existsSync(d)), `left after the mode change: ${first}`);
    await sb.dispose("test");
    assert.deepEqual(fresh(), [], "left after dispose");
  });

  test("a /scratch that grows past PI_PYTHON_TOOL_SCRATCH_NOTE is noted once, off the warm path", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    await sb.execute("print(1)"); // the first walk: an empty scratch
    assert.ok(await waitUntil(() => sb.status().containment.scratchBytes !== undefined, 2000));
    assert.ok((sb.status().containment.scratchBytes ?? 0) < 1024 * 1024);
    const write = await sb.execute(py`
      import os
      with open("/scratch/two-mib.bin", "wb") as f:
          f.write(os.urandom(2 << 20))
      os.symlink("/usr", "/scratch/usr-link")
    `);
    assert.equal(write.notes.length, 0, "no walk within 5 s of the last: nothing is measured yet");
    await sleep(5100);
    await sb.execute("pass"); // starts a walk, after its result
    assert.ok(await waitUntil(() => (sb.status().containment.scratchBytes ?? 0) >= 2 << 20, 3000));
    const noted = await sb.execute("pass");
    const note = noted.notes.find((n) => n.startsWith("/scratch now holds"));
    assert.ok(note, show(noted));
    assert.match(note, /2 MiB on the host's disk, past the 1 MiB this tool notes \(PI_SANDBOX_SCRATCH_NOTE\)/);
    assert.match(sb.status().text, /scratch disk use: 2 MiB at the last check \(PAST THE THRESHOLD\)/);
    const again = await sb.execute("pass");
    assert.ok(!again.notes.some((n) => n.startsWith("/scratch now holds")), "said once per crossing");
  });
});
