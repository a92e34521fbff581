// Makes a checkout ready to run: system packages, npm packages, the addon.
// Installs what it can (apt as root, npm ci, the Rust build) and otherwise
// says exactly what is missing. Used by `npm run demo` and `npm test`.
import { execFileSync, spawnSync } from "node:child_process";
import { existsSync, readdirSync, statSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

export const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const APT_PACKAGES = ["bubblewrap", "libseccomp-dev", "python3", "python3-venv"];
const isRoot = process.getuid?.() === 0;

export function run(cmd, args, opts = {}) {
  console.log(`$ ${[cmd, ...args].join(" ")}`);
  const r = spawnSync(cmd, args, { stdio: "inherit", cwd: root, ...opts });
  if (r.error) throw new Error(`${cmd} could not be started: ${r.error.message}`);
  if (r.status !== 0) {
    const e = new Error(`${cmd} ${args.join(" ")} failed (exit ${r.status ?? r.signal})`);
    e.exitCode = r.status ?? 1;
    throw e;
  }
}

function have(cmd) {
  return spawnSync("sh", ["-c", `command -v ${cmd}`], { stdio: "ignore" }).status === 0;
}

function missingSystemPackages() {
  const missing = [];
  if (!existsSync("/usr/bin/bwrap") && !have("bwrap")) missing.push("bubblewrap");
  const seccompStatic = ["/usr/lib/x86_64-linux-gnu/libseccomp.a", "/usr/lib/aarch64-linux-gnu/libseccomp.a", "/usr/lib/libseccomp.a"];
  if (!seccompStatic.some(existsSync)) missing.push("libseccomp-dev");
  if (!existsSync("/usr/bin/python3")) missing.push("python3");
  return missing;
}

function ensureSystemPackages() {
  const missing = missingSystemPackages();
  if (missing.length === 0) return;
  if (!isRoot || !have("apt-get")) {
    console.error(`Missing system packages: ${missing.join(", ")}. Install them with:\n  sudo apt-get install -y ${APT_PACKAGES.join(" ")}`);
    process.exit(1);
  }
  run("apt-get", ["update", "-qq"]);
  run("apt-get", ["install", "-y", "-qq", ...APT_PACKAGES], { env: { ...process.env, DEBIAN_FRONTEND: "noninteractive" } });
}

function ensureToolchain() {
  if (!have("cargo")) {
    console.error("Rust is needed to build the addon: install it with rustup (https://rustup.rs), then run this again.");
    process.exit(1);
  }
}

function newestMtime(dir) {
  let newest = 0;
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    const p = join(dir, entry.name);
    newest = Math.max(newest, entry.isDirectory() ? newestMtime(p) : statSync(p).mtimeMs);
  }
  return newest;
}

function addonPath() {
  const arch = { x64: "x64", arm64: "arm64" }[process.arch] ?? process.arch;
  return join(root, `pi-python-sandbox.linux-${arch}-gnu.node`);
}

/** System packages, node_modules and an up-to-date addon build. */
export function prepare() {
  if (process.platform !== "linux") {
    console.error(`pi-python-sandbox needs Linux (bubblewrap, seccomp); this is ${process.platform}.`);
    process.exit(1);
  }
  ensureSystemPackages();
  if (!existsSync(join(root, "node_modules", "@napi-rs", "cli"))) run("npm", ["ci", "--no-audit", "--no-fund"]);
  const addon = addonPath();
  const sources = Math.max(newestMtime(join(root, "src")), statSync(join(root, "Cargo.toml")).mtimeMs);
  if (!existsSync(addon) || statSync(addon).mtimeMs < sources) {
    ensureToolchain();
    run("npm", ["run", "build"]);
  }
  return addon;
}

export { execFileSync, isRoot };
