/**
 * The trusted configuration through the addon's `loadTrustedConfig`: what the bash tool's
 * JavaScript gets for a valid file, each kind of error (named by its key path, its part at the
 * most restrictive value, the rest applied), a missing file, a project's own file (ignored, with a
 * notice) and `PI_SANDBOX_BASH`.
 * Run: node --import tsx --test __test__/config.test.ts
 *
 * No sandbox is started: every test owns a temporary agent directory and project (removed in
 * t.after), and none needs bubblewrap, so none skips.
 */
import assert from "node:assert/strict";
import { mkdirSync, mkdtempSync, realpathSync, rmSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { type TestContext, test } from "node:test";
import type { TrustedConfig } from "../index.d.ts";

const addon = createRequire(import.meta.url)("../index.cjs") as {
  loadTrustedConfig(agentDir: string, projectDir: string): TrustedConfig;
};

const REL = "extensions/pi-python-sandbox/config.json";

/** What a broken part falls back to: nothing leaves the sandbox, nothing is added to it. */
const RESTRICTIVE = { bash: "sandbox", userBash: "sandbox", additionalAllowRead: [], envPassthrough: [] };
const DEFAULTS = { bash: "sandbox", userBash: "host", additionalAllowRead: [], envPassthrough: [] };

function dirs(t: TestContext, file?: string) {
  const base = realpathSync(mkdtempSync(join(tmpdir(), "pps-config-")));
  t.after(() => rmSync(base, { recursive: true, force: true }));
  const agent = join(base, "agent");
  const project = join(base, "project");
  mkdirSync(join(agent, dirname(REL)), { recursive: true });
  mkdirSync(project);
  if (file !== undefined) writeFileSync(join(agent, REL), file);
  const load = () => addon.loadTrustedConfig(agent, project);
  return { agent, project, load };
}

function values(c: TrustedConfig) {
  return { bash: c.bash, userBash: c.userBash, additionalAllowRead: c.additionalAllowRead, envPassthrough: c.envPassthrough };
}

// The tests read PI_SANDBOX_BASH from this process's environment: none of them inherits one.
delete process.env.PI_SANDBOX_BASH;

test("a valid file sets every key, normalised", (t) => {
  const { agent, load } = dirs(
    t,
    JSON.stringify({
      bash: "host",
      userBash: "sandbox",
      filesystem: { additionalAllowRead: ["/home/u/.nvm/", "/opt//tools/./bin"] },
      env: { passthrough: ["NPM_TOKEN"] },
    }),
  );
  const c = load();
  assert.deepEqual(c.errors, []);
  assert.deepEqual(values(c), {
    bash: "host",
    userBash: "sandbox",
    additionalAllowRead: ["/home/u/.nvm", "/opt/tools/bin"],
    envPassthrough: ["NPM_TOKEN"],
  });
  assert.equal(c.bashSource, "file");
  assert.equal(c.path, join(agent, REL));
  assert.equal(c.found, true);
});

test("a missing file gives the defaults and no error", (t) => {
  const { load } = dirs(t);
  const c = load();
  assert.deepEqual(values(c), DEFAULTS);
  assert.deepEqual([c.errors, c.notices, c.found, c.bashSource], [[], [], false, "default"]);
});

test("an unknown key is named, and its part falls back while the rest applies", (t) => {
  const { load } = dirs(t, JSON.stringify({ bash: "host", filesystem: { allowRead: ["/opt"] } }));
  const c = load();
  assert.deepEqual(c.errors, ["filesystem.allowRead: unknown key (the keys here are additionalAllowRead)"]);
  assert.deepEqual(values(c), { ...DEFAULTS, bash: "host" });
  // An unknown top-level key belongs to no part: every part is most restrictive.
  writeFileSync(join(dirname(c.path), "config.json"), JSON.stringify({ bash: "host", userbash: "sandbox" }));
  const top = load();
  assert.deepEqual(top.errors, ["userbash: unknown key (the keys here are bash, userBash, filesystem, env, network)"]);
  assert.deepEqual(values(top), RESTRICTIVE);
});

test("a wrong type is named by its key path, and its part falls back", (t) => {
  const { load } = dirs(t, JSON.stringify({ userBash: true, env: { passthrough: ["NPM_TOKEN"] } }));
  const c = load();
  assert.deepEqual(c.errors, ["userBash: expected a string, found a boolean"]);
  assert.deepEqual(values(c), { ...DEFAULTS, userBash: "sandbox", envPassthrough: ["NPM_TOKEN"] });
});

test("a relative read path is named with its index, and no extra path is read", (t) => {
  const { load } = dirs(t, JSON.stringify({ bash: "host", filesystem: { additionalAllowRead: ["/opt/a", "/opt/b", "rel/c"] } }));
  const c = load();
  assert.deepEqual(c.errors, [
    "filesystem.additionalAllowRead[2]: `rel/c` is not an absolute path (write it from `/`; `~` is not expanded)",
  ]);
  assert.deepEqual(values(c), { ...DEFAULTS, bash: "host" });
});

test("a bad or refused environment name is named with why, and nothing is passed", (t) => {
  const { load } = dirs(t, JSON.stringify({ env: { passthrough: ["NPM_TOKEN", "A-B"] } }));
  const bad = load();
  assert.deepEqual(bad.errors, [
    "env.passthrough[1]: `A-B` is not an environment variable name (letters, digits and `_`, not starting with a digit)",
  ]);
  assert.deepEqual(bad.envPassthrough, []);
  writeFileSync(bad.path, JSON.stringify({ env: { passthrough: ["LD_PRELOAD"] } }));
  const refused = load();
  assert.match(refused.errors[0] ?? "", /^env\.passthrough\[0\]: `LD_PRELOAD` is never passed: it changes what the dynamic loader loads/);
  assert.deepEqual(refused.envPassthrough, []);
});

test("a file that is not JSON makes every part most restrictive and says so", (t) => {
  const { load } = dirs(t, '{ "bash": "host", }');
  const c = load();
  assert.equal(c.errors.length, 1);
  assert.match(c.errors[0] ?? "", /^not valid JSON: trailing comma at line 1 column 19$/);
  assert.deepEqual(values(c), RESTRICTIVE);
  assert.equal(c.bashSource, "fallback");
});

test("a project's own file is ignored, with a notice", (t) => {
  const { project, load } = dirs(t);
  const own = join(project, ".pi", REL);
  mkdirSync(dirname(own), { recursive: true });
  writeFileSync(own, JSON.stringify({ bash: "host", env: { passthrough: ["AWS_SECRET_ACCESS_KEY"] } }));
  const nested = join(project, "vendor/thing/pi-python-sandbox/config.json");
  mkdirSync(dirname(nested), { recursive: true });
  writeFileSync(nested, JSON.stringify({ filesystem: { additionalAllowRead: ["/home"] } }));
  const c = load();
  assert.deepEqual(values(c), DEFAULTS);
  assert.deepEqual(c.errors, []);
  assert.equal(c.notices.length, 1);
  assert.match(c.notices[0] ?? "", /^ignored the project's files \.pi\/extensions\/pi-python-sandbox\/config\.json, vendor\/thing\/pi-python-sandbox\/config\.json: /);
  assert.ok(c.notices[0]?.includes(c.path), c.notices[0]);
});

test("PI_SANDBOX_BASH wins over the file, and a bad value keeps bash sandboxed", (t) => {
  const { load } = dirs(t, JSON.stringify({ bash: "host" }));
  t.after(() => delete process.env.PI_SANDBOX_BASH);
  process.env.PI_SANDBOX_BASH = "1";
  assert.deepEqual([load().bash, load().bashSource], ["sandbox", "environment"]);
  process.env.PI_SANDBOX_BASH = "0";
  assert.deepEqual([load().bash, load().bashSource], ["host", "environment"]);
  process.env.PI_SANDBOX_BASH = "perhaps";
  const bad = load();
  assert.deepEqual([bad.bash, bad.bashSource], ["sandbox", "fallback"]);
  assert.match(bad.errors[0] ?? "", /^PI_SANDBOX_BASH="perhaps" is not /);
});
