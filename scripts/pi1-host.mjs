// The pi 1.x host for the end-to-end suite: @earendil-works/pi-coding-agent
// and a Node 22 binary from the npm registry (node-linux-<arch>), installed
// into .hosts/pi1 (gitignored) from the pinned manifest and lockfile in
// scripts/hosts/pi1. The root package.json keeps pi 0.73 for everything else.
//
//   node scripts/pi1-host.mjs                    install (if needed) and print the paths
//   node scripts/pi1-host.mjs --test [FILE...]   install (if needed) and run the pi 1.x e2e tests
//                                                (with rollback as PI_PYTHON_TOOL_ROLLBACK says:
//                                                on unless it is 0, false, off or no)
import { spawnSync } from "node:child_process";
import { copyFileSync, existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import { root, run } from "./prepare.mjs";

const SPEC_DIR = join(root, "scripts", "hosts", "pi1");
export const PI1_DIR = join(root, ".hosts", "pi1");
/** The pi end-to-end files, run under both hosts (harness.test.ts checks 0.73 internals; the rest needs no pi). */
export const PI1_TEST_FILES = [
  "__test__/bash-session.test.ts",
  "__test__/bash-tool.test.ts",
  "__test__/describe.test.ts",
  "__test__/extension.test.ts",
  "__test__/live-grants.test.ts",
  "__test__/live-mode.test.ts",
  "__test__/network-inside.test.ts",
  "__test__/network-python.test.ts",
  "__test__/network-bus.test.ts",
  "__test__/network-review.test.ts",
  "__test__/listeners.test.ts",
  "__test__/output-order.test.ts",
  "__test__/permissions.test.ts",
  "__test__/permissions-client.test.ts",
  "__test__/project-path.test.ts",
  "__test__/rich.test.ts",
  "__test__/rpc.test.ts",
  "__test__/words.test.ts",
  "__test__/words-results.test.ts",
];

function nodePackage() {
  const arch = { x64: "x64", arm64: "arm64" }[process.arch];
  if (process.platform !== "linux" || !arch) throw new Error(`no registry Node 22 for ${process.platform}-${process.arch}`);
  return `node-linux-${arch}`;
}

/** Paths of an installed pi 1.x host. */
export function pi1Paths() {
  return {
    dir: PI1_DIR,
    node: join(PI1_DIR, "node_modules", nodePackage(), "bin", "node"),
    cli: join(PI1_DIR, "node_modules", "@earendil-works", "pi-coding-agent", "dist", "cli.js"),
    version: () => JSON.parse(readFileSync(join(PI1_DIR, "node_modules", "@earendil-works", "pi-coding-agent", "package.json"), "utf8")).version,
  };
}

/** Installs .hosts/pi1 unless it already matches the pinned lockfile. Throws on failure. */
export function ensurePi1Host() {
  const lock = readFileSync(join(SPEC_DIR, "package-lock.json"), "utf8");
  const stamp = join(PI1_DIR, ".installed-lock.json");
  const paths = pi1Paths();
  if (existsSync(stamp) && readFileSync(stamp, "utf8") === lock && existsSync(paths.node) && existsSync(paths.cli)) return paths;
  console.log(`\n# installing the pi 1.x host into ${PI1_DIR}`);
  mkdirSync(PI1_DIR, { recursive: true });
  copyFileSync(join(SPEC_DIR, "package.json"), join(PI1_DIR, "package.json"));
  copyFileSync(join(SPEC_DIR, "package-lock.json"), join(PI1_DIR, "package-lock.json"));
  run("npm", ["ci", "--no-audit", "--no-fund", "--loglevel=error"], { cwd: PI1_DIR });
  if (!existsSync(paths.node)) throw new Error(`the pi 1.x host has no Node binary at ${paths.node}`);
  const v = spawnSync(paths.node, ["--version"], { encoding: "utf8" });
  if (v.status !== 0) throw new Error(`${paths.node} does not run: ${v.stderr || v.error?.message}`);
  writeFileSync(stamp, lock);
  return paths;
}

/** Whether a PI_PYTHON_TOOL_ROLLBACK value leaves rollback on (as the addon reads it). */
export const rollbackOn = (value) => !/^(0|false|off|no)$/i.test(value?.trim() ?? "");

/**
 * Runs the shared e2e files under pi 1.x and Node 22 (type stripping, no tsx), with rollback on
 * (the default users get: PI_PYTHON_TOOL_ROLLBACK unset) or off (PI_PYTHON_TOOL_ROLLBACK=0).
 */
export function runPi1Tests(files = PI1_TEST_FILES, { rollback = true } = {}) {
  const paths = ensurePi1Host();
  const nodeVersion = spawnSync(paths.node, ["--version"], { encoding: "utf8" }).stdout.trim();
  const setting = rollback ? "rollback on" : "PI_PYTHON_TOOL_ROLLBACK=0";
  console.log(`\n# end-to-end tests under pi ${paths.version()} (@earendil-works) on Node ${nodeVersion}, ${setting}`);
  const env = { ...process.env, PI_HOST: "pi1" };
  if (rollback) delete env.PI_PYTHON_TOOL_ROLLBACK;
  else env.PI_PYTHON_TOOL_ROLLBACK = "0";
  run(
    paths.node,
    ["--experimental-strip-types", "--no-warnings=ExperimentalWarning", "--import", "./__test__/helpers/pi1-host.mjs",
     "--test", "--test-concurrency=1", ...files],
    // The suites assert the behaviour of the setting in force (__test__/helpers/sandbox-env.ts).
    { env },
  );
}

if (import.meta.url === pathToFileURL(process.argv[1]).href) {
  try {
    if (process.argv.includes("--test")) {
      const files = process.argv.slice(2).filter((a) => a !== "--test");
      runPi1Tests(files.length > 0 ? files : undefined, { rollback: rollbackOn(process.env.PI_PYTHON_TOOL_ROLLBACK) });
    } else {
      const p = ensurePi1Host();
      console.log(`pi ${p.version()}: ${p.cli}\nnode: ${p.node}`);
    }
  } catch (err) {
    console.error(err.message);
    process.exit(err.exitCode ?? 1);
  }
}
