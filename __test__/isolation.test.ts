/**
 * Integration tests of the PythonSandbox addon against the real bubblewrap + seccomp sandbox:
 * what the sandbox can see and reach (mounts, environment, /proc, host files and sockets,
 * privileges, read roots).
 * Run: node --import tsx --test __test__/isolation.test.ts (with or without
 * PI_PYTHON_TOOL_ROLLBACK=0: where the process tree depends on it, the test asserts the setting
 * in force).
 *
 * One named test per behaviour. Every test skips loudly (never under CI=true) where bwrap cannot
 * run, and owns its project directory, runtime root and sandboxes (cleaned up in t.after).
 * Independent tests run concurrently inside each suite. Its sandboxes keep no spare
 * (makeFixtureWithoutSpare): what a test finds on the host is its own sandbox alone.
 * The escape attempts with an unfiltered baseline are in escapes*.test.ts.
 */
import assert from "node:assert/strict";
import { randomUUID } from "node:crypto";
import { existsSync, readFileSync } from "node:fs";
import { mkdir, readdir, readFile, stat, symlink, writeFile } from "node:fs/promises";
import { createServer, type Server } from "node:net";
import { homedir } from "node:os";
import { join } from "node:path";
import { describe, test } from "node:test";
import {
  assertOk,
  FIXTURE_CONTENT,
  jsonOut,
  lit,
  hostPidsWithCmdline,
  makeFixtureWithoutSpare as makeFixture,
  py,
  sleep,
} from "./helpers/sandbox-fixture.ts";
import { ROLLBACK, skipWithoutSandbox } from "./helpers/sandbox-env.ts";

const CONCURRENCY = 4;

// ---------------------------------------------------------------------------------------------
describe("isolation", { concurrency: CONCURRENCY }, () => {
  test("/workspace is read-only and the host file stays unchanged", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb, project } = await makeFixture(t);
    const r = await sb.execute(py`
      import json, os
      def attempt(fn):
          try:
              fn()
              return "allowed"
          except OSError as e:
              return e.errno
      print(json.dumps({
          "read": open("/workspace/data.txt").read(),
          "overwrite": attempt(lambda: open("/workspace/data.txt", "w").write("pwned")),
          "append": attempt(lambda: open("data.txt", "a").write("pwned")),
          "remove": attempt(lambda: os.remove("/workspace/data.txt")),
          "create": attempt(lambda: open("/workspace/new.txt", "w")),
          "mkdir": attempt(lambda: os.mkdir("/workspace/d")),
      }))
    `);
    const out = jsonOut(r);
    assert.equal(out.read, FIXTURE_CONTENT);
    for (const op of ["overwrite", "append", "remove", "create", "mkdir"]) {
      assert.equal(out[op], 30, `${op}: expected EROFS, got ${out[op]}`);
    }
    assert.equal(await readFile(join(project, "data.txt"), "utf8"), FIXTURE_CONTENT);
    assert.deepEqual(await readdir(project), ["data.txt"]);
    assert.equal(sb.status().workspaceMode, "read-only");
  });

  test("cwd is /workspace and /scratch is the host scratch directory", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    const r = await sb.execute(
      "import os\nopen('/scratch/from-sandbox.txt', 'w').write('inside')\n(os.getcwd(), open('data.txt').read())",
    );
    assertOk(r);
    assert.equal(r.repr, "('/workspace', 'fixture-content\\n')");
    const scratchDir = sb.status().paths.scratchDir;
    assert.ok(scratchDir);
    assert.equal(await readFile(join(scratchDir, "from-sandbox.txt"), "utf8"), "inside");
    await writeFile(join(scratchDir, "from-host.txt"), "outside");
    assert.equal((await sb.execute("open('/scratch/from-host.txt').read()")).repr, "'outside'");
    const mode = (await stat(scratchDir)).mode & 0o777;
    assert.equal(mode, 0o700, `scratch mode ${mode.toString(8)}`);
  });

  test("the environment holds only the sandbox's variables, never the host's", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const secret = `pps-secret-${randomUUID()}`;
    process.env.PI_SANDBOX_TEST_SECRET = secret;
    t.after(() => {
      delete process.env.PI_SANDBOX_TEST_SECRET;
    });
    const { sb, runtimeRoot } = await makeFixture(t);
    const r = await sb.execute(py`
      import json, os, subprocess
      child = subprocess.run(["env"], capture_output=True, text=True).stdout
      print(json.dumps({
          "env": dict(os.environ),
          "child": sorted(line.split("=", 1)[0] for line in child.splitlines()),
          "environ": open("/proc/self/environ").read(),
      }))
    `);
    const out = jsonOut(r);
    // Exactly the documented --clearenv + --setenv set (the worker drops the PWD bwrap exports).
    assert.deepEqual(out.env, { HOME: "/scratch", LANG: "C.UTF-8", PATH: "/usr/bin:/bin", TMPDIR: "/tmp" });
    assert.deepEqual(out.child, ["HOME", "LANG", "PATH", "TMPDIR"]);
    assert.ok(!r.stdout.includes(secret), "the host secret reached the sandbox");
    // Nor does bwrap itself carry the host environment.
    const bwraps = hostPidsWithCmdline(runtimeRoot);
    assert.ok(bwraps.length > 0, "no sandbox process found on the host");
    for (const pid of bwraps) {
      try {
        assert.ok(!readFileSync(`/proc/${pid}/environ`).includes(secret), `pid ${pid} has the secret`);
      } catch (e) {
        if ((e as NodeJS.ErrnoException).code !== "ENOENT") throw e;
      }
    }
  });

  test("/proc shows only the sandbox's own processes: PID 1, the interpreter and, with rollback, its copy", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    const look = py`
      import json, os
      pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
      def parent(p):
          return int(open("/proc/%d/stat" % p).read().rsplit(")", 1)[1].split()[1])
      print(json.dumps({"pids": pids, "me": os.getpid(), "host": os.path.exists("/proc/${process.pid}"),
                        "init": open("/proc/1/cmdline").read().split("\0"), "parents": [parent(p) for p in pids]}))
    `;
    const first = jsonOut(await sb.execute(look));
    const second = jsonOut(await sb.execute(look));
    for (const out of [first, second]) {
      assert.equal(out.me, 2);
      assert.equal(out.host, false, "the host node process is visible");
    }
    if (ROLLBACK) {
      // PID 1 is the keeper (the worker that never runs code), the interpreter its child; from
      // the second call on, the call's rollback copy (forked by the interpreter between calls).
      assert.match(first.init[0], /python3[.\d]*$/, first.init.join(" "));
      assert.ok(first.init.includes("/worker.py") && first.init.includes("--keeper"), first.init.join(" "));
      assert.deepEqual([first.pids, first.parents], [[1, 2], [0, 1]], "the keeper and the interpreter");
      assert.equal(second.pids.length, 3, JSON.stringify(second));
      assert.deepEqual([second.pids.slice(0, 2), second.parents], [[1, 2], [0, 1, 2]], "and the interpreter's copy");
    } else {
      // PID 1 is bubblewrap's init, the interpreter its only child, the same on every call.
      for (const out of [first, second]) {
        assert.match(out.init[0], /bwrap$/, out.init.join(" "));
        assert.deepEqual([out.pids, out.parents], [[1, 2], [0, 1]], "only bwrap's init and the worker");
      }
    }
  });

  test("host secrets are unreachable: /etc/shadow, the home directory, host temp files", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb, base, project } = await makeFixture(t);
    const canaryText = `pps-canary-${randomUUID()}`;
    const canary = join(base, "canary.txt");
    await writeFile(canary, canaryText);
    await symlink(canary, join(project, "abs-link"));
    await symlink("../canary.txt", join(project, "rel-link"));
    const home = homedir();
    const r = await sb.execute(py`
      import json, os, subprocess
      # The read hook refuses these first (SandboxReadDenied); the kernel
      # mounts are the enforcement, shown by the same reads from a subprocess.
      def read(path):
          try:
              with open(path) as f:
                  return "READ:" + f.read()
          except Exception as e:
              return type(e).__name__
      def listing(path):
          try:
              return "LISTED:" + ",".join(os.listdir(path))
          except Exception as e:
              return type(e).__name__
      def cat(path):
          r = subprocess.run(["cat", path], capture_output=True, text=True)
          return "READ:" + r.stdout if r.returncode == 0 else "failed"
      print(json.dumps({
          "shadow": read("/etc/shadow"),
          "passwd": read("/etc/passwd"),
          "home": listing(${lit(home)}),
          "canary": read(${lit(canary)}),
          "abs-link": read("/workspace/abs-link"),
          "rel-link": read("/workspace/rel-link"),
          "tmp": listing("/tmp"),
          "base": listing(${lit(base)}),
          "shadow-sub": cat("/etc/shadow"),
          "canary-sub": cat(${lit(canary)}),
          "abs-link-sub": cat("/workspace/abs-link"),
      }))
    `);
    const out = jsonOut(r);
    // The project's host path is a link to /workspace; under /tmp (the sandbox's own tmpfs) the
    // link and the directories above it are all /tmp holds, and all the sandbox's `base` holds.
    const inTmp = project.startsWith("/tmp/");
    for (const [what, value] of Object.entries(out)) {
      if (what === "tmp" || (what === "base" && inTmp)) continue;
      assert.ok(!String(value).startsWith("READ:") && !String(value).startsWith("LISTED:"), `${what}: ${value}`);
    }
    assert.equal(out.tmp, `LISTED:${inTmp ? project.split("/")[2] : ""}`, "/tmp is a private tmpfs with the project's link alone");
    if (inTmp) assert.equal(out.base, "LISTED:project", "the sandbox's own directory above the link, not the host's");
    assert.ok(!r.stdout.includes(canaryText));
  });

  test("a TCP connection to a host loopback server fails", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    let connections = 0;
    const server: Server = createServer((c) => {
      connections++;
      c.destroy();
    });
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    t.after(() => new Promise<void>((resolve) => server.close(() => resolve())));
    const port = (server.address() as { port: number }).port;
    const r = await sb.execute(py`
      import socket
      try:
          socket.create_connection(("127.0.0.1", ${port}), timeout=3)
          outcome = "connected"
      except OSError as e:
          outcome = (type(e).__name__, e.errno)
      outcome
    `);
    assertOk(r);
    assert.equal(r.repr, "('PermissionError', 1)");
    await sleep(100);
    assert.equal(connections, 0);
  });

  test("an AF_UNIX connection to a socket bound in the project fails", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb, project } = await makeFixture(t);
    let connections = 0;
    const server: Server = createServer((c) => {
      connections++;
      c.destroy();
    });
    await new Promise<void>((resolve) => server.listen(join(project, "host.sock"), resolve));
    t.after(() => new Promise<void>((resolve) => server.close(() => resolve())));
    const r = await sb.execute(py`
      import os, socket
      assert os.path.exists("/workspace/host.sock")
      try:
          s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
          s.connect("/workspace/host.sock")
          outcome = "connected"
      except OSError as e:
          outcome = (type(e).__name__, e.errno)
      outcome
    `);
    assertOk(r);
    assert.equal(r.repr, "('PermissionError', 1)");
    await sleep(100);
    assert.equal(connections, 0);
  });

  test("no_new_privs is set, seccomp is in filter mode and no capabilities remain", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    const r = await sb.execute(py`
      import json, subprocess
      def fields(text):
          return {k: v.strip() for k, v in (l.split(":", 1) for l in text.splitlines() if ":" in l)}
      own = fields(open("/proc/self/status").read())
      child = fields(subprocess.run(["cat", "/proc/self/status"], capture_output=True, text=True).stdout)
      keys = ["NoNewPrivs", "Seccomp", "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"]
      print(json.dumps([{k: own[k] for k in keys}, {k: child[k] for k in keys}]))
    `);
    const zero = "0000000000000000";
    const expected = { NoNewPrivs: "1", Seccomp: "2", CapInh: zero, CapPrm: zero, CapEff: zero, CapBnd: zero, CapAmb: zero };
    const [own, child] = jsonOut(r);
    assert.deepEqual(own, expected);
    assert.deepEqual(child, expected, "a subprocess inherits the confinement");
  });

  test("workspaceWritable mounts the project read-write", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const fx = await makeFixture(t);
    const sb = fx.open({ workspaceWritable: true });
    assert.equal(sb.status().workspaceMode, "read-write");
    const r = await sb.execute("open('/workspace/new.txt', 'w').write('written')\nopen('data.txt', 'a').write('more')\nNone");
    assertOk(r);
    assert.equal(await readFile(join(fx.project, "new.txt"), "utf8"), "written");
    assert.equal(await readFile(join(fx.project, "data.txt"), "utf8"), `${FIXTURE_CONTENT}more`);
  });

  test("readRoots are mounted read-only at their own host paths", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const fx = await makeFixture(t);
    const root = join(fx.base, "granted");
    const other = join(fx.base, "not-granted");
    await mkdir(root);
    await mkdir(other);
    await writeFile(join(root, "f.txt"), "granted-content");
    await writeFile(join(other, "f.txt"), "other-content");
    const sb = fx.open({ readRoots: [root] });
    const r = await sb.execute(py`
      import json
      def attempt(fn):
          try:
              return fn()
          except OSError as e:
              return type(e).__name__ + ":" + str(e.errno)
      print(json.dumps({
          "read": attempt(lambda: open(${lit(join(root, "f.txt"))}).read()),
          "write": attempt(lambda: open(${lit(join(root, "new.txt"))}, "w") and "written"),
          "other": attempt(lambda: open(${lit(join(other, "f.txt"))}).read()),
      }))
    `);
    assert.deepEqual(jsonOut(r), { read: "granted-content", write: "OSError:30", other: "FileNotFoundError:2" });
    assert.deepEqual(sb.status().readRoots, [root]);
    assert.equal(existsSync(join(root, "new.txt")), false);
  });

  test("nested user namespaces cannot be created", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    const r = await sb.execute(py`
      import ctypes, json, subprocess
      libc = ctypes.CDLL(None, use_errno=True)
      ret = libc.unshare(0x10000000)  # CLONE_NEWUSER
      err = ctypes.get_errno()
      tool = subprocess.run(["unshare", "-U", "true"], capture_output=True, text=True)
      print(json.dumps({"ret": ret, "errno": err, "tool": tool.returncode}))
    `);
    const out = jsonOut(r);
    assert.equal(out.ret, -1, "unshare(CLONE_NEWUSER) succeeded");
    assert.notEqual(out.errno, 0);
    assert.notEqual(out.tool, 0, "`unshare -U true` succeeded");
  });
});
