/**
 * The `unavailable` message names the fix that fits how the package was installed (a checkout,
 * pi's npm project, pi's git clone, a plain npm install), judged from where the package is.
 * Run: node --import tsx --test __test__/install.test.ts
 */
import assert from "node:assert/strict";
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";
import { installFix, installKind } from "../js/addon.ts";

const PKG = "pi-python-sandbox-linux-x64-gnu";

function tree(t: { after(fn: () => void): void }, files: string[]): string {
  const base = mkdtempSync(join(tmpdir(), "pps-install-"));
  t.after(() => rmSync(base, { recursive: true, force: true }));
  for (const f of files) {
    mkdirSync(join(base, f, ".."), { recursive: true });
    writeFileSync(join(base, f), "{}");
  }
  return base;
}

test("a checkout is told to build the addon in place", (t) => {
  const base = tree(t, ["repo/Cargo.toml", "repo/package.json"]);
  const dir = join(base, "repo");
  assert.equal(installKind(dir), "checkout");
  assert.match(installFix("checkout", PKG, dir), /build the addon in this checkout .*npm ci && npm run build/);
});

test("pi's npm project is told to install again, and where overrides go for a tarball", (t) => {
  const base = tree(t, ["agent/npm/package.json", "agent/npm/node_modules/pi-python-sandbox/package.json"]);
  const dir = join(base, "agent", "npm", "node_modules", "pi-python-sandbox");
  assert.equal(installKind(dir), "pi-npm");
  const fix = installFix("pi-npm", PKG, dir);
  assert.match(fix, /run `pi install npm:pi-python-sandbox` again/);
  assert.ok(fix.includes(join(base, "agent", "npm", "package.json")), fix);
  assert.ok(fix.includes(`"overrides": { "${PKG}"`), fix);
});

test("pi's git clone is told to build, since only the npm install brings the prebuilt addon", (t) => {
  const base = tree(t, [".pi/agent/git/github.com/o/pi-python-sandbox/Cargo.toml"]);
  const dir = join(base, ".pi", "agent", "git", "github.com", "o", "pi-python-sandbox");
  assert.equal(installKind(dir), "pi-git");
  assert.match(installFix("pi-git", PKG, dir), /build the addon in pi's clone/);
});

test("a plain npm install is told not to skip optional dependencies", (t) => {
  const base = tree(t, ["prefix/node_modules/pi-python-sandbox/package.json"]);
  const dir = join(base, "prefix", "node_modules", "pi-python-sandbox");
  assert.equal(installKind(dir), "npm");
  assert.match(installFix("npm", PKG, dir), /not --omit=optional/);
});

test("the lock's packages all admit Node 20.19 (no EBADENGINE from npm ci or npm run demo on Node 20)", async () => {
  const { createRequire } = await import("node:module");
  const require = createRequire(import.meta.url);
  const semver = require("semver") as { satisfies(v: string, range: string): boolean };
  const lock = require("../package-lock.json") as { packages: Record<string, { engines?: { node?: string }; os?: string[]; cpu?: string[]; libc?: string[] }> };
  const installed = (p: { os?: string[]; cpu?: string[]; libc?: string[] }) =>
    (!p.os || p.os.includes("linux")) && (!p.cpu || p.cpu.includes("x64")) && (!p.libc || p.libc.includes("glibc"));
  const versions = ["20.19.0", ...(process.versions.node.startsWith("20.") ? [process.versions.node] : [])];
  for (const v of versions) {
    const refused = Object.entries(lock.packages)
      .filter(([name, p]) => name && installed(p) && p.engines?.node && !semver.satisfies(v, p.engines.node))
      .map(([name, p]) => `${name} (${p.engines!.node})`);
    assert.deepEqual(refused, [], `Node ${v}: pin these in package.json's overrides`);
  }
  // The pins that make it so: @napi-rs/cli's dependencies would otherwise ask for Node 22.
  const pkg = require("../package.json") as { overrides?: Record<string, string> };
  assert.deepEqual(pkg.overrides, { "content-type": "2.1.0", "@napi-rs/lzma": "1.4.5" });
});
