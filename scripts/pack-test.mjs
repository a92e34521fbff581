// The package as a user gets it: `npm pack` of the root and of this machine's platform package,
// installed into fresh prefixes with no Rust toolchain on PATH, then loaded into the real pi CLI
// (RPC mode, scripted faux model) that runs `1+1` through the python tool.
//
//   1. platform packages in sync (scripts/platform-packages.mjs check), this build staged
//   2. npm pack of both; the root tarball holds exactly the loader, the types, js/, README and
//      package.json; the platform tarball holds the .node
//   3. both tarballs installed together (the optional dependency resolves to the local tarball),
//      then `pi install <installed folder>` (pi 0.73) and a run: `result: 2`, the .node mapped into
//      pi comes from the platform package
//   4. the root tarball without its optional dependency: the tool says `unavailable` and why;
//      with NAPI_RS_NATIVE_LIBRARY_PATH it runs
//   5. when the pi 1.x host is installed (.hosts/pi1): the pi 1.x steps of docs/development.md
//      (installing from local tarballs) verbatim: `pi install npm:pi-python-sandbox@file:<tarball>`
//      into a temp agent dir (no platform package: the tool says so), `overrides` added to the npm
//      project pi made, the same install again, then a run: `result: 2`
//   pi's header must name the package (`pi-python-sandbox`, not `js`) after both installs.
//
//   node scripts/pack-test.mjs          (KEEP=1 keeps the temp dir)
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, realpathSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { delimiter, join } from "node:path";
import { pathToFileURL } from "node:url";
import { mappedFiles, piCli, processesMentioning, startRpcPi, toolText } from "../__test__/helpers/rpc-client.mjs";
import { pi1Paths } from "./pi1-host.mjs";
import { hostPlatform, platformPackages, stage, sync } from "./platform-packages.mjs";
import { prepare, root } from "./prepare.mjs";

const PI0_PACKAGE = join(root, "node_modules", "@mariozechner", "pi-coding-agent");
const ROOT_NAME = JSON.parse(readFileSync(join(root, "package.json"), "utf8")).name;

/** This environment without any Rust toolchain: no cargo/rustup on PATH, no CARGO_ or RUSTUP_ variables. */
function envWithoutRust() {
  const env = Object.fromEntries(Object.entries(process.env).filter(([k]) => !/^(CARGO|RUSTUP|RUSTC|RUST)_?/.test(k)));
  env.PATH = (process.env.PATH ?? "")
    .split(delimiter)
    .filter((dir) => dir && !/cargo|rustup/.test(dir) && !["cargo", "rustc", "rustup"].some((b) => existsSync(join(dir, b))))
    .join(delimiter);
  const found = spawnSync("sh", ["-c", "command -v cargo || command -v rustc || command -v rustup"], { env, encoding: "utf8" });
  assert.notEqual(found.status, 0, `a Rust tool is still on PATH: ${found.stdout.trim()}`);
  return env;
}

function sh(cmd, args, { cwd, env, quiet = false } = {}) {
  if (!quiet) console.log(`$ ${[cmd, ...args].join(" ")}`);
  const r = spawnSync(cmd, args, { cwd, env, encoding: "utf8", maxBuffer: 64 * 1024 * 1024 });
  if (r.error) throw new Error(`${cmd} could not be started: ${r.error.message}`);
  if (r.status !== 0) throw new Error(`${cmd} ${args.join(" ")} failed (exit ${r.status}):\n${r.stdout}\n${r.stderr}`);
  return r.stdout;
}

/** `npm pack` of `dir` into `dest`: { file, files }. */
function npmPack(dir, dest, env) {
  const [info] = JSON.parse(sh("npm", ["pack", "--json", "--pack-destination", dest], { cwd: dir, env }));
  return { file: join(dest, info.filename), files: info.files.map((f) => f.path).sort() };
}

/** A fresh npm project at `dir` with `specs` installed, as `npm install` (pi 0.73's `pi install`) does it. */
function npmInstall(dir, specs, env, extraArgs = []) {
  mkdirSync(dir, { recursive: true });
  writeFileSync(join(dir, "package.json"), JSON.stringify({ name: "pack-test-prefix", private: true }));
  sh("npm", ["install", "--prefix", dir, "--no-audit", "--no-fund", "--loglevel=error", ...extraArgs, ...specs], { env });
  return join(dir, "node_modules");
}

let step = 0;
async function timed(title, fn) {
  const started = Date.now();
  console.log(`\n# pack test ${++step}: ${title}`);
  const value = await fn();
  console.log(`# ... ${((Date.now() - started) / 1000).toFixed(1)} s`);
  return value;
}

/**
 * One pi run over RPC in a fresh project: the faux model calls python with `code`; resolves to
 * { text, details, isError, nodeFiles } (nodeFiles: the .node files mapped into pi). pi must exit
 * cleanly after stdin closes and leave no sandbox behind.
 */
async function runInPi({ node = process.execPath, cliPackage = PI0_PACKAGE, extensions = [], discover = false, agentDir, base, env, code }) {
  const cwd = mkdtempSync(join(base, "project-"));
  const childTmp = mkdtempSync(join(base, "tmp-"));
  const pi = startRpcPi({
    node,
    cli: piCli(cliPackage),
    extensions,
    noDiscovery: !discover,
    script: [{ toolCalls: [{ name: "python", arguments: { code } }] }, { text: "done" }],
    cwd,
    env: { ...env, PI_CODING_AGENT_DIR: agentDir, TMPDIR: childTmp },
  });
  try {
    const end = await pi.runPrompt("run it", 60_000);
    const nodeFiles = mappedFiles(pi.child.pid, ".node");
    const exit = await pi.close();
    assert.deepEqual(exit, { code: 0, signal: null }, `pi did not exit cleanly\n${pi.context()}`);
    assert.deepEqual(processesMentioning(childTmp), [], "no sandbox process is left");
    return { text: toolText(end.result), details: end.result.details ?? {}, isError: end.isError, nodeFiles };
  } finally {
    await pi.kill();
  }
}

/** The names pi's interactive header gives the installed extensions (scripts/lib/extension-labels.mjs). */
function headerLabels({ node = process.execPath, cliPackage = PI0_PACKAGE, agentDir, base, env }) {
  const cwd = mkdtempSync(join(base, "labels-"));
  const out = sh(node, [join(root, "scripts", "lib", "extension-labels.mjs"), cliPackage, cwd], { env: { ...env, PI_CODING_AGENT_DIR: agentDir }, quiet: true });
  return JSON.parse(out.trim().split("\n").at(-1));
}

/**
 * The run must have worked. A sandbox that cannot start on this machine (no bubblewrap, no user
 * namespaces) only skips, and not under CI; a missing or broken addon always fails.
 */
function assertRan(r, what) {
  if (r.details.status === "unavailable" && !/native addon/.test(r.text) && process.env.CI !== "true") {
    console.log(`# SKIP ${what}: the sandbox is unavailable here:\n${r.text}`);
    return false;
  }
  assert.equal(r.details.status, "ok", `${what}:\n${r.text}`);
  assert.match(r.text, /^result: 2$/m, what);
  return true;
}

export async function packTest() {
  const started = Date.now();
  const base = realpathSync(mkdtempSync(join(tmpdir(), "pps-pack-")));
  const platform = hostPlatform();
  const platformPkg = platformPackages().find((p) => p.platform === platform);
  const nodeFile = platformPkg.manifest.main;
  const env = envWithoutRust();
  try {
    await timed("platform packages in sync; this build staged", () => {
      const changes = sync({ write: false });
      assert.deepEqual(changes, [], "run `node scripts/platform-packages.mjs sync`");
      console.log(`staged ${join(stage(), nodeFile)}`);
    });

    const [rootTgz, platformTgz] = await timed("npm pack of the root and of the platform package", () => {
      const dest = join(base, "tarballs");
      mkdirSync(dest);
      const r = npmPack(root, dest, env);
      const p = npmPack(platformPkg.dir, dest, env);
      console.log(`${r.file}:\n  ${r.files.join("\n  ")}\n${p.file}:\n  ${p.files.join("\n  ")}`);
      for (const f of ["package.json", "README.md", "index.cjs", "index.d.ts", "index.js", "js/index.ts"]) assert.ok(r.files.includes(f), `root tarball has ${f}`);
      const unexpected = r.files.filter((f) => !/^(package\.json|README\.md|LICENSE(\.\w+)?|index\.cjs|index\.d\.ts|index\.js|js\/[\w./-]+\.ts)$/.test(f));
      assert.deepEqual(unexpected, [], "root tarball: only the loader, the types, js/*.ts, README, package.json");
      assert.deepEqual(p.files, ["README.md", nodeFile, "package.json"].sort(), "platform tarball: the addon");
      return [r.file, p.file];
    });

    await timed("install both tarballs into a fresh prefix, `pi install` the folder, run 1+1 (pi 0.73)", async () => {
      const modules = npmInstall(join(base, "prefix"), [rootTgz, platformTgz], env);
      const pkgDir = join(modules, ROOT_NAME);
      const lock = JSON.parse(readFileSync(join(base, "prefix", "package-lock.json"), "utf8"));
      assert.match(lock.packages[`node_modules/${platformPkg.name}`]?.resolved ?? "", /^file:.*\.tgz$/, "the platform package came from the tarball");
      assert.ok(existsSync(join(modules, platformPkg.name, nodeFile)));
      assert.deepEqual(readdirSync(pkgDir).filter((f) => f.endsWith(".node") || f === "src"), [], "no addon or sources in the root package");
      assert.equal(existsSync(join(modules, "@mariozechner")), false, "pi's packages are optional peers and not installed");
      const agentDir = join(base, "agent-pi0");
      sh(process.execPath, [piCli(PI0_PACKAGE), "install", pkgDir], { env: { ...env, PI_CODING_AGENT_DIR: agentDir } });
      assert.deepEqual(headerLabels({ agentDir, base, env }), [ROOT_NAME], "pi's header names the package");
      const r = await runInPi({ agentDir, discover: true, base, env, code: "1+1" });
      if (assertRan(r, "installed package")) {
        assert.deepEqual(r.nodeFiles, [join(modules, platformPkg.name, nodeFile)], "the addon came from the platform package");
      }
    });

    await timed("the root tarball without its platform package: unavailable, then NAPI_RS_NATIVE_LIBRARY_PATH", async () => {
      const modules = npmInstall(join(base, "prefix-root-only"), [rootTgz], env, ["--omit=optional"]);
      const pkgDir = join(modules, ROOT_NAME);
      assert.equal(existsSync(join(modules, platformPkg.name)), false);
      const agentDir = join(base, "agent-missing");
      const missing = await runInPi({ agentDir, extensions: [pkgDir], base, env, code: "1+1" });
      console.log(`what the model sees:\n${missing.text}`);
      assert.equal(missing.details.status, "unavailable");
      assert.equal(missing.isError, true);
      assert.match(missing.text, /native addon could not be loaded/);
      assert.deepEqual(missing.nodeFiles, []);
      assert.match(missing.text, new RegExp(`the platform package ${platformPkg.name} is not installed`));
      assert.match(missing.text, /install it again without skipping optional dependencies/, "the fix fits a plain npm install");
      // The explicit override: a build anywhere on disk.
      const override = join(base, "override", nodeFile);
      mkdirSync(join(base, "override"));
      writeFileSync(override, readFileSync(join(root, nodeFile)));
      const r = await runInPi({ agentDir, extensions: [pkgDir], base, env: { ...env, NAPI_RS_NATIVE_LIBRARY_PATH: override }, code: "1+1" });
      if (assertRan(r, "NAPI_RS_NATIVE_LIBRARY_PATH")) assert.deepEqual(r.nodeFiles, [override]);
    });

    const pi1 = pi1Paths();
    if (!existsSync(pi1.cli) || !existsSync(pi1.node)) {
      console.log("\n# SKIP pi 1.x `pi install`: the pi 1.x host is not installed (node scripts/pi1-host.mjs)");
    } else {
      await timed(`pi ${pi1.version()}: docs/development.md's \`pi install npm:${ROOT_NAME}@file:<tarball>\`, overrides, the same install again, run 1+1`, async () => {
        // As docs/development.md says it: the install alone brings no platform package (it is not on the
        // registry, or not this version); `overrides` in the npm project pi made points it at the
        // local tarball, and the same install again brings it.
        const agentDir = join(base, "agent-pi1");
        const cliPackage = join(pi1.dir, "node_modules", "@earendil-works", "pi-coding-agent");
        const env1 = { ...env, PI_CODING_AGENT_DIR: agentDir, PATH: `${join(pi1.node, "..")}${delimiter}${env.PATH}` };
        const install = () => sh(pi1.node, [piCli(cliPackage), "install", `npm:${ROOT_NAME}@file:${rootTgz}`], { env: env1 });
        install();
        const modules = join(agentDir, "npm", "node_modules");
        assert.ok(existsSync(join(modules, ROOT_NAME, "index.js")));
        assert.equal(existsSync(join(modules, platformPkg.name)), false, "the first install lacks the platform package");
        const missing = await runInPi({ node: pi1.node, cliPackage, agentDir, discover: true, base, env: env1, code: "1+1" });
        assert.equal(missing.details.status, "unavailable", missing.text);
        assert.match(missing.text, new RegExp(`the platform package ${platformPkg.name} is not installed`));
        const npmProject = join(agentDir, "npm", "package.json");
        const manifest = JSON.parse(readFileSync(npmProject, "utf8"));
        manifest.overrides = { [platformPkg.name]: `file:${platformTgz}` };
        writeFileSync(npmProject, JSON.stringify(manifest, null, 2));
        install();
        assert.ok(existsSync(join(modules, platformPkg.name, nodeFile)), "the same install again brings it");
        // pi names a package by its source (`npm:pi-python-sandbox` shows `pi-python-sandbox`) and adds
        // the entry's folder unless the entry is the package's own index file (it was `...:js`).
        assert.deepEqual(headerLabels({ node: pi1.node, cliPackage, agentDir, base, env: env1 }), [`${ROOT_NAME}@file:${rootTgz}`], "pi's header names the package");
        const r = await runInPi({ node: pi1.node, cliPackage, agentDir, discover: true, base, env: env1, code: "1+1" });
        if (assertRan(r, "pi 1.x pi install")) assert.deepEqual(r.nodeFiles, [join(modules, platformPkg.name, nodeFile)]);
      });
    }
    console.log(`\n# pack test passed in ${((Date.now() - started) / 1000).toFixed(1)} s`);
  } finally {
    if (process.env.KEEP) console.log(`# kept ${base}`);
    else rmSync(base, { recursive: true, force: true, maxRetries: 3 });
  }
}

if (import.meta.url === pathToFileURL(process.argv[1]).href) {
  try {
    prepare();
    await packTest();
  } catch (err) {
    console.error(err.stack ?? err.message);
    process.exit(1);
  }
}
