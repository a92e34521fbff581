/**
 * The escape catalogue: one named test per way out of the sandbox, each run from inside it.
 * Run: node --import tsx --test __test__/escapes.test.ts
 *
 * Attempts covered by isolation.test.ts are not repeated here: TCP and AF_UNIX connections to
 * host servers; /etc/shadow, the host home, host /tmp and symlinks out of the project; /workspace
 * read-only without a mode event; /proc; the environment; NoNewPrivs, Seccomp=2 and capabilities;
 * nested user namespaces via unshare(1).
 *
 * System calls are made through ctypes with x86_64 numbers and arguments chosen so that an
 * allowed call fails differently (EFAULT, EBADF, EINVAL, ...) or succeeds, while the filter
 * answers EPERM (ENOSYS for clone3). Every probe also runs OUTSIDE the filter
 * (helpers/unfiltered.ts), in bubblewrap with the same namespaces and every capability of its user
 * namespace (`--uid 0 --cap-add ALL`), so that the kernel's own namespace-capability checks pass
 * there: a probe whose baseline is not EPERM proves that the EPERM inside comes from the filter.
 * `gated` calls check a capability of the initial namespace (or a sysctl) first; their baseline is
 * reported, not asserted.
 */
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { existsSync, readdirSync, readFileSync, readlinkSync } from "node:fs";
import { mkdir, readFile, symlink, writeFile } from "node:fs/promises";
import { createServer, type Server } from "node:net";
import { join } from "node:path";
import { describe, test } from "node:test";
import { workerPids } from "./helpers/host-procs.ts";
import { skipWithoutSandbox } from "./helpers/sandbox-env.ts";
import { unfiltered } from "./helpers/unfiltered.ts";
import {
  assertOk,
  INDEX_CJS,
  jsonOut,
  lit,
  makeFixture,
  makeFixtureWithoutSpare,
  py,
  show,
  sleep,
  waitUntil,
} from "./helpers/sandbox-fixture.ts";
import { ioUringConnect, lastJson, processVmReadvOfParent, probeTable, skipProbe } from "./helpers/syscall-probes.ts";

const CONCURRENCY = 4;
const EPERM = 1;
const ENOSYS = 38;
const ENXIO = 6;
const EROFS = 30;
const SIGSYS = 31;



const skip = skipProbe;

// ---------------------------------------------------------------------------------------------
/**
 * The filter's table, probed all at once (one sandbox, one baseline) and asserted one test per
 * call. `args` are chosen so that the unfiltered kernel fails without doing anything.
 */
interface Probe {
  title: string;
  nr: number;
  args: number[];
  /** What the filter answers (default EPERM). */
  expect?: number;
  gated?: boolean;
}

const CLONE_FS = 0x200;
const CLONE_THREAD = 0x10000;
const NAMESPACE_FLAGS: [string, number][] = [
  ["CLONE_NEWTIME", 0x80],
  ["CLONE_NEWNS", 0x20000],
  ["CLONE_NEWCGROUP", 0x2000000],
  ["CLONE_NEWUTS", 0x4000000],
  ["CLONE_NEWIPC", 0x8000000],
  ["CLONE_NEWUSER", 0x10000000],
  ["CLONE_NEWPID", 0x20000000],
  ["CLONE_NEWNET", 0x40000000],
];
const U32 = 0xffffffff;

const PROBES: Probe[] = [
  // io_uring: bad params pointer -> EFAULT; bad ring fd -> EBADF.
  { title: "io_uring_setup", nr: 425, args: [1, 1] },
  { title: "io_uring_enter", nr: 426, args: [-1, 0, 0, 0, 0, 0] },
  { title: "io_uring_register", nr: 427, args: [-1, 0, 0, 0] },
  // Keyrings: an unknown keyctl operation -> EOPNOTSUPP; bad type pointers -> EFAULT.
  { title: "keyctl", nr: 250, args: [9999, 0, 0, 0, 0] },
  { title: "add_key", nr: 248, args: [1, 1, 1, 0, -3] },
  { title: "request_key", nr: 249, args: [1, 1, 1, 0] },
  { title: "setns", nr: 308, args: [-1, 0] }, // EBADF
  // The mount table: bad pointers -> EFAULT, bad flags -> EINVAL, bad fds -> EBADF.
  { title: "mount", nr: 165, args: [1, 1, 1, 0, 0] },
  { title: "umount2", nr: 166, args: [1, U32] },
  { title: "pivot_root", nr: 155, args: [1, 1], gated: process.getuid?.() !== 0 }, // as a non-root user the kernel refuses it unfiltered too
  { title: "chroot", nr: 161, args: [1] },
  { title: "open_tree", nr: 428, args: [-1, 1, U32] },
  { title: "move_mount", nr: 429, args: [-1, 1, -1, 1, U32], gated: process.getuid?.() !== 0 }, // as a non-root user the kernel refuses it unfiltered too
  { title: "fsopen", nr: 430, args: [1, U32], gated: process.getuid?.() !== 0 }, // as a non-root user the kernel refuses it unfiltered too
  { title: "fsconfig", nr: 431, args: [-1, 0, 0, 0, 0] },
  { title: "fsmount", nr: 432, args: [-1, U32, 0], gated: process.getuid?.() !== 0 }, // as a non-root user the kernel refuses it unfiltered too
  { title: "fspick", nr: 433, args: [-1, 1, U32], gated: process.getuid?.() !== 0 }, // as a non-root user the kernel refuses it unfiltered too
  { title: "mount_setattr", nr: 442, args: [-1, 1, U32, 0, 0] },
  // Terminal control on fd 0 (/dev/null, not a tty): ENOTTY when allowed.
  { title: "ioctl TIOCLINUX", nr: 16, args: [0, 0x541c, 0] },
  { title: "ioctl TIOCSTI on a non-tty", nr: 16, args: [0, 0x5412, 0] },
  // Obsolete and host-wide calls.
  { title: "syslog", nr: 103, args: [10, 0, 0], gated: true }, // dmesg_restrict / CAP_SYSLOG
  { title: "uselib", nr: 134, args: [1] }, // EFAULT, or ENOSYS without CONFIG_USELIB
  { title: "acct", nr: 163, args: [1], gated: true }, // CAP_SYS_PACCT of the initial namespace
  { title: "modify_ldt", nr: 154, args: [99, 0, 0] }, // ENOSYS for an unknown function
  { title: "quotactl", nr: 179, args: [U32, 1, 0, 1] },
  // NUMA policy: unaligned address / no such pid / bad pointers / bad mode.
  { title: "mbind", nr: 237, args: [1, 4096, 0, 0, 0, 0] },
  { title: "migrate_pages", nr: 256, args: [999999, 1, 1, 1] },
  { title: "move_pages", nr: 279, args: [0, 1, 1, 1, 1, 0] },
  { title: "set_mempolicy", nr: 238, args: [99, 0, 0] },
  // Namespaces: an invalid flag beside each namespace flag makes the unfiltered kernel answer
  // EINVAL before it creates anything (unshare: bit 0 is not an unshare flag; clone:
  // CLONE_THREAD without CLONE_SIGHAND, and CLONE_FS with CLONE_NEWNS/NEWUSER).
  ...NAMESPACE_FLAGS.map(([name, flag]) => ({ title: `unshare with ${name}`, nr: 272, args: [flag | 1] })),
  ...NAMESPACE_FLAGS.map(([name, flag]) => ({ title: `clone with ${name}`, nr: 56, args: [flag | CLONE_THREAD | CLONE_FS, 0, 0, 0, 0] })),
  // clone3: NULL args of size 0 -> EINVAL when allowed; the filter says ENOSYS.
  { title: "clone3 with ENOSYS", nr: 435, args: [0, 0], expect: ENOSYS },
];


describe("seccomp: the hardening table, call by call", { concurrency: CONCURRENCY }, () => {
  const table = probeTable("escape", PROBES);

  for (const p of PROBES) {
    // "clone with CLONE_NEWNS" is the catalogue's "blocks clone with CLONE_NEWNS".
    test(p.title === "clone3 with ENOSYS" ? "clone3 answers ENOSYS (raw call)" : `blocks ${p.title}`, (t) => {
      if (skip(t)) return;
      const [inside, outside] = [table.inside(), table.outside()];
      assert.ok(inside && outside, "the probes did not run");
      const want = p.expect ?? EPERM;
      assert.deepEqual(inside[p.title], { ret: -1, errno: want }, `${p.title} inside the sandbox`);
      const free = outside[p.title];
      if (p.gated && free.errno === EPERM) {
        t.diagnostic(`${p.title}: the unfiltered kernel also answers EPERM here (${JSON.stringify(free)}); the filter is defence in depth`);
        return;
      }
      assert.notEqual(free.errno, want, `unfiltered, ${p.title} must not answer ${want} (${JSON.stringify(free)})`);
      if (want === EPERM) assert.notEqual(free.errno, EPERM, `${p.title} unfiltered: ${JSON.stringify(free)}`);
    });
  }
});

// ---------------------------------------------------------------------------------------------
/**
 * Seccomp catalogue: each call is made through ctypes with x86_64 numbers and arguments chosen so
 * that an allowed call fails differently (EFAULT, ESRCH, ...) or succeeds. The same probe runs in
 * plain bwrap without the filter to prove the probe can tell "blocked" from "ran and failed"; unlike
 * the other baselines here, with no capability, as in the sandbox, so that it differs from the
 * sandbox in the filter alone.
 * `gated`: the kernel itself may answer EPERM there (capability or sysctl checks before argument
 * checks), so the baseline is reported, not asserted.
 */
const SYSCALLS: { name: string; nr: number; args: number[]; gated?: boolean }[] = [
  { name: "socket", nr: 41, args: [2, 1, 0] }, // AF_INET, SOCK_STREAM: allowed -> an fd
  { name: "socketpair", nr: 53, args: [1, 1, 0, 1] }, // bad sv pointer: allowed -> EFAULT
  { name: "ptrace", nr: 101, args: [12, 999999, 0, 0] }, // PTRACE_GETREGS on no pid: allowed -> ESRCH
  { name: "bpf", nr: 321, args: [0, 1, 16], gated: true }, // bad attr pointer
  { name: "userfaultfd", nr: 323, args: [1], gated: true }, // UFFD_USER_MODE_ONLY: allowed -> an fd
  { name: "perf_event_open", nr: 298, args: [1, 0, -1, -1, 0] }, // bad attr pointer: EFAULT
  { name: "process_vm_readv", nr: 310, args: [1, 1, 1, 1, 1, 0] }, // bad iovec: EFAULT
  { name: "process_vm_writev", nr: 311, args: [1, 1, 1, 1, 1, 0] },
  { name: "kexec_load", nr: 246, args: [0, 0, 0, 0], gated: true }, // CAP_SYS_BOOT or ENOSYS
  { name: "kexec_file_load", nr: 320, args: [-1, -1, 0, 0, 0], gated: true },
  { name: "open_by_handle_at", nr: 304, args: [-100, 1, 0], gated: true }, // CAP_DAC_READ_SEARCH
  { name: "name_to_handle_at", nr: 303, args: [-100, 1, 1, 1, 0] }, // bad path pointer: EFAULT
];

function syscallProbe(nr: number, args: number[]): string {
  return py`
    import ctypes, json, os
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    ctypes.set_errno(0)
    ret = libc.syscall(ctypes.c_long(${nr}), *[ctypes.c_long(a) for a in ${JSON.stringify(args)}])
    err = ctypes.get_errno()
    if ret >= 0 and ${nr} in (41, 323):
        os.close(ret)
    print(json.dumps({"ret": ret, "errno": err}))
  `;
}

describe("seccomp blocks the documented system calls", { concurrency: CONCURRENCY }, () => {
  // One sandbox per call: a spare starting beside each would only cost time.
  const makeFixture = makeFixtureWithoutSpare;
  for (const { name, nr, args, gated } of SYSCALLS) {
    test(`blocks ${name}`, async (t) => {
      if (skipWithoutSandbox(t)) return;
      if (process.arch !== "x64") {
        console.log(`# SKIP blocks ${name}: syscall numbers are x86_64, this is ${process.arch}`);
        t.skip(`x86_64 syscall numbers; this is ${process.arch}`);
        return;
      }
      const { sb } = await makeFixture(t);
      const code = syscallProbe(nr, args);
      const inside = jsonOut<{ ret: number; errno: number }>(await sb.execute(code));
      assert.deepEqual(inside, { ret: -1, errno: EPERM }, `${name} inside the sandbox`);
      const baseline = JSON.parse(await unfiltered(code, { capabilities: false })) as { ret: number; errno: number };
      if (gated && baseline.errno === EPERM) {
        t.diagnostic(`${name}: the unfiltered kernel also answers EPERM here; the probe cannot tell the filter apart`);
      } else {
        assert.notEqual(baseline.errno, EPERM, `the ${name} probe must not fail with EPERM unfiltered (${JSON.stringify(baseline)})`);
      }
      if (name === "socket" || name === "socketpair") {
        const api = await sb.execute(py`
          import socket
          try:
              socket.${name}()
              outcome = "created"
          except OSError as e:
              outcome = (type(e).__name__, e.errno)
          outcome
        `);
        assert.equal(api.repr, "('PermissionError', 1)", `socket.${name}()`);
      }
    });
  }
});

// ---------------------------------------------------------------------------------------------
const IO_URING_CONNECT = ioUringConnect("/workspace/host.sock");

describe("escapes from inside the sandbox", { concurrency: CONCURRENCY }, () => {
  test("blocks io_uring socket (IORING_OP_SOCKET to a host Unix socket in the project)", async (t) => {
    if (skip(t)) return;
    const { sb, project } = await makeFixture(t);
    const received: string[] = [];
    const server: Server = createServer((c) => c.on("data", (d) => received.push(String(d))));
    await new Promise<void>((resolve) => server.listen(join(project, "host.sock"), resolve));
    t.after(() => new Promise<void>((resolve) => server.close(() => resolve())));

    const inside = jsonOut(await sb.execute(IO_URING_CONNECT));
    assert.deepEqual(inside, { step: "io_uring_setup", errno: EPERM });
    await sleep(100);
    assert.deepEqual(received, [], "a connection reached the host socket");

    // Without the filter the same code reaches the host server through the read-only bind
    // mount, despite the network namespace: what the io_uring rules close.
    const free = lastJson(await unfiltered(IO_URING_CONNECT, { project }));
    if (free.step === "io_uring_setup" && free.errno === EPERM) {
      t.diagnostic("io_uring is disabled on this host (kernel.io_uring_disabled); the baseline cannot show the bypass");
      return;
    }
    assert.deepEqual(free, { step: "connected", errno: 0 }, "the unfiltered baseline should reach the host socket");
    assert.ok(await waitUntil(() => received.join("").includes("hello through io_uring"), 2000), `server got ${received}`);
  });

  test("blocks TIOCSTI (typing into its own controlling terminal)", async (t) => {
    if (skip(t)) return;
    const { sb } = await makeFixture(t);
    // In a new session, make a fresh pty the controlling terminal, then push a character into
    // its input queue: allowed for one's own terminal (legacy_tiocsti=1), EIO when the host
    // disables TIOCSTI, EPERM only from the filter.
    const code = py`
      import json, subprocess, sys
      script = '''
      import fcntl, json, os, termios
      os.setsid()
      master, slave = os.openpty()
      fcntl.ioctl(slave, termios.TIOCSCTTY, 0)
      try:
          fcntl.ioctl(slave, termios.TIOCSTI, b"X")
          out = "injected"
      except OSError as e:
          out = e.errno
      print(json.dumps(out))
      '''.replace("\n      ", "\n")
      r = subprocess.run([sys.executable, "-I", "-S", "-c", script], capture_output=True, text=True)
      print(r.stdout.strip() or json.dumps("failed: " + r.stderr[-300:]))
    `;
    assert.equal(jsonOut(await sb.execute(code)), EPERM);
    const free = lastJson(await unfiltered(code));
    assert.notEqual(free, EPERM, `unfiltered: ${free}`);
    t.diagnostic(`unfiltered TIOCSTI: ${free}`);
  });

  test("cannot reach the host's controlling terminal, also when the host runs in one", async (t) => {
    if (skip(t)) return;
    // pi runs in a terminal. Host Node here gets a pty as its controlling terminal (Python's
    // pty.fork), proves it can open /dev/tty, then runs code in a sandbox that tries the same.
    const fx = await makeFixture(t);
    const resultFile = join(fx.base, "tty.json");
    const code = py`
      import fcntl, json, os, termios
      def attempt(f):
          try:
              f()
              return "done"
          except OSError as e:
              return e.errno
      def inject():
          fd = os.open("/dev/tty", os.O_RDWR)
          fcntl.ioctl(fd, termios.TIOCSTI, b"X")
      stat = open("/proc/self/stat").read().rsplit(")", 1)[1].split()
      print(json.dumps({
          "tty_nr": int(stat[4]),
          "open": attempt(lambda: os.close(os.open("/dev/tty", os.O_RDWR))),
          "inject": attempt(inject),
      }))
    `;
    const host = `
      const fs = require("node:fs");
      const stat = fs.readFileSync("/proc/self/stat", "utf8").split(")").pop().trim().split(" ");
      let own;
      try { fs.closeSync(fs.openSync("/dev/tty", "r+")); own = "opened"; } catch (e) { own = e.code; }
      const { PythonSandbox } = require(${lit(INDEX_CJS)});
      const sb = new PythonSandbox({ projectDir: ${lit(fx.project)}, runtimeRoot: ${lit(fx.runtimeRoot)} });
      sb.execute(${lit(code)}).then(async (r) => {
        fs.writeFileSync(${lit(resultFile)}, JSON.stringify({ own, ttyNr: Number(stat[4]), r }));
        await sb.dispose();
      });
    `;
    const driver = py`
      import os, pty, sys
      pid, fd = pty.fork()
      if pid == 0:
          os.execv(sys.argv[1], [sys.argv[1], "-e", sys.argv[2]])
      while True:
          try:
              if not os.read(fd, 4096):
                  break
          except OSError:
              break
      _, status = os.waitpid(pid, 0)
      sys.exit(os.waitstatus_to_exitcode(status))
    `;
    await new Promise<void>((resolve, reject) =>
      execFile("python3", ["-c", driver, process.execPath, host], { timeout: 30_000 }, (err, _out, stderr) =>
        err ? reject(new Error(`pty host failed: ${err.message}\n${stderr}`)) : resolve(),
      ),
    );
    const { own, ttyNr, r } = JSON.parse(readFileSync(resultFile, "utf8"));
    assert.equal(own, "opened", "the host should have a controlling terminal (baseline)");
    assert.notEqual(ttyNr, 0, "the host's /proc/self/stat names its terminal (baseline)");
    const out = jsonOut(r);
    assert.deepEqual(out, { tty_nr: 0, open: ENXIO, inject: ENXIO }, "the sandbox has no controlling terminal");
  });

  test("blocks unshare of a user namespace (a real attempt)", async (t) => {
    if (skip(t)) return;
    const { sb } = await makeFixture(t);
    const code = py`
      import ctypes, json
      libc = ctypes.CDLL(None, use_errno=True)
      ret = libc.unshare(0x10000000)  # CLONE_NEWUSER
      print(json.dumps({"ret": ret, "errno": ctypes.get_errno()}))
    `;
    assert.deepEqual(jsonOut(await sb.execute(code)), { ret: -1, errno: EPERM });
    // Unfiltered (and without --disable-userns) the kernel creates it.
    assert.deepEqual(lastJson(await unfiltered(code)), { ret: 0, errno: 0 });
  });

  test("clone3 answers ENOSYS and fork, threads and subprocesses still work", async (t) => {
    if (skip(t)) return;
    const { sb } = await makeFixture(t);
    const r = await sb.execute(py`
      import ctypes, json, os, subprocess, threading
      libc = ctypes.CDLL(None, use_errno=True)
      libc.syscall.restype = ctypes.c_long
      # A valid clone3 argument block (flags 0, exit signal SIGCHLD): would fork if allowed.
      args = (ctypes.c_uint64 * 11)(0, 0, 0, 0, 17, 0, 0, 0, 0, 0, 0)
      ret = libc.syscall(ctypes.c_long(435), ctypes.byref(args), ctypes.c_long(88))
      if ret == 0:
          os._exit(0)
      err = ctypes.get_errno()
      seen = []
      th = threading.Thread(target=lambda: seen.append("thread"))
      th.start(); th.join()
      pid = os.fork()
      if pid == 0:
          os._exit(7)
      code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
      echo = subprocess.run(["echo", "sub"], capture_output=True, text=True).stdout.strip()
      print(json.dumps({"clone3": [ret, err], "thread": seen, "fork": code, "subprocess": echo}))
    `);
    assert.deepEqual(jsonOut(r), { clone3: [-1, ENOSYS], thread: ["thread"], fork: 7, subprocess: "sub" });
  });

  test("blocks personality ADDR_NO_RANDOMIZE", async (t) => {
    if (skip(t)) return;
    const { sb } = await makeFixture(t);
    const code = py`
      import ctypes, json, subprocess
      libc = ctypes.CDLL(None, use_errno=True)
      ctypes.set_errno(0)
      norand = libc.personality(0x0040000)  # ADDR_NO_RANDOMIZE
      norand_errno = ctypes.get_errno()
      ctypes.set_errno(0)
      linux = libc.personality(0)  # PER_LINUX: the default, allowed
      linux_errno = ctypes.get_errno()
      import shutil
      setarch = subprocess.run(["setarch", "x86_64", "-R", "true"], capture_output=True).returncode if shutil.which("setarch") else None
      print(json.dumps({"norand": [norand, norand_errno], "linux": [linux, linux_errno], "setarch -R": setarch}))
    `;
    const inside = jsonOut(await sb.execute(code));
    assert.deepEqual(inside.norand, [-1, EPERM]);
    assert.deepEqual(inside.linux, [0, 0], "personality(PER_LINUX) must stay allowed");
    assert.notEqual(inside["setarch -R"], 0, "setarch -R (no ASLR) succeeded");
    const free = lastJson(await unfiltered(code));
    assert.deepEqual(free.norand, [0, 0], `unfiltered: ${JSON.stringify(free)}`);
    if (free["setarch -R"] !== null) assert.equal(free["setarch -R"], 0);
  });

  /** A subprocess that makes one foreign-ABI getpid; prints its return code and output. */
  const foreignAbi = (child: string) => py`
    import json, subprocess, sys
    r = subprocess.run([sys.executable, "-I", "-S", "-c", ${lit(child)}], capture_output=True, text=True)
    print(json.dumps({"returncode": r.returncode, "stdout": r.stdout.strip()}))
  `;

  test("kills x32 syscalls", async (t) => {
    if (skip(t)) return;
    const { sb } = await makeFixture(t);
    // getpid (39) with __X32_SYSCALL_BIT: same audit arch, so only the filter's x32 check stops it.
    const code = foreignAbi(
      "import ctypes; libc = ctypes.CDLL(None, use_errno=True); libc.syscall.restype = ctypes.c_long; " +
        "print(libc.syscall(ctypes.c_long(39 | 0x40000000)), ctypes.get_errno())",
    );
    const inside = jsonOut(await sb.execute(code));
    assert.equal(inside.returncode, -SIGSYS, `x32 call was not killed: ${JSON.stringify(inside)}`);
    const free = lastJson(await unfiltered(code));
    assert.equal(free.returncode, 0, `unfiltered: ${JSON.stringify(free)}`);
    t.diagnostic(`unfiltered x32 getpid: ${free.stdout} (ENOSYS = kernel without x32)`);
  });

  test("kills i386 syscalls (int 0x80)", async (t) => {
    if (skip(t)) return;
    const { sb } = await makeFixture(t);
    // mov eax, 20 (i386 getpid); int 0x80; ret -- from an executable anonymous mapping.
    const child = [
      "import ctypes, mmap",
      "m = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)",
      "m.write(bytes([0xb8, 0x14, 0, 0, 0, 0xcd, 0x80, 0xc3]))",
      "print(ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(m)))())",
    ].join("\n");
    const free = lastJson(await unfiltered(foreignAbi(child)));
    assert.notEqual(free.returncode, -SIGSYS, `unfiltered: ${JSON.stringify(free)}`);
    t.diagnostic(`unfiltered i386 getpid: ${JSON.stringify(free)}`);
    const inside = jsonOut(await sb.execute(foreignAbi(child)));
    if (free.returncode !== 0) {
      // No ia32 emulation in this kernel: int 0x80 faults before any filter sees it.
      t.diagnostic("this kernel has no i386 emulation; int 0x80 never reaches seccomp");
      assert.equal(inside.returncode, free.returncode);
      return;
    }
    assert.equal(inside.returncode, -SIGSYS, `i386 call was not killed: ${JSON.stringify(inside)}`);
  });

  test("no DNS", async (t) => {
    if (skip(t)) return;
    const { sb } = await makeFixture(t);
    const r = await sb.execute(py`
      import json, os, socket
      def attempt(fn):
          try:
              return ["ok", repr(fn())[:80]]
          except OSError as e:
              return [type(e).__name__, e.errno]
      print(json.dumps({
          "getaddrinfo": attempt(lambda: socket.getaddrinfo("example.com", 80)),
          "udp": attempt(lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM)),
          "resolver files": [p for p in ("/etc/resolv.conf", "/etc/hosts", "/etc/nsswitch.conf",
                             "/run/systemd/resolve", "/var/run/nscd/socket", "/run/dbus") if os.path.exists(p)],
      }))
    `);
    const out = jsonOut(r);
    assert.equal(out.getaddrinfo[0], "gaierror", JSON.stringify(out));
    assert.deepEqual(out.udp, ["PermissionError", EPERM], "a UDP socket for a DNS query could be created");
    assert.deepEqual(out["resolver files"], [], "resolver configuration or sockets are visible");
  });

  test("ptrace of another sandbox process fails", async (t) => {
    if (skip(t)) return;
    const { sb } = await makeFixture(t);
    const code = py`
      import ctypes, json, os, subprocess, time
      libc = ctypes.CDLL(None, use_errno=True)
      libc.syscall.restype = ctypes.c_long
      def ptrace(req, pid):
          ctypes.set_errno(0)
          return [libc.syscall(ctypes.c_long(101), ctypes.c_long(req), ctypes.c_long(pid), None, None), ctypes.get_errno()]
      child = subprocess.Popen(["sleep", "30"])
      time.sleep(0.1)
      attach = ptrace(16, child.pid)  # PTRACE_ATTACH
      if attach[0] == 0:
          os.waitpid(child.pid, 0)
          ptrace(17, child.pid)  # PTRACE_DETACH
      seize = ptrace(0x4206, child.pid)  # PTRACE_SEIZE
      child.kill()
      child.wait()
      # The other direction: a child asking to be traced by the worker.
      r, w = os.pipe()
      pid = os.fork()
      if pid == 0:
          os.write(w, json.dumps(ptrace(0, 0)).encode())  # PTRACE_TRACEME
          os._exit(0)
      os.close(w)
      traceme = json.loads(os.read(r, 100))
      os.waitpid(pid, 0)
      print(json.dumps({"attach": attach, "seize": seize, "traceme": traceme}))
    `;
    assert.deepEqual(jsonOut(await sb.execute(code)), { attach: [-1, EPERM], seize: [-1, EPERM], traceme: [-1, EPERM] });
    assert.deepEqual(lastJson(await unfiltered(code)), { attach: [0, 0], seize: [0, 0], traceme: [0, 0] });
  });

  test("process_vm_readv of another process fails", async (t) => {
    if (skip(t)) return;
    const { sb } = await makeFixture(t);
    assert.deepEqual(jsonOut(await sb.execute(processVmReadvOfParent)), { ret: -1, errno: EPERM, read: "" });
    assert.deepEqual(lastJson(await unfiltered(processVmReadvOfParent)), { ret: 24, errno: 0, read: "parent-secret-0123456789" });
  });

  test("another session's processes are invisible and cannot be traced or signalled", async (t) => {
    if (skip(t)) return;
    const fx = await makeFixture(t);
    const victim = fx.open();
    assertOk(await victim.execute("secret = 'victim-secret'"));
    const scratch = victim.status().paths.scratchDir;
    assert.ok(scratch);
    const [pid] = workerPids(scratch);
    assert.ok(pid, "the victim's worker was not found on the host");
    const r = await fx.sb.execute(py`
      import ctypes, json, os, signal
      libc = ctypes.CDLL(None, use_errno=True)
      libc.syscall.restype = ctypes.c_long
      def sc(nr, *args):
          ctypes.set_errno(0)
          return [libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args]), ctypes.get_errno()]
      def kill():
          try:
              os.kill(${pid}, 0)
              return "signalled"
          except OSError as e:
              return e.errno
      print(json.dumps({
          "proc": os.path.exists("/proc/${pid}"),
          "kill": kill(),
          "ptrace": sc(101, 16, ${pid}, 0, 0),
          "process_vm_readv": sc(310, ${pid}, 1, 1, 1, 1, 0),
          "pidfd_open": sc(434, ${pid}, 0),
      }))
    `);
    const out = jsonOut(r);
    assert.equal(out.proc, false, "the other sandbox's worker is visible in /proc");
    assert.equal(out.kill, 3, "kill() must answer ESRCH");
    assert.deepEqual(out.ptrace, [-1, EPERM]);
    assert.deepEqual(out.process_vm_readv, [-1, EPERM]);
    assert.deepEqual(out.pidfd_open, [-1, 3], "pidfd_open must answer ESRCH");
    assert.equal((await victim.execute("secret")).repr, "'victim-secret'", "the victim was disturbed");
  });

  test("no host file descriptor reaches the sandbox", async (t) => {
    if (skip(t)) return;
    const { sb } = await makeFixture(t);
    const r = await sb.execute(py`
      import json, os, subprocess
      def table(pid="self"):
          out = {}
          for fd in os.listdir("/proc/%s/fd" % pid):
              try:
                  out[fd] = os.readlink("/proc/%s/fd/%s" % (pid, fd))
              except OSError:
                  pass  # the descriptor listdir itself used
          return out
      child = subprocess.run(["python3", "-I", "-S", "-c",
          "import json, os; print(json.dumps(sorted(os.listdir('/proc/self/fd'))))"], capture_output=True, text=True)
      print(json.dumps({"worker": table(), "child": json.loads(child.stdout)}))
    `);
    const out = jsonOut(r);
    // 0 = /dev/null, 1/2 = output pipes, 3/4 = the protocol pipes, 10-17 = /dev/null placeholders
    // that keep those numbers the worker's own; the seccomp memfd is gone.
    const placeholders = ["10", "11", "12", "13", "14", "15", "16", "17"];
    assert.deepEqual(Object.keys(out.worker).sort(), ["0", "1", "2", "3", "4", ...placeholders].sort(), JSON.stringify(out.worker));
    assert.equal(out.worker["0"], "/dev/null");
    for (const fd of placeholders) assert.equal(out.worker[fd], "/dev/null", `fd ${fd}`);
    for (const fd of ["1", "2", "3", "4"]) assert.match(out.worker[fd], /^pipe:/, `fd ${fd}: ${out.worker[fd]}`);
    // A subprocess gets 0-2 and the descriptor of its own listdir; not the protocol pipes.
    assert.deepEqual(out.child, ["0", "1", "2", "3"]);
  });

  test("writing /workspace in manual mode fails, also for a writer started in yolo mode", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb, project } = await makeFixture(t);
    sb.applyModeEvent({ mode: "yolo", readRoots: [] });
    // A background writer holding /workspace/log.txt open, started while the mount was writable.
    assertOk(await sb.execute(
      `import subprocess\nsubprocess.Popen(["sh", "-c", "exec 3>>/workspace/log.txt; while :; do echo x >&3; sleep 0.05; done"])\nNone`,
    ));
    const log = join(project, "log.txt");
    assert.ok(await waitUntil(() => existsSync(log) && readFileSync(log, "utf8").length > 4, 3000), "the writer never wrote");
    const change = sb.applyModeEvent({ mode: "manual", readRoots: [] });
    assert.deepEqual([change.changed, change.discarded, change.workspaceMode], [true, true, "read-only"]);
    await sleep(300);
    const size = readFileSync(log, "utf8").length;
    await sleep(500);
    assert.equal(readFileSync(log, "utf8").length, size, "a writer from the writable mode outlived it");
    const r = await sb.execute(py`
      import json
      def attempt(path):
          try:
              open(path, "a").write("manual")
              return "written"
          except OSError as e:
              return e.errno
      print(json.dumps([attempt("/workspace/log.txt"), attempt("/workspace/new.txt")]))
    `);
    assert.deepEqual(jsonOut(r), [EROFS, EROFS]);
    assert.equal(r.stateLost, true);
    assert.equal(existsSync(join(project, "new.txt")), false);
  });

  test("write access revoked while the sandbox starts is never used by the code", async (t) => {
    if (skipWithoutSandbox(t)) return;
    // Each call starts a sandbox in yolo mode; manual mode arrives a little later each time, so
    // that some changes land while bubblewrap or the interpreter is still starting (no process to
    // kill yet). The code waits, then writes: it must meet the read-only mount or be killed.
    const { project, open } = await makeFixture(t);
    for (let i = 0; i < 16; i++) {
      const sb = open({ prewarm: false });
      sb.applyModeEvent({ mode: "yolo", readRoots: [] });
      const pending = sb.execute(`import time\ntime.sleep(0.3)\nopen('/workspace/w${i}.txt', 'w').write('x')`);
      await sleep(i * 3);
      sb.applyModeEvent({ mode: "manual", readRoots: [] });
      const r = await pending;
      assert.equal(existsSync(join(project, `w${i}.txt`)), false, `change after ${i * 3} ms: the write went through: ${show(r)}`);
      assert.ok(
        (r.status === "runtime_error" && r.exception?.type === "OSError") || /permission mode or read roots changed/.test(r.diagnostic ?? ""),
        `change after ${i * 3} ms: ${show(r)}`,
      );
      await sb.dispose();
    }
  });

  test("the only writable host directory is /scratch (read-only mode)", async (t) => {
    if (skip(t)) return;
    const { sb } = await makeFixture(t);
    const r = await sb.execute(py`
      import json
      mounts = []
      for line in open("/proc/self/mountinfo"):
          f = line.split()
          fstype = f[f.index("-") + 1]
          mounts.append([f[4], f[5].split(",")[0], fstype])
      print(json.dumps(mounts))
    `);
    const mounts: [string, string, string][] = jsonOut(r);
    const kernelFs = new Set(["tmpfs", "proc", "devtmpfs", "devpts", "mqueue", "sysfs"]);
    const writableHost = mounts.filter(([, mode, fs]) => mode === "rw" && !kernelFs.has(fs)).map(([p]) => p);
    assert.deepEqual(writableHost, ["/scratch"], JSON.stringify(mounts));
    assert.ok(mounts.some(([p, mode]) => p === "/workspace" && mode === "ro"), "/workspace is not read-only");
  });
});

// ---------------------------------------------------------------------------------------------
/**
 * Yolo (and edits/auto) mount /workspace read-write; paths that make the host run code or
 * configure tools (src/permissions.rs DEFAULT_PROTECTED) stay read-only even then.
 */
const PROTECTED_FILES = [
  ".git/config", ".git/hooks/pre-commit", ".pi/settings.json", ".vscode/settings.json", ".idea/workspace.xml",
  ".mcp.json", ".envrc", ".bashrc", ".bash_profile", ".bash_login", ".profile", ".zshrc", ".zprofile", ".zshenv",
];
/** New files in protected directories. */
const PROTECTED_NEW = [".git/hooks/post-checkout", ".vscode/tasks.json", ".pi/extensions/evil.ts", ".idea/evil.xml"];

async function protectedProject(project: string): Promise<void> {
  for (const file of PROTECTED_FILES) {
    await mkdir(join(project, file, ".."), { recursive: true });
    await writeFile(join(project, file), `original ${file}\n`);
  }
  await writeFile(join(project, ".git/HEAD"), "ref: refs/heads/main\n");
}

/** Python: try to write each of FILES and NEW (creating parents) and src/main.py. */
const WRITE_ATTEMPTS = py`
  import json, os
  def attempt(fn):
      try:
          fn()
          return "written"
      except OSError as e:
          return e.errno
  def write(path):
      def go():
          os.makedirs(os.path.dirname(path), exist_ok=True)
          with open(path, "w") as f:
              f.write("pwned\n")
      return attempt(go)
  print(json.dumps({
      "files": {p: write("/workspace/" + p) for p in FILES},
      "new": {p: write("/workspace/" + p) for p in NEW},
      "other": write("/workspace/src/main.py"),
  }))
`;

const writeAttempts = (files: string[], fresh: string[]) =>
  `FILES = ${JSON.stringify(files)}\nNEW = ${JSON.stringify(fresh)}\n${WRITE_ATTEMPTS}`;

describe("protected paths in a writable workspace", { concurrency: CONCURRENCY }, () => {
  test("writing a protected path in yolo mode fails with EROFS; other project writes succeed", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb, project } = await makeFixture(t);
    await protectedProject(project);
    const mode = sb.applyModeEvent({ mode: "yolo", readRoots: [] });
    assert.equal(mode.workspaceMode, "read-write");
    const out = jsonOut(await sb.execute(writeAttempts(PROTECTED_FILES, PROTECTED_NEW)));
    const all = { ...out.files, ...out.new } as Record<string, string | number>;
    assert.equal(out.other, "written", "an ordinary project write must succeed in yolo mode");
    assert.equal(await readFile(join(project, "src/main.py"), "utf8"), "pwned\n");
    for (const [path, outcome] of Object.entries(all)) assert.equal(outcome, EROFS, `${path}: ${outcome}`);
    for (const file of PROTECTED_FILES) {
      assert.equal(readFileSync(join(project, file), "utf8"), `original ${file}\n`, `${file} changed on the host`);
    }
  });

  test(
    "a protected path cannot be swapped out by renaming its parent",
    async (t) => {
      if (skipWithoutSandbox(t)) return;
      const { sb, project } = await makeFixture(t);
      await protectedProject(project);
      sb.applyModeEvent({ mode: "yolo", readRoots: [] });
      // Bind mounts move with a renamed parent directory: renaming .git and recreating
      // .git/hooks and .git/config leaves the read-only binds behind in .git-moved.
      const r = await sb.execute(py`
        import json, os
        def attempt(fn):
            try:
                fn()
                return "done"
            except OSError as e:
                return e.errno
        def replace_git():
            os.rename("/workspace/.git", "/workspace/.git-moved")
            os.makedirs("/workspace/.git/hooks")
            open("/workspace/.git/hooks/pre-commit", "w").write("pwned\n")
            open("/workspace/.git/config", "w").write("[core]\n\thooksPath = /tmp\n")
        def replace_vscode():
            os.rename("/workspace/.vscode", "/workspace/.vscode-moved")
        print(json.dumps({"git": attempt(replace_git), "vscode": attempt(replace_vscode)}))
      `);
      const out = jsonOut(r);
      assert.equal(out.vscode, 16, "a protected directory must not be renamable (EBUSY)");
      assert.notEqual(out.git, "done", "renaming .git swapped out the protected hooks and config");
      assert.equal(readFileSync(join(project, ".git/hooks/pre-commit"), "utf8"), "original .git/hooks/pre-commit\n");
      assert.equal(readFileSync(join(project, ".git/config"), "utf8"), "original .git/config\n");
    },
  );

  test("a protected path that is a symbolic link is put back after the code replaces it", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb, project } = await makeFixture(t);
    // .pi is a link to config/pi: the mount protects the target, the link itself sits in the
    // writable project and the code replaces it with a directory holding its own settings.
    await mkdir(join(project, "config/pi"), { recursive: true });
    await writeFile(join(project, "config/pi/settings.json"), "{}\n");
    await symlink("config/pi", join(project, ".pi"));
    sb.applyModeEvent({ mode: "yolo", readRoots: [] });
    const r = await sb.execute(py`
      import json, os
      def attempt(fn):
          try:
              fn()
              return "done"
          except OSError as e:
              return e.errno
      def replace():
          os.remove("/workspace/.pi")
          os.makedirs("/workspace/.pi/extensions")
          open("/workspace/.pi/extensions/evil.ts", "w").write("pwned")
      print(json.dumps({
          "replace": attempt(replace),
          "target": attempt(lambda: open("/workspace/config/pi/settings.json", "a").write("x")),
      }))
    `);
    const out = jsonOut(r);
    assert.equal(out.target, EROFS, "the link's target stays read-only");
    assert.equal(readlinkSync(join(project, ".pi")), "config/pi", "the link was put back");
    assert.equal(readFileSync(join(project, "config/pi/settings.json"), "utf8"), "{}\n");
    assert.match(r.notes.join("\n"), /The protected link \.pi -> config\/pi was replaced in the project; it was put back/);
    // Whatever replaced it is kept, renamed in place so that no tool reads it.
    const inert = readdirSync(project).filter((n) => n.startsWith(".pi.pi-inert"));
    assert.ok(inert.length >= 1, `no inert copy in ${readdirSync(project)}`);
  });

  test(
    "a protected path that does not exist yet cannot be created in yolo mode",
    async (t) => {
      if (skipWithoutSandbox(t)) return;
      const { sb, project } = await makeFixture(t);
      await mkdir(join(project, ".git/hooks"), { recursive: true });
      await writeFile(join(project, ".git/config"), "[core]\n");
      sb.applyModeEvent({ mode: "yolo", readRoots: [] });
      // .pi/extensions, .vscode/tasks.json, .mcp.json and .envrc are read by tools on the host.
      const fresh = [".pi/extensions/evil.ts", ".vscode/tasks.json", ".mcp.json", ".envrc", ".bashrc"];
      // Nothing can be mounted over a path that does not exist without
      // creating it in the project; the session renames what appears, in
      // place, to a name no tool reads, and says so.
      const r = await sb.execute(writeAttempts([], fresh));
      const out = jsonOut(r);
      assert.equal(out.other, "written");
      for (const path of fresh) {
        const top = path.split("/")[0];
        assert.equal(existsSync(join(project, top)), false, `${top} is still in the project after the execution`);
        assert.ok(existsSync(join(project, `${top}.pi-inert`)), `${top} was not kept as ${top}.pi-inert`);
        assert.match(r.text, new RegExp(`${top.replace(".", "\\.")} appeared in the project .* renamed to ${top.replace(".", "\\.")}\\.pi-inert`));
      }
    },
  );

  test(
    "a worktree's .git file cannot be redirected to a gitdir inside the project",
    async (t) => {
      if (skipWithoutSandbox(t)) return;
      const { sb, project, base } = await makeFixture(t);
      // A linked worktree: .git is a file naming the real git directory outside the project.
      const gitdir = join(base, "main-repo.git");
      await mkdir(join(gitdir, "hooks"), { recursive: true });
      await writeFile(join(gitdir, "config"), "[core]\n");
      await writeFile(join(project, ".git"), `gitdir: ${gitdir}\n`);
      sb.applyModeEvent({ mode: "yolo", readRoots: [] });
      const r = await sb.execute(py`
        import json, os
        try:
            os.makedirs("/workspace/evil-git/hooks")
            open("/workspace/evil-git/hooks/pre-commit", "w").write("#!/bin/sh\necho pwned\n")
            open("/workspace/.git", "w").write("gitdir: evil-git\n")
            out = "redirected"
        except OSError as e:
            out = e.errno
        print(json.dumps(out))
      `);
      assert.notEqual(jsonOut(r), "redirected", "git on the host would now run hooks written by the sandbox");
      assert.equal(readFileSync(join(project, ".git"), "utf8"), `gitdir: ${gitdir}\n`);
    },
  );
});
