/**
 * Integration tests of the PythonSandbox addon against the real bubblewrap + seccomp sandbox: what
 * is left of them here, the documented system calls the filter blocks (the other suites are
 * state, output, errors, lifecycle, protocol, limits, isolation and api .test.ts).
 * Run: node --import tsx --test __test__/sandbox.test.ts
 *
 * One named test per behaviour. Every test skips loudly (never under CI=true) where bwrap cannot
 * run, and owns its project directory, runtime root and sandboxes (cleaned up in t.after).
 * Independent tests run concurrently inside each suite. Its sandboxes keep no spare
 * (makeFixtureWithoutSpare): what a test finds on the host is its own sandbox alone.
 */
import assert from "node:assert/strict";
import { describe, test } from "node:test";
import { jsonOut, makeFixtureWithoutSpare as makeFixture, py } from "./helpers/sandbox-fixture.ts";
import { skipWithoutSandbox } from "./helpers/sandbox-env.ts";
import { unfiltered } from "./helpers/unfiltered.ts";

const CONCURRENCY = 4;
const EPERM = 1;

// ---------------------------------------------------------------------------------------------
/**
 * Seccomp catalogue: each call is made through ctypes with x86_64 numbers and arguments chosen so
 * that an allowed call fails differently (EFAULT, ESRCH, ...) or succeeds. The same probe runs in
 * plain bwrap without the filter to prove the probe can tell "blocked" from "ran and failed".
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
