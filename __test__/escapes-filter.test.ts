/**
 * The escape catalogue, continued: the default-deny seccomp filter and the RAM a sandbox can hold
 * beyond one process's life. One named test per attempt, each run from inside the sandbox through
 * the addon, each with a baseline OUTSIDE the defence that shows the attempt works there.
 * Run: node --import tsx --test --test-concurrency=1 __test__/escapes-filter.test.ts
 *
 * The baseline is the catalogue's one (helpers/unfiltered.ts): bubblewrap with the sandbox's
 * namespaces and every capability of its user namespace, without the filter, and with the mounts
 * the sandbox made before it sized them: an unsized `--tmpfs /tmp`, and `--dev /dev`, whose
 * /dev/shm is a folder of that unsized, writable tmpfs.
 *
 * Also here: what must keep working under the allowlist (Python's threads, subprocesses,
 * multiprocessing, sh and coreutils, git, numpy, pandas and matplotlib from a user venv).
 */
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { chmodSync, mkdirSync, mkdtempSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, type TestContext, test } from "node:test";
import { sandboxSkipReason, skipWithoutSandbox } from "./helpers/sandbox-env.ts";
import { unfiltered } from "./helpers/unfiltered.ts";
import { jsonOut, lit, makeFixture, PythonSandbox, py, show } from "./helpers/sandbox-fixture.ts";
import { venvOrSkip } from "./helpers/test-venv.ts";
import { lastJson, probeTable, skipProbe } from "./helpers/syscall-probes.ts";

const EPERM = 1;
const ENOSYS = 38;
const EROFS = 30;
const ENOSPC = 28;
const MiB = 1 << 20;
const TMP_DEFAULT = 256 * MiB;
const SHM_DEFAULT = 64 * MiB;

const skip = skipProbe;

/** Set environment variables for one test (the addon reads them when a sandbox starts). */
function withEnv(t: TestContext, env: Record<string, string>): void {
  const saved = Object.fromEntries(Object.keys(env).map((k) => [k, process.env[k]]));
  Object.assign(process.env, env);
  t.after(() => {
    for (const [k, v] of Object.entries(saved)) {
      if (v === undefined) delete process.env[k];
      else process.env[k] = v;
    }
  });
}

// ---------------------------------------------------------------------------------------------
/**
 * Calls the filter does not allow, probed all at once (one sandbox, one baseline) and asserted
 * one test per call. Arguments make the unfiltered kernel fail without doing anything (bad
 * descriptors, ids and pointers), so its answer is not the filter's.
 */
interface Probe {
  title: string;
  nr: number;
  args: number[];
  expect: number;
  /** The kernel may lack the call (too old, or not configured): its baseline is reported then. */
  mayLack?: boolean;
}

const PROBES: Probe[] = [
  // Newer than the allowlist (Linux 6.15): the default answers.
  { title: "open_tree_attr", nr: 467, args: [-1, 1, 0xffffffff, 0, 0], expect: ENOSYS, mayLack: true },
  // Left out of the allowlist (Docker allows them only with CAP_SYS_PTRACE or CAP_SYS_ADMIN).
  { title: "pidfd_getfd", nr: 438, args: [-1, 0, 0], expect: ENOSYS },
  { title: "process_madvise", nr: 440, args: [-1, 0, 0, 0, 0], expect: ENOSYS },
  { title: "quotactl_fd", nr: 443, args: [-1, 0, 0, 0], expect: ENOSYS },
  { title: "kcmp", nr: 312, args: [999999, 999999, 0, 0, 0], expect: ENOSYS, mayLack: true },
  // SysV IPC on an id that does not exist: EINVAL when allowed.
  { title: "msgsnd", nr: 69, args: [-1, 0, 0, 0], expect: EPERM },
  { title: "msgrcv", nr: 70, args: [-1, 0, 0, 0, 0], expect: EPERM },
  { title: "msgctl", nr: 71, args: [-1, 2, 0], expect: EPERM },
  { title: "shmat", nr: 30, args: [-1, 0, 0], expect: EPERM },
  { title: "shmdt", nr: 67, args: [1], expect: EPERM },
  { title: "shmctl", nr: 31, args: [-1, 2, 0], expect: EPERM },
  { title: "semop", nr: 65, args: [-1, 0, 0], expect: EPERM },
  { title: "semtimedop", nr: 220, args: [-1, 0, 0, 0], expect: EPERM },
  { title: "semctl", nr: 66, args: [-1, 0, 2, 0], expect: EPERM },
  // Native AIO takes contexts from the host-wide fs.aio-max-nr: a NULL context pointer makes the
  // unfiltered kernel fail with EFAULT (io_setup) or EINVAL before it reserves anything.
  { title: "io_setup", nr: 206, args: [1, 0], expect: EPERM },
  { title: "io_destroy", nr: 207, args: [0], expect: EPERM },
  { title: "io_getevents", nr: 208, args: [0, 0, 0, 0, 0], expect: EPERM },
  { title: "io_submit", nr: 209, args: [0, 0, 0], expect: EPERM },
  { title: "io_cancel", nr: 210, args: [0, 0, 0], expect: EPERM },
  { title: "io_pgetevents", nr: 333, args: [0, 0, 0, 0, 0, 0], expect: EPERM },
  // Host-shared state: a lease on a project file stalls the host's writers (45 s); a directory
  // notification is a kernel mark outside the inotify limits; a secret memory area stops the
  // host from hibernating. A bad descriptor (EBADF) or invalid flags (EINVAL) when allowed.
  { title: "fcntl(F_SETLEASE)", nr: 72, args: [-1, 1024, 0], expect: EPERM },
  { title: "fcntl(F_NOTIFY)", nr: 72, args: [-1, 1026, 0x80000000], expect: EPERM },
  { title: "memfd_secret", nr: 447, args: [0xffffffff], expect: EPERM, mayLack: true },
  // prctl(PR_SET_DUMPABLE, 1): the unfiltered process becomes dumpable (0).
  { title: "prctl(PR_SET_DUMPABLE, 1)", nr: 157, args: [4, 1], expect: EPERM },
];


describe("seccomp default-deny: calls outside the allowlist", { concurrency: 4 }, () => {
  const table = probeTable("filter", PROBES);

  for (const p of PROBES) {
    const name = p.expect === ENOSYS ? `${p.title} answers ENOSYS (not in the allowlist)` : `blocks ${p.title}`;
    test(name, (t) => {
      if (skip(t)) return;
      const [inside, outside] = [table.inside(), table.outside()];
      assert.ok(inside && outside, "the probes did not run");
      assert.deepEqual(inside[p.title], { ret: -1, errno: p.expect }, `${p.title} inside the sandbox`);
      const free = outside[p.title];
      if (p.mayLack && free.errno === ENOSYS) {
        t.diagnostic(`${p.title}: this kernel lacks the call (unfiltered: ${JSON.stringify(free)}); the baseline cannot show it`);
        return;
      }
      assert.notEqual(free.errno, p.expect, `unfiltered, ${p.title} must not answer ${p.expect} (${JSON.stringify(free)})`);
      t.diagnostic(`unfiltered ${p.title}: ${JSON.stringify(free)}`);
    });
  }
});

// ---------------------------------------------------------------------------------------------
describe("memory the sandbox can hold beyond a process", { concurrency: 1 }, () => {
  /**
   * Python: write zeros in files of at most 8 MiB (below RLIMIT_FSIZE) under `dir` until `limit`
   * bytes or an error, delete them again, and print what was written, the error and the size of
   * the file system.
   */
  const fill = (dir: string, limit: number) => py`
    import json, os
    def fill(d, limit):
        block, written, n, err = bytes(1 << 20), 0, 0, None
        try:
            while written < limit:
                fd = os.open("%s/fill%d" % (d, n), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                n += 1
                try:
                    for _ in range(8):
                        if written >= limit:
                            break
                        written += os.write(fd, block[: limit - written])
                finally:
                    os.close(fd)
        except OSError as e:
            err = e.errno
        for i in range(n):
            os.unlink("%s/fill%d" % (d, i))
        st = os.statvfs(d)
        return {"written": written, "errno": err, "size": st.f_blocks * st.f_frsize}
    print(json.dumps(fill(${lit(dir)}, ${limit})))
  `;

  test("/tmp is sized: writing past 256 MiB fails with ENOSPC", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t, { prewarm: false });
    const inside = jsonOut(await sb.execute(fill("/tmp", TMP_DEFAULT + 8 * MiB), 60));
    assert.equal(inside.size, TMP_DEFAULT, JSON.stringify(inside));
    assert.equal(inside.errno, ENOSPC, JSON.stringify(inside));
    assert.ok(inside.written > TMP_DEFAULT - 2 * MiB && inside.written <= TMP_DEFAULT, JSON.stringify(inside));
    // An unsized tmpfs (half the host's RAM) takes 300 MiB.
    const free = lastJson(await unfiltered(fill("/tmp", 300 * MiB)));
    assert.deepEqual([free.written, free.errno], [300 * MiB, null], `unfiltered: ${JSON.stringify(free)}`);
  });

  test("/dev/shm is sized: writing past 64 MiB fails with ENOSPC", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t, { prewarm: false });
    const inside = jsonOut(await sb.execute(fill("/dev/shm", SHM_DEFAULT + 8 * MiB), 60));
    assert.equal(inside.size, SHM_DEFAULT, JSON.stringify(inside));
    assert.equal(inside.errno, ENOSPC, JSON.stringify(inside));
    assert.ok(inside.written > SHM_DEFAULT - 2 * MiB && inside.written <= SHM_DEFAULT, JSON.stringify(inside));
    // In bubblewrap's --dev, /dev/shm is a folder of the unsized /dev tmpfs.
    const free = lastJson(await unfiltered(fill("/dev/shm", 100 * MiB)));
    assert.deepEqual([free.written, free.errno], [100 * MiB, null], `unfiltered: ${JSON.stringify(free)}`);
  });

  test("/dev is read-only; /dev/null, /dev/zero and /dev/urandom still work", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t, { prewarm: false });
    const code = py`
      import json, os
      def attempt(fn):
          try:
              fn()
              return "done"
          except OSError as e:
              return e.errno
      def hoard():
          with open("/dev/hoard", "wb") as f:
              f.write(bytes(8 << 20))
          os.unlink("/dev/hoard")
      print(json.dumps({
          "file": attempt(hoard),
          "dir": attempt(lambda: os.mkdir("/dev/d")),
          "null": attempt(lambda: open("/dev/null", "w").write("x")),
          "zero": len(open("/dev/zero", "rb").read(16)),
          "urandom": len(open("/dev/urandom", "rb").read(16)),
      }))
    `;
    assert.deepEqual(jsonOut(await sb.execute(code)), { file: EROFS, dir: EROFS, null: "done", zero: 16, urandom: 16 });
    const free = lastJson(await unfiltered(code));
    assert.deepEqual([free.file, free.dir], ["done", "done"], `unfiltered: ${JSON.stringify(free)}`);
  });

  /** A real SysV attempt: make the object in a child that exits, then look for it. */
  const sysv = (make: string) => py`
    import ctypes, json, os
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    def sc(nr, *args):
        ctypes.set_errno(0)
        return libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args]), ctypes.get_errno()
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        ${make}
        os.write(w, json.dumps(out).encode())
        os._exit(0)
    os.close(w)
    out = json.loads(os.read(r, 4096))
    os.waitpid(pid, 0)
    out["left"] = [l.split()[:4] for l in open("/proc/sysvipc/" + out["kind"]).read().splitlines()[1:]]
    print(json.dumps(out))
  `;
  const IPC_CREAT_0600 = 0o1000 | 0o600;

  test("blocks SysV message queues (msgget)", async (t) => {
    if (skip(t)) return;
    const { sb } = await makeFixture(t);
    // msgget(IPC_PRIVATE), then msgsnd of a 4 KiB message that stays queued after the child exits.
    const code = sysv(py`
        out = {"kind": "msg", "get": sc(68, 0, ${IPC_CREAT_0600})}
        buf = ctypes.create_string_buffer(8 + 4096)
        ctypes.c_long.from_buffer(buf).value = 1
        out["send"] = sc(69, out["get"][0], ctypes.addressof(buf), 4096, 0)
    `.replaceAll("\n", "\n        "));
    const inside = jsonOut(await sb.execute(code));
    assert.deepEqual(inside.get, [-1, EPERM], JSON.stringify(inside));
    assert.deepEqual(inside.left, [], "a queue exists in the sandbox");
    const free = lastJson(await unfiltered(code));
    assert.ok(free.get[0] >= 0 && free.send[0] === 0, `unfiltered: ${JSON.stringify(free)}`);
    assert.equal(free.left.length, 1, `unfiltered, the queue outlives its maker: ${JSON.stringify(free)}`);
  });

  test("blocks POSIX message queues (mq_open), which a reset could not remove", async (t) => {
    if (skip(t)) return;
    const { sb } = await makeFixture(t);
    // A child makes a queue and exits; the parent opens it again by name (x86_64: mq_open 240).
    const code = py`
      import ctypes, json, os
      libc = ctypes.CDLL(None, use_errno=True)
      libc.syscall.restype = ctypes.c_long
      def sc(nr, *args):
          ctypes.set_errno(0)
          return libc.syscall(ctypes.c_long(nr), *[ctypes.c_void_p(a) if isinstance(a, bytes) else ctypes.c_long(a) for a in args]), ctypes.get_errno()
      name = ctypes.create_string_buffer(b"pps-queue")
      pid = os.fork()
      if pid == 0:
          os._exit(0 if sc(240, ctypes.addressof(name), os.O_CREAT | os.O_RDWR, 0o600, 0)[0] >= 0 else 1)
      made = os.waitpid(pid, 0)[1] == 0
      again = sc(240, ctypes.addressof(name), os.O_RDWR, 0, 0)
      print(json.dumps({"made": made, "again": list(again)}))
    `;
    const inside = jsonOut(await sb.execute(code));
    assert.deepEqual(inside, { made: false, again: [-1, EPERM] }, JSON.stringify(inside));
    const free = lastJson(await unfiltered(code));
    assert.equal(free.made, true, `unfiltered: ${JSON.stringify(free)}`);
    assert.ok(free.again[0] >= 0, `unfiltered, the queue outlives its maker: ${JSON.stringify(free)}`);
  });

  test("blocks SysV shared memory (shmget)", async (t) => {
    if (skip(t)) return;
    const { sb } = await makeFixture(t);
    // shmget(IPC_PRIVATE, 16 MiB), shmat, touch every page, exit without IPC_RMID.
    const code = sysv(py`
        out = {"kind": "shm", "get": sc(29, 0, 16 << 20, ${IPC_CREAT_0600})}
        if out["get"][0] >= 0:
            addr, _ = sc(30, out["get"][0], 0, 0)
            ctypes.memset(addr, 1, 16 << 20)
    `.replaceAll("\n", "\n        "));
    const inside = jsonOut(await sb.execute(code));
    assert.deepEqual(inside.get, [-1, EPERM], JSON.stringify(inside));
    assert.deepEqual(inside.left, [], "a segment exists in the sandbox");
    const free = lastJson(await unfiltered(code));
    assert.ok(free.get[0] >= 0, `unfiltered: ${JSON.stringify(free)}`);
    assert.equal(free.left.length, 1, `unfiltered, the segment outlives its maker: ${JSON.stringify(free)}`);
    assert.equal(Number(free.left[0][3]), 16 * MiB, JSON.stringify(free.left));
  });

  test("blocks SysV semaphores (semget)", async (t) => {
    if (skip(t)) return;
    const { sb } = await makeFixture(t);
    // semget(IPC_PRIVATE, 32000 semaphores): a cache line of kernel memory each.
    const code = sysv(py`
        out = {"kind": "sem", "get": sc(64, 0, 32000, ${IPC_CREAT_0600})}
    `.replaceAll("\n", "\n        "));
    const inside = jsonOut(await sb.execute(code));
    assert.deepEqual(inside.get, [-1, EPERM], JSON.stringify(inside));
    assert.deepEqual(inside.left, [], "a semaphore set exists in the sandbox");
    const free = lastJson(await unfiltered(code));
    assert.ok(free.get[0] >= 0, `unfiltered: ${JSON.stringify(free)}`);
    assert.equal(free.left.length, 1, `unfiltered, the set outlives its maker: ${JSON.stringify(free)}`);
  });

  test("PI_PYTHON_TOOL_TMP_SIZE and PI_PYTHON_TOOL_SHM_SIZE set the sizes, and status names them", async (t) => {
    if (skipWithoutSandbox(t)) return;
    withEnv(t, { PI_PYTHON_TOOL_TMP_SIZE: "8M", PI_PYTHON_TOOL_SHM_SIZE: "4096k" });
    const { sb } = await makeFixture(t, { prewarm: false });
    const tmp = jsonOut(await sb.execute(fill("/tmp", 12 * MiB)));
    assert.deepEqual([tmp.size, tmp.errno], [8 * MiB, ENOSPC], JSON.stringify(tmp));
    const shm = jsonOut(await sb.execute(fill("/dev/shm", 8 * MiB)));
    assert.deepEqual([shm.size, shm.errno], [4 * MiB, ENOSPC], JSON.stringify(shm));
    const st = sb.status();
    assert.deepEqual([st.limits.tmpSizeBytes, st.limits.shmSizeBytes], [8 * MiB, 4 * MiB]);
    assert.match(st.text, /memory file systems: \/tmp 8 MiB, \/dev\/shm 4 MiB in all \(PI_SANDBOX_TMP_SIZE, PI_SANDBOX_SHM_SIZE\); writes past them fail with ENOSPC/);
  });

  test("a size that is not one is a clear error, and the next start after fixing it works", async (t) => {
    if (skipWithoutSandbox(t)) return;
    withEnv(t, { PI_PYTHON_TOOL_TMP_SIZE: "lots" });
    const { sb } = await makeFixture(t, { prewarm: false });
    const r = await sb.execute("1 + 1");
    assert.equal(r.status, "unavailable", show(r));
    assert.match(r.text, /PI_PYTHON_TOOL_TMP_SIZE="lots" is not a size: set it to a number of bytes, or a whole number with K, M or G \(such as 256M\)/);
    const st = sb.status();
    assert.equal(st.limits.tmpSizeBytes, undefined);
    assert.match(st.text, /memory file systems: PI_PYTHON_TOOL_TMP_SIZE="lots" is not a size.*No sandbox starts until then/);
    process.env.PI_PYTHON_TOOL_TMP_SIZE = "0";
    assert.equal((await sb.execute("1 + 1")).status, "unavailable", "0 (which a tmpfs reads as unlimited) is refused too");
    delete process.env.PI_PYTHON_TOOL_TMP_SIZE;
    assert.equal((await sb.execute("1 + 1")).repr, "2");
  });
});

// ---------------------------------------------------------------------------------------------
describe("what must keep working under the allowlist", { concurrency: 1 }, () => {
  test("threads, subprocesses, sh and coreutils, selectors and signals work under the filter", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    const r = await sb.execute(py`
      import json, os, selectors, signal, subprocess, threading, time
      out = {}
      seen = []
      threads = [threading.Thread(target=lambda i=i: seen.append(i)) for i in range(8)]
      [th.start() for th in threads]
      [th.join() for th in threads]
      out["threads"] = sorted(seen)
      script = """set -e
      mkdir -p /tmp/w && cd /tmp/w
      printf 'b\\na\\nc\\n' > in.txt
      sort in.txt | head -2 | tr a-z A-Z | xargs echo
      cp in.txt copy.txt && mv copy.txt moved.txt && ln -s moved.txt link && cat link | wc -l
      sha256sum in.txt | cut -c1-8
      tar cf t.tar in.txt && tar tf t.tar
      expr $(seq 4 | wc -l) + 6
      sed s/a/z/ in.txt | grep -c z
      find . -name '*.txt' | sort | tr '\\n' ' '; echo
      stat -c %s in.txt; du -s . > /dev/null; df /tmp > /dev/null; date +%Y > /dev/null; id -u > /dev/null
      sleep 0.05; rm -r /tmp/w; echo end
      """
      out["sh"] = subprocess.run(["sh", "-c", script], capture_output=True, text=True).stdout.split("\n")
      pid = os.posix_spawn("/usr/bin/true", ["true"], {})
      out["posix_spawn"] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
      with selectors.DefaultSelector() as sel:
          r, w = os.pipe()
          sel.register(r, selectors.EVENT_READ)
          os.write(w, b"x")
          out["selector"] = len(sel.select(timeout=5))
      fired = []
      signal.signal(signal.SIGALRM, lambda *a: fired.append(1))
      signal.setitimer(signal.ITIMER_REAL, 0.01)
      time.sleep(0.2)
      out["alarm"] = fired
      print(json.dumps(out))
    `);
    assert.deepEqual(jsonOut(r), {
      threads: [0, 1, 2, 3, 4, 5, 6, 7],
      sh: ["A B", "3", jsonOut(r).sh[2], "in.txt", "10", "1", "./in.txt ./moved.txt ", "6", "end", ""],
      posix_spawn: 0,
      selector: 1,
      alarm: [1],
    });
    assert.match(jsonOut(r).sh[2], /^[0-9a-f]{8}$/);
  });

  test("git works under the filter", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    const r = await sb.execute(py`
      import json, subprocess
      script = """set -e
      git init -q /tmp/repo && cd /tmp/repo
      echo one > f.txt && git add f.txt && git -c user.name=t -c user.email=t@t commit -qm first
      echo two >> f.txt && git diff --stat | tail -1
      git -c user.name=t -c user.email=t@t commit -qam second && git log --format=%s | tr '\\n' ' '; echo
      git gc -q && git status --porcelain | wc -l
      """
      p = subprocess.run(["sh", "-c", script], capture_output=True, text=True)
      print(json.dumps({"rc": p.returncode, "out": p.stdout.split("\n"), "err": p.stderr[-500:]}))
    `);
    const out = jsonOut(r);
    assert.deepEqual(out, { rc: 0, out: [" 1 file changed, 1 insertion(+)", "second first ", "0", ""], err: "" });
  });

  test("multiprocessing works: fork and spawn pools, queues, locks, shared values and shared memory", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb } = await makeFixture(t);
    // A file run as a script, since spawn re-imports the main module.
    const r = await sb.execute(py`
      import json, subprocess, sys
      open("/tmp/mp.py", "w").write('''
      import json, multiprocessing as mp
      from multiprocessing import shared_memory
      def square(x):
          return x * x
      def bump(v, lock):
          with lock:
              v.value += 1
      if __name__ == "__main__":
          out = {}
          for method in ("fork", "spawn"):
              with mp.get_context(method).Pool(2) as pool:
                  out[method] = pool.map(square, range(5))
          q = mp.Queue()
          q.put("queued")
          out["queue"] = q.get(timeout=10)
          v, lock = mp.Value("i", 0), mp.Lock()
          ps = [mp.Process(target=bump, args=(v, lock)) for _ in range(3)]
          [p.start() for p in ps]
          [p.join() for p in ps]
          out["value"] = v.value
          shm = shared_memory.SharedMemory(create=True, size=1 << 20)
          shm.buf[:5] = b"hello"
          other = shared_memory.SharedMemory(name=shm.name)
          out["shm"] = bytes(other.buf[:5]).decode()
          other.close(); shm.close(); shm.unlink()
          print(json.dumps(out))
      ''')
      p = subprocess.run([sys.executable, "-I", "-S", "/tmp/mp.py"], capture_output=True, text=True, timeout=60)
      print(p.stdout.strip() or json.dumps({"failed": p.stderr[-800:]}))
    `, 90);
    assert.deepEqual(jsonOut(r), {
      fork: [0, 1, 4, 9, 16],
      spawn: [0, 1, 4, 9, 16],
      queue: "queued",
      value: 3,
      shm: "hello",
    });
  });

  test("numpy, pandas and matplotlib from a user venv work under the filter", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const venv = venvOrSkip(t);
    if (!venv) return;
    const { sb } = await makeFixture(t, { pythonPackages: venv });
    const r = await sb.execute(py`
      import json
      import numpy as np
      import pandas as pd
      import matplotlib
      matplotlib.use("Agg")
      import matplotlib.pyplot as plt
      from PIL import Image
      a = np.arange(90000, dtype=float).reshape(300, 300) % 7
      df = pd.DataFrame({"k": np.arange(1000) % 4, "v": np.arange(1000)})
      df.to_csv("/tmp/d.csv", index=False)
      plt.plot([1, 4, 9])
      plt.savefig("/tmp/p.png")
      print(json.dumps({
          "matmul": float((a @ a).trace()),
          "groupby": df.groupby("k").v.sum().tolist(),
          "csv": open("/tmp/d.csv").read().splitlines()[:2],
          "png": Image.open("/tmp/p.png").format,
      }))
    `, 90);
    const a = Array.from({ length: 300 }, (_, i) => Array.from({ length: 300 }, (_, j) => (i * 300 + j) % 7));
    let trace = 0;
    for (let i = 0; i < 300; i++) for (let k = 0; k < 300; k++) trace += a[i][k] * a[k][i];
    assert.deepEqual(jsonOut(r), { matmul: trace, groupby: [124500, 124750, 125000, 125250], csv: ["k,v", "0,0"], png: "PNG" });
  });
});

// ---------------------------------------------------------------------------------------------
/**
 * Setuid plants: the sandbox owns the files it writes on the host, and the host file system is
 * not nosuid, so a setuid or setgid bit it set would run a planted program as pi's user (as root
 * when pi runs as root). Each route is tried for both bits on a file of the project in yolo mode,
 * and the host stats the file; the baseline runs the same code unfiltered, without capabilities,
 * on a writable copy of the layout, and the bit reaches its file there.
 */
const S_ISUID = 0o4000;
const S_ISGID = 0o2000;

/**
 * Python that tries every route (or only the one titled `only`) for both bits and prints
 * `{title: {u: answer, g: answer}}`.
 */
const plants = (only: string | null) => py`
  import ctypes, json, os, subprocess
  libc = ctypes.CDLL(None, use_errno=True)
  libc.syscall.restype = ctypes.c_long
  AT_FDCWD, O_TMPFILE, S_IFREG = -100, 0o20000000 | 0o200000, 0o100000
  def sc(nr, *args):
      conv = [ctypes.c_char_p(a.encode()) if isinstance(a, str) else ctypes.c_void_p(a) if isinstance(a, ctypes.Array) else ctypes.c_long(a) for a in args]
      ctypes.set_errno(0)
      ret = libc.syscall(ctypes.c_long(nr), *conv)
      return ret, ctypes.get_errno()
  def errno(nr, *args):
      ret, err = sc(nr, *args)
      return err if ret < 0 else 0
  def made(p):
      os.close(os.open(p, os.O_CREAT | os.O_WRONLY, 0o755))
      return p
  def py_(f):
      try:
          f()
          return 0
      except OSError as e:
          return e.errno
  def tool(*argv):
      return "exit %d" % subprocess.run(argv, capture_output=True).returncode
  def tmpfile(nr):
      def attempt(p, m):
          ret, err = sc(nr, "/workspace", O_TMPFILE | os.O_WRONLY, m) if nr == 2 else sc(nr, AT_FDCWD, "/workspace", O_TMPFILE | os.O_WRONLY, m)
          if ret < 0:
              return err
          # Named through /proc with AT_SYMLINK_FOLLOW (os.link calls link(2), which does not follow).
          if libc.linkat(AT_FDCWD, b"/proc/self/fd/%d" % ret, AT_FDCWD, p.encode(), 0x400) != 0:
              raise OSError(ctypes.get_errno(), "linkat")
          return 0
      return attempt
  def openat2(p, m):
      how = (ctypes.c_uint64 * 3)(os.O_CREAT | os.O_WRONLY, m, 0)
      return errno(437, AT_FDCWD, p, ctypes.addressof(how), 24)
  def xattr(p, m):
      # A VFS_CAP_REVISION_2 capability set: effective, permitted CAP_SETUID.
      caps = (0x02000001).to_bytes(4, "little") + (1 << 7).to_bytes(4, "little") + bytes(12)
      return py_(lambda: os.setxattr(made(p), "security.capability", caps))
  ATTEMPTS = {
      "chmod": lambda p, m: errno(90, made(p), m),
      "fchmod": lambda p, m: errno(91, os.open(p, os.O_CREAT | os.O_WRONLY, 0o755), m),
      "fchmodat": lambda p, m: errno(268, AT_FDCWD, made(p), m),
      "fchmodat2": lambda p, m: errno(452, AT_FDCWD, made(p), m, 0),
      "open O_CREAT": lambda p, m: errno(2, p, os.O_CREAT | os.O_WRONLY, m),
      "openat O_CREAT": lambda p, m: errno(257, AT_FDCWD, p, os.O_CREAT | os.O_WRONLY, m),
      "open O_TMPFILE": tmpfile(2),
      "openat O_TMPFILE": tmpfile(257),
      "creat": lambda p, m: errno(85, p, m),
      "mknod": lambda p, m: errno(133, p, S_IFREG | m, 0),
      "mknodat": lambda p, m: errno(259, AT_FDCWD, p, S_IFREG | m, 0),
      "openat2": openat2,
      "os.chmod": lambda p, m: py_(lambda: os.chmod(made(p), m)),
      "os.chmod of a directory": lambda p, m: py_(lambda: (os.mkdir(p, 0o755), os.chmod(p, m))),
      "os.open": lambda p, m: py_(lambda: os.open(p, os.O_CREAT | os.O_WRONLY, m)),
      "os.mknod": lambda p, m: py_(lambda: os.mknod(p, S_IFREG | m)),
      "sh chmod u+s / g+s": lambda p, m: tool("sh", "-c", 'chmod %s+s "$0"' % ("u" if m & 0o4000 else "g"), made(p)),
      "sh chmod g+s of a directory": lambda p, m: (os.mkdir(p, 0o755), tool("sh", "-c", 'chmod %s+s "$0"' % ("u" if m & 0o4000 else "g"), p))[1],
      "install -m": lambda p, m: tool("install", "-m", "%o" % m, "/usr/bin/true", p),
      "cp -p": lambda p, m: tool("cp", "-p", "/workspace/source-%s" % ("u" if m & 0o4000 else "g"), p),
      "cp -a": lambda p, m: tool("cp", "-a", "/workspace/source-%s" % ("u" if m & 0o4000 else "g"), p),
      "security.capability": xattr,
  }
  ONLY = ${only === null ? "None" : lit(only)}
  if ONLY is not None:
      ATTEMPTS = {ONLY: ATTEMPTS[ONLY]}
  out = {}
  for title, attempt in ATTEMPTS.items():
      out[title] = {}
      for tag, bit in (("u", 0o4000), ("g", 0o2000)):
          path = "/workspace/%s-%s" % ("".join(c if c.isalnum() else "_" for c in title), tag)
          try:
              out[title][tag] = attempt(path, 0o755 | bit)
          except OSError as e:
              out[title][tag] = "setup failed: %s" % e
  print(json.dumps(out))
`;

/** The host file of an attempt, as PLANTS names it. */
const plantPath = (dir: string, title: string, tag: "u" | "g") => join(dir, `${title.replace(/[^A-Za-z0-9]/g, "_")}-${tag}`);

/** The set-ID bits of a host file (0 when it does not exist), and whether it has a capability. */
function planted(path: string): { bits: number; capability: boolean } {
  let bits = 0;
  try {
    bits = statSync(path).mode & (S_ISUID | S_ISGID);
  } catch {
    return { bits: 0, capability: false };
  }
  const cap = spawnSync("/usr/bin/python3", ["-c", "import os, sys; print('security.capability' in os.listxattr(sys.argv[1]))", path], { encoding: "utf8" });
  return { bits, capability: cap.stdout.trim() === "True" };
}

const PLANT_ROUTES: { title: string; inside: number | "exit"; capability?: boolean }[] = [
  { title: "chmod", inside: EPERM },
  { title: "fchmod", inside: EPERM },
  { title: "fchmodat", inside: EPERM },
  { title: "fchmodat2", inside: EPERM },
  { title: "open O_CREAT", inside: EPERM },
  { title: "openat O_CREAT", inside: EPERM },
  { title: "open O_TMPFILE", inside: EPERM },
  { title: "openat O_TMPFILE", inside: EPERM },
  { title: "creat", inside: EPERM },
  { title: "mknod", inside: EPERM },
  { title: "mknodat", inside: EPERM },
  { title: "openat2", inside: ENOSYS },
  { title: "os.chmod", inside: EPERM },
  { title: "os.chmod of a directory", inside: EPERM },
  { title: "os.open", inside: EPERM },
  { title: "os.mknod", inside: EPERM },
  { title: "sh chmod u+s / g+s", inside: "exit" },
  { title: "sh chmod g+s of a directory", inside: "exit" },
  { title: "install -m", inside: "exit" },
  { title: "cp -p", inside: "exit" },
  { title: "cp -a", inside: "exit" },
  { title: "security.capability", inside: EPERM, capability: true },
];

describe("no setuid or setgid bit, and no file capability, reaches a host file", { concurrency: 4 }, () => {
  let inside: Record<string, Record<string, number | string>> | undefined;
  let outside: Record<string, Record<string, number | string>> | undefined;
  let capable: Record<string, Record<string, number | string>> | undefined;
  let base: string | undefined;
  let sandbox: PythonSandbox | undefined;
  const project = () => join(base ?? "", "project");
  const free = () => join(base ?? "", "unfiltered");
  const withCaps = () => join(base ?? "", "capable");
  before(async () => {
    if (sandboxSkipReason() !== null || process.arch !== "x64") return;
    base = mkdtempSync(join(tmpdir(), "pps-setuid-"));
    for (const dir of [project(), free(), withCaps()]) {
      mkdirSync(dir);
      for (const [tag, mode] of [["u", 0o4755], ["g", 0o2755]] as const) {
        writeFileSync(join(dir, `source-${tag}`), "#!/bin/sh\nid\n");
        chmodSync(join(dir, `source-${tag}`), mode);
      }
    }
    sandbox = new PythonSandbox({ projectDir: project(), runtimeRoot: join(base, "runtime") });
    sandbox.applyModeEvent({ mode: "yolo", readRoots: [] });
    const [r, baseline, withCapabilities] = await Promise.all([
      sandbox.execute(plants(null), 60),
      unfiltered(plants(null), { project: free(), writable: true, capabilities: false }),
      // A file capability needs CAP_SETFCAP, which the sandbox drops: this baseline has it.
      unfiltered(plants("security.capability"), { project: withCaps(), writable: true }),
    ]);
    inside = jsonOut(r);
    outside = lastJson(baseline);
    capable = lastJson(withCapabilities);
  });
  after(async () => {
    await sandbox?.dispose("test end");
    if (base) rmSync(base, { recursive: true, force: true });
  });

  for (const route of PLANT_ROUTES) {
    test(`${route.title}: no ${route.capability ? "file capability" : "setuid or setgid bit"} reaches the host file`, (t) => {
      if (skip(t)) return;
      assert.ok(inside && outside && base, "the attempts did not run");
      for (const tag of ["u", "g"] as const) {
        const bit = tag === "u" ? S_ISUID : S_ISGID;
        const got: number | string = inside[route.title][tag];
        if (route.inside === "exit") assert.match(String(got), /^exit [1-9]/, `${route.title} ${tag} inside: ${got}`);
        else assert.equal(got, route.inside, `${route.title} ${tag} inside: ${got}`);
        const host = planted(plantPath(project(), route.title, tag));
        assert.equal(host.bits, 0, `${route.title} ${tag}: the host file has mode bits ${host.bits.toString(8)}`);
        assert.equal(host.capability, false, `${route.title} ${tag}: the host file has a capability`);
        if (route.capability) {
          assert.ok(capable, "the baseline with capabilities did not run");
          assert.equal(capable[route.title][tag], 0, `with CAP_SETFCAP, ${route.title} ${tag}: ${capable[route.title][tag]}`);
          const there = planted(plantPath(withCaps(), route.title, tag));
          assert.equal(there.capability, true, "with CAP_SETFCAP the capability must reach the host file");
          continue;
        }
        const baseline = outside[route.title][tag];
        assert.ok(baseline === 0 || baseline === "exit 0", `unfiltered ${route.title} ${tag}: ${baseline}`);
        const there = planted(plantPath(free(), route.title, tag));
        assert.equal(there.bits, bit, `unfiltered, ${route.title} ${tag} must set the bit on the host file`);
      }
    });
  }
});

test("a directory made in a host directory that has the set-group-ID bit inherits it (the one exception)", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const { sb, project } = await makeFixture(t);
  mkdirSync(join(project, "shared"));
  chmodSync(join(project, "shared"), 0o2775);
  sb.applyModeEvent({ mode: "yolo", readRoots: [] });
  const r = await sb.execute(py`
    import os
    os.mkdir("/workspace/shared/sub", 0o755)
    open("/workspace/shared/file", "w").close()
  `);
  assert.equal(r.status, "ok", show(r));
  // The kernel gives a new directory its parent's bit; a new file never gets one.
  assert.equal(statSync(join(project, "shared/sub")).mode & 0o7777, 0o2755);
  assert.equal(statSync(join(project, "shared/file")).mode & (S_ISUID | S_ISGID), 0);
});

test("io_setup with a real context is refused (unfiltered it takes events from fs.aio-max-nr)", async (t) => {
  if (skip(t)) return;
  const { sb } = await makeFixture(t);
  const code = py`
    import ctypes, json
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    ctx = ctypes.c_ulong(0)
    ctypes.set_errno(0)
    ret = libc.syscall(ctypes.c_long(206), ctypes.c_long(128), ctypes.byref(ctx))
    got = {"ret": ret, "errno": ctypes.get_errno(), "ctx": ctx.value != 0}
    if ret == 0:
        libc.syscall(ctypes.c_long(207), ctx)
    print(json.dumps(got))
  `;
  assert.deepEqual(jsonOut(await sb.execute(code)), { ret: -1, errno: EPERM, ctx: false });
  const free = lastJson(await unfiltered(code, { capabilities: false }));
  assert.deepEqual(free, { ret: 0, errno: 0, ctx: true }, `unfiltered: ${JSON.stringify(free)}`);
});

// ---------------------------------------------------------------------------------------------
/**
 * Pipes of a later call reopened: a process of the sandbox that could open the interpreter's or
 * PID 1's descriptors through /proc could write into a later call's result. The interpreter, PID
 * 1 and every rollback copy are non-dumpable before the first call's code and cannot become
 * dumpable again; a program a child execs is dumpable, and holds no channel (all are
 * close-on-exec). Tried from a child that execs (Python and sh), in both rollback settings; the
 * baseline is the same code unfiltered, where the interpreter is an ordinary dumpable process.
 */
const REOPEN = py`
  import ctypes, json, os, subprocess, sys
  CHILD = r'''
  import json, os, sys
  def reach(pid):
      try:
          names = os.listdir("/proc/%s/fd" % pid)
      except OSError as e:
          return {"list": e.errno}
      got = {}
      for n in names:
          try:
              fd = os.open("/proc/%s/fd/%s" % (pid, n), os.O_RDONLY | os.O_NONBLOCK)
          except OSError:
              continue
          got[n] = os.readlink("/proc/self/fd/%d" % fd)
          os.close(fd)
      return got
  print(json.dumps({p: reach(p) for p in sys.argv[1:]}))
  '''
  SH = 'for f in /proc/$0/fd/* /proc/1/fd/*; do (exec 9<>"$f") 2>/dev/null && readlink "$f"; done; true'
  me = str(os.getpid())
  def target(n):
      try:
          return os.readlink("/proc/self/fd/" + n)
      except OSError:
          return "/dev/null"  # the descriptor of the listing itself
  mine = sorted({target(n) for n in os.listdir("/proc/self/fd")} - {"/dev/null"})
  libc = ctypes.CDLL(None, use_errno=True)
  ctypes.set_errno(0)
  dumpable = [libc.prctl(4, 1, 0, 0, 0), ctypes.get_errno()]
  py_child = json.loads(subprocess.run([sys.executable, "-I", "-S", "-c", CHILD, me, "1"], capture_output=True, text=True).stdout)
  sh_child = subprocess.run(["/bin/sh", "-c", SH, me], capture_output=True, text=True).stdout.split()
  print(json.dumps({"me": me, "mine": mine, "dumpable": dumpable, "py": py_child, "sh": sh_child}))
`;

for (const rollback of ["1", "0"]) {
  describe(`no process of the sandbox can reopen the interpreter's channels (rollback ${rollback === "1" ? "on" : "off"})`, { concurrency: 1 }, () => {
    test("from the first call's code, a child that execs opens none of the interpreter's or PID 1's pipes", async (t) => {
      if (skipWithoutSandbox(t)) return;
      withEnv(t, { PI_PYTHON_TOOL_ROLLBACK: rollback });
      const { sb } = await makeFixture(t, { prewarm: false });
      const out = jsonOut(await sb.execute(REOPEN));
      assert.deepEqual(out.dumpable, [-1, EPERM], "prctl(PR_SET_DUMPABLE, 1) must be refused");
      const pipes = out.mine.filter((f: string) => f.startsWith("pipe:"));
      assert.ok(pipes.length >= 4, `the interpreter's pipes: ${out.mine}`);
      const mineReached = Object.values(out.py[out.me]).filter((f) => typeof f === "string");
      assert.deepEqual(mineReached, [], `an exec'd child opened the interpreter's ${JSON.stringify(out.py[out.me])}`);
      const pid1 = Object.values(out.py["1"]).filter((f) => typeof f === "string");
      if (rollback === "1") assert.deepEqual(pid1, [], `an exec'd child opened PID 1's ${JSON.stringify(out.py["1"])}`);
      // With rollback off PID 1 is bubblewrap's: it holds the host's first streams, retired before
      // the first call, and none of the interpreter's.
      for (const f of [...pid1, ...out.sh]) assert.ok(!out.mine.includes(f), `reached ${f}, one of the interpreter's`);
      assert.deepEqual(out.sh.filter((f: string) => f.startsWith("pipe:") && rollback === "1"), [], `sh reached ${out.sh}`);
      // Unfiltered, the interpreter is an ordinary dumpable process: both children reach its pipes.
      const free = lastJson(await unfiltered(REOPEN, { capabilities: false }));
      assert.deepEqual(free.dumpable, [0, 0], `unfiltered: ${JSON.stringify(free.dumpable)}`);
      const freeReached = Object.values(free.py[free.me]).filter((f) => String(f).startsWith("pipe:"));
      assert.ok(freeReached.length > 0, `unfiltered, the child must reach the interpreter's pipes: ${JSON.stringify(free.py)}`);
      assert.ok(free.sh.some((f: string) => f.startsWith("pipe:")), `unfiltered sh: ${free.sh}`);
    });
  });
}
