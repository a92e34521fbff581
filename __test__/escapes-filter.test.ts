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
import { describe, type TestContext, test } from "node:test";
import { skipWithoutSandbox } from "./helpers/sandbox-env.ts";
import { unfiltered } from "./helpers/unfiltered.ts";
import { jsonOut, lit, makeFixture, py, show } from "./helpers/sandbox-fixture.ts";
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
    assert.match(st.text, /memory file systems: \/tmp 8 MiB, \/dev\/shm 4 MiB in all \(PI_PYTHON_TOOL_TMP_SIZE, PI_PYTHON_TOOL_SHM_SIZE\); writes past them fail with ENOSPC/);
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
