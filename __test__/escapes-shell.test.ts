/**
 * The escape catalogue as shell payloads: each attempt of the python tool's catalogue (and the
 * ones only a shell makes) run as a command of the sandboxed `bash` tool through
 * `execShell`, one named test per attempt. Each test also runs the attempt WITHOUT the defence,
 * so that it tells "refused" from "could not work anyway": on the host through /bin/sh (what pi's
 * own bash would do), or in a bare bubblewrap with the sandbox's namespaces but no seccomp
 * filter, no masks and no caps (helpers/unfiltered.ts, the command run by /bin/sh there).
 *
 * Kernel files are OPENED FOR WRITING AND NEVER WRITTEN (`exec 3>>FILE` opens with O_APPEND and
 * writes nothing), inside and in the baselines. Every process a baseline leaves is killed and
 * every file it makes removed. System calls are made through ctypes with x86_64 numbers, by the
 * python3 of /usr, which a shell command sees.
 * Run: node --import tsx --test --test-concurrency=1 __test__/escapes-shell.test.ts
 */
import assert from "node:assert/strict";
import { spawn, spawnSync } from "node:child_process";
import { once } from "node:events";
import {
  chmodSync,
  chownSync,
  closeSync,
  copyFileSync,
  existsSync,
  mkdirSync,
  mkdtempSync,
  openSync,
  readdirSync,
  readFileSync,
  readlinkSync,
  rmSync,
  statSync,
  writeFileSync,
} from "node:fs";
import { createServer, type Server } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { describe, test, type TestContext } from "node:test";
import type { ShellResult } from "../index.d.ts";
import { assertNoProcess, workerPids } from "./helpers/host-procs.ts";
import { skipWithoutSandbox, withEnv } from "./helpers/sandbox-env.ts";
import {
  type Fixture,
  hostPidsWithCmdline,
  INDEX_CJS,
  lit,
  makeFixture,
  PythonSandbox,
  py,
  sleep,
  waitUntil,
} from "./helpers/sandbox-fixture.ts";
import { type Answer, ioUringConnect, lastJson, processVmReadvOfParent, skipProbe, tableProbe } from "./helpers/syscall-probes.ts";
import { unfiltered, type UnfilteredOptions } from "./helpers/unfiltered.ts";

const EPERM = 1;
const EROFS = "Read-only file system";
const ROOT = process.getuid?.() === 0;

let nextId = 1;

/** Run `command` in `sb`'s bash sandbox: its result and everything `onData` got. */
async function sh(sb: PythonSandbox, cwd: string, command: string, timeoutSeconds = 30): Promise<{ r: ShellResult; out: string }> {
  let out = "";
  const r = await sb.execShell(nextId++, command, { cwd, timeoutSeconds }, (t: string) => {
    out += t;
  });
  return { r, out };
}

/** The same command on the host through /bin/sh, unconfined: the baseline pi's own bash gives. */
function host(cwd: string, command: string, env: NodeJS.ProcessEnv = process.env): { status: number | null; out: string } {
  const r = spawnSync("/bin/sh", ["-c", command], { cwd, env, encoding: "utf8", timeout: 20_000, stdio: ["ignore", "pipe", "pipe"] });
  return { status: r.status, out: (r.stdout ?? "") + (r.stderr ?? "") };
}

/**
 * The command in a bare bubblewrap (helpers/unfiltered.ts: the sandbox's namespaces, no filter,
 * no masks, `--proc /proc`, a writable tmpfs root; the project at /workspace), run by /bin/sh
 * with stdin /dev/null. Its exit status and output.
 */
async function bare(command: string, options: UnfilteredOptions = {}): Promise<{ status: number; out: string }> {
  const stdout = await unfiltered(
    py`
      import base64, json, subprocess
      command = base64.b64decode("${Buffer.from(command).toString("base64")}").decode()
      r = subprocess.run(["/bin/sh", "-c", command], stdin=subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=30)
      print(json.dumps({"status": r.returncode, "out": r.stdout.decode("utf-8", "replace")}))
    `,
    options,
  );
  return lastJson(stdout);
}

/** `s` as one word of /bin/sh. */
const quote = (s: string) => `'${s.replace(/'/g, `'\\''`)}'`;
/** A shell command running Python `code` by the system's python3 (the one a command sees). */
const python = (code: string) => `/usr/bin/python3 -I -S -c ${quote(code)}`;

/** Kill (SIGKILL) every host process whose command line holds `marker`, after the test. */
function killAfter(t: TestContext, marker: string): void {
  t.after(async () => {
    for (const pid of hostPidsWithCmdline(marker)) {
      try {
        process.kill(pid, "SIGKILL");
      } catch {
        // Gone already.
      }
    }
    await waitUntil(() => hostPidsWithCmdline(marker).length === 0, 5000);
  });
}

const uniq = (tag: string) => `pps-esh-${tag}-${process.pid}-${nextId++}`;

async function fixture(t: TestContext, options: Parameters<typeof makeFixture>[1] = {}): Promise<Fixture | undefined> {
  if (skipWithoutSandbox(t)) return undefined;
  return makeFixture(t, options);
}

/** In `base` (a folder nobody can reach): a runtime root nobody owns and a copy of the addon. */
function nobodysAddon(base: string): { runtimeRoot: string; addonDir: string } {
  const runtimeRoot = join(base, "rt");
  mkdirSync(runtimeRoot, { mode: 0o700 });
  chownSync(runtimeRoot, 65534, 65534);
  const addonDir = join(base, "addon");
  mkdirSync(addonDir);
  for (const name of readdirSync(dirname(INDEX_CJS)).filter((n) => n === "index.cjs" || n.endsWith(".node"))) {
    copyFileSync(join(dirname(INDEX_CJS), name), join(addonDir, name));
  }
  return { runtimeRoot, addonDir };
}

/** Root-only attempts report, never pass in silence, where the baseline cannot show them. */
function needsRoot(t: TestContext, why: string): boolean {
  if (ROOT) return false;
  t.diagnostic(`not root: ${why}; the attempt is still asserted inside`);
  return true;
}

// ---------------------------------------------------------------------------------------------
describe("host files outside the sandbox's mounts", { concurrency: 1 }, () => {
  test("cat /etc/shadow fails, also as root", async (t) => {
    const f = await fixture(t);
    if (!f) return;
    const { r, out } = await sh(f.sb, f.project, "cat /etc/shadow");
    assert.notEqual(r.exitCode, 0, out);
    assert.doesNotMatch(out, /root:/);
    if (!needsRoot(t, "the host refuses /etc/shadow too")) assert.match(host(f.project, "cat /etc/shadow").out, /^root:/m, "baseline");
  });

  test("/root is not there", async (t) => {
    const f = await fixture(t);
    if (!f) return;
    const marker = join("/root", `.${uniq("root")}`);
    if (ROOT) {
      writeFileSync(marker, "root-secret\n");
      t.after(() => rmSync(marker, { force: true }));
      assert.match(host(f.project, `cat ${marker}`).out, /root-secret/, "baseline");
    } else {
      t.diagnostic("not root: no marker planted in /root; its listing is still asserted empty");
    }
    // cat's error on stdout: the two streams reach the host in no fixed order, and the count must come last.
    const { out } = await sh(f.sb, f.project, `cat ${marker} 2>&1; ls -A /root 2>/dev/null | wc -l`);
    assert.doesNotMatch(out, /root-secret/);
    assert.match(out, /(^|\n)0\n$/, out);
  });

  test("another user's home under /home is not there", async (t) => {
    const f = await fixture(t);
    if (!f || needsRoot(t, "no other home can be planted")) return;
    const home = join("/home", uniq("home"));
    mkdirSync(join(home, ".ssh"), { recursive: true });
    t.after(() => rmSync(home, { recursive: true, force: true }));
    writeFileSync(join(home, ".ssh", "id_ed25519"), "OTHER-USER-KEY\n");
    assert.match(host(f.project, `cat ${home}/.ssh/id_ed25519`).out, /OTHER-USER-KEY/, "baseline");
    const { out } = await sh(f.sb, f.project, `cat ${home}/.ssh/id_ed25519; echo "listed:$(ls -A /home 2>/dev/null | tr '\\n' ' ')"`);
    assert.doesNotMatch(out, /OTHER-USER-KEY/);
    assert.match(out, /^listed:$/m, out);
  });

  test("/proc/1/root leads to the sandbox's own root, not the host's", async (t) => {
    const f = await fixture(t);
    if (!f) return;
    writeFileSync(join(f.base, "outside.txt"), "OUTSIDE-THE-PROJECT\n");
    const file = join(f.base, "outside.txt");
    // The baseline: a host shell reads it through its parent's root (the host's pid 1 may be
    // out of reach where the tests run in a container).
    assert.match(host(f.project, `cat /proc/$PPID/root${file}`).out, /OUTSIDE-THE-PROJECT/, "baseline: through a process's root");
    const seen = host(f.project, `cat /proc/1/root${file}`).out;
    t.diagnostic(`host, through /proc/1/root: ${seen.trim()}`);
    const { out } = await sh(f.sb, f.project, `cat /proc/1/root${file} /proc/$PPID/root${file}; cat /proc/1/root/etc/shadow; ls /proc/1/root${f.base}`);
    assert.doesNotMatch(out, /OUTSIDE-THE-PROJECT|root:/);
    // cat's errors (stderr) and ls's listing (stdout) come through two pipes, in either order.
    const listed = out.split("\n").filter((l) => l !== "" && !l.startsWith("cat: "));
    assert.deepEqual(listed, ["project"], `the fixture's base shows the project alone: ${out}`);
  });

  test("/proc/self/mounts names no host path but the project's", async (t) => {
    const f = await fixture(t);
    if (!f) return;
    const { out } = await sh(f.sb, f.project, "cat /proc/self/mounts");
    const seen = host(f.project, "cat /proc/self/mounts").out;
    assert.match(seen, / \/ /, "baseline: the host's mount table");
    const lines = out.trim().split("\n");
    assert.ok(lines.length > 3, out);
    for (const line of lines) {
      const [, where] = line.split(" ");
      if (where.startsWith(f.base)) assert.ok(where === f.project || where.startsWith(`${f.project}/`), `a host path outside the project: ${line}`);
      for (const hidden of [f.runtimeRoot, "/root", "/home"]) {
        assert.ok(!(where === hidden || where.startsWith(`${hidden}/`)), `${hidden} mounted: ${line}`);
      }
    }
    // mountinfo's fourth field is the root of each bind in its source file system: the host
    // paths of the masks' sources (the session directory) show there, names only, none mounted.
    const info = (await sh(f.sb, f.project, "cut -d' ' -f4 /proc/self/mountinfo | sort -u")).out;
    t.diagnostic(`bind roots named in mountinfo: ${info.trim().replace(/\n/g, " ")}`);
  });
});

// ---------------------------------------------------------------------------------------------
describe("the host's kernel interfaces", { concurrency: 1 }, () => {
  const openForAppend = (path: string) => `( exec 3>>${path} ) && echo opened`;
  for (const path of ["/proc/sys/kernel/core_pattern", "/proc/sys/vm/drop_caches", "/proc/sysrq-trigger"]) {
    test(`${path} cannot be opened for writing`, async (t) => {
      const f = await fixture(t);
      if (!f) return;
      const { out } = await sh(f.sb, f.project, openForAppend(path));
      assert.doesNotMatch(out, /opened/);
      if (!existsSync(path)) {
        t.diagnostic(`${path}: this kernel has none; nothing to protect (inside: ${out.trim()})`);
        return;
      }
      if (needsRoot(t, "the kernel refuses the open by mode bits")) return;
      assert.match(out, new RegExp(EROFS));
      assert.match((await bare(openForAppend(path))).out, /opened/, "baseline: a bare bwrap opens it as root");
    });
  }

  test("/proc/kallsyms and /proc/kcore are masked", async (t) => {
    const f = await fixture(t);
    if (!f) return;
    const cmd = "for p in /proc/kallsyms /proc/kcore; do echo \"$p $(stat -f -c %T $p) $(wc -c < $p)\"; done";
    const { out } = await sh(f.sb, f.project, cmd);
    const free = (await bare(cmd)).out;
    for (const path of ["/proc/kallsyms", "/proc/kcore"]) {
      if (!existsSync(path)) {
        t.diagnostic(`${path}: this kernel has none; nothing to hide`);
        continue;
      }
      assert.match(free, new RegExp(`${path} proc `), `baseline: ${free}`);
      assert.match(out, new RegExp(`${path} (?!proc)\\S+ 0\n`), out);
    }
    assert.match(free, /\/proc\/kallsyms proc [1-9]/, `baseline: the kernel's symbols (${free})`);
  });

  test("/sys is not there", async (t) => {
    const f = await fixture(t);
    if (!f) return;
    const cmd = "ls /sys/kernel /sys/class/net 2>&1 | head -3; ( exec 3>>/sys/kernel/uevent_helper ) && echo opened";
    assert.match(host(f.project, "ls /sys/kernel").out, /mm|security|uevent/, "baseline: the host's sysfs");
    const { out } = await sh(f.sb, f.project, cmd);
    assert.doesNotMatch(out, /opened/);
    assert.match(out, /No such file or directory|Read-only file system/);
    assert.doesNotMatch(out, /(^|\s)(mm|security|eth0|lo)(\s|$)/);
  });
});

// ---------------------------------------------------------------------------------------------
/** Raw calls, made by python3 inside the shell, as escapes.test.ts makes them. */
interface Probe {
  title: string;
  nr: number;
  args: number[];
  /** The call is allowed: the same answer inside and unfiltered. */
  allowed?: boolean;
  /** The kernel gates the call for an unprivileged namespace too: the baseline is reported. */
  gated?: boolean;
}

const SYSCALLS: Probe[] = [
  // Keyrings: an unknown keyctl operation -> EOPNOTSUPP; bad type pointers -> EFAULT.
  { title: "keyctl", nr: 250, args: [9999, 0, 0, 0, 0] },
  { title: "add_key", nr: 248, args: [1, 1, 1, 0, -3] },
  // bpf with a bad attr pointer: the kernel gates it on unprivileged_bpf_disabled first.
  { title: "bpf", nr: 321, args: [0, 1, 16], gated: true },
  { title: "perf_event_open", nr: 298, args: [1, 0, -1, -1, 0] }, // bad attr pointer: EFAULT
  { title: "io_uring_setup", nr: 425, args: [1, 1] }, // bad params pointer: EFAULT
  { title: "io_uring_enter", nr: 426, args: [-1, 0, 0, 0, 0, 0] }, // EBADF
  // Terminal control on fd 0 (/dev/null, not a terminal): ENOTTY when allowed.
  { title: "ioctl TIOCSTI", nr: 16, args: [0, 0x5412, 0] },
  { title: "ioctl TIOCLINUX", nr: 16, args: [0, 0x541c, 0] },
  { title: "unshare CLONE_NEWUSER", nr: 272, args: [0x10000000 | 1] }, // an invalid bit beside: EINVAL
  { title: "unshare CLONE_NEWNS", nr: 272, args: [0x20000 | 1] },
  { title: "mount", nr: 165, args: [1, 1, 1, 0, 0] }, // EFAULT
  { title: "setns", nr: 308, args: [-1, 0] }, // EBADF
  { title: "ptrace(PTRACE_ATTACH) of no such pid", nr: 101, args: [16, 0x3fffffff, 0, 0] }, // ESRCH
  // Sockets: a network protocol gets an fd unfiltered (in an empty network namespace).
  { title: "socket(AF_INET, SOCK_STREAM)", nr: 41, args: [2, 1, 0] },
  { title: "socket(AF_INET, SOCK_DGRAM)", nr: 41, args: [2, 2, 0] },
  { title: "socket(AF_INET6, SOCK_STREAM)", nr: 41, args: [10, 1, 0] },
  { title: "socket(AF_NETLINK, NETLINK_ROUTE)", nr: 41, args: [16, 3, 0] },
  { title: "socket(AF_UNIX)", nr: 41, args: [1, 1, 0] },
  { title: "socketpair(AF_INET)", nr: 53, args: [2, 1, 0, 1] }, // EOPNOTSUPP unfiltered
  // The one socket call a shell has: a Unix pair with a bad vector pointer, EFAULT when allowed.
  { title: "socketpair(AF_UNIX)", nr: 53, args: [1, 1, 0, 1], allowed: true },
];

describe("seccomp refuses a shell's raw calls", { concurrency: 1 }, () => {
  // The table runs once (in the first test that needs it), inside and in a bare bwrap.
  let both: Promise<[Record<string, Answer>, Record<string, Answer>]> | undefined;
  const answers = (t: TestContext) => {
    if (skipProbe(t)) return undefined;
    both ??= (async () => {
      const f = await makeFixture(t);
      const code = tableProbe(SYSCALLS.map(({ title, nr, args }) => ({ title, nr, args })));
      const { r, out } = await sh(f.sb, f.project, python(code));
      assert.equal(r.exitCode, 0, out);
      const free = await bare(python(code));
      assert.equal(free.status, 0, free.out);
      return [lastJson(out), lastJson(free.out)] as [Record<string, Answer>, Record<string, Answer>];
    })();
    return both;
  };
  for (const p of SYSCALLS) {
    test(p.allowed ? `${p.title} works (the shell profile allows it)` : `blocks ${p.title}`, async (t) => {
      const got = await answers(t);
      if (!got) return;
      const [inside, free] = [got[0][p.title], got[1][p.title]];
      if (p.allowed) {
        assert.deepEqual(inside, free, `${p.title}: inside ${JSON.stringify(inside)}, unfiltered ${JSON.stringify(free)}`);
        assert.notEqual(inside.errno, EPERM);
        return;
      }
      assert.deepEqual(inside, { ret: -1, errno: EPERM }, `${p.title} inside the sandbox`);
      t.diagnostic(`unfiltered ${p.title}: ${JSON.stringify(free)}`);
      if (!p.gated) assert.notEqual(free.errno, EPERM, `unfiltered, ${p.title} must not answer EPERM (${JSON.stringify(free)})`);
    });
  }

  test("a real socketpair(AF_UNIX) carries bytes (sort and coprocesses need it)", async (t) => {
    const f = await fixture(t);
    if (!f) return;
    const code = py`
      import socket
      a, b = socket.socketpair()
      a.sendall(b"pair-ok")
      print(b.recv(16).decode())
    `;
    const { r, out } = await sh(f.sb, f.project, python(code));
    assert.equal(r.exitCode, 0, out);
    assert.equal(out, "pair-ok\n");
  });

  test("ptrace of a sibling process fails", async (t) => {
    const f = await fixture(t);
    if (!f) return;
    const marker = uniq("ptrace");
    const attach = py`
      import ctypes, os, sys
      libc = ctypes.CDLL(None, use_errno=True)
      pid = int(sys.argv[1])
      ret = libc.ptrace(16, pid, 0, 0)
      print("attach", ret, ctypes.get_errno())
    `;
    // One process holding the marker, killed before the command ends (the baseline's pipe
    // stays open until every writer is gone).
    const cmd = `/usr/bin/python3 -I -S -c 'import time; time.sleep(30)' ${marker} & ${python(attach)} $!; kill -9 $!; wait`;
    killAfter(t, marker);
    const { out } = await sh(f.sb, f.project, cmd);
    assert.match(out, new RegExp(`^attach -1 ${EPERM}\\n`), out);
    assert.match((await bare(cmd)).out, /^attach 0 0\n/, "baseline: a bare bwrap attaches");
  });

  test("unshare -U fails", async (t) => {
    const f = await fixture(t);
    if (!f) return;
    const cmd = "unshare -U true && echo unshared";
    const { out } = await sh(f.sb, f.project, cmd);
    assert.doesNotMatch(out, /unshared/);
    assert.match(out, /Operation not permitted/);
    assert.match((await bare(cmd)).out, /unshared/, "baseline");
  });

  test("unshare -m and mount fail", async (t) => {
    const f = await fixture(t);
    if (!f) return;
    const cmd = "unshare -m true && echo unshared; mount -t tmpfs none /tmp && echo mounted";
    const { out } = await sh(f.sb, f.project, cmd);
    assert.doesNotMatch(out, /unshared|mounted/);
    const free = (await bare(cmd)).out;
    assert.match(free, /unshared/, `baseline: ${free}`);
    // Not root, mount(8) refuses in the bare bwrap too; the raw call's table shows the filter.
    if (!needsRoot(t, "mount(8) refuses unfiltered as well")) assert.match(free, /mounted/, `baseline: ${free}`);
  });

  test("TIOCSTI into a terminal of its own is refused", async (t) => {
    const f = await fixture(t);
    if (!f) return;
    const code = py`
      import fcntl, os, termios
      master, slave = os.openpty()
      try:
          fcntl.ioctl(slave, termios.TIOCSTI, b"X")
          print("typed")
      except OSError as e:
          print("errno", e.errno)
    `;
    const { out } = await sh(f.sb, f.project, python(code));
    assert.equal(out, `errno ${EPERM}\n`);
    // Where dev.tty.legacy_tiocsti is off the kernel refuses it unfiltered as well.
    t.diagnostic(`unfiltered TIOCSTI: ${(await bare(python(code))).out.trim()}`);
  });
});

// ---------------------------------------------------------------------------------------------
describe("network", { concurrency: 1 }, () => {
  /**
   * A host server on 127.0.0.1 in a process of its own (the baseline's spawnSync blocks this
   * one's event loop); its port. Killed after the test.
   */
  const listen = async (t: TestContext): Promise<number> => {
    const server = spawn(process.execPath, ["-e", `
      const s = require("node:net").createServer((c) => c.end("HTTP/1.0 200 OK\\r\\n\\r\\nHOST-SERVER\\n"));
      s.listen(0, "127.0.0.1", () => console.log(s.address().port));`], { stdio: ["ignore", "pipe", "inherit"] });
    t.after(() => {
      server.kill("SIGKILL");
    });
    const [line] = (await once(server.stdout, "data")) as [Buffer];
    return Number(line.toString().trim());
  };

  test("curl and python to a host server on 127.0.0.1 fail", async (t) => {
    const f = await fixture(t);
    if (!f) return;
    const port = await listen(t);
    const code = `import socket; s = socket.create_connection(("127.0.0.1", ${port}), 3); print(s.recv(64).decode())`;
    const cmd = `curl -sS -m 3 http://127.0.0.1:${port}/ 2>&1 | head -c 300; echo; ${python(code)} 2>&1 | tail -1`;
    assert.match(host(f.project, cmd).out, /HOST-SERVER/, "baseline: the host reaches it");
    const { out } = await sh(f.sb, f.project, cmd);
    assert.doesNotMatch(out, /HOST-SERVER/);
    assert.match(out, /PermissionError|Operation not permitted/, out);
  });

  test("a public address is unreachable (no route, no socket)", async (t) => {
    const f = await fixture(t);
    if (!f) return;
    const cmd = `cat /proc/net/route | tail -n +2 | wc -l; curl -sS -m 5 -o /dev/null -w 'http %{http_code}\\n' http://1.1.1.1/ 2>&1 | tail -1`;
    const seen = host(f.project, cmd).out;
    assert.match(seen, /^[1-9]/, `baseline: the host has a route (${seen})`);
    t.diagnostic(`host: ${seen.trim().replace(/\n/g, "; ")}`);
    const { out } = await sh(f.sb, f.project, cmd);
    assert.match(out, /^0\n/, out);
    assert.doesNotMatch(out, /http [1-9]/);
  });

  test("no DNS: no resolver and no socket to one", async (t) => {
    const f = await fixture(t);
    if (!f) return;
    const code = py`
      import socket
      try:
          print(socket.getaddrinfo("example.com", 80)[0][4])
      except OSError as e:
          print("refused", type(e).__name__)
    `;
    const nameserver = /^nameserver\s+(\S+)/m.exec(existsSync("/etc/resolv.conf") ? readFileSync("/etc/resolv.conf", "utf8") : "")?.[1];
    if (nameserver) {
      const udp = `import socket; s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.connect((${JSON.stringify(nameserver)}, 53)); print("udp-ok")`;
      assert.match(host(f.project, python(udp)).out, /udp-ok/, "baseline: the host can address its resolver");
    } else {
      t.diagnostic("the host names no resolver; the sandbox's refusal is still asserted");
    }
    const { out } = await sh(f.sb, f.project, `cat /etc/resolv.conf 2>&1 | grep -c nameserver; getent hosts example.com || echo no-answer; ${python(code)}`);
    assert.match(out, /^0\n/, out);
    assert.match(out, /no-answer/);
    assert.match(out, /refused \w+/);
  });
});

// ---------------------------------------------------------------------------------------------
describe("writes outside what the mode grants", { concurrency: 1 }, () => {
  test("the project is read-only in the default mode", async (t) => {
    const f = await fixture(t);
    if (!f) return;
    const cmd = "touch x && echo wrote; echo more >> data.txt && echo appended";
    const { out } = await sh(f.sb, f.project, cmd);
    assert.doesNotMatch(out, /wrote|appended/);
    assert.match(out, new RegExp(EROFS));
    assert.equal(readFileSync(join(f.project, "data.txt"), "utf8"), "fixture-content\n");
    assert.match((await bare(cmd.replace(/x|data\.txt/g, (m) => `/workspace/${m}`), { project: f.project, writable: true })).out, /wrote[\s\S]*appended/, "baseline");
  });

  test("/usr, the root, /etc files and /dev cannot be written", async (t) => {
    const f = await fixture(t);
    if (!f) return;
    const name = uniq("w");
    const cmd = [
      `( exec 3>>/usr/bin/env ) && echo usr-opened`,
      `mkdir /usr/${name} && rmdir /usr/${name} && echo usr-made`,
      `mkdir /${name} && echo root-made`,
      `( exec 3>>/etc/passwd ) && echo passwd-opened`,
      `( exec 3>>/etc/hosts ) && echo hosts-opened`,
      `( exec 3>/dev/${name} ) && echo dev-made`,
    ].join("; ");
    const { out } = await sh(f.sb, f.project, cmd);
    assert.doesNotMatch(out, /opened|made/, out);
    if (!needsRoot(t, "the host refuses these by mode bits")) {
      const seen = host(f.project, [cmd.split("; ")[0], cmd.split("; ")[1], cmd.split("; ")[3]].join("; ")).out;
      assert.match(seen, /usr-opened\nusr-made\npasswd-opened/, `baseline, the host as root: ${seen}`);
    }
    const free = (await bare(cmd)).out;
    assert.match(free, /root-made/, `baseline, a bare bwrap's tmpfs root: ${free}`);
    assert.match(free, /dev-made/, `baseline, a bare bwrap's --dev: ${free}`);
  });

  test("a link planted in a writable project to a host path is neither followed inside nor by the host", async (t) => {
    const f = await fixture(t, { workspaceWritable: true });
    if (!f) return;
    const victim = join(f.base, "victim");
    writeFileSync(victim, "HOST-FILE\n");
    assert.match(host(f.project, `ln -s ${victim} probe-link && cat probe-link; rm probe-link`).out, /HOST-FILE/, "baseline: the host follows it");
    // Inside: the target is not mounted; a protected name planted as a link is made inert by the
    // host, which must rename the link, never write or move what it points to.
    const { out } = await sh(f.sb, f.project, `ln -s ${victim} leak && cat leak; ln -s ${victim} .envrc; ln -s ${f.base} .git; echo done`);
    assert.doesNotMatch(out, /HOST-FILE/);
    assert.match(out, /done/);
    assert.equal(readFileSync(victim, "utf8"), "HOST-FILE\n", "the host followed a planted link");
    assert.ok(statSync(victim).isFile());
    assert.ok(existsSync(join(f.base, "project")), "the host moved what a planted link points to");
    assert.equal(readlinkSync(join(f.project, "leak")), victim, "an ordinary link stays as it was written");
    // The protected names were renamed as links (their targets untouched), and nothing of the
    // host is reached through them in the next command.
    assert.ok(!existsSync(join(f.project, ".envrc")) && !existsSync(join(f.project, ".git")), "a protected name stayed active");
    assert.equal(readlinkSync(join(f.project, ".envrc.pi-inert")), victim);
    assert.equal(readlinkSync(join(f.project, ".git.pi-inert")), f.base);
    const next = await sh(f.sb, f.project, "cat .envrc.pi-inert .git.pi-inert/victim leak");
    assert.doesNotMatch(next.out, /HOST-FILE/);
  });
});

// ---------------------------------------------------------------------------------------------
describe("containment", { concurrency: 1 }, () => {
  /**
   * A bounded fork bomb: a binary tree of shells `depth` deep (2^(depth+1) - 1 processes), each
   * leaf sleeping 2 s; the counts of its lines. Run by /bin/sh, whose failed fork fails at once
   * (bash retries for half a minute).
   */
  const bomb = (marker: string, depth: number) =>
    `/bin/sh -c ${quote(`b() { if [ "$1" -gt 0 ]; then b $(($1 - 1)) & b $(($1 - 1)) & wait; else sleep 2; echo leaf; fi; }; b ${depth}`)} ${marker} 2>&1 | sort | uniq -c`;

  test("a fork bomb stops at PI_SANDBOX_MAX_TASKS", async (t) => {
    if (skipWithoutSandbox(t)) return;
    withEnv(t, "PI_SANDBOX_MAX_TASKS", "16");
    const f = await makeFixture(t);
    const marker = uniq("bomb");
    killAfter(t, marker);
    const seen = host(f.project, bomb(marker, 6)).out;
    assert.match(seen, /^\s*64 leaf$/m, `baseline: the host runs every leaf (${seen})`);
    const { r, out } = await sh(f.sb, f.project, bomb(marker, 6), 30);
    assert.equal(r.ending, "exited", out);
    const leaves = Number(/^\s*(\d+) leaf$/m.exec(out)?.[1] ?? 0);
    assert.ok(leaves < 16, `${leaves} leaves ran at once under a cap of 16 tasks: ${out}`);
    assert.match(out, /Cannot fork|Resource temporarily unavailable/, out);
    await assertNoProcess(marker);
  });

  test("as an ordinary user, with no cgroup it may write, a fork bomb still stops at PI_SANDBOX_MAX_TASKS", async (t) => {
    if (skipWithoutSandbox(t)) return;
    if (!ROOT) {
      assert.ok(process.env.CI !== "true", "CI runs as root: this test runs its child as nobody");
      t.skip("needs root to run a child as nobody");
      return;
    }
    // Outside /tmp and the checkout (nobody may not read a private folder): the project, a
    // runtime root nobody owns, and a copy of the addon.
    const base = mkdtempSync(join("/var/tmp", "pps-esh-nobody-"));
    t.after(() => rmSync(base, { recursive: true, force: true }));
    chmodSync(base, 0o755);
    const project = join(base, "project");
    mkdirSync(project);
    const { runtimeRoot, addonDir } = nobodysAddon(base);
    const marker = uniq("bomb-nobody");
    killAfter(t, marker);
    const env = { PATH: "/usr/local/bin:/usr/bin:/bin", HOME: "/nonexistent", PI_SANDBOX_MAX_TASKS: "16" };
    const asNobody = { uid: 65534, gid: 65534, env, encoding: "utf8" as const, timeout: 60_000 };
    // Baseline: nobody on the host, unconfined, runs every leaf.
    const seen = spawnSync("/bin/sh", ["-c", bomb(marker, 6)], { ...asNobody, cwd: project });
    assert.match(seen.stdout, /^\s*64 leaf$/m, `baseline: nobody's host shell runs every leaf (${seen.stdout}${seen.stderr})`);
    const script = `
      const { PythonSandbox } = require(${JSON.stringify(join(addonDir, "index.cjs"))});
      const sb = new PythonSandbox({ projectDir: ${JSON.stringify(project)}, runtimeRoot: ${JSON.stringify(runtimeRoot)} });
      let out = "";
      sb.execShell(1, ${JSON.stringify(bomb(marker, 6))}, { cwd: ${JSON.stringify(project)}, timeoutSeconds: 30 }, (t) => { out += t; })
        .then((r) => { console.log("RESOLVED " + JSON.stringify({ out, ending: r.ending, tasks: sb.status().containment.tasks })); return sb.dispose(); },
              (e) => { console.log("REJECTED " + e.message); return sb.dispose(); });`;
    const r = spawnSync(process.execPath, ["-e", script], asNobody);
    const line = /^RESOLVED (.*)$/m.exec(r.stdout)?.[1];
    assert.ok(line, r.stdout + r.stderr);
    const { out, ending, tasks } = JSON.parse(line) as { out: string; ending: string; tasks: string };
    assert.equal(ending, "exited", out);
    assert.notEqual(tasks, "none", `the status claims no task cap for nobody: ${tasks}`);
    const leaves = Number(/^\s*(\d+) leaf$/m.exec(out)?.[1] ?? 0);
    assert.ok(leaves < 16, `${leaves} leaves ran at once under a cap of 16 tasks (${tasks}): ${out}`);
    assert.match(out, /Cannot fork|Resource temporarily unavailable/, out);
    await assertNoProcess(marker);
  });

  test("memory past PI_SANDBOX_MAX_MEMORY is refused where a cgroup is available", async (t) => {
    if (skipWithoutSandbox(t)) return;
    withEnv(t, "PI_SANDBOX_MAX_MEMORY", "64M");
    const f = await makeFixture(t);
    const code = `b = bytearray(256 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\nprint("held", len(b) >> 20)`;
    assert.match(host(f.project, python(code)).out, /held 256/, "baseline: the host holds 256 MiB");
    const mechanism = f.sb.status().containment?.memory;
    const { r, out } = await sh(f.sb, f.project, python(code));
    if (mechanism === undefined || mechanism === "none") {
      t.diagnostic(`no memory containment here (${mechanism}); the attempt held: ${/held/.test(out)}`);
      return;
    }
    assert.doesNotMatch(out, /held/, out);
    assert.notEqual(r.exitCode, 0);
  });
});

// ---------------------------------------------------------------------------------------------
describe("no process outlives its command", { concurrency: 1 }, () => {
  const ways: [string, (m: string) => string][] = [
    ["setsid", (m) => `setsid sh -c 'sleep 60; : ${m}' > /dev/null 2>&1 < /dev/null &`],
    ["nohup", (m) => `nohup sh -c 'sleep 60; : ${m}' > /dev/null 2>&1 < /dev/null &`],
    ["a double fork", (m) => `( ( sh -c 'sleep 60; : ${m}' > /dev/null 2>&1 < /dev/null & ) & )`],
    ["a process that ignores SIGTERM and SIGHUP", (m) => `sh -c 'trap "" TERM HUP INT; while :; do sleep 1; done; : ${m}' > /dev/null 2>&1 < /dev/null &`],
  ];
  for (const [way, start] of ways) {
    test(`${way} does not outlive the command`, async (t) => {
      const f = await fixture(t);
      if (!f) return;
      const marker = uniq("bg");
      const [onHost, inside] = [`host-${marker}`, `sandbox-${marker}`];
      killAfter(t, marker);
      host(f.project, `${start(onHost)}\necho started`);
      assert.ok(await waitUntil(() => hostPidsWithCmdline(onHost).length > 0, 3000), "baseline: it outlives a host shell");
      for (const pid of hostPidsWithCmdline(onHost)) process.kill(pid, "SIGKILL");
      const { r } = await sh(f.sb, f.project, `${start(inside)}\nsleep 0.3; echo started`);
      assert.equal(r.exitCode, 0);
      await assertNoProcess(inside);
    });
  }
});

// ---------------------------------------------------------------------------------------------
describe("output", { concurrency: 1 }, () => {
  test("a flood of escape sequences stops at PI_SANDBOX_BASH_MAX_OUTPUT and none arrives raw", async (t) => {
    const f = await fixture(t);
    if (!f) return;
    withEnv(t, "PI_SANDBOX_BASH_MAX_OUTPUT", "1M");
    const flood = "while :; do printf '\\033]0;owned\\007\\033]52;c;ZXZpbA==\\007\\033[2J\\033[H\\033P+q\\033\\\\\\n'; done";
    const seen = host(f.project, `${flood} | head -c 4096`).out;
    assert.match(seen, /\u001b\]0;owned\u0007/, "baseline: the command writes raw escapes");
    const { r, out } = await sh(f.sb, f.project, flood, 30);
    assert.equal(r.ending, "flooded");
    assert.ok(out.length <= 1024 * 1024, `${out.length} characters passed`);
    assert.ok(!/[\u0000-\u0008\u000b-\u001f\u007f\u009b]/.test(out), JSON.stringify(out.slice(0, 200)));
    assert.match(out, /␛\]0;owned/);
  });
});

// ---------------------------------------------------------------------------------------------
describe("the host's environment", { concurrency: 1 }, () => {
  test("neither /proc/1/environ nor a parent's environ holds pi's variables", async (t) => {
    const f = await fixture(t);
    if (!f) return;
    withEnv(t, "PPS_TEST_API_KEY", "sk-shell-0123456789");
    const cmd = `for p in /proc/1 /proc/$PPID /proc/self /proc/[0-9]*; do tr '\\0' '\\n' < $p/environ 2>/dev/null; done | grep -c sk-shell-`;
    // A process's environ holds what it was started with: a host shell started from pi has it.
    assert.match(host(f.project, "tr '\\0' '\\n' < /proc/$$/environ | grep -c sk-shell-").out, /^[1-9]/, "baseline: a host shell has it");
    const { out } = await sh(f.sb, f.project, cmd);
    assert.equal(out, "0\n");
  });
});

// ---------------------------------------------------------------------------------------------
describe("setuid plants", { concurrency: 1 }, () => {
  const status = "grep -E '^(Uid|CapEff|CapPrm|NoNewPrivs)' /proc/self/status";
  for (const [where, writable] of [["/scratch", false], ["a writable project", true]] as const) {
    test(`a setuid binary written to ${where} gains no privilege`, async (t) => {
      const f = await fixture(t, { workspaceWritable: writable });
      if (!f) return;
      const dir = writable ? f.project : "/scratch";
      const plant = `cp /usr/bin/cat ${dir}/suid-cat && chmod 4755 ${dir}/suid-cat; ls -l ${dir}/suid-cat | cut -c1-10; ${dir}/suid-cat /proc/self/status | grep -E '^(Uid|CapEff|NoNewPrivs)'; ${status}`;
      // The baseline: nobody on the host runs a setuid-root copy and gets uid 0 as its euid.
      if (!needsRoot(t, "no setuid-root file can be made on the host")) {
        const open = join(f.base, "open");
        mkdirSync(open);
        chmodSync(f.base, 0o711);
        chmodSync(open, 0o755);
        const seen = host(open, `cp /usr/bin/cat ./suid-cat && chmod 4755 ./suid-cat && setpriv --reuid=65534 --regid=65534 --clear-groups ./suid-cat /proc/self/status | grep ^Uid`).out;
        assert.match(seen, /^Uid:\s+65534\s+0\s/m, `baseline: the plant gives euid 0 (${seen})`);
      }
      const { out } = await sh(f.sb, f.project, plant);
      assert.match(out, /^-rwxr-xr-x$/m, `the copy has no setuid bit: ${out}`);
      assert.match(out, /^CapEff:\s+0+$/m, out);
      assert.doesNotMatch(out, /^CapEff:\s+0*[1-9a-f]/m, out);
      assert.match(out, /^NoNewPrivs:\s+1$/m, out);
      if (writable) assert.equal(statSync(join(f.project, "suid-cat")).mode & 0o6000, 0, "a setuid bit reached a host file");
    });
  }
});

// ---------------------------------------------------------------------------------------------
describe("the python catalogue's attempts, made by a shell command", { concurrency: 1 }, () => {
  const SIGSYS = 31;
  const ENOSYS = 38;
  const ESRCH = 3;
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

  test("blocks io_uring socket (IORING_OP_SOCKET to a host Unix socket in the project)", async (t) => {
    if (skipProbe(t)) return;
    const f = await makeFixture(t);
    const received: string[] = [];
    const server: Server = createServer((c) => c.on("data", (d) => received.push(String(d))));
    await new Promise<void>((resolve) => server.listen(join(f.project, "host.sock"), resolve));
    t.after(() => new Promise<void>((resolve) => server.close(() => resolve())));
    // The project is at its host path inside; the bare bwrap has it at /workspace.
    const { out } = await sh(f.sb, f.project, python(ioUringConnect(join(f.project, "host.sock"))));
    assert.deepEqual(lastJson(out), { step: "io_uring_setup", errno: EPERM }, out);
    await sleep(100);
    assert.deepEqual(received, [], "a connection reached the host socket");
    const free = lastJson((await bare(python(ioUringConnect("/workspace/host.sock")), { project: f.project })).out);
    if (free.step === "io_uring_setup" && free.errno === EPERM) {
      t.diagnostic("io_uring is disabled on this host (kernel.io_uring_disabled); the baseline cannot show the bypass");
      return;
    }
    assert.deepEqual(free, { step: "connected", errno: 0 }, "baseline: a bare bwrap reaches the host socket through io_uring");
    assert.ok(await waitUntil(() => received.join("").includes("hello through io_uring"), 2000), `server got ${received}`);
  });

  test("clone3 answers ENOSYS, also with namespace flags, while the shell's own forks work", async (t) => {
    if (skipProbe(t)) return;
    const f = await makeFixture(t);
    // A valid clone3 argument block (exit signal SIGCHLD): it forks where allowed; the child
    // leaves at once. One call plain, one per namespace flag.
    const code = py`
      import ctypes, json, os
      libc = ctypes.CDLL(None, use_errno=True)
      libc.syscall.restype = ctypes.c_long
      def clone3(flags):
          args = (ctypes.c_uint64 * 11)(flags, 0, 0, 0, 17, 0, 0, 0, 0, 0, 0)
          ctypes.set_errno(0)
          ret = libc.syscall(ctypes.c_long(435), ctypes.byref(args), ctypes.c_long(88))
          if ret == 0:
              os._exit(0)
          err = ctypes.get_errno()
          if ret > 0:
              os.waitpid(ret, 0)
              return "forked"
          return err
      flags = json.loads(${lit(JSON.stringify(Object.fromEntries([["none", 0], ...NAMESPACE_FLAGS])))})
      print(json.dumps({name: clone3(flag) for name, flag in flags.items()}))
    `;
    const cmd = `echo "sub:$(echo forked | cat)"; ${python(code)}`;
    const { r, out } = await sh(f.sb, f.project, cmd);
    assert.equal(r.exitCode, 0, out);
    assert.match(out, /^sub:forked$/m, "a shell's pipeline and command substitution fork");
    const inside = lastJson(out) as Record<string, unknown>;
    const free = lastJson((await bare(cmd)).out) as Record<string, unknown>;
    t.diagnostic(`unfiltered clone3: ${JSON.stringify(free)}`);
    assert.equal(free.none, "forked", "baseline: a bare bwrap forks through clone3");
    assert.equal(free.CLONE_NEWUSER, "forked", "baseline: a bare bwrap makes a user namespace through clone3");
    for (const name of Object.keys(inside)) assert.equal(inside[name], ENOSYS, `clone3 with ${name}: ${JSON.stringify(inside)}`);
    assert.equal(Object.keys(inside).length, NAMESPACE_FLAGS.length + 1);
  });

  test("blocks personality ADDR_NO_RANDOMIZE (and setarch -R)", async (t) => {
    if (skipProbe(t)) return;
    const f = await makeFixture(t);
    const code = py`
      import ctypes, json
      libc = ctypes.CDLL(None, use_errno=True)
      ctypes.set_errno(0)
      norand = libc.personality(0x0040000)  # ADDR_NO_RANDOMIZE
      norand_errno = ctypes.get_errno()
      ctypes.set_errno(0)
      linux = libc.personality(0)  # PER_LINUX: the default, allowed
      print(json.dumps({"norand": [norand, norand_errno], "linux": [linux, ctypes.get_errno()]}))
    `;
    const cmd = `setarch x86_64 -R true; echo "setarch:$?"; ${python(code)}`;
    const { out } = await sh(f.sb, f.project, cmd);
    const inside = lastJson(out);
    assert.deepEqual(inside.norand, [-1, EPERM], out);
    assert.deepEqual(inside.linux, [0, 0], "personality(PER_LINUX) must stay allowed");
    assert.match(out, /^setarch:[1-9]/m, out);
    const free = await bare(cmd);
    assert.deepEqual(lastJson(free.out).norand, [0, 0], `baseline: ${free.out}`);
    assert.match(free.out, /^setarch:0$/m, `baseline: ${free.out}`);
  });

  /** A python3 child that makes one foreign-ABI getpid, and the status the shell saw. */
  const foreignAbi = (child: string) => `${python(child)}; echo "status:$?"`;

  test("kills x32 syscalls", async (t) => {
    if (skipProbe(t)) return;
    const f = await makeFixture(t);
    // getpid (39) with __X32_SYSCALL_BIT: same audit arch, so only the filter's x32 check stops it.
    const cmd = foreignAbi(
      "import ctypes; libc = ctypes.CDLL(None, use_errno=True); libc.syscall.restype = ctypes.c_long; " +
        "print(libc.syscall(ctypes.c_long(39 | 0x40000000)), ctypes.get_errno())",
    );
    const { out } = await sh(f.sb, f.project, cmd);
    assert.match(out, new RegExp(`^status:${128 + SIGSYS}$`, "m"), `the x32 call was not killed: ${out}`);
    const free = (await bare(cmd)).out;
    assert.match(free, /^status:0$/m, `baseline: ${free}`);
    t.diagnostic(`unfiltered x32 getpid: ${free.trim().replace(/\n/g, "; ")} (ENOSYS = kernel without x32)`);
  });

  test("kills i386 syscalls (int 0x80)", async (t) => {
    if (skipProbe(t)) return;
    const f = await makeFixture(t);
    // mov eax, 20 (i386 getpid); int 0x80; ret -- from an executable anonymous mapping.
    const cmd = foreignAbi(
      [
        "import ctypes, mmap",
        "m = mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)",
        "m.write(bytes([0xb8, 0x14, 0, 0, 0, 0xcd, 0x80, 0xc3]))",
        "print(ctypes.CFUNCTYPE(ctypes.c_int)(ctypes.addressof(ctypes.c_char.from_buffer(m)))())",
      ].join("\n"),
    );
    const free = (await bare(cmd)).out;
    t.diagnostic(`unfiltered i386 getpid: ${free.trim().replace(/\n/g, "; ")}`);
    assert.doesNotMatch(free, new RegExp(`^status:${128 + SIGSYS}$`, "m"), `baseline: ${free}`);
    const { out } = await sh(f.sb, f.project, cmd);
    if (!/^status:0$/m.test(free)) {
      // No ia32 emulation in this kernel: int 0x80 faults before any filter sees it.
      t.diagnostic("this kernel has no i386 emulation; int 0x80 never reaches seccomp");
      assert.equal(/^status:\d+$/m.exec(out)?.[0], /^status:\d+$/m.exec(free)?.[0], out);
      return;
    }
    assert.match(out, new RegExp(`^status:${128 + SIGSYS}$`, "m"), `the i386 call was not killed: ${out}`);
  });

  test("process_vm_readv of another process fails", async (t) => {
    if (skipProbe(t)) return;
    const f = await makeFixture(t);
    const { out } = await sh(f.sb, f.project, python(processVmReadvOfParent));
    assert.deepEqual(lastJson(out), { ret: -1, errno: EPERM, read: "" }, out);
    assert.deepEqual(lastJson((await bare(python(processVmReadvOfParent))).out), { ret: 24, errno: 0, read: "parent-secret-0123456789" }, "baseline");
  });

  test("another session's processes are invisible and cannot be traced or signalled", async (t) => {
    if (skipProbe(t)) return;
    const f = await makeFixture(t);
    // The victim: another session's python worker, holding a value.
    const victim = f.open();
    const held = await victim.execute("secret = 'victim-secret'");
    assert.equal(held.status, "ok", JSON.stringify(held));
    const scratch = victim.status().paths.scratchDir;
    assert.ok(scratch);
    const [pid] = workerPids(scratch);
    assert.ok(pid, "the victim's worker was not found on the host");
    const code = py`
      import ctypes, json
      libc = ctypes.CDLL(None, use_errno=True)
      libc.syscall.restype = ctypes.c_long
      def sc(nr, *args):
          ctypes.set_errno(0)
          return [libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args]), ctypes.get_errno()]
      print(json.dumps({"ptrace": sc(101, 16, ${pid}, 0, 0), "process_vm_readv": sc(310, ${pid}, 1, 1, 1, 1, 0), "pidfd_open": sc(434, ${pid}, 0)}))
    `;
    const cmd = `test -e /proc/${pid} && echo visible; kill -0 ${pid} 2>/dev/null && echo signalled; ${python(code)}`;
    // The baseline: a host shell of the same user sees and may signal it (signal 0 sends nothing).
    const seen = host(f.project, `test -e /proc/${pid} && echo visible; kill -0 ${pid} && echo signalled`).out;
    assert.match(seen, /visible\nsignalled/, `baseline: ${seen}`);
    const { out } = await sh(f.sb, f.project, cmd);
    assert.doesNotMatch(out, /visible|signalled/, out);
    const inside = lastJson(out);
    assert.deepEqual(inside.ptrace, [-1, EPERM], out);
    assert.deepEqual(inside.process_vm_readv, [-1, EPERM], out);
    assert.deepEqual(inside.pidfd_open, [-1, ESRCH], "pidfd_open must answer ESRCH");
    assert.equal((await victim.execute("secret")).repr, "'victim-secret'", "the victim was disturbed");
  });

  test("no host file descriptor reaches the sandbox", async (t) => {
    const f = await fixture(t);
    if (!f) return;
    // Every descriptor of the shell and of a process it starts.
    const cmd = `for d in /proc/$$/fd/*; do echo "shell \${d##*/} $(readlink $d)"; done; sh -c 'for d in /proc/$$/fd/*; do echo "child \${d##*/} $(readlink $d)"; done'`;
    const table = (out: string) =>
      Object.fromEntries(
        out
          .trim()
          .split("\n")
          .map((l) => l.split(" "))
          .map(([who, fd, target]) => [`${who} ${fd}`, /^pipe:/.test(target) ? "pipe" : target]),
      );
    // The baseline: a descriptor the host holds open without close-on-exec reaches a host shell
    // (what the engine's own pipes to a sandbox would be if it passed them on).
    const secret = join(f.base, "held.txt");
    writeFileSync(secret, "held\n");
    const held = openSync(secret, "r");
    t.after(() => closeSync(held));
    const base = spawnSync("/bin/sh", ["-c", cmd], { cwd: f.project, encoding: "utf8", stdio: ["ignore", "pipe", "pipe", held] });
    assert.equal(table(base.stdout)["child 3"], secret, `baseline: ${base.stdout}`);
    const { r, out } = await sh(f.sb, f.project, cmd);
    assert.equal(r.exitCode, 0, out);
    // 0 is /dev/null, 1 and 2 the output pipes; 3 is the directory the glob read, which is free
    // again (and the pipe of $(readlink)) by the time it is read: nothing else is open.
    const own = { "0": "/dev/null", "1": "pipe", "2": "pipe", "3": "pipe" };
    const expected = Object.fromEntries(["shell", "child"].flatMap((who) => Object.entries(own).map(([fd, v]) => [`${who} ${fd}`, v])));
    assert.deepEqual(table(out), expected, out);
  });

  test("a proc and a sysfs mount inside a writable project show empty and cannot be written", async (t) => {
    if (skipWithoutSandbox(t)) return;
    if (!ROOT) {
      assert.ok(process.env.CI !== "true", "CI runs as root: this test mounts proc and sysfs");
      t.skip("needs root to mount proc and sysfs in a project");
      return;
    }
    const dir = mkdtempSync(join(tmpdir(), "pps-esh-submount-"));
    const project = join(dir, "project");
    const mounted: string[] = [];
    t.after(() => {
      for (const m of mounted.reverse()) spawnSync("umount", ["-l", m]);
      rmSync(dir, { recursive: true, force: true });
    });
    for (const [kind, at] of [["proc", "proc"], ["sysfs", "sys"]]) {
      const point = join(project, "root", at);
      mkdirSync(point, { recursive: true });
      const m = spawnSync("mount", ["-t", kind, kind, point], { encoding: "utf8" });
      assert.equal(m.status, 0, m.stderr);
      mounted.push(point);
    }
    const sb = new PythonSandbox({ projectDir: project, runtimeRoot: join(dir, "runtime"), prewarm: false, workspaceWritable: true });
    t.after(() => sb.dispose("test end"));
    const cmd = (at: string) =>
      `( exec 3>>${at}/root/proc/sys/kernel/core_pattern ) 2>/dev/null && echo opened; echo "proc:$(ls -A ${at}/root/proc | wc -l)"; echo "sys:$(ls -A ${at}/root/sys | wc -l)"; test -e ${at}/root/proc/keys && echo keys`;
    const free = (await bare(cmd("/workspace"), { project, writable: true })).out;
    assert.match(free, /^opened$/m, `baseline: a bare bwrap opens the host's core_pattern for writing (${free})`);
    assert.match(free, /^proc:[1-9]\d+$/m, `baseline: ${free}`);
    assert.match(free, /^sys:[1-9]\d*$/m, `baseline: ${free}`);
    const { out } = await sh(sb, project, cmd(project));
    // The mounts show empty (whether the project stays writable is the next test's).
    assert.doesNotMatch(out, /^(opened|keys)$/m, out);
    assert.match(out, /^proc:0$/m, out);
    assert.match(out, /^sys:0$/m, out);
  });

  test("a writable project holding proc and sysfs mounts stays writable, its protected names read-only", async (t) => {
    if (!rootWithSandbox(t, "mounts proc and sysfs in a project")) return;
    // A bound the kernel's mounts alone pass: a walk that went into them would stop there and
    // hold the whole project read-only.
    withEnv(t, "PI_SANDBOX_SCAN_ENTRIES", String(WALK_BOUND));
    const { dir, project, mount } = projectWithMounts(t);
    makeRepo(project);
    mount("root/proc", "proc");
    mount("root/sys", "sysfs");
    assert.ok(entriesBeneath(join(project, "root"), WALK_BOUND) > WALK_BOUND, `baseline: the mounts hold more than ${WALK_BOUND} entries`);
    const cmd = (at: string) =>
      `cd ${at} && touch made.txt && echo made; echo x >> .git/config && echo wrote-config; echo "proc:$(ls -A root/proc | wc -l)"`;
    const free = (await bare(cmd("/workspace"), { project, writable: true })).out;
    assert.match(free, /^wrote-config$/m, `baseline: a bare bwrap writes .git/config (${free})`);
    const sb = new PythonSandbox({ projectDir: project, runtimeRoot: join(dir, "runtime"), prewarm: false, workspaceWritable: true });
    t.after(() => sb.dispose("test end"));
    const { r, out } = await sh(sb, project, cmd(project));
    assert.deepEqual(r.notes, [], `the project was not held read-only: ${r.notes.join(" | ")}`);
    assert.match(out, /^made$/m, out);
    assert.doesNotMatch(out, /^wrote-config$/m, out);
    assert.match(out, new RegExp(EROFS), out);
    assert.match(out, /^proc:0$/m, out);
  });

  test("a protected name on a data file system mounted inside a writable project stays read-only", async (t) => {
    if (!rootWithSandbox(t, "mounts a tmpfs in a project")) return;
    const { dir, project, mount } = projectWithMounts(t);
    makeRepo(mount("vendor", "tmpfs", ["-o", "size=1m"]));
    const cmd = (at: string) => `cd ${at}/vendor && touch made.txt && echo made; echo x >> .git/config && echo wrote-config`;
    const free = (await bare(cmd("/workspace"), { project, writable: true })).out;
    assert.match(free, /^wrote-config$/m, `baseline: a bare bwrap writes vendor/.git/config (${free})`);
    const sb = new PythonSandbox({ projectDir: project, runtimeRoot: join(dir, "runtime"), prewarm: false, workspaceWritable: true });
    t.after(() => sb.dispose("test end"));
    const { r, out } = await sh(sb, project, cmd(project));
    assert.deepEqual(r.notes, [], r.notes.join(" | "));
    assert.match(out, /^made$/m, out);
    assert.doesNotMatch(out, /^wrote-config$/m, out);
    assert.match(out, new RegExp(EROFS), out);
  });

  test("a secret on a data file system mounted inside a project is masked", async (t) => {
    if (!rootWithSandbox(t, "mounts a tmpfs in a project")) return;
    const { dir, project, mount } = projectWithMounts(t);
    writeFileSync(join(mount("vendor", "tmpfs", ["-o", "size=1m"]), ".env"), "TOKEN=on-the-mount\n");
    const cmd = (at: string) => `cat ${at}/vendor/.env; echo end`;
    const free = (await bare(cmd("/workspace"), { project })).out;
    assert.match(free, /TOKEN=on-the-mount/, `baseline: a bare bwrap reads vendor/.env (${free})`);
    const sb = new PythonSandbox({ projectDir: project, runtimeRoot: join(dir, "runtime"), prewarm: false });
    t.after(() => sb.dispose("test end"));
    const { out } = await sh(sb, project, cmd(project));
    assert.match(out, /^end$/m, out);
    assert.doesNotMatch(out, /on-the-mount/, out);
  });

  test("as nobody, a writable project holding a proc mount stays writable", async (t) => {
    if (!rootWithSandbox(t, "mounts proc in a project and runs its child as nobody")) return;
    // Outside /tmp (nobody may not read a private folder): the project nobody owns, with a proc
    // mount root made; a runtime root nobody owns; a copy of the addon.
    const { dir: base, project, mount } = projectWithMounts(t, "/var/tmp");
    chmodSync(base, 0o755);
    makeRepo(project);
    // Before anything is mounted there (chown -R would go into a mount).
    assert.equal(spawnSync("chown", ["-R", "65534:65534", project]).status, 0);
    mount("root/proc", "proc");
    const { runtimeRoot, addonDir } = nobodysAddon(base);
    const env = { PATH: "/usr/local/bin:/usr/bin:/bin", HOME: "/nonexistent", PI_SANDBOX_SCAN_ENTRIES: String(WALK_BOUND) };
    const asNobody = { uid: 65534, gid: 65534, env, encoding: "utf8" as const, timeout: 60_000 };
    const cmd = `touch made.txt && echo made; echo x >> .git/config && echo wrote-config`;
    // Baseline: nobody on the host writes both, and meets more entries under the mount than the
    // walk's bound.
    const seen = spawnSync("/bin/sh", ["-c", `${cmd}; rm -f made.txt`], { ...asNobody, cwd: project });
    assert.match(seen.stdout, /^wrote-config$/m, `baseline: nobody writes .git/config on the host (${seen.stdout}${seen.stderr})`);
    assert.ok(entriesBeneath(join(project, "root"), WALK_BOUND) > WALK_BOUND, `baseline: the mount holds more than ${WALK_BOUND} entries`);
    const script = `
      const { PythonSandbox } = require(${JSON.stringify(join(addonDir, "index.cjs"))});
      const sb = new PythonSandbox({ projectDir: ${JSON.stringify(project)}, runtimeRoot: ${JSON.stringify(runtimeRoot)}, prewarm: false, workspaceWritable: true });
      let out = "";
      sb.execShell(1, ${JSON.stringify(cmd)}, { cwd: ${JSON.stringify(project)}, timeoutSeconds: 30 }, (t) => { out += t; })
        .then((r) => { console.log("RESOLVED " + JSON.stringify({ out, notes: r.notes })); return sb.dispose(); },
              (e) => { console.log("REJECTED " + e.message); return sb.dispose(); });`;
    const r = spawnSync(process.execPath, ["-e", script], asNobody);
    const line = /^RESOLVED (.*)$/m.exec(r.stdout)?.[1];
    assert.ok(line, r.stdout + r.stderr);
    const { out, notes } = JSON.parse(line) as { out: string; notes: string[] };
    assert.deepEqual(notes, [], `the project was not held read-only: ${notes.join(" | ")}`);
    assert.match(out, /^made$/m, out);
    assert.doesNotMatch(out, /^wrote-config$/m, out);
    assert.match(out, new RegExp(EROFS), out);
  });
});

/** The bound of the project's walk in the mount tests: fewer entries than a proc mount holds. */
const WALK_BOUND = 2000;

/** A sandbox test that needs root (it mounts): false when it cannot run (a loud skip). */
function rootWithSandbox(t: TestContext, why: string): boolean {
  if (skipWithoutSandbox(t)) return false;
  if (!ROOT) {
    assert.ok(process.env.CI !== "true", `CI runs as root: this test ${why}`);
    t.skip(`needs root: this test ${why}`);
    return false;
  }
  return true;
}

/**
 * A temp directory (under `parent`) with `project` in it, and `mount(rel, type, options)`: a file
 * system of `type` mounted at `rel` in the project (made), its mount point returned. After the
 * test, everything mounted is unmounted before the directory is removed.
 */
function projectWithMounts(t: TestContext, parent = tmpdir()): { dir: string; project: string; mount(rel: string, type: string, options?: string[]): string } {
  const dir = mkdtempSync(join(parent, "pps-esh-mounts-"));
  const project = join(dir, "project");
  mkdirSync(project);
  const mounted: string[] = [];
  t.after(() => {
    for (const m of mounted.reverse()) spawnSync("umount", ["-l", m]);
    rmSync(dir, { recursive: true, force: true });
  });
  const mount = (rel: string, type: string, options: string[] = []) => {
    const point = join(project, rel);
    mkdirSync(point, { recursive: true });
    const m = spawnSync("mount", ["-t", type, ...options, type, point], { encoding: "utf8" });
    assert.equal(m.status, 0, m.stderr);
    mounted.push(point);
    return point;
  };
  return { dir, project, mount };
}

/** A git repository's `.git` in `dir` (its HEAD and config). */
function makeRepo(dir: string): void {
  mkdirSync(join(dir, ".git", "refs"), { recursive: true });
  writeFileSync(join(dir, ".git", "HEAD"), "ref: refs/heads/main\n");
  writeFileSync(join(dir, ".git", "config"), "[core]\n\trepositoryformatversion = 0\n");
}

/** The entries beneath `dir`, breadth first, counted up to one past `max` (unreadable ones passed). */
function entriesBeneath(dir: string, max: number): number {
  let n = 0;
  const queue = [dir];
  while (queue.length > 0 && n <= max) {
    const at = queue.shift() as string;
    let list;
    try {
      list = readdirSync(at, { withFileTypes: true });
    } catch {
      continue;
    }
    for (const e of list) {
      n += 1;
      if (e.isDirectory()) queue.push(join(at, e.name));
    }
  }
  return n;
}
