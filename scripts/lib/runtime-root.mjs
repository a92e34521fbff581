// The layout of a runtime root, shared by the tests and the soak script.
import { readdirSync } from "node:fs";

/**
 * Names of the session directories under `root` (16 hex digits each), sorted; empty when `root`
 * does not exist. The shared `.worker-code` directory is not a session's.
 * @param {string} root
 * @returns {string[]}
 */
export function sessionDirs(root) {
  try {
    return readdirSync(root).filter((name) => /^[0-9a-f]{16}$/.test(name)).sort();
  } catch (err) {
    if (err && err.code === "ENOENT") return [];
    throw err;
  }
}
