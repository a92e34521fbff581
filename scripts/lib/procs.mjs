// Host process queries shared by the tests and the soak script.
import { readdirSync, readFileSync } from "node:fs";

/**
 * Host pids whose command line contains `needle`, other than this process
 * (zombies have no command line and never match).
 * @param {string} needle
 * @returns {number[]}
 */
export function hostPidsWithCmdline(needle) {
  const found = [];
  for (const entry of readdirSync("/proc")) {
    if (!/^\d+$/.test(entry) || Number(entry) === process.pid) continue;
    try {
      if (readFileSync(`/proc/${entry}/cmdline`).includes(needle)) found.push(Number(entry));
    } catch {
      // The process ended while we looked.
    }
  }
  return found;
}
