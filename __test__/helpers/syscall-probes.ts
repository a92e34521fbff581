/**
 * Raw system-call probes for the escape catalogue: one Python snippet that makes every call of a
 * table through ctypes and prints each answer, run once in the sandbox and once in an unfiltered
 * bubblewrap baseline (see unfiltered.ts), so that each call can then be asserted in its own test.
 */
import { mkdtempSync, rmSync } from "node:fs";
import { mkdir } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, type TestContext } from "node:test";
import { sandboxSkipReason, skipWithoutSandbox } from "./sandbox-env.ts";
import { jsonOut, lit, PythonSandbox, py } from "./sandbox-fixture.ts";
import { unfiltered } from "./unfiltered.ts";

/** What one call answered. */
export type Answer = { ret: number; errno: number };

/** The x86_64 system call numbers of the probes are meaningless elsewhere: skip loudly. */
export function skipUnlessX64(t: TestContext): boolean {
  if (process.arch === "x64") return false;
  console.log(`# SKIP ${t.name}: the probes use x86_64 system call numbers, this is ${process.arch}`);
  t.skip(`x86_64 system call numbers; this is ${process.arch}`);
  return true;
}

/** Skip (loudly, never under CI) without a sandbox or off x86_64. */
export const skipProbe = (t: TestContext) => skipWithoutSandbox(t) || skipUnlessX64(t);

/** The last stdout line, as JSON. */
export const lastJson = (out: string) => JSON.parse(out.trim().split("\n").at(-1) ?? "null");

/** Python that makes each call (title, number, arguments) and prints `{title: answer}`. */
export function tableProbe(probes: { title: string; nr: number; args: number[] }[]): string {
  return py`
    import ctypes, json
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    def call(nr, args):
        ctypes.set_errno(0)
        ret = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
        return {"ret": ret, "errno": ctypes.get_errno()}
    probes = json.loads(${lit(JSON.stringify(probes.map((p) => [p.title, p.nr, p.args])))})
    print(json.dumps({title: call(nr, args) for title, nr, args in probes}))
  `;
}

/**
 * In the enclosing describe: run the table once inside a sandbox and once unfiltered (before its
 * tests; cleaned up after). The getters are undefined where the probes could not run.
 */
export function probeTable(
  tag: string,
  probes: { title: string; nr: number; args: number[] }[],
): { inside(): Record<string, Answer> | undefined; outside(): Record<string, Answer> | undefined } {
  let inside: Record<string, Answer> | undefined;
  let outside: Record<string, Answer> | undefined;
  let base: string | undefined;
  let sandbox: PythonSandbox | undefined;
  before(async () => {
    if (sandboxSkipReason() !== null || process.arch !== "x64") return;
    base = mkdtempSync(join(tmpdir(), `pps-${tag}-`));
    await mkdir(join(base, "project"));
    sandbox = new PythonSandbox({ projectDir: join(base, "project"), runtimeRoot: join(base, "runtime") });
    const code = tableProbe(probes);
    const [r, baseline] = await Promise.all([sandbox.execute(code), unfiltered(code)]);
    inside = jsonOut(r);
    outside = lastJson(baseline);
  });
  after(async () => {
    await sandbox?.dispose("test end");
    if (base) rmSync(base, { recursive: true, force: true });
  });
  return { inside: () => inside, outside: () => outside };
}

/**
 * Open a socket with io_uring's IORING_OP_SOCKET (no socket(2) call), then connect(2) it to the
 * Unix socket at `path`: the way around a filter that only refuses socket(2). Prints the step that
 * failed and its errno, or "connected".
 */
export function ioUringConnect(path: string): string {
  return py`
  import ctypes, json, mmap, os, struct
  libc = ctypes.CDLL(None, use_errno=True)
  libc.syscall.restype = ctypes.c_long
  def sc(nr, *args):
      ctypes.set_errno(0)
      ret = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
      return ret, ctypes.get_errno()
  def attempt(path):
      params = ctypes.create_string_buffer(120)
      ring, err = sc(425, 4, ctypes.addressof(params))  # io_uring_setup
      if ring < 0:
          return {"step": "io_uring_setup", "errno": err}
      sq_entries, cq_entries = struct.unpack_from("<2I", params, 0)
      sq_head, sq_tail, sq_mask, _, _, _, sq_array = struct.unpack_from("<7I", params, 40)
      cq_head, cq_tail, cq_mask, _, _, cq_cqes = struct.unpack_from("<6I", params, 80)
      rw = mmap.PROT_READ | mmap.PROT_WRITE
      sq = mmap.mmap(ring, sq_array + sq_entries * 4, mmap.MAP_SHARED, rw, offset=0)
      cq = mmap.mmap(ring, cq_cqes + cq_entries * 16, mmap.MAP_SHARED, rw, offset=0x8000000)
      sqes = mmap.mmap(ring, sq_entries * 64, mmap.MAP_SHARED, rw, offset=0x10000000)
      # IORING_OP_SOCKET (45): fd = domain (AF_UNIX), off = type (SOCK_STREAM), len = protocol.
      sqes[0:64] = struct.pack("<BBHiQQIIQHHIQQ", 45, 0, 0, 1, 1, 0, 0, 0, 7, 0, 0, 0, 0, 0)
      tail = struct.unpack_from("<I", sq, sq_tail)[0]
      mask = struct.unpack_from("<I", sq, sq_mask)[0]
      struct.pack_into("<I", sq, sq_array + (tail & mask) * 4, 0)
      struct.pack_into("<I", sq, sq_tail, tail + 1)
      n, err = sc(426, ring, 1, 1, 1, 0, 0)  # io_uring_enter(to_submit=1, min_complete=1, GETEVENTS)
      if n < 0:
          return {"step": "io_uring_enter", "errno": err}
      head = struct.unpack_from("<I", cq, cq_head)[0]
      _, res, _ = struct.unpack_from("<QiI", cq, cq_cqes + (head & struct.unpack_from("<I", cq, cq_mask)[0]) * 16)
      if res < 0:
          return {"step": "IORING_OP_SOCKET", "errno": -res}
      addr = struct.pack("<H108s", 1, path.encode())
      buf = ctypes.create_string_buffer(addr, len(addr))
      r, err = sc(42, res, ctypes.addressof(buf), len(addr))  # connect
      if r < 0:
          return {"step": "connect", "errno": err}
      os.write(res, b"hello through io_uring\n")
      return {"step": "connected", "errno": 0}
  print(json.dumps(attempt(${lit(path)})))
`;
}

/**
 * A forked child reads its parent's buffer through process_vm_readv with valid iovecs. Prints
 * `{"ret", "errno", "read"}`: 24 and the secret where the call is allowed.
 */
export const processVmReadvOfParent = py`
  import ctypes, json, os
  libc = ctypes.CDLL(None, use_errno=True)
  libc.syscall.restype = ctypes.c_long
  class iovec(ctypes.Structure):
      _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
  secret = ctypes.create_string_buffer(b"parent-secret-0123456789")
  r, w = os.pipe()
  pid = os.fork()
  if pid == 0:
      buf = ctypes.create_string_buffer(24)
      local, remote = iovec(ctypes.addressof(buf), 24), iovec(ctypes.addressof(secret), 24)
      ctypes.set_errno(0)
      ret = libc.syscall(ctypes.c_long(310), ctypes.c_long(os.getppid()), ctypes.byref(local), ctypes.c_long(1),
                         ctypes.byref(remote), ctypes.c_long(1), ctypes.c_long(0))
      os.write(w, json.dumps({"ret": ret, "errno": ctypes.get_errno(), "read": buf.value.decode("latin1")}).encode())
      os._exit(0)
  os.close(w)
  out = json.loads(os.read(r, 4096))
  os.waitpid(pid, 0)
  print(json.dumps(out))
`;
