// The whole test suite: Rust lints, the TypeScript type check, Rust unit and
// engine tests, the engine tests again as an unprivileged user (when run as
// root), then the addon integration and pi end-to-end tests under node:test:
// every suite with rollback off, and the rollback suite and the suites whose
// behaviour depends on the setting with rollback on (the default users get).
// Under CI=true a sandbox test that would skip fails instead.
import { spawnSync } from "node:child_process";
import { chmodSync, copyFileSync, existsSync, mkdtempSync, readdirSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { packTest } from "./pack-test.mjs";
import { ensurePi1Host, PI1_TEST_FILES, runPi1Tests } from "./pi1-host.mjs";
import { isRoot, prepare, root, run } from "./prepare.mjs";

const UNPRIVILEGED = 65534; // nobody

function engineTestBinary() {
  const r = spawnSync("cargo", ["test", "--locked", "--test", "sandbox", "--no-run", "--message-format=json"], {
    cwd: root,
    encoding: "utf8",
    stdio: ["ignore", "pipe", "inherit"],
  });
  for (const line of r.stdout.split("\n")) {
    if (!line.startsWith("{")) continue;
    const msg = JSON.parse(line);
    if (msg.reason === "compiler-artifact" && msg.target?.name === "sandbox" && msg.executable) return msg.executable;
  }
  throw new Error("could not locate the engine test binary");
}

/** Run the engine's sandbox tests as an ordinary user, from a copy it can read. */
function engineTestsUnprivileged() {
  const dir = mkdtempSync(join(tmpdir(), "pps-unpriv-"));
  try {
    chmodSync(dir, 0o755);
    const bin = join(dir, "sandbox-tests");
    copyFileSync(engineTestBinary(), bin);
    chmodSync(bin, 0o755);
    console.log(`\n# engine sandbox tests as uid ${UNPRIVILEGED}`);
    run("setpriv", [`--reuid=${UNPRIVILEGED}`, `--regid=${UNPRIVILEGED}`, "--clear-groups", "--reset-env", bin, "--test-threads=2"], {
      cwd: dir,
      env: { PATH: "/usr/bin:/bin", CI: process.env.CI ?? "", TMPDIR: "/tmp" },
    });
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

/**
 * The pi end-to-end files again under pi 1.x on Node 22 (scripts/pi1-host.mjs), with rollback on
 * or off. The host is installed from the registry on first use; if that fails, the run is
 * skipped, except under CI.
 */
function pi1EndToEnd(rollback, files) {
  try {
    ensurePi1Host();
  } catch (err) {
    if (process.env.CI === "true") throw err;
    console.log(`\n# SKIP pi 1.x end-to-end tests: the pi 1.x host could not be installed (${err.message.split("\n")[0]})`);
    return;
  }
  runPi1Tests(files, { rollback });
}

const steps = [];
async function step(name, fn) {
  console.log(`\n# step: ${name}`);
  const started = Date.now();
  await fn();
  console.log(`# step done in ${((Date.now() - started) / 1000).toFixed(1)} s: ${name}`);
  steps.push(name);
}

try {
  prepare();
  await step("rustfmt and clippy", () => {
    run("cargo", ["fmt", "--check"]);
    run("cargo", ["clippy", "--locked", "--all-targets", "--features", "addon", "--", "-D", "warnings"]);
  });
  // js/ and __test__/ (tsconfig.json): nothing else checks types, since tsx, pi and Node's
  // type stripping all run the .ts files by erasing them.
  await step("TypeScript type check (tsc --noEmit)", () => {
    const tsc = join(root, "node_modules", "typescript", "bin", "tsc");
    if (!existsSync(tsc)) throw new Error("typescript is not installed: run `npm ci` (it is a devDependency)");
    run(process.execPath, [tsc, "--noEmit"]);
  });
  await step("cargo test (unit, engine, frame fuzz corpus)", () => run("cargo", ["test", "--locked"]));
  if (isRoot) await step("engine sandbox tests as an unprivileged user", engineTestsUnprivileged);
  const files = readdirSync(join(root, "__test__"))
    .filter((f) => f.endsWith(".test.ts"))
    .sort()
    .map((f) => join("__test__", f));
  // Node 20 cannot strip types and `node --test DIR` finds no .ts files:
  // the list is explicit.
  // Every suite but the rollback suite runs with rollback off (the spec's
  // recovery: kill, state lost, fresh interpreter). The rollback suite, and
  // the suites whose behaviour depends on the setting (lifecycle, faults,
  // containment, isolation, permissions, protocol, output, pi end-to-end, what results say), run again with rollback on, the default:
  // those assert the exact behaviour of the setting in force
  // (__test__/helpers/sandbox-env.ts). The rest (escapes, limits, output,
  // secrets, ...) either behave the same in both or set it per test.
  const rollbackSuite = join("__test__", "rollback.test.ts");
  const onDefault = [
    "lifecycle",
    "faults",
    "containment",
    "isolation",
    "permissions",
    "permissions-client",
    "protocol",
    "output",
    "extension",
    "rpc",
    "words",
    "words-results",
  ].map((name) => join("__test__", `${name}.test.ts`));
  const rollbackOff = { ...process.env, PI_PYTHON_TOOL_ROLLBACK: "0" };
  const rollbackOn = { ...process.env };
  delete rollbackOn.PI_PYTHON_TOOL_ROLLBACK;
  await step("addon, escape, fault and pi 0.73 suites (PI_PYTHON_TOOL_ROLLBACK=0)", () =>
    run(process.execPath, ["--import", "tsx", "--test", "--test-concurrency=1", ...files.filter((f) => f !== rollbackSuite)], {
      env: rollbackOff,
    }),
  );
  await step("rollback, lifecycle, fault, containment, isolation, permission, protocol, output and pi 0.73 end-to-end suites (rollback on, the default)", () =>
    run(process.execPath, ["--import", "tsx", "--test", "--test-concurrency=1", rollbackSuite, ...onDefault], {
      env: rollbackOn,
    }),
  );
  // Under pi 1.x every end-to-end file runs with rollback on, the default; with rollback off
  // only those whose behaviour depends on the setting (the same rule as under pi 0.73). The
  // rest set it per test where it matters (live grants, live mode, describe), or run no python
  // call whose outcome it changes (bash, network, rendering), and run with rollback off under
  // pi 0.73 above.
  const pi1SettingDependent = PI1_TEST_FILES.filter((f) => onDefault.includes(f));
  await step("pi 1.x suites (rollback on, the default)", () => pi1EndToEnd(true, PI1_TEST_FILES));
  await step(`pi 1.x setting-dependent suites (PI_PYTHON_TOOL_ROLLBACK=0): ${pi1SettingDependent.map((f) => f.replace(/^__test__\/|\.test\.ts$/g, "")).join(", ")}`, () =>
    pi1EndToEnd(false, pi1SettingDependent),
  );
  // The published shape: npm pack, install without Rust, load in pi (see scripts/pack-test.mjs).
  await step("packed install", packTest);
  console.log(`\n${steps.map((s) => `# ok: ${s}`).join("\n")}\nsummary: ${steps.length} passed, 0 failed`);
} catch (err) {
  console.error(err.message);
  console.log(`\nsummary: ${steps.length} passed, 1 failed`);
  process.exit(err.exitCode ?? 1);
}
