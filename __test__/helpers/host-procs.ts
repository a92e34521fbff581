/**
 * Host-side views of processes and descriptors for the escape, fault and soak tests: the process
 * tree under a sandbox, the sandbox worker's host pid, and this process's fd count and RSS.
 */
import assert from "node:assert/strict";
import { readdirSync, readFileSync, readlinkSync } from "node:fs";
import { hostPidsWithCmdline } from "../../scripts/lib/procs.mjs";
import { waitUntil } from "./sandbox-fixture.ts";

/** Parent pid of `pid`, or null when it is gone. */
export function parentOf(pid: number): number | null {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    // The command name may hold spaces and parentheses; the fields after the last ')' do not.
    const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    return Number(fields[1]);
  } catch {
    return null;
  }
}

/** Every live descendant of `root` (children, grandchildren, ...). */
export function descendantsOf(root: number): number[] {
  const children = new Map<number, number[]>();
  for (const entry of readdirSync("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    const ppid = parentOf(Number(entry));
    if (ppid === null) continue;
    const list = children.get(ppid) ?? [];
    list.push(Number(entry));
    children.set(ppid, list);
  }
  const out: number[] = [];
  const queue = [root];
  while (queue.length) {
    const next = children.get(queue.shift() as number) ?? [];
    out.push(...next);
    queue.push(...next);
  }
  return out.sort((a, b) => a - b);
}

/** No host process mentions `needle` (a runtime root, a session dir or a marker) within `ms`. */
export async function assertNoProcess(needle: string, ms = 5000): Promise<void> {
  assert.ok(
    await waitUntil(() => hostPidsWithCmdline(needle).length === 0, ms),
    `processes remain: ${hostPidsWithCmdline(needle).map(describeProcess).join("; ")}`,
  );
}

/** "pid state ppid=N pgid=N: command line", for a failure message. */
export function describeProcess(pid: number): string {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    return `${pid} ${fields[0]} ppid=${fields[1]} pgid=${fields[2]}: ${cmdline(pid).slice(0, 300)}`;
  } catch {
    return `${pid} (gone)`;
  }
}

function cmdline(pid: number): string {
  try {
    return readFileSync(`/proc/${pid}/cmdline`, "utf8").split("\0").join(" ");
  } catch {
    return "";
  }
}

/**
 * Host pids of the Python workers of the sandboxes whose bubblewrap command line contains
 * `needle` (a session's scratch directory names exactly one session; a runtime root names all of
 * a fixture's sessions).
 */
export function workerPids(needle: string): number[] {
  const found = new Set<number>();
  for (const bwrap of hostPidsWithCmdline(needle)) {
    for (const pid of descendantsOf(bwrap)) {
      // bubblewrap's own command line names the worker too (a mount and the command).
      const argv = cmdline(pid).split(" ");
      if (!argv[0].endsWith("/bwrap") && argv.some((a) => a === "/worker.py" || a === "/worker.pyc")) found.add(pid);
    }
  }
  return [...found];
}

/**
 * In a keeper layout (rollback on): host pids of the interpreter of the sandboxes whose
 * bubblewrap command line contains `needle`: the children of PID 1 (the worker whose parent is
 * bubblewrap). The interpreter's rollback copies, its children, are not (the next call's waits
 * between calls, the last call's until the host has its result); a copy whose interpreter died
 * is PID 1's child until the next call.
 */
export function interpreterPids(needle: string): number[] {
  const workers = workerPids(needle);
  const keepers = workers.filter((pid) => !workers.includes(parentOf(pid) ?? -1));
  return workers.filter((pid) => keepers.includes(parentOf(pid) ?? -1));
}

/** Number of open descriptors of this process. */
export function fdCount(): number {
  return readdirSync("/proc/self/fd").length;
}

/** This process's descriptors and what they point at, for a failure message. */
export function fdTable(): Record<string, string> {
  const table: Record<string, string> = {};
  for (const fd of readdirSync("/proc/self/fd")) {
    try {
      table[fd] = readlinkSync(`/proc/self/fd/${fd}`);
    } catch {
      table[fd] = "(closed while listing)";
    }
  }
  return table;
}

/** Descriptors present in `after` but not in `before`, with their targets. */
export function fdDiff(before: Record<string, string>, after: Record<string, string>): Record<string, string> {
  const diff: Record<string, string> = {};
  for (const [fd, target] of Object.entries(after)) {
    if (before[fd] !== target) diff[fd] = target;
  }
  return diff;
}

/** Zombies whose parent is this process, as "pid (command)". */
export function ownZombies(): string[] {
  const zombies: string[] = [];
  for (const entry of readdirSync("/proc")) {
    if (!/^\d+$/.test(entry)) continue;
    try {
      const stat = readFileSync(`/proc/${entry}/stat`, "utf8");
      const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
      const comm = stat.slice(stat.indexOf("(") + 1, stat.lastIndexOf(")"));
      if (fields[0] === "Z" && Number(fields[1]) === process.pid) zombies.push(`${entry} (${comm})`);
    } catch {
      // gone
    }
  }
  return zombies;
}

/**
 * CPU time (ms) the addon's threads (tokio's: where the sandbox's pipes are read and the watches
 * react) spend over `ms` of wall time, from each thread's schedstat. The test's own JavaScript
 * and garbage collection are not the host's work for the sandbox.
 */
export async function addonCpuOver(ms: number): Promise<number> {
  const threads = (): Map<string, number> => {
    const out = new Map<string, number>();
    for (const tid of readdirSync("/proc/self/task")) {
      try {
        if (!readFileSync(`/proc/self/task/${tid}/comm`, "utf8").startsWith("tokio")) continue;
        out.set(tid, Number(readFileSync(`/proc/self/task/${tid}/schedstat`, "utf8").split(" ")[0]));
      } catch {
        // The thread ended while we looked.
      }
    }
    return out;
  };
  const before = threads();
  await new Promise((resolve) => setTimeout(resolve, ms));
  let ns = 0;
  for (const [tid, now] of threads()) ns += now - (before.get(tid) ?? 0);
  return ns / 1e6;
}
