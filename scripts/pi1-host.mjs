// The pi 1.x host for the end-to-end suite: @earendil-works/pi-coding-agent
// and a Node 22 binary from the npm registry (node-linux-<arch>), installed
// into .hosts/pi1 (gitignored) from the pinned manifest and lockfile in
// scripts/hosts/pi1. The root package.json keeps pi 0.73 for everything else.
//
//   node scripts/pi1-host.mjs                    install (if needed) and print the paths
//   node scripts/pi1-host.mjs --test [FILE...]   install (if needed) and run the pi 1.x e2e tests
import { spawnSync } from "node:child_process";
import { copyFileSync, existsSync, mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import { root, run } from "./prepare.mjs";

const SPEC_DIR = join(root, "scripts", "hosts", "pi1");
export const PI1_DIR = join(root, ".hosts", "pi1");
/** The pi end-to-end files, run under both hosts (harness.test.ts checks 0.73 internals; the rest needs no pi). */
export const PI1_TEST_FILES = [
  "__test__/describe.test.ts",
  "__test__/extension.test.ts",
  "__test__/listeners.test.ts",
  "__test__/permissions.test.ts",
  "__test__/permissions-client.test.ts",
  "__test__/rich.test.ts",
  "__test__/rpc.test.ts",
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

/** Runs the shared e2e files under pi 1.x and Node 22 (type stripping, no tsx). */
export function runPi1Tests(files = PI1_TEST_FILES) {
  const paths = ensurePi1Host();
  const nodeVersion = spawnSync(paths.node, ["--version"], { encoding: "utf8" }).stdout.trim();
  console.log(`\n# end-to-end tests under pi ${paths.version()} (@earendil-works) on Node ${nodeVersion}`);
  run(
    paths.node,
    ["--experimental-strip-types", "--no-warnings=ExperimentalWarning", "--import", "./__test__/helpers/pi1-host.mjs",
     "--test", "--test-concurrency=1", ...files],
    // These suites assert the spec's kill-and-restart recovery (as under pi 0.73).
    { env: { ...process.env, PI_HOST: "pi1", PI_PYTHON_TOOL_ROLLBACK: "0" } },
  );
}

if (import.meta.url === pathToFileURL(process.argv[1]).href) {
  try {
    if (process.argv.includes("--test")) {
      const files = process.argv.slice(2).filter((a) => a !== "--test");
      runPi1Tests(files.length > 0 ? files : undefined);
    } else {
      const p = ensurePi1Host();
      console.log(`pi ${p.version()}: ${p.cli}\nnode: ${p.node}`);
    }
  } catch (err) {
    console.error(err.message);
    process.exit(err.exitCode ?? 1);
  }
}
