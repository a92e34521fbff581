/**
 * Lazy loading of the native addon. pi must keep running when the addon is
 * missing or broken, so nothing here throws: a failure becomes a message the
 * tool reports as `unavailable`.
 */
import { existsSync } from "node:fs";
import { createRequire } from "node:module";
import { dirname, join, sep } from "node:path";
import { fileURLToPath } from "node:url";
import type {
  TrustedConfig,
  Limits,
  PythonSandbox as PythonSandboxClass,
  SandboxOptions,
  ToolPermissions as ToolPermissionsClass,
  ToolSettings,
} from "../index.d.ts";

export type PythonSandbox = PythonSandboxClass;
export type ToolPermissions = ToolPermissionsClass;
type Binding = {
  PythonSandbox: new (options: SandboxOptions, permissions?: ToolPermissionsClass) => PythonSandboxClass;
  ToolPermissions: new () => ToolPermissionsClass;
  cleanupAll(): void;
  sandboxLimits?(): Limits;
  toolSettings?(): ToolSettings;
  displayText(text: string): string;
  displayLine?(text: string): string;
  loadTrustedConfig?(agentDir: string, projectDir: string): TrustedConfig;
  sandboxProbe?(): Promise<string | null | undefined>;
};
const EXIT_HOOK = Symbol.for("pi-python-sandbox.exit-hook");

let cached: { binding?: Binding; error?: string } | undefined;

const PREBUILT = ["linux-x64", "linux-arm64"];

/** How this copy of the package was installed, judged from where it is. */
export type InstallKind = "checkout" | "pi-npm" | "pi-git" | "npm";

export function installKind(packageDir: string): InstallKind {
  if (existsSync(join(packageDir, "Cargo.toml"))) {
    return packageDir.split(sep).includes("git") && packageDir.includes(`${sep}.pi${sep}`) ? "pi-git" : "checkout";
  }
  // pi keeps the npm packages it installs in an npm project of its own
  // (~/.pi/agent/npm, or PI_CODING_AGENT_DIR/npm).
  const parts = packageDir.split(sep);
  const at = parts.lastIndexOf("node_modules");
  if (at > 0 && parts[at - 1] === "npm" && existsSync(join(parts.slice(0, at).join(sep), "package.json"))) return "pi-npm";
  return "npm";
}

/** The fix for a missing platform package that fits the install. */
export function installFix(kind: InstallKind, pkg: string, packageDir: string): string {
  switch (kind) {
    case "checkout":
      return `build the addon in this checkout (${packageDir}): \`npm ci && npm run build\``;
    case "pi-git":
      return `build the addon in pi's clone (${packageDir}): \`npm ci && npm run build\` (the prebuilt addon comes only with \`pi install npm:pi-python-sandbox\`)`;
    case "pi-npm": {
      const project = dirname(dirname(packageDir));
      return (
        `run \`pi install npm:pi-python-sandbox\` again (it brings ${pkg}); if it was installed from a local tarball, ` +
        `first add \`"overrides": { "${pkg}": "file:/abs/path/${pkg}-VERSION.tgz" }\` to ${join(project, "package.json")}`
      );
    }
    case "npm":
      return `install it again without skipping optional dependencies (\`npm install pi-python-sandbox\`, not --omit=optional), which brings ${pkg}`;
  }
}

/** Why the addon did not load, naming what is missing for which platform. */
function missingAddonMessage(err: unknown): string {
  const detail = err instanceof Error ? err.message.split("\n")[0] : String(err);
  const key = `${process.platform}-${process.arch}`;
  const pkg = `pi-python-sandbox-${key}-gnu`;
  const report = process.report?.getReport() as { header?: { glibcVersionRuntime?: string } } | undefined;
  const glibc = Boolean(report?.header?.glibcVersionRuntime);
  const override = process.env.NAPI_RS_NATIVE_LIBRARY_PATH;
  let reason: string;
  if (override) reason = `NAPI_RS_NATIVE_LIBRARY_PATH=${override} could not be loaded (${detail})`;
  else if (!PREBUILT.includes(key) || !glibc)
    reason = `there is no prebuilt addon for ${key}${glibc ? "" : " with musl"} (prebuilt: linux-x64-gnu, linux-arm64-gnu)`;
  else if (/Cannot find native binding/.test(detail)) reason = `the platform package ${pkg} is not installed (were optional dependencies skipped?)`;
  else reason = detail;
  const packageDir = dirname(dirname(fileURLToPath(import.meta.url)));
  const fix = installFix(installKind(packageDir), pkg, packageDir);
  return (
    `The sandbox's native addon could not be loaded: ${reason}. To fix it, ${fix}; ` +
    `or set NAPI_RS_NATIVE_LIBRARY_PATH to a built .node file.`
  );
}

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
    cached = { error: missingAddonMessage(err) };
  }
  return cached;
}
