/**
 * Lazy loading of the native addon. pi must keep running when the addon is
 * missing or broken, so nothing here throws: a failure becomes a message the
 * tool reports as `unavailable`.
 */
import { createRequire } from "node:module";
import type { PythonSandbox as PythonSandboxClass, SandboxOptions } from "../index.d.ts";

export type PythonSandbox = PythonSandboxClass;
type Binding = { PythonSandbox: new (options: SandboxOptions) => PythonSandboxClass; cleanupAll(): void };
const EXIT_HOOK = Symbol.for("pi-python-sandbox.exit-hook");

let cached: { binding?: Binding; error?: string } | undefined;

/** The addon, or the reason it cannot be used on this machine. */
export function loadAddon(): { binding?: Binding; error?: string } {
  if (cached) return cached;
  if (process.platform !== "linux") {
    cached = {
      error: `The python tool requires Linux for its bubblewrap sandbox; this platform is ${process.platform}. It never runs Python unsandboxed.`,
    };
    return cached;
  }
  try {
    const require = createRequire(import.meta.url);
    const binding = require("../index.cjs") as Binding;
    cached = { binding };
    // process.exit() skips the addon's environment cleanup: kill sandboxes
    // and delete session directories here too (once per process).
    const g = globalThis as { [EXIT_HOOK]?: boolean };
    if (!g[EXIT_HOOK]) {
      g[EXIT_HOOK] = true;
      process.once("exit", () => binding.cleanupAll());
    }
  } catch (err) {
    const detail = err instanceof Error ? err.message.split("\n")[0] : String(err);
    cached = {
      error:
        `The sandbox's native addon could not be loaded for ${process.platform}-${process.arch} (${detail}). ` +
        "Reinstall with `pi install npm:pi-python-sandbox`, or build it from a checkout with `npm run build`.",
    };
  }
  return cached;
}
