/**
 * Per-user kernel budgets a sandbox shares with the host: what one sandbox may take of them, seen
 * from the host while a process inside holds all it could get. Each attempt runs first in a bare
 * bubblewrap (the sandbox's namespaces without its filter or rlimits), where it takes the host
 * user's whole budget, then through the python tool and the bash tool. As root, the file runs
 * again as nobody.
 * Run: node --import tsx --test __test__/budgets.test.ts (and with PI_PYTHON_TOOL_ROLLBACK=0)
 */
import assert from "node:assert/strict";
import { type ChildProcess, spawn, spawnSync } from "node:child_process";
import { once } from "node:events";
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { describe, type TestContext, test } from "node:test";
import { rerunAsNobody } from "./helpers/as-nobody.ts";
import { skipWithoutSandbox } from "./helpers/sandbox-env.ts";
import { jsonOut, lit, makeFixtureWithoutSpare as makeFixture, py, show } from "./helpers/sandbox-fixture.ts";

/** The sandbox's bound on queued signals (`RLIMIT_SIGPENDING` in src/spawn.rs). */
const SIGPENDING = 1024;

/**
 * Blocks SIGRTMIN and queues it to itself until the kernel refuses; prints how many it queued and
 * the errno of the refusal, then holds them until the file named by its argument exists, taking
 * again every slot another program of the user frees meanwhile.
 */
const HOLDER = py`
  import ctypes, os, signal, sys, time
  libc = ctypes.CDLL(None, use_errno=True)
  signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGRTMIN])
  queue = lambda: libc.sigqueue(os.getpid(), signal.SIGRTMIN, ctypes.c_void_p(0)) == 0
  n = 0
  while queue():
      n += 1
  print("queued", n, ctypes.get_errno(), flush=True)
  while not os.path.exists(sys.argv[1]):
      queue()
      time.sleep(0.001)
`;

/**
 * On the host, as the test's user: the errno of each of 10 attempts to make a POSIX timer and to
 * queue a signal that failed (none: all 10 worked). The user's other programs free slots now and
 * then, which a single attempt could take even while a holder keeps taking them.
 */
function hostCanQueue(): { timer: number[]; sigqueue: number[] } {
  const code = py`
    import ctypes, json, os, signal
    libc = ctypes.CDLL(None, use_errno=True)
    signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGRTMIN])
    out = {"timer": [], "sigqueue": []}
    for _ in range(10):
        timer = ctypes.c_void_p()
        if libc.timer_create(1, None, ctypes.byref(timer)) != 0:
            out["timer"].append(ctypes.get_errno())
        if libc.sigqueue(os.getpid(), signal.SIGRTMIN, ctypes.c_void_p(0)) != 0:
            out["sigqueue"].append(ctypes.get_errno())
    print(json.dumps(out))
  `;
  const r = spawnSync("/usr/bin/python3", ["-I", "-S", "-c", code], { encoding: "utf8", timeout: 10_000 });
  assert.equal(r.status, 0, r.stderr);
  return JSON.parse(r.stdout);
}

const EAGAIN = 11;
const queued = (line: string) => {
  const m = /queued (\d+) (\d+)/.exec(line);
  assert.ok(m, `the holder said ${JSON.stringify(line)}`);
  return { n: Number(m[1]), errno: Number(m[2]) };
};

/** Wait for `child`'s stdout to hold a whole line. */
async function firstLine(child: ChildProcess): Promise<string> {
  let out = "";
  for await (const chunk of child.stdout!) {
    out += chunk;
    if (out.includes("\n")) return out;
  }
  throw new Error(`ended before a line: ${JSON.stringify(out)}`);
}

describe("queued signals (RLIMIT_SIGPENDING, counted per user up the namespaces)", () => {
  test("baseline: a process in a bare bubblewrap takes the host user's whole budget", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { base } = await makeFixture(t);
    const stop = join(base, "stop");
    const argv = [
      "--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-net", "--die-with-parent",
      "--new-session", "--ro-bind", "/usr", "/usr", "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64",
      "--symlink", "usr/bin", "/bin", "--proc", "/proc", "--dev", "/dev", "--bind", base, base,
      "--", "/usr/bin/python3", "-I", "-S", "-c", HOLDER, stop,
    ];
    const child = spawn("bwrap", argv, { stdio: ["ignore", "pipe", "inherit"] });
    child.stdout.setEncoding("utf8");
    t.after(() => child.kill("SIGKILL"));
    const held = queued(await firstLine(child));
    const host = hostCanQueue();
    writeFileSync(stop, "");
    await once(child, "exit");
    assert.equal(held.errno, EAGAIN);
    assert.ok(held.n > SIGPENDING, `it queued ${held.n}`);
    assert.ok(host.timer.length > 0 && host.sigqueue.length > 0, `the host's user was refused: ${JSON.stringify(host)}`);
    assert.ok([...host.timer, ...host.sigqueue].every((e) => e === EAGAIN), JSON.stringify(host));
    assert.deepEqual(hostCanQueue(), { timer: [], sigqueue: [] }, "and was not once it ended");
  });

  test("python: a background process queues at most the sandbox's bound; the host's timers and signals still work", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    const r = await sb.execute(py`
      import subprocess, sys
      p = subprocess.Popen([sys.executable, "-I", "-S", "-c", ${lit(HOLDER)}, "/tmp/stop"], stdout=subprocess.PIPE, text=True, start_new_session=True)
      print(p.stdout.readline().strip())
    `);
    const held = queued(r.stdout);
    const host = hostCanQueue();
    assert.equal(held.errno, EAGAIN, show(r));
    assert.ok(held.n <= SIGPENDING, `it queued ${held.n}`);
    assert.deepEqual(host, { timer: [], sigqueue: [] }, "the host's user can still queue signals");
    assert.equal(jsonOut(await sb.execute(`import json, resource; print(json.dumps(resource.getrlimit(resource.RLIMIT_SIGPENDING)))`)).join(), `${SIGPENDING},${SIGPENDING}`);
  });

  test("bash: a command queues at most the sandbox's bound; the host's timers and signals still work", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb, project } = await makeFixture(t);
    const stop = join(project, "stop");
    writeFileSync(join(project, "holder.py"), HOLDER);
    let out = "";
    let host: ReturnType<typeof hostCanQueue> | undefined;
    const r = await sb.execShell(1, `python3 -I -S holder.py ${stop}`, { cwd: project }, (text: string) => {
      out += text;
      if (!host && out.includes("\n")) {
        host = hostCanQueue();
        writeFileSync(stop, "");
      }
    });
    assert.equal(r.exitCode, 0, out);
    const held = queued(out);
    assert.equal(held.errno, EAGAIN, out);
    assert.ok(held.n <= SIGPENDING, `it queued ${held.n}`);
    assert.deepEqual(host, { timer: [], sigqueue: [] }, "the host's user can still queue signals");
  });
});

const AS_NOBODY_ENV = "PPS_BUDGETS_AS_NOBODY";

test("as nobody: every test above passes unprivileged", { skip: process.env[AS_NOBODY_ENV] === "1" ? "this is the nobody run" : false }, (t: TestContext) => {
  rerunAsNobody(t, "__test__/budgets.test.ts", AS_NOBODY_ENV, 3);
});
