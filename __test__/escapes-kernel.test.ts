/**
 * Escapes through the kernel's own files: what the sandbox can change of the host's kernel, what
 * it can read of the host's kernel, and what it can leave in the root of its own file system. The
 * sandbox's uid is pi's, so when pi runs as root the code runs as host uid 0 (without
 * capabilities), and the kernel lets that uid write most sysctls by their mode bits alone:
 * `kernel.core_pattern` set to `|/path/x.sh` ran a script as host root on the next crash. One
 * named test per path, run from inside the sandbox, each with the unfiltered baseline
 * (helpers/unfiltered.ts, bubblewrap's plain `--proc /proc` and tmpfs root) showing the attempt
 * works there.
 *
 * Kernel files are OPENED FOR WRITING AND NEVER WRITTEN, inside and in the baseline: a baseline
 * that wrote would change the host's kernel settings. The lists come from src/bwrap.rs
 * (READ_ONLY_PROC, PROC_MASKS), read here so that a new entry gets its test.
 * Run: node --import tsx --test --test-concurrency=1 __test__/escapes-kernel.test.ts
 */
import assert from "node:assert/strict";
import { existsSync, mkdtempSync, readFileSync, rmSync } from "node:fs";
import { mkdir } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, type TestContext, test } from "node:test";
import { sandboxSkipReason, skipWithoutSandbox } from "./helpers/sandbox-env.ts";
import { jsonOut, lit, PythonSandbox, py } from "./helpers/sandbox-fixture.ts";
import { lastJson } from "./helpers/syscall-probes.ts";
import { unfiltered } from "./helpers/unfiltered.ts";

const EROFS = 30;
const PROC_SUPER_MAGIC = 0x9fa0;

const source = readFileSync(new URL("../src/bwrap.rs", import.meta.url), "utf8");
const listed = (name: string) => {
  const at = source.indexOf(`pub const ${name}`);
  assert.ok(at >= 0, `${name} not found in src/bwrap.rs`);
  return source.slice(at, source.indexOf("\n];", at));
};
/** The read-only kernel views, as src/bwrap.rs lists them. */
const READ_ONLY = [...listed("READ_ONLY_PROC").matchAll(/\(\s*"(\/proc\/[^"]+)"/g)].map((m) => m[1]);
/** The masked kernel files and directories, as src/bwrap.rs lists them. */
const MASKED = [...listed("PROC_MASKS").matchAll(/(file|dir)\("(\/proc\/[^"]+)"/g)].map((m) => ({
  path: m[2],
  dir: m[1] === "dir",
}));

/**
 * Files opened for writing (never written): sysctl samples, then the first owner-writable file
 * under each read-only directory (found where the probe runs, since irq and pci numbers differ
 * between hosts), then the files of READ_ONLY themselves.
 */
const SYSCTLS = ["/proc/sys/kernel/core_pattern", "/proc/sys/vm/drop_caches", "/proc/sys/kernel/hostname"];

/** Python: every answer the tests need, as one JSON line. Never writes a kernel file. */
const PROBE = py`
  import ctypes, json, os, stat
  libc = ctypes.CDLL(None, use_errno=True)
  def fstype(p):
      buf = ctypes.create_string_buffer(256)
      if libc.statfs(os.fsencode(p), buf) != 0:
          return -ctypes.get_errno()
      return ctypes.c_long.from_buffer(buf).value
  def open_for_writing(p):
      # O_WRONLY without O_TRUNC, closed at once: nothing is ever written.
      try:
          os.close(os.open(p, os.O_WRONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC))
          return "opened"
      except OSError as e:
          return e.errno
  def first_writable(top):
      for d, dirs, files in os.walk(top):
          dirs.sort(); files.sort()
          for f in files:
              p = os.path.join(d, f)
              try:
                  st = os.lstat(p)
              except OSError:
                  continue
              if stat.S_ISREG(st.st_mode) and st.st_mode & 0o200:
                  return p
      return None
  def read(p, is_dir, whole):
      try:
          if is_dir:
              return {"entries": len(os.listdir(p))}
          if p == "/proc/kmsg" and not whole:
              # Reading it would take messages away from the host's logger.
              return {"bytes": None}
          fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
          try:
              return {"bytes": len(os.read(fd, 1 << 20 if whole else 64))}
          finally:
              os.close(fd)
      except OSError as e:
          return {"errno": e.errno}
  read_only = ${lit(JSON.stringify(READ_ONLY))}
  masked = ${lit(JSON.stringify(MASKED))}
  inside = INSIDE
  samples = {}
  for top in json.loads(read_only):
      if os.path.isdir(top):
          samples[top] = first_writable(top)
      else:
          samples[top] = top if os.path.exists(top) else None
  writes = {p: open_for_writing(p) for p in json.loads(${lit(JSON.stringify(SYSCTLS))})}
  writes.update({p: open_for_writing(p) for p in samples.values() if p})
  ro = {}
  for top in json.loads(read_only):
      try:
          ro[top] = bool(os.statvfs(top).f_flag & os.ST_RDONLY)
      except OSError as e:
          ro[top] = e.errno
  masks = {m["path"]: dict(read(m["path"], m["dir"], inside), fstype=fstype(m["path"]),
                           exists=os.path.lexists(m["path"])) for m in json.loads(masked)}
  def make(f):
      try:
          f()
          return "made"
      except OSError as e:
          return e.errno
  def rootfile():
      with open("/rootfile", "x") as f:
          f.write("x")
  root = {"file": make(rootfile), "dir": make(lambda: os.makedirs("/home/zz")),
          "readonly": bool(os.statvfs("/").f_flag & os.ST_RDONLY)}
  print(json.dumps({"samples": samples, "writes": writes, "ro": ro, "masks": masks, "root": root}))
`;

interface Answers {
  samples: Record<string, string | null>;
  writes: Record<string, string | number>;
  ro: Record<string, boolean | number>;
  masks: Record<string, { entries?: number; bytes?: number | null; errno?: number; fstype: number; exists: boolean }>;
  root: { file: string | number; dir: string | number; readonly: boolean };
}

let inside: Answers | undefined;
let outside: Answers | undefined;
let base: string | undefined;
let sandbox: PythonSandbox | undefined;
before(async () => {
  if (sandboxSkipReason() !== null) return;
  base = mkdtempSync(join(tmpdir(), "pps-kernel-"));
  await mkdir(join(base, "project"));
  sandbox = new PythonSandbox({ projectDir: join(base, "project"), runtimeRoot: join(base, "runtime") });
  const [r, baseline] = await Promise.all([
    sandbox.execute(PROBE.replace("inside = INSIDE", "inside = True")),
    unfiltered(PROBE.replace("inside = INSIDE", "inside = False")),
  ]);
  inside = jsonOut(r);
  outside = lastJson(baseline);
});
after(async () => {
  await sandbox?.dispose("test end");
  if (base) rmSync(base, { recursive: true, force: true });
});

/** The probes' answers; skips loudly (never under CI) without a sandbox. */
function answers(t: TestContext): [Answers, Answers] | undefined {
  if (skipWithoutSandbox(t)) return undefined;
  assert.ok(inside && outside, "the probes did not run");
  return [inside, outside];
}

/** The attempts need host root: as another user the kernel refuses them without the defence. */
function skipUnlessRoot(t: TestContext): boolean {
  if (process.getuid?.() === 0) return false;
  if (process.env.CI === "true") throw new Error(`${t.name}: the kernel-file tests must run as root under CI`);
  console.log(`# SKIP ${t.name}: needs root (as another user the kernel refuses without the defence)`);
  t.skip("needs root");
  return true;
}

describe("the host's kernel settings cannot be opened for writing", () => {
  for (const path of SYSCTLS) {
    test(`${path} opened for writing fails with EROFS`, (t) => {
      const both = answers(t);
      if (!both || skipUnlessRoot(t)) return;
      const [sb, free] = both;
      if (free.writes[path] === 2 && sb.writes[path] === 2) {
        t.diagnostic(`${path}: this kernel has no such sysctl; the baseline cannot show it`);
        return;
      }
      assert.equal(sb.writes[path], EROFS, `${path} inside the sandbox`);
      assert.equal(free.writes[path], "opened", `unfiltered, ${path} must open for writing as root`);
    });
  }
  for (const top of READ_ONLY) {
    test(`a file under ${top} opened for writing fails with EROFS`, (t) => {
      const both = answers(t);
      if (!both || skipUnlessRoot(t)) return;
      const [sb, free] = both;
      const sample = free.samples[top];
      if (!sample) {
        // The mount's read-only flag is still asserted below.
        t.diagnostic(`${top}: this kernel has no owner-writable file there; the baseline cannot show an open`);
        return;
      }
      assert.equal(sb.writes[sample], EROFS, `${sample} inside the sandbox`);
      if (free.ro[top] === true) {
        t.diagnostic(`${top}: bubblewrap's --proc already remounts it read-only here; the bind keeps it so on every host`);
        return;
      }
      assert.equal(free.writes[sample], "opened", `unfiltered, ${sample} must open for writing as root`);
    });
    test(`${top} is mounted read-only`, (t) => {
      const both = answers(t);
      if (!both) return;
      const [sb, free] = both;
      if (free.ro[top] === 2) {
        t.diagnostic(`${top}: this kernel has none; nothing to protect`);
        assert.equal(sb.ro[top], 2);
        return;
      }
      assert.equal(sb.ro[top], true, `${top} inside the sandbox`);
      // Bubblewrap remounts a /proc directory read-only itself only when access(W_OK) on it
      // succeeds: for /proc/irq and /proc/bus, never for /proc/sys (mode 0555) or /proc/fs.
      if (top === "/proc/irq" || top === "/proc/bus") {
        t.diagnostic(`unfiltered ${top} read-only: ${free.ro[top]}`);
        return;
      }
      assert.equal(free.ro[top], false, `unfiltered, ${top} is writable`);
    });
  }
});

describe("the host's kernel information files read empty", () => {
  for (const { path, dir } of MASKED) {
    test(`${path} reads empty (masked)`, (t) => {
      const both = answers(t);
      if (!both) return;
      const [sb, free] = both;
      const [mine, theirs] = [sb.masks[path], free.masks[path]];
      if (!theirs.exists) {
        t.diagnostic(`${path}: this kernel has none; nothing to hide`);
        assert.equal(mine.exists, false);
        return;
      }
      assert.notEqual(mine.fstype, PROC_SUPER_MAGIC, `${path} is still the kernel's inside the sandbox`);
      assert.deepEqual(mine, dir ? { entries: 0, fstype: mine.fstype, exists: true } : { bytes: 0, fstype: mine.fstype, exists: true });
      assert.equal(theirs.fstype, PROC_SUPER_MAGIC, `unfiltered, ${path} is the kernel's`);
      // What the kernel gives without the mask (some are empty even for root on this host, or
      // need a capability the baseline lacks: the file system type above shows the mask).
      t.diagnostic(`unfiltered ${path}: ${JSON.stringify(theirs)}`);
    });
  }
});

/** One line of /proc/self/mountinfo. */
interface Mount {
  id: string;
  parent: string;
  root: string;
  point: string;
  options: string[];
  fstype: string;
}

const unescape = (s: string) => s.replace(/\\([0-7]{3})/g, (_, o: string) => String.fromCharCode(Number.parseInt(o, 8)));

function mountTable(text: string): Mount[] {
  return text
    .split("\n")
    .filter((l) => l.includes(" - "))
    .map((l) => {
      const [left, right] = l.split(" - ");
      const f = left.split(" ");
      return { id: f[0], parent: f[1], root: unescape(f[3]), point: unescape(f[4]), options: f[5].split(","), fstype: right.split(" ")[0] };
    });
}

/**
 * What is wrong with `/proc` in mount table `text`: for every entry of READ_ONLY and MASKED that
 * this host has, the mount on top at its path (the one no other mount at that path sits on) must
 * be read-only, nosuid and nodev; a mask must be the session's empty file or directory, never the
 * kernel's.
 */
function procProblems(text: string): string[] {
  const table = mountTable(text);
  const top = (path: string) => {
    const at = table.filter((m) => m.point === path);
    return at.find((m) => !at.some((o) => o.parent === m.id));
  };
  const problems: string[] = [];
  const locked = (path: string, m: Mount | undefined) => {
    if (!m) return problems.push(`${path}: not a mount point`);
    const missing = ["ro", "nosuid", "nodev"].filter((o) => !m.options.includes(o));
    if (missing.length) problems.push(`${path}: not ${missing.join(", ")} (${m.options.join(",")})`);
  };
  for (const path of READ_ONLY.filter((p) => existsSync(p))) locked(path, top(path));
  for (const { path, dir } of MASKED.filter((m) => existsSync(m.path))) {
    const m = top(path);
    locked(path, m);
    const source = dir ? "/mask-dir" : "/mask-file";
    if (m && (m.fstype === "proc" || !m.root.endsWith(source))) problems.push(`${path}: ${m.fstype} ${m.root}, not ${source}`);
  }
  return problems;
}

describe("the sandbox's mount table holds every /proc view read-only and every mask", () => {
  const MOUNTINFO = "import json\nprint(json.dumps(open('/proc/self/mountinfo').read()))";
  const masked = () => MASKED.filter((m) => existsSync(m.path)).length;

  test("python: every read-only view and mask is mounted, read-only, nosuid, nodev", async (t) => {
    if (!answers(t) || !sandbox) return;
    const text: string = jsonOut(await sandbox.execute(MOUNTINFO));
    assert.deepEqual(procProblems(text), [], text);
    // Baseline: bubblewrap's plain --proc has none of the masks.
    const free = procProblems(JSON.parse(lastLine(await unfiltered(MOUNTINFO))));
    assert.ok(masked() > 0, "this host's /proc has none of the masked entries");
    assert.ok(free.filter((p) => p.endsWith("not a mount point")).length >= masked(), free.join("\n"));
  });

  test("bash: every read-only view and mask is mounted, read-only, nosuid, nodev", async (t) => {
    if (!answers(t) || !sandbox || !base) return;
    let text = "";
    const r = await sandbox.execShell(1, "cat /proc/self/mountinfo", { cwd: join(base, "project") }, (d: string) => {
      text += d;
    });
    assert.equal(r.exitCode, 0, JSON.stringify(r));
    assert.ok(text.includes(" /proc "), text);
    assert.deepEqual(procProblems(text), [], text);
    const free = procProblems(JSON.parse(lastLine(await unfiltered(MOUNTINFO))));
    assert.ok(free.filter((p) => p.endsWith("not a mount point")).length >= masked(), `baseline: ${free.join("\n")}`);
  });
});

const lastLine = (s: string) => s.trim().split("\n").at(-1) ?? "";

describe("the sandbox's root file system is read-only", () => {
  test("a file at /rootfile cannot be made (EROFS)", (t) => {
    const both = answers(t);
    if (!both) return;
    const [sb, free] = both;
    assert.equal(sb.root.file, EROFS);
    assert.equal(free.root.file, "made", "unfiltered, bubblewrap's root is a writable tmpfs");
  });
  test("a directory /home/zz cannot be made (EROFS)", (t) => {
    const both = answers(t);
    if (!both) return;
    const [sb, free] = both;
    assert.equal(sb.root.dir, EROFS);
    assert.equal(free.root.dir, "made");
  });
  test("/ is mounted read-only", (t) => {
    const both = answers(t);
    if (!both) return;
    const [sb, free] = both;
    assert.equal(sb.root.readonly, true);
    assert.equal(free.root.readonly, false);
  });
});

describe("kernel file systems mounted inside the project are hidden", () => {
  /**
   * A project that holds a mount of the kernel's (a chroot's or a build root's /proc and /sys, a
   * project at /): bubblewrap binds a tree with its mounts, so without the masks the host's
   * /proc/sys sits writable under /workspace in a writable mode when pi runs as root. The mounts
   * are made here (as root) in a temporary project and removed after; nothing is ever written.
   */
  const SUB = py`
    import json, os
    def open_for_writing(p):
        try:
            os.close(os.open(p, os.O_WRONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC))
            return "opened"
        except OSError as e:
            return e.errno
    def entries(p):
        try:
            return len(os.listdir(p))
        except OSError as e:
            return -e.errno
    print(json.dumps({
        "core_pattern": open_for_writing("/workspace/root/proc/sys/kernel/core_pattern"),
        "proc_entries": entries("/workspace/root/proc"),
        "sys_entries": entries("/workspace/root/sys"),
        "keys": os.path.exists("/workspace/root/proc/keys"),
    }))
  `;

  test("a proc and a sysfs mount inside a writable project show empty and cannot be written", async (t) => {
    if (skipWithoutSandbox(t) || skipUnlessRoot(t)) return;
    const { execFileSync } = await import("node:child_process");
    const dir = mkdtempSync(join(tmpdir(), "pps-submount-"));
    const project = join(dir, "project");
    const mounted: string[] = [];
    t.after(() => {
      for (const m of mounted.reverse()) execFileSync("umount", ["-l", m]);
      rmSync(dir, { recursive: true, force: true });
    });
    for (const [kind, at] of [["proc", "proc"], ["sysfs", "sys"]]) {
      const point = join(project, "root", at);
      await mkdir(point, { recursive: true });
      execFileSync("mount", ["-t", kind, kind, point]);
      mounted.push(point);
    }
    const sb = new PythonSandbox({ projectDir: project, runtimeRoot: join(dir, "runtime"), prewarm: false });
    t.after(() => sb.dispose("test end"));
    sb.applyModeEvent({ mode: "yolo", readRoots: [] });
    const mine = jsonOut(await sb.execute(SUB));
    const theirs = lastJson(await unfiltered(SUB, { project, writable: true }));
    assert.equal(theirs.core_pattern, "opened", `unfiltered, the host's core_pattern opens for writing: ${JSON.stringify(theirs)}`);
    assert.ok((theirs.proc_entries as number) > 10 && (theirs.sys_entries as number) > 3, JSON.stringify(theirs));
    assert.deepEqual(mine, { core_pattern: 2, proc_entries: 0, sys_entries: 0, keys: false });
  });
});
