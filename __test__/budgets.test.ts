/**
 * Per-user and host-wide kernel budgets a sandbox shares with the host: what one sandbox may take
 * of them, seen from the host while a process inside holds all it could get. Each attempt runs
 * first in a bare bubblewrap (the sandbox's namespaces without its filter, rlimits or network
 * settings), where it takes more than the sandbox's bound (the host user's whole budget, where it
 * is one), then through the python tool and the bash tool. As root, the file runs again as nobody.
 * Run: node --import tsx --test __test__/budgets.test.ts (and with PI_PYTHON_TOOL_ROLLBACK=0)
 */
import assert from "node:assert/strict";
import { type ChildProcess, spawn, spawnSync } from "node:child_process";
import { once } from "node:events";
import { accessSync, constants, readFileSync, writeFileSync } from "node:fs";
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

/** The sandbox's `net.ipv4.tcp_rmem` and `tcp_wmem` (`TCP_RMEM`, `TCP_WMEM` in src/nshelper/listen.rs). */
const TCP_RMEM = "4096 131072 524288";
const TCP_WMEM = "4096 16384 524288";
/** Pairs of connected sockets the filler makes: a bound on what the test itself takes. */
const PAIRS = 16;
/**
 * What PAIRS filled pairs may hold in the sandbox: each of their sockets a full send and receive
 * buffer (most of tcp_wmem and tcp_rmem), and a quarter more for what the kernel lets a buffer
 * pass its size by (one packet) and keeps in reserve per CPU; in pages. With the host's settings
 * (tcp_wmem's most is 4 MiB by default) the same pairs take several times as much.
 */
const TCP_BOUND = Math.ceil((PAIRS * 2 * (524288 + 524288) * 1.25) / 4096);

/**
 * Listens on 127.0.0.1 (the sandbox's own loopback), connects the pairs its first argument says
 * to it and writes into both sockets of each, never reading, until no socket takes more; prints
 * the pairs and bytes it wrote, then holds them until the file named by its second argument
 * exists. A third argument sets each socket's SO_SNDBUF and SO_RCVBUF to that many bytes first.
 * Bounded: the pairs asked for, 40 rounds.
 */
const FILLER = py`
  import os, socket, sys, time
  pairs = int(sys.argv[1])
  listener = socket.socket()
  listener.bind(("127.0.0.1", 0))
  listener.listen(pairs)
  held = []
  for _ in range(pairs):
      c = socket.create_connection(listener.getsockname())
      s, _ = listener.accept()
      held += [c, s]
  for x in held:
      if len(sys.argv) > 3:
          x.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, int(sys.argv[3]))
          x.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, int(sys.argv[3]))
      x.setblocking(False)
  chunk, sent = b"x" * 65536, 0
  for _ in range(40):
      more = 0
      for x in held:
          while True:
              try:
                  n = x.send(chunk)
              except BlockingIOError:
                  break
              more += n
      sent += more
      if not more:
          break
      time.sleep(0.02)
  print("filled", len(held) // 2, sent, flush=True)
  while not os.path.exists(sys.argv[2]):
      time.sleep(0.01)
`;

/** The host's TCP socket memory in pages: /proc/net/sockstat's count, one for every namespace. */
function tcpMem(): number {
  const m = /^TCP: .* mem (\d+)$/m.exec(readFileSync("/proc/net/sockstat", "utf8"));
  assert.ok(m, "/proc/net/sockstat has a TCP line");
  return Number(m[1]);
}

/**
 * The host's TCP memory once it has stopped falling (at most 10 s): the sockets of a test just
 * ended are freed some time after its sandbox is gone, and would otherwise be taken off what the
 * next test's filler adds (8 pairs that took 65,000 pages were once seen to take 22).
 */
async function settledTcpMem(): Promise<number> {
  let last = tcpMem();
  for (let i = 0; i < 40; i++) {
    await new Promise((resolve) => setTimeout(resolve, 250));
    const now = tcpMem();
    if (now >= last - 64) return now;
    last = now;
  }
  return last;
}

const filled = (text: string) => {
  const m = /filled (\d+) (\d+)/.exec(text);
  assert.ok(m, `the filler said ${JSON.stringify(text)}`);
  return { pairs: Number(m[1]), bytes: Number(m[2]) };
};

/** The filler run in a bare bubblewrap with `args`: what it said, and how much the host's TCP memory grew meanwhile. */
async function bareFill(t: TestContext, args: string[]): Promise<{ held: ReturnType<typeof filled>; grew: number }> {
  const { base } = await makeFixture(t);
  const stop = join(base, "stop");
  const argv = [
    "--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-net", "--die-with-parent",
    "--new-session", "--ro-bind", "/usr", "/usr", "--symlink", "usr/lib", "/lib", "--symlink", "usr/lib64", "/lib64",
    "--symlink", "usr/bin", "/bin", "--proc", "/proc", "--dev", "/dev", "--bind", base, base,
    "--", "/usr/bin/python3", "-I", "-S", "-c", FILLER, args[0], stop, ...args.slice(1),
  ];
  const before = await settledTcpMem();
  const child = spawn("bwrap", argv, { stdio: ["ignore", "pipe", "inherit"] });
  child.stdout.setEncoding("utf8");
  t.after(() => child.kill("SIGKILL"));
  const held = filled(await firstLine(child));
  const grew = tcpMem() - before;
  writeFileSync(stop, "");
  await once(child, "exit");
  return { held, grew };
}

/** Whether this host gives the sandbox a cgroup v1 memory cgroup (as root where it is mounted, as here). */
function memoryCgroupV1(): boolean {
  if (!readFileSync("/proc/self/cgroup", "utf8").split("\n").some((l) => /^\d+:memory:/.test(l))) return false;
  try {
    accessSync("/sys/fs/cgroup/memory", constants.W_OK);
    return true;
  } catch {
    return false;
  }
}

/** The sandbox's TCP limit on cgroup v1 (`TCP_MAX` in src/contain.rs), in pages. */
const CGROUP_TCP = (64 << 20) / 4096;
/** Pairs whose sockets ask for 4 MiB buffers (8 MiB each, by the kernel's doubling): far past CGROUP_TCP. */
const BIG_PAIRS = 8;
const BIG_BUFFER = String(4 << 20);

/** A network part that gives the tools the proxy (nothing is reached through it here). */
const NETWORK = { mode: "proxy" as const, allowedDomains: [], deniedDomains: [], allowPrivate: [], python: true };

/** The sandbox's `net.ipv4.tcp_rmem` and `tcp_wmem` lines, as the filler's runs below print them first. */
const readTcpMem = `print("rmem", *open("/proc/sys/net/ipv4/tcp_rmem").read().split(), "wmem", *open("/proc/sys/net/ipv4/tcp_wmem").read().split())`;

/**
 * The filler run with `args` in the background of a python call, in a sandbox with the network
 * on: what the call printed (the sandbox's tcp_rmem and tcp_wmem, then the filler's line), what the
 * filler said, and how much the host's TCP memory grew while it held its pairs.
 */
async function pythonFill(t: TestContext, args: string[]): Promise<{ out: string; held: ReturnType<typeof filled>; grew: number }> {
  const { sb } = await makeFixture(t);
  sb.setShellConfig({ network: NETWORK });
  const before = await settledTcpMem();
  const r = await sb.execute(py`
    import subprocess, sys
    ${readTcpMem}
    p = subprocess.Popen([sys.executable, "-I", "-S", "-c", ${lit(FILLER)}, ${lit(args[0])}, "/tmp/stop", *${JSON.stringify(args.slice(1))}], stdout=subprocess.PIPE, text=True, start_new_session=True)
    print(p.stdout.readline().strip())
  `);
  const grew = tcpMem() - before;
  const stopped = await sb.execute(`open("/tmp/stop", "w").close()`);
  assert.equal(stopped.status, "ok", show(stopped));
  assert.equal(r.status, "ok", show(r));
  return { out: r.stdout, held: filled(r.stdout), grew };
}

/**
 * The filler run with `args` by a bash command in a sandbox with the network on: what the command
 * printed (`cat` of the sandbox's tcp_rmem and tcp_wmem, then the filler's line), what the filler
 * said, and how much the host's TCP memory grew by the time it said so.
 */
async function bashFill(t: TestContext, args: string[]): Promise<{ out: string; held: ReturnType<typeof filled>; grew: number }> {
  const { sb, project } = await makeFixture(t);
  sb.setShellConfig({ network: NETWORK });
  const stop = join(project, "stop");
  writeFileSync(join(project, "filler.py"), FILLER);
  let out = "";
  let grew: number | undefined;
  const before = await settledTcpMem();
  const command = `cat /proc/sys/net/ipv4/tcp_rmem /proc/sys/net/ipv4/tcp_wmem; python3 -I -S filler.py ${args[0]} ${stop} ${args.slice(1).join(" ")}`;
  const r = await sb.execShell(1, command, { cwd: project }, (text: string) => {
    out += text;
    if (grew === undefined && out.includes("filled")) {
      grew = tcpMem() - before;
      writeFileSync(stop, "");
    }
  });
  assert.equal(r.exitCode, 0, out);
  assert.ok(grew !== undefined, out);
  return { out, held: filled(out), grew };
}

/** With a cgroup v1 memory cgroup, `grew` is at most its TCP limit; without one, more (what docs/security.md says). */
function assertCgroupTcp(held: ReturnType<typeof filled>, grew: number): void {
  if (memoryCgroupV1()) {
    assert.ok(grew <= CGROUP_TCP * 1.1, `${BIG_PAIRS} pairs (${held.bytes} bytes written) took ${grew} pages, the limit is ${CGROUP_TCP}`);
  } else {
    // No memory cgroup, no bound on the total but the sockets'.
    assert.ok(grew > CGROUP_TCP * 1.1, `${BIG_PAIRS} pairs (${held.bytes} bytes written) took ${grew} pages`);
  }
}

describe("TCP socket memory (net.ipv4.tcp_mem, one count for the whole host) with the network on", () => {
  test("baseline: pairs filled on a bare bubblewrap's own loopback take more than the sandbox's bound", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { held, grew } = await bareFill(t, [String(PAIRS)]);
    t.diagnostic(`${PAIRS} pairs took ${grew} pages (bound ${TCP_BOUND})`);
    assert.equal(held.pairs, PAIRS);
    assert.ok(grew > TCP_BOUND, `${PAIRS} pairs (${held.bytes} bytes written) took ${grew} pages, the bound is ${TCP_BOUND}`);
  });

  test("python: pairs filled on the sandbox's loopback take at most its bound of the host's TCP memory", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { out, held, grew } = await pythonFill(t, [String(PAIRS)]);
    t.diagnostic(`${PAIRS} pairs took ${grew} pages (bound ${TCP_BOUND})`);
    assert.equal(held.pairs, PAIRS, out);
    assert.ok(grew <= TCP_BOUND, `${PAIRS} pairs (${held.bytes} bytes written) took ${grew} pages, the bound is ${TCP_BOUND}`);
    assert.ok(out.includes(`rmem ${TCP_RMEM} wmem ${TCP_WMEM}\n`), out);
  });

  test("bash: pairs filled on the sandbox's loopback take at most its bound of the host's TCP memory", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { out, held, grew } = await bashFill(t, [String(PAIRS)]);
    t.diagnostic(`${PAIRS} pairs took ${grew} pages (bound ${TCP_BOUND})`);
    assert.equal(held.pairs, PAIRS, out);
    assert.ok(grew <= TCP_BOUND, `${PAIRS} pairs (${held.bytes} bytes written) took ${grew} pages, the bound is ${TCP_BOUND}`);
    assert.ok(out.startsWith(`${TCP_RMEM.replaceAll(" ", "\t")}\n${TCP_WMEM.replaceAll(" ", "\t")}\n`), out);
  });

  test("baseline: pairs whose sockets raise SO_SNDBUF and SO_RCVBUF take more than the cgroup's TCP limit in a bare bubblewrap", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { held, grew } = await bareFill(t, [String(BIG_PAIRS), BIG_BUFFER]);
    t.diagnostic(`${BIG_PAIRS} pairs took ${grew} pages (cgroup TCP limit ${CGROUP_TCP})`);
    assert.equal(held.pairs, BIG_PAIRS);
    assert.ok(grew > CGROUP_TCP * 1.1, `${BIG_PAIRS} pairs (${held.bytes} bytes written) took ${grew} pages`);
  });

  test("python: sockets that raise SO_SNDBUF and SO_RCVBUF take at most the memory cgroup's TCP limit (cgroup v1); without a memory cgroup, more", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { out, held, grew } = await pythonFill(t, [String(BIG_PAIRS), BIG_BUFFER]);
    t.diagnostic(`${BIG_PAIRS} pairs took ${grew} pages (cgroup TCP limit ${CGROUP_TCP})`);
    assert.equal(held.pairs, BIG_PAIRS, out);
    assertCgroupTcp(held, grew);
  });

  test("bash: sockets that raise SO_SNDBUF and SO_RCVBUF take at most the memory cgroup's TCP limit (cgroup v1); without a memory cgroup, more", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { out, held, grew } = await bashFill(t, [String(BIG_PAIRS), BIG_BUFFER]);
    t.diagnostic(`${BIG_PAIRS} pairs took ${grew} pages (cgroup TCP limit ${CGROUP_TCP})`);
    assert.equal(held.pairs, BIG_PAIRS, out);
    assertCgroupTcp(held, grew);
  });
});

const AS_NOBODY_ENV = "PPS_BUDGETS_AS_NOBODY";

test("as nobody: every test above passes unprivileged", { skip: process.env[AS_NOBODY_ENV] === "1" ? "this is the nobody run" : false }, (t: TestContext) => {
  rerunAsNobody(t, "__test__/budgets.test.ts", AS_NOBODY_ENV, 9);
});
