/**
 * Secret masks and agent instructions, from inside the sandbox. The project holds `.env`,
 * `sub/.env.production`, `deploy/key.pem`, `.env.example` and `AGENTS.md`; every attempt to get a
 * secret's content is one named test, and each runs first with masking off
 * (`PI_PYTHON_TOOL_SECRETS=''`), which shows that the attempt reads the secret without the
 * defence, then with the default patterns, where no result holds it.
 * Run: PI_PYTHON_TOOL_ROLLBACK=0 node --import tsx --test __test__/secrets.test.ts
 */
import assert from "node:assert/strict";
import { existsSync, lstatSync, mkdtempSync, readdirSync, readFileSync, readlinkSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { link, mkdir, mkdtemp, rename, rm, symlink, writeFile } from "node:fs/promises";
import { dirname, join } from "node:path";
import { describe, type TestContext, test } from "node:test";
import { skipWithoutSandbox } from "./helpers/sandbox-env.ts";
import { type ExecResult, type Fixture, hostPidsWithCmdline, jsonOut, lit, makeFixture, makeFixtureWithoutSpare, type PythonSandbox, py, show, sleep, waitUntil } from "./helpers/sandbox-fixture.ts";

const SECRETS: Record<string, string> = {
  ".env": "TOKEN=root-secret-4f1c\n",
  "sub/.env.production": "TOKEN=prod-secret-9a2e\n",
  "deploy/key.pem": "-----BEGIN PRIVATE KEY-----pem-secret-77d0\n",
};
const PLAIN: Record<string, string> = {
  ".env.example": "TOKEN=example-value\n",
  "AGENTS.md": "original agent instructions\n",
};
const MARKERS = /root-secret-4f1c|prod-secret-9a2e|pem-secret-77d0/;

async function put(project: string, files: Record<string, string>): Promise<void> {
  for (const [p, content] of Object.entries(files)) {
    await mkdir(join(project, p, ".."), { recursive: true });
    await writeFile(join(project, p), content);
  }
}

/** Run `fn` with the environment variables `env` set (undefined: unset), then restore them.
 * The settings are read at each sandbox start, so `fn` must start its sandbox. */
async function withEnv<T>(env: Record<string, string | undefined>, fn: () => Promise<T>): Promise<T> {
  const saved = Object.fromEntries(Object.keys(env).map((k) => [k, process.env[k]]));
  for (const [k, v] of Object.entries(env)) {
    if (v === undefined) delete process.env[k];
    else process.env[k] = v;
  }
  try {
    return await fn();
  } finally {
    for (const [k, v] of Object.entries(saved)) {
      if (v === undefined) delete process.env[k];
      else process.env[k] = v;
    }
  }
}

async function project(t: TestContext): Promise<Fixture> {
  const fx = await makeFixtureWithoutSpare(t);
  await put(fx.project, { ...SECRETS, ...PLAIN });
  return fx;
}

/** Everything a result carries that the model could see. */
const seen = (r: ExecResult) => JSON.stringify({ ...r, images: undefined });

/** Run `code` in a sandbox with masking off, then in one with the default masks, each over a
 * fresh project (what the baseline run leaves, a hard link for one, must not help the other). */
async function both(t: TestContext, code: string, mode?: string): Promise<{ off: ExecResult; on: ExecResult }> {
  const run = async (secrets: string | undefined) => {
    const fx = await project(t);
    const sb = fx.open();
    if (mode) sb.applyModeEvent({ mode, readRoots: [] });
    const r = await withEnv({ PI_PYTHON_TOOL_SECRETS: secrets }, () => sb.execute(code));
    await sb.dispose();
    if (secrets === undefined) {
      for (const [p, content] of Object.entries(SECRETS)) {
        assert.equal(readFileSync(join(fx.project, p), "utf8"), content, `${p} changed on the host`);
      }
    }
    return r;
  };
  return { off: await run(""), on: await run(undefined) };
}

/** Asserts the baseline read a secret and the masked run read none. */
function assertHidden({ off, on }: { off: ExecResult; on: ExecResult }): void {
  assert.match(seen(off), MARKERS, `without masks the attempt should read a secret: ${show(off)}`);
  assert.doesNotMatch(seen(on), MARKERS, `a secret reached the result: ${show(on)}`);
}

/** A subprocess without the worker's read hook: what the kernel lets it read. */
const sub = (body: string) => py`
  import json, subprocess, sys
  r = subprocess.run([sys.executable, "-I", "-S", "-c", ${lit(body)}], capture_output=True, text=True)
  print(json.dumps({"out": r.stdout, "err": r.stderr[-300:]}))
`;

describe("secrets in the project are hidden from the sandbox", () => {
  test("open() of each secret is refused as a secret read", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const r = await both(t, py`
      import json
      out = {}
      for p in ${JSON.stringify(Object.keys(SECRETS))}:
          try:
              out[p] = open("/workspace/" + p).read()
          except Exception as e:
              out[p] = type(e).__name__
      print(json.dumps(out))
    `);
    assertHidden(r);
    assert.deepEqual(jsonOut(r.on), Object.fromEntries(Object.keys(SECRETS).map((p) => [p, "SandboxReadDenied"])));
  });

  test("os.listdir of a secret's directory lists its name; its content is empty", async (t) => {
    if (skipWithoutSandbox(t)) return;
    // Documented: the names stay listed (a mask is mounted over each), only the content is gone.
    const r = await both(t, py`
      import json, os
      print(json.dumps({"ls": sorted(os.listdir("/workspace/deploy")), "size": os.stat("/workspace/deploy/key.pem").st_size,
                        "root": sorted(os.listdir("/workspace"))}))
    `);
    const on = jsonOut(r.on);
    assert.deepEqual(on.ls, ["key.pem"]);
    assert.equal(on.size, 0);
    assert.deepEqual(on.root, [".env", ".env.example", "AGENTS.md", "data.txt", "deploy", "sub"]);
    assert.ok(jsonOut(r.off).size > 0, "without masks the file has its size");
  });

  test("a subprocess cat of each secret reads nothing", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const r = await both(t, py`
      import json, subprocess
      paths = ["/workspace/" + p for p in ${JSON.stringify(Object.keys(SECRETS))}]
      c = subprocess.run(["cat", *paths], capture_output=True, text=True)
      print(json.dumps({"out": c.stdout, "rc": c.returncode}))
    `);
    assertHidden(r);
    assert.deepEqual(jsonOut(r.on), { out: "", rc: 0 });
  });

  test("reading through /proc/self/root finds the mask", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const r = await both(t, py`
      import json, subprocess
      try:
          hooked = open("/proc/self/root/workspace/.env").read()
      except Exception as e:
          hooked = type(e).__name__
      c = subprocess.run(["cat", "/proc/self/root/workspace/.env", "/proc/1/root/workspace/deploy/key.pem"], capture_output=True, text=True)
      print(json.dumps({"hooked": hooked, "cat": c.stdout}))
    `);
    assertHidden(r);
    assert.equal(jsonOut(r.on).hooked, "SandboxReadDenied");
  });

  test("a symlink made in /scratch to /workspace/.env reads the mask", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const r = await both(t, py`
      import json, os, subprocess
      if not os.path.islink("/scratch/env-link"):
          os.symlink("/workspace/.env", "/scratch/env-link")
      try:
          hooked = open("/scratch/env-link").read()
      except Exception as e:
          hooked = type(e).__name__
      c = subprocess.run(["cat", "/scratch/env-link"], capture_output=True, text=True)
      print(json.dumps({"hooked": hooked, "cat": c.stdout}))
    `);
    assertHidden(r);
    assert.equal(jsonOut(r.on).hooked, "SandboxReadDenied");
  });

  test("a hard link to a secret cannot be made in a writable mode", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const r = await both(t, py`
      import json, os, subprocess
      made = {}
      for dst in ["/workspace/env-hard", "/scratch/env-hard", "/workspace/sub/prod-hard"]:
          src = "/workspace/sub/.env.production" if "prod" in dst else "/workspace/.env"
          try:
              os.link(src, dst)
              made[dst] = "linked"
          except OSError as e:
              made[dst] = e.errno
      c = subprocess.run(["cat"] + [d for d, v in made.items() if v == "linked"], capture_output=True, text=True)
      print(json.dumps({"made": made, "cat": c.stdout}))
    `, "yolo");
    assertHidden(r);
    assert.equal(jsonOut(r.off).made["/workspace/env-hard"], "linked", "without masks the link is made");
  });

  test("os.open with O_PATH, then a reopen through /proc/self/fd, reads nothing", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const r = await both(t, sub(`
import os
fd = os.open("/workspace/.env", os.O_PATH)
print(open("/proc/self/fd/%d" % fd).read(), end="")
d = os.open("/workspace/deploy", os.O_PATH | os.O_DIRECTORY)
print(open(os.open("key.pem", os.O_RDONLY, dir_fd=d)).read(), end="")
`));
    assertHidden(r);
    assert.equal(jsonOut(r.on).out, "", show(r.on));
  });

  test("mmap of a secret maps nothing", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const r = await both(t, sub(`
import mmap, os
for p in ["/workspace/.env", "/workspace/sub/.env.production"]:
    fd = os.open(p, os.O_RDONLY)
    try:
        print(mmap.mmap(fd, 0, prot=mmap.PROT_READ)[:].decode(), end="")
    except ValueError as e:
        print("ValueError", end=";")
`));
    assertHidden(r);
    assert.equal(jsonOut(r.on).out, "ValueError;ValueError;", "an empty file cannot be mapped");
  });

  test("a secret named in another case (.ENV, SERVER.PEM, ID_RSA, Secrets/) is masked; .ENV.EXAMPLE reads", async (t) => {
    if (skipWithoutSandbox(t)) return;
    // Key files exported on other systems often carry upper-case names or extensions; a project
    // copied from a case-insensitive file system holds `.ENV` where tools read `.env`.
    const upper: Record<string, string> = {
      ".ENV": "TOKEN=upper-secret-51ac\n",
      "deploy/SERVER.PEM": "-----BEGIN PRIVATE KEY-----upper-secret-62bd\n",
      "ID_RSA": "-----BEGIN OPENSSH PRIVATE KEY-----upper-secret-73ce\n",
      "Secrets/token.txt": "TOKEN=upper-secret-84df\n",
      ".ENV.EXAMPLE": "TOKEN=example-upper\n",
    };
    const code = py`
      import json, subprocess
      c = subprocess.run(["cat", *${JSON.stringify(Object.keys(upper).map((p) => `/workspace/${p}`))}], capture_output=True, text=True)
      print(json.dumps({"out": c.stdout, "rc": c.returncode}))
    `;
    const run = async (secrets: string | undefined) => {
      const fx = await makeFixtureWithoutSpare(t);
      await put(fx.project, upper);
      return withEnv({ PI_PYTHON_TOOL_SECRETS: secrets }, () => fx.open().execute(code));
    };
    const off = await run("");
    assert.match(jsonOut(off).out, /upper-secret-51ac[^]*upper-secret-62bd[^]*upper-secret-73ce[^]*upper-secret-84df/, `baseline: ${show(off)}`);
    const on = await run(undefined);
    assert.doesNotMatch(seen(on), /upper-secret/, `a secret reached the result: ${show(on)}`);
    // The masked directory is empty, so cat fails on Secrets/token.txt alone.
    assert.deepEqual(jsonOut(on), { out: "TOKEN=example-upper\n", rc: 1 }, "the example stays readable");
  });

  test(".env.example and other files read normally", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const fx = await project(t);
    const out = jsonOut(await fx.sb.execute(py`
      import json
      print(json.dumps({p: open("/workspace/" + p).read() for p in [".env.example", "AGENTS.md", "data.txt"]}))
    `));
    assert.deepEqual(out, { ...PLAIN, "data.txt": "fixture-content\n" });
  });

  test("the read of .env is permission_needed naming /workspace/.env as a secret", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const fx = await project(t);
    const r = await fx.sb.execute("open('.env').read()");
    assert.equal(r.status, "permission_needed", show(r));
    assert.equal(r.permissionPath, "/workspace/.env");
    assert.equal(r.permissionSecret, true);
    assert.match(r.text, /The code tried to read \/workspace\/\.env, which looks like a secret/);
    // Nobody to ask (no permission extension has spoken): refused at once, with how to allow it.
    const verdict = fx.sb.readDecision("/workspace/.env", true);
    assert.equal(verdict.prompt, false);
    assert.match(verdict.diagnostic ?? "", /looks like a secret .* no permission extension/);
    assert.match(verdict.diagnostic ?? "", /PI_SANDBOX_SECRETS/);
    assert.ok(verdict.diagnostic?.includes(fx.project), verdict.diagnostic ?? "");
    // A read outside the mounts keeps its own wording.
    const outside = await fx.sb.execute("open('/etc/hostname').read()");
    assert.equal(outside.permissionSecret, false);
    assert.match(outside.text, /outside the sandbox mounts/);
    // status lists what is masked.
    const s = fx.sb.status();
    assert.deepEqual(s.maskedPaths, ["/workspace/.env", "/workspace/deploy/key.pem", "/workspace/sub/.env.production"]);
    assert.equal(s.secretScanComplete, true);
    assert.match(s.text, /secret masks \(every mode, shown empty\): \/workspace\/\.env, /);
  });

  test("secrets inside dependency trees are not masked (the documented rule)", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const fx = await project(t);
    await put(fx.project, { "node_modules/pkg/test/fixture.pem": "dependency test key\n" });
    const r = await fx.sb.execute("open('/workspace/node_modules/pkg/test/fixture.pem').read()");
    assert.equal(r.repr, "'dependency test key\\n'", show(r));
  });

  test("a link named like a secret masks its target in the project", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const fx = await makeFixtureWithoutSpare(t);
    await put(fx.project, { "config/production-vars": "TOKEN=root-secret-4f1c\n" });
    await symlink("config/production-vars", join(fx.project, ".env"));
    const r = await fx.sb.execute(py`
      import json, subprocess
      c = subprocess.run(["cat", "/workspace/.env", "/workspace/config/production-vars"], capture_output=True, text=True)
      print(json.dumps(c.stdout))
    `);
    assert.equal(jsonOut(r), "", show(r));
  });
});

describe("masked and protected files cannot be written", () => {
  const targets = [".env", "sub/.env.production", "deploy/key.pem", "AGENTS.md", "sub/CLAUDE.md", ".agents/rules.md",
    "skills/deploy/SKILL.md", ".pi/settings.json"];
  const writeAll = py`
    import json, os
    out = {}
    for p in ${JSON.stringify(targets)}:
        try:
            with open("/workspace/" + p, "w") as f:
                f.write("pwned\n")
            out[p] = "written"
        except OSError as e:
            out[p] = e.errno
    for p in [".env", "AGENTS.md"]:
        try:
            os.rename("/workspace/" + p, "/workspace/" + p + ".moved")
            out["mv " + p] = "moved"
        except OSError as e:
            out["mv " + p] = e.errno
    print(json.dumps(out))
  `;

  async function fixture(t: TestContext): Promise<Fixture> {
    const fx = await project(t);
    await put(fx.project, {
      "sub/CLAUDE.md": "original claude\n", ".agents/rules.md": "original rules\n",
      "skills/deploy/SKILL.md": "original skill\n", ".pi/settings.json": "{}\n",
    });
    return fx;
  }

  const original = (fx: Fixture) =>
    Object.fromEntries(targets.map((p) => [p, existsSync(join(fx.project, p)) ? readFileSync(join(fx.project, p), "utf8") : null]));

  test("writes to each masked or agent-instruction file fail in yolo mode; the host files are unchanged", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const fx = await fixture(t);
    const before = original(fx);
    fx.sb.applyModeEvent({ mode: "yolo" });
    const out = jsonOut(await fx.sb.execute(writeAll));
    for (const p of targets) assert.equal(out[p], 30, `${p}: ${out[p]} (EROFS expected)`);
    assert.equal(out["mv .env"], 16, "a mask is a mount point (EBUSY)");
    assert.equal(out["mv AGENTS.md"], 16, "a protected file is a mount point (EBUSY)");
    assert.deepEqual(original(fx), before);
  });

  test("baseline: with masks and protection off the same writes succeed", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const fx = await fixture(t);
    fx.sb.applyModeEvent({ mode: "yolo" });
    const out = await withEnv({ PI_PYTHON_TOOL_SECRETS: "", PI_PYTHON_TOOL_PROTECTED: "" }, async () =>
      jsonOut(await fx.sb.execute(writeAll)));
    for (const p of targets) assert.equal(out[p], "written", `${p}: ${out[p]}`);
  });

  test("an agent-instruction file created later is made inert, never deleted", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const fx = await fixture(t);
    fx.sb.applyModeEvent({ mode: "yolo" });
    const r = await fx.sb.execute(py`
      import os
      os.makedirs("/workspace/lib/skills/evil", exist_ok=True)
      open("/workspace/lib/skills/evil/SKILL.md", "w").write("planted skill\n")
      open("/workspace/lib/AGENTS.md", "w").write("planted instructions\n")
      os.makedirs("/workspace/docs/skills", exist_ok=True)
      open("/workspace/docs/skills/notes.txt", "w").write("not a skill\n")
      None
    `);
    assert.equal(r.status, "ok", show(r));
    // Found by the check at the end of the execution or by the background walk (every 2 s);
    // the note reaches the result after the repair.
    assert.ok(await waitUntil(() => existsSync(join(fx.project, "lib/AGENTS.md.pi-inert")) && existsSync(join(fx.project, "lib/skills.pi-inert")), 8000));
    const notes = r.text + (await fx.sb.execute("None")).text;
    assert.match(notes, /lib\/AGENTS\.md appeared in the project/);
    assert.match(notes, /lib\/skills appeared in the project/);
    assert.equal(existsSync(join(fx.project, "lib/AGENTS.md")), false);
    assert.equal(readFileSync(join(fx.project, "lib/AGENTS.md.pi-inert"), "utf8"), "planted instructions\n");
    assert.equal(existsSync(join(fx.project, "lib/skills")), false, "a skills directory with */SKILL.md is made inert");
    assert.ok(readdirSync(join(fx.project, "lib")).includes("skills.pi-inert"));
    assert.equal(readFileSync(join(fx.project, "docs/skills/notes.txt"), "utf8"), "not a skill\n", "other skills/ stay");
  });
});

describe("the scan's bound and the unmask set", () => {
  test("a scan over its bound masks what it found and says so in status and the first result", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const fx = await project(t);
    await put(fx.project, Object.fromEntries(Array.from({ length: 40 }, (_, i) => [`zz/f${i}.txt`, "x\n"])));
    await put(fx.project, { "zz/deeper/.env": "TOKEN=never-scanned\n" });
    // The root has 6 entries, sub/ and deploy/ one each: the bound is reached inside zz/.
    const r = await withEnv({ PI_PYTHON_TOOL_SCAN_ENTRIES: "20" }, () => fx.sb.execute(py`
      import subprocess
      subprocess.run(["cat", "/workspace/.env", "/workspace/deploy/key.pem", "/workspace/sub/.env.production"], capture_output=True, text=True).stdout
    `));
    assert.equal(r.repr, "''", show(r));
    assert.match(r.text, /The secret scan was incomplete: it stopped after 20 entries/);
    assert.match(r.text, /Raise PI_SANDBOX_SCAN_ENTRIES/);
    const s = fx.sb.status();
    assert.equal(s.secretScanComplete, false);
    assert.match(s.text, /secret scan was incomplete: it stopped after 20 entries/);
    assert.deepEqual(s.maskedPaths, ["/workspace/.env", "/workspace/deploy/key.pem", "/workspace/sub/.env.production"]);
    const later = await fx.sb.execute("1");
    assert.doesNotMatch(later.text, /incomplete/, "only the first result of a sandbox says it");
  });

  test("a granted root inside the project unmasks the secrets under it; one file unmasks exactly that file", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const fx = await project(t);
    const read = py`
      import json, subprocess
      paths = ["/workspace/" + p for p in ${JSON.stringify(Object.keys(SECRETS))}]
      print(json.dumps({p: subprocess.run(["cat", p], capture_output=True, text=True).stdout for p in paths}))
    `;
    const hidden = jsonOut(await fx.sb.execute(read));
    assert.deepEqual(Object.values(hidden), ["", "", ""]);
    const change = fx.sb.applyModeEvent({ mode: "manual", readRoots: [join(fx.project, "sub")] });
    assert.equal(change.changed, true);
    assert.match(change.notification ?? "", /secrets no longer masked at or under: .*\/sub/);
    const sub = jsonOut(await fx.sb.execute(read));
    assert.deepEqual(sub, { "/workspace/.env": "", "/workspace/sub/.env.production": SECRETS["sub/.env.production"], "/workspace/deploy/key.pem": "" });
    assert.deepEqual(fx.sb.status().maskedPaths, ["/workspace/.env", "/workspace/deploy/key.pem"]);
    fx.sb.applyModeEvent({ mode: "manual", readRoots: [join(fx.project, ".env")] });
    const one = jsonOut(await fx.sb.execute(read));
    assert.deepEqual(one, { "/workspace/.env": SECRETS[".env"], "/workspace/sub/.env.production": "", "/workspace/deploy/key.pem": "" });
    // A root inside the project that covers no secret is still skipped.
    const docs = fx.sb.applyModeEvent({ mode: "manual", readRoots: [join(fx.project, "deploy"), join(fx.project, "sub", "..", "AGENTS.md")] });
    assert.deepEqual(docs.skipped.map((s) => s.reason), ["inside the project, already readable under /workspace"]);
  });
});

describe("what a writable sandbox or a wide grant cannot do to the masks", () => {
  for (const remembered of [false, true]) {
    test(`junk that pushes secrets past the scan's bound ${remembered ? "does not unmask what an earlier start found" : "(baseline: a first start on such a project misses them)"}`, async (t) => {
      if (skipWithoutSandbox(t)) return;
      const fx = await project(t);
      const junk = py`
        import os
        for i in range(60):
            open(f"/workspace/junk{i:03}", "w").close()
      `;
      // The claim is about a new start: with rollback on, a reset keeps the sandbox (and the scan
      // its start made), so the reset here is the spec's, which starts a new sandbox.
      await withEnv({ PI_PYTHON_TOOL_SCAN_ENTRIES: "40", PI_PYTHON_TOOL_ROLLBACK: "0" }, async () => {
        if (!remembered) {
          // A project that is this big from the start: the walk never reaches sub/.
          for (let i = 0; i < 60; i++) await writeFile(join(fx.project, `junk${i}`), "");
          const r = await fx.sb.execute("print(open('/workspace/sub/.env.production').read())");
          assert.match(seen(r), /prod-secret-9a2e/, "baseline: past the bound, unmasked (the README says so)");
          return;
        }
        fx.sb.applyModeEvent({ mode: "yolo", readRoots: [] });
        const first = await fx.sb.execute(`${junk}\nimport subprocess\nprint(subprocess.run(["cat", "/workspace/sub/.env.production"], capture_output=True, text=True).stdout)`);
        assert.doesNotMatch(seen(first), MARKERS, show(first));
        await fx.sb.reset();
        const r = await fx.sb.execute(py`
          import subprocess
          print(subprocess.run(["cat", "/workspace/sub/.env.production", "/workspace/.env"], capture_output=True, text=True).stdout)
        `);
        assert.doesNotMatch(seen(r), MARKERS, `a secret the first start masked leaked: ${show(r)}`);
        assert.match(r.text, /incomplete/);
      });
    });
  }

  test("a granted read root that contains the project masks the project's secrets at their host path", async (t) => {
    if (skipWithoutSandbox(t)) return;
    // Not under /tmp (a reserved mount): the root must be mountable.
    const base = await mkdtemp("/var/tmp/pps-secret-wide-");
    t.after(() => rm(base, { recursive: true, force: true }));
    const proj = join(base, "proj");
    await mkdir(proj);
    await put(proj, { ...SECRETS, ...PLAIN });
    const { PythonSandbox } = await import("../index.cjs");
    const host = (p: string) => join(proj, p);
    const code = py`
      import subprocess
      print(subprocess.run(["cat", ${lit(host(".env"))}, ${lit(host("deploy/key.pem"))}, ${lit(host(".env.example"))}], capture_output=True, text=True).stdout)
    `;
    for (const secrets of ["", undefined]) {
      const sb = new PythonSandbox({ projectDir: proj, prewarm: false });
      t.after(() => sb.dispose());
      sb.applyModeEvent({ mode: "manual", readRoots: [base] });
      const r: ExecResult = await withEnv({ PI_PYTHON_TOOL_SECRETS: secrets }, () => sb.execute(code));
      assert.match(r.text, /example-value/, "the root shows the project");
      if (secrets === "") assert.match(seen(r), /root-secret-4f1c/, "baseline: without masks the host path reads it");
      else assert.doesNotMatch(seen(r), MARKERS, show(r));
      await sb.dispose();
    }
  });

  test("no spare sandbox is prepared while one that can write the project runs", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const fx = await makeFixture(t, { prewarm: true });
    assert.equal((await fx.sb.execute("1")).status, "ok");
    for (let i = 0; i < 50 && fx.sb.status().spare !== "ready"; i++) await new Promise((r) => setTimeout(r, 100));
    assert.equal(fx.sb.status().spare, "ready", "baseline: read-only, a spare is made");
    fx.sb.applyModeEvent({ mode: "yolo", readRoots: [] });
    assert.equal((await fx.sb.execute("1")).status, "ok");
    await new Promise((r) => setTimeout(r, 1500));
    assert.equal(fx.sb.status().spare, "none");
  });
});

/**
 * Secrets that appear after the sandbox started. Each attempt runs first with masking off (the
 * baseline: the new file reads in full) and then with the default patterns, in each mode where it
 * applies. The guarantee: a secret-named entry (or a new name of a masked file) that appears in
 * the project stops the sandbox the moment inotify reports it, and no execution runs in a sandbox
 * planned before it: the next one masks it.
 */
describe("secrets that appear after the sandbox started", () => {
  const LATE = "TOKEN=late-secret-3b8e\n";
  const catAll = (paths: string[]) => py`
    import json, subprocess
    c = subprocess.run(["cat", *${JSON.stringify(paths.map((p) => `/workspace/${p}`))}], capture_output=True, text=True)
    print(json.dumps({"out": c.stdout}))
  `;
  /** One fixture with `secrets` as the setting, in `mode` (none: read-only default). */
  async function late(t: TestContext, secrets: string | undefined, mode: string | undefined, rollback = false) {
    const fx = await makeFixtureWithoutSpare(t, { rollback });
    await put(fx.project, { ...SECRETS, ...PLAIN });
    const sb = fx.open();
    if (mode) sb.applyModeEvent({ mode, readRoots: [] });
    const exec = (code: string) => withEnv({ PI_PYTHON_TOOL_SECRETS: secrets }, () => sb.execute(code));
    assert.equal((await exec("1")).status, "ok");
    return { fx, sb, exec };
  }

  for (const mode of [undefined, "edits", "yolo"]) {
    const name = mode ?? "read-only";
    test(`${name}: a .env.local the host makes after the start cannot be read by the next execution`, async (t) => {
      if (skipWithoutSandbox(t)) return;
      for (const secrets of ["", undefined]) {
        const { fx, sb, exec } = await late(t, secrets, mode);
        await writeFile(join(fx.project, ".env.local"), LATE);
        const r = await exec(catAll([".env.local"]));
        if (secrets === "") {
          assert.match(seen(r), /late-secret-3b8e/, `baseline: without masks it reads: ${show(r)}`);
        } else {
          assert.doesNotMatch(seen(r), /late-secret-3b8e/, show(r));
          assert.equal(jsonOut(r).out, "");
          assert.match(r.stateLostReason ?? "", /\.env\.local/, "the restart says why");
        }
        await sb.dispose();
      }
    });

    test(`${name}: a secrets/ directory the host makes after the start is masked whole`, async (t) => {
      if (skipWithoutSandbox(t)) return;
      for (const secrets of ["", undefined]) {
        const { fx, sb, exec } = await late(t, secrets, mode);
        // A plain directory first (watched as it appears), then the secret in it.
        await mkdir(join(fx.project, "config/secrets"), { recursive: true });
        await writeFile(join(fx.project, "config/secrets/token.txt"), LATE);
        const r = await exec(catAll(["config/secrets/token.txt"]));
        if (secrets === "") assert.match(seen(r), /late-secret-3b8e/, `baseline: ${show(r)}`);
        else assert.doesNotMatch(seen(r), /late-secret-3b8e|TOKEN/, show(r));
        await sb.dispose();
      }
    });
  }

  test("yolo: a secret named like a protected file (.npmrc), made inert by the guard, stays masked under its inert name", async (t) => {
    if (skipWithoutSandbox(t)) return;
    for (const secrets of ["", undefined]) {
      const { fx, sb, exec } = await late(t, secrets, "yolo");
      await writeFile(join(fx.project, ".npmrc"), LATE);
      // The guard renames the new protected name; the secret watch sees the new name.
      assert.ok(await waitUntil(() => existsSync(join(fx.project, ".npmrc.pi-inert")), 5000), "the guard made it inert");
      const r = await exec(catAll([".npmrc.pi-inert"]));
      if (secrets === "") assert.match(seen(r), /late-secret-3b8e/, `baseline: without masks the inert file reads: ${show(r)}`);
      else assert.doesNotMatch(seen(r), /late-secret-3b8e/, show(r));
      await sb.dispose();
    }
  });

  for (const mode of [undefined, "yolo"]) {
    test(`${mode ?? "read-only"}: a .ENV.LOCAL and a KEY.PEM the host makes after the start are masked as their lower-case names would be`, async (t) => {
      if (skipWithoutSandbox(t)) return;
      for (const secrets of ["", undefined]) {
        const { fx, sb, exec } = await late(t, secrets, mode);
        await writeFile(join(fx.project, ".ENV.LOCAL"), LATE);
        await writeFile(join(fx.project, "deploy", "KEY.PEM"), LATE);
        const r = await exec(catAll([".ENV.LOCAL", "deploy/KEY.PEM"]));
        if (secrets === "") assert.match(seen(r), /late-secret-3b8e[^]*late-secret-3b8e/, `baseline: without masks both read: ${show(r)}`);
        else {
          assert.doesNotMatch(seen(r), /late-secret-3b8e/, show(r));
          assert.equal(jsonOut(r).out, "");
        }
        await sb.dispose();
      }
    });

    test(`${mode ?? "read-only"}: a masked secret the host renames to a plain name stays masked under it`, async (t) => {
      if (skipWithoutSandbox(t)) return;
      for (const secrets of ["", undefined]) {
        const { fx, sb, exec } = await late(t, secrets, mode);
        await rename(join(fx.project, ".env"), join(fx.project, "notes.txt"));
        await rename(join(fx.project, "deploy"), join(fx.project, "stuff"));
        const r = await exec(catAll(["notes.txt", "stuff/key.pem"]));
        if (secrets === "") assert.match(seen(r), /root-secret-4f1c/, `baseline: without masks the renamed file reads: ${show(r)}`);
        else {
          assert.doesNotMatch(seen(r), /root-secret-4f1c|pem-secret-77d0/, show(r));
          // And in the sandbox after that one (its plan knows the files by what they are).
          await sb.reset();
          assert.doesNotMatch(seen(await exec(catAll(["notes.txt", "stuff/key.pem"]))), /root-secret-4f1c|pem-secret-77d0/);
        }
        await sb.dispose();
      }
    });
  }

  test("the watch stops an idle sandbox the moment a secret appears (before any execution asks)", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { fx, sb } = await late(t, undefined, undefined);
    await writeFile(join(fx.project, ".env.local"), LATE);
    // The watch, not the check before the next execution, ends it: no execution runs until its
    // processes are gone.
    assert.ok(await waitUntil(() => hostPidsWithCmdline(fx.runtimeRoot).length === 0, 10_000), "the watch did not stop the idle sandbox");
    const r = await sb.execute(catAll([".env.local"]));
    assert.equal(jsonOut(r).out, "");
    assert.match(r.stateLostReason ?? "", /killed between executions: .*\.env\.local/, show(r));
  });

  for (const rollback of [false, true]) {
    test(`yolo${rollback ? " with rollback" : ""}: a .env.local the sandbox makes itself stops it within the call; the next execution masks it`, async (t) => {
      if (skipWithoutSandbox(t)) return;
      for (const secrets of ["", undefined]) {
        const { fx, sb, exec } = await late(t, secrets, "yolo", rollback);
        const made = await exec(py`
          import shutil, time
          shutil.copy("/workspace/.env.example", "/workspace/.env.local")
          time.sleep(3)
          print("still running")
        `);
        // The user then fills it in on the host (in place: the same file).
        await writeFile(join(fx.project, ".env.local"), LATE);
        const r = await exec(catAll([".env.local"]));
        if (secrets === "") {
          assert.match(made.stdout, /still running/);
          assert.match(seen(r), /late-secret-3b8e/, `baseline: ${show(r)}`);
        } else {
          assert.doesNotMatch(made.stdout, /still running/, `the sandbox ran on after the secret appeared: ${show(made)}`);
          assert.equal(made.stateLost, true, "the kill says the state is gone");
          assert.equal(made.rolledBack, false, "nothing was rolled back: the sandbox was stopped");
          assert.match(made.stateLostReason ?? "", /\.env\.local/, show(made));
          assert.doesNotMatch(seen(r), /late-secret-3b8e/, show(r));
        }
        await sb.dispose();
      }
    });
  }

  for (const where of ["notes.txt", "node_modules/pkg/index.txt"]) {
    test(`yolo: a hard link the sandbox made to a new secret (${where}) is masked after the restart`, async (t) => {
      if (skipWithoutSandbox(t)) return;
      for (const secrets of ["", undefined]) {
        const { fx, sb, exec } = await late(t, secrets, "yolo");
        // The innocuous name first, then the secret name as a second link of the same file.
        await exec(py`
          import os, time
          os.makedirs("/workspace/node_modules/pkg", exist_ok=True)
          open(${lit(`/workspace/${where}`)}, "w").write("placeholder\\n")
          os.link(${lit(`/workspace/${where}`)}, "/workspace/.env.local")
          time.sleep(1)
        `);
        // Filled in on the host, in place: both names are the one file.
        await writeFile(join(fx.project, ".env.local"), LATE);
        assert.equal(readFileSync(join(fx.project, where), "utf8"), LATE, "setup: the two names are one file");
        const r = await exec(catAll([".env.local", where]));
        if (secrets === "") assert.match(seen(r), /late-secret-3b8e/, `baseline: ${show(r)}`);
        else assert.doesNotMatch(seen(r), /late-secret-3b8e/, `a hard link of a masked secret read: ${show(r)}`);
        await sb.dispose();
      }
    });
  }

  test("a hard link the host made to a secret is masked at the start (read-only)", async (t) => {
    if (skipWithoutSandbox(t)) return;
    for (const secrets of ["", undefined]) {
      const fx = await makeFixtureWithoutSpare(t);
      await put(fx.project, { ...SECRETS, ...PLAIN });
      await link(join(fx.project, ".env"), join(fx.project, "sub/backup.txt"));
      const sb = fx.open();
      const r = await withEnv({ PI_PYTHON_TOOL_SECRETS: secrets }, () => sb.execute(catAll(["sub/backup.txt"])));
      if (secrets === "") assert.match(seen(r), /root-secret-4f1c/, `baseline: ${show(r)}`);
      else assert.equal(jsonOut(r).out, "", show(r));
      await sb.dispose();
    }
  });

  test("a reset does not keep a sandbox whose masks miss a new secret", async (t) => {
    if (skipWithoutSandbox(t)) return;
    for (const secrets of ["", undefined]) {
      const { fx, sb, exec } = await late(t, secrets, undefined, true);
      await writeFile(join(fx.project, ".env.local"), LATE);
      await withEnv({ PI_PYTHON_TOOL_SECRETS: secrets }, () => sb.reset());
      const r = await exec(catAll([".env.local"]));
      if (secrets === "") assert.match(seen(r), /late-secret-3b8e/, `baseline: ${show(r)}`);
      else assert.equal(jsonOut(r).out, "", show(r));
      await sb.dispose();
    }
  });
});

/**
 * What a sandbox wrote after a secret appeared. A process already in the sandbox can win the race
 * with the watch that stops it: here a background process started by the first call waits on
 * inotify for the secret's name and copies the file to /scratch the moment it appears, before the
 * host's kill lands (usually; an attempt it loses is run again). /scratch outlives the sandbox, so
 * without more the next sandbox reads the copy back. The guarantee: the stopped sandbox's scratch
 * is moved aside on the host, never mounted again, before the next sandbox starts; the next one
 * gets an empty /scratch, and its result (and `status`) says where the old files are.
 * Baseline: on the engine before this, the next sandbox's /scratch holds the copy.
 */
describe("what a sandbox wrote after a secret appeared is set aside", () => {
  const SECRET = "realsecret-5c1d9e\n";
  /** A background process: waits on inotify in `dir` for `name`, appends its content to /scratch/stolen. */
  const thief = (dir: string, name: string) => py`
    import subprocess, sys, time, os
    src = ${lit(THIEF)}
    open("/tmp/thief.py", "w").write(src)
    subprocess.Popen([sys.executable, "/tmp/thief.py", ${lit(dir)}, ${lit(name)}], start_new_session=True,
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(200):
        if os.path.exists("/scratch/armed"): break
        time.sleep(0.025)
    print("armed" if os.path.exists("/scratch/armed") else "not armed")
  `;
  const look = py`
    import json, os
    p = "/scratch/stolen"
    print(json.dumps({"stolen": open(p).read() if os.path.exists(p) else None, "listing": sorted(os.listdir("/scratch"))}))
  `;
  /** The note that names the set-aside scratch, and the path it names. */
  function setAside(r: ExecResult): string | undefined {
    const note = [...r.notes, r.text].join("\n").match(/\/scratch was set aside because a secret appeared[^\n]* at (\/[^ ]+) \(never mounted/);
    return note?.[1];
  }
  /**
   * One attempt: arm the thief, make the secret appear (`appear`), wait for the stop, run the next
   * call. Returns that call, and whether the thief copied the secret before the stop (seen in the
   * next /scratch, or in the set-aside scratch).
   */
  async function attempt(sb: PythonSandbox, runtimeRoot: string, dir: string, name: string, appear: () => void) {
    const armed = await sb.execute(thief(dir, name));
    assert.match(armed.stdout, /^armed$/m, `setup: the background watch runs: ${show(armed)}`);
    const scratchDir = sb.status().paths.scratchDir!;
    appear();
    // The watch stops it within milliseconds (the next result says so); where it has not, the
    // check before the next execution does.
    await waitUntil(() => hostPidsWithCmdline(runtimeRoot).length === 0, 5000);
    const next = await sb.execute(look);
    const moved = setAside(next);
    // The copy made whole: a thief stopped between opening its file and writing it left it empty.
    const kept = moved !== undefined && existsSync(join(moved, "stolen")) ? readFileSync(join(moved, "stolen"), "utf8") : "";
    const copied = jsonOut(next).stolen !== null || kept !== "";
    return { next, moved, copied, scratchDir };
  }
  /**
   * Up to 10 attempts (each a new session) until the thief wins one; every attempt is checked.
   * `mustWin`: the race must be won at least once (the project variant shows the attack works);
   * the host watch is often faster than any thief, and then each attempt's set-aside is what is
   * shown.
   */
  async function untilCopied(
    t: TestContext,
    setup: () => Promise<{ sb: PythonSandbox; runtimeRoot: string; dir: string; name: string; appear: () => void }>,
    mustWin = true,
  ) {
    for (let i = 0; i < 10; i++) {
      const { sb, runtimeRoot, dir, name, appear } = await setup();
      const a = await attempt(sb, runtimeRoot, dir, name, appear);
      const seenNext = jsonOut(a.next);
      assert.equal(seenNext.stolen, null, `the next sandbox's /scratch holds what the stopped one copied: ${show(a.next)}`);
      assert.deepEqual(seenNext.listing, [], "the next sandbox's /scratch is empty");
      assert.ok(a.moved, `the result names the set-aside scratch: ${show(a.next)}`);
      assert.ok(a.moved.startsWith(join(dirname(a.scratchDir), "quarantine") + "/"), `inside the session directory: ${a.moved}`);
      assert.ok(existsSync(join(a.moved, "armed")), "the old scratch is there, whole");
      assert.match(a.next.stateLostReason ?? "", /secret appeared|\.env\.local|\.vault-token/, show(a.next));
      const status = sb.status().text;
      assert.match(status, /scratch set aside 1 time because a secret appeared/, status);
      assert.ok(status.includes(a.moved), status);
      if (a.copied) {
        t.diagnostic(`the background process copied the secret before the stop in attempt ${i + 1}`);
        assert.equal(readFileSync(join(a.moved, "stolen"), "utf8"), SECRET, "the set-aside scratch holds the copy");
        // The next sandbox after that one mounts the new scratch, not the set-aside one.
        assert.equal(jsonOut(await sb.execute(look)).stolen, null);
        await sb.dispose();
        return;
      }
      await sb.dispose();
    }
    if (mustWin) assert.fail("the background process never copied the secret before the stop in 10 attempts: nothing was shown");
    t.diagnostic("the host's watch stopped the sandbox before the background process could copy the secret in all 10 attempts; each attempt's scratch was set aside and the next one was empty");
  }

  test("read-only: a project secret a background process copied to /scratch is set aside, not shown to the next sandbox", async (t) => {
    if (skipWithoutSandbox(t)) return;
    await untilCopied(t, async () => {
      const fx = await makeFixtureWithoutSpare(t);
      await put(fx.project, PLAIN);
      const sb = fx.open();
      return {
        sb,
        runtimeRoot: fx.runtimeRoot,
        dir: "/workspace",
        name: ".env.local",
        // Filled outside, then moved in (as `mv` or an editor's save does): it appears whole.
        appear: () => {
          writeFileSync(join(fx.base, "staged"), SECRET);
          renameSync(join(fx.base, "staged"), join(fx.project, ".env.local"));
        },
      };
    });
  });

  test("a host secret that appears in a read root, copied to /scratch, is set aside", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const stage = mkdtempSync("/var/tmp/pps-secret-stage-");
    const old = process.env.PI_PYTHON_TOOL_HOST_SECRETS;
    t.after(() => {
      rmSync(stage, { recursive: true, force: true });
      if (old === undefined) delete process.env.PI_PYTHON_TOOL_HOST_SECRETS;
      else process.env.PI_PYTHON_TOOL_HOST_SECRETS = old;
    });
    await untilCopied(t, async () => {
      // A read root per attempt (not under /tmp, a reserved mount), its secret on the list.
      const root = mkdtempSync("/var/tmp/pps-secret-root-");
      t.after(() => rmSync(root, { recursive: true, force: true }));
      process.env.PI_PYTHON_TOOL_HOST_SECRETS = join(root, ".vault-token");
      const fx = await makeFixtureWithoutSpare(t);
      const sb = fx.open();
      sb.applyModeEvent({ mode: "manual", readRoots: [root] });
      return {
        sb,
        runtimeRoot: fx.runtimeRoot,
        dir: root,
        name: ".vault-token",
        appear: () => {
          writeFileSync(join(stage, "staged"), SECRET);
          renameSync(join(stage, "staged"), join(root, ".vault-token"));
        },
      };
    }, false);
  });

  test("links planted in /scratch make the host move or touch nothing outside the session directory", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const fx = await makeFixtureWithoutSpare(t);
    const outside = join(fx.base, "outside");
    await mkdir(outside);
    writeFileSync(join(outside, "canary"), "canary\n");
    const sb = fx.open();
    const planted = await sb.execute(py`
      import os
      os.symlink(${lit(outside)}, "/scratch/out")
      os.symlink(${lit(fx.runtimeRoot)}, "/scratch/runtime")
      os.symlink("..", "/scratch/up")
      os.makedirs("/scratch/d")
      os.symlink("/", "/scratch/d/root")
      open("/scratch/kept.txt", "w").write("kept\n")
      print(sorted(os.listdir("/scratch")))
    `);
    assert.equal(planted.status, "ok", show(planted));
    const runtimeBefore = readdirSync(fx.runtimeRoot).sort();
    const session = dirname(sb.status().paths.scratchDir!);
    writeFileSync(join(fx.project, ".env.local"), SECRET);
    // The watch stops it within milliseconds (the next result says so); where it has not, the
    // check before the next execution does.
    await waitUntil(() => hostPidsWithCmdline(fx.runtimeRoot).length === 0, 5000);
    const next = await sb.execute(py`
      import json, os
      print(json.dumps(sorted(os.listdir("/scratch"))))
    `);
    assert.deepEqual(jsonOut(next), [], show(next));
    const moved = setAside(next);
    assert.equal(moved, join(session, "quarantine", "scratch-1"), show(next));
    // Outside the session directory: nothing moved, nothing touched.
    assert.deepEqual(readdirSync(outside), ["canary"]);
    assert.equal(readFileSync(join(outside, "canary"), "utf8"), "canary\n");
    assert.deepEqual(readdirSync(fx.runtimeRoot).sort(), runtimeBefore);
    assert.deepEqual(readdirSync(fx.project).sort(), [".env.local", "data.txt"]);
    // The links moved as links, with their targets; the files with them.
    assert.equal(readlinkSync(join(moved, "out")), outside);
    assert.equal(readlinkSync(join(moved, "runtime")), fx.runtimeRoot);
    assert.equal(readlinkSync(join(moved, "up")), "..");
    assert.equal(readlinkSync(join(moved, "d", "root")), "/");
    assert.equal(readFileSync(join(moved, "kept.txt"), "utf8"), "kept\n");
    assert.ok(lstatSync(join(session, "scratch")).isDirectory() && !lstatSync(join(session, "scratch")).isSymbolicLink());
    assert.ok(lstatSync(join(session, "quarantine")).isDirectory());
  });
});

describe("a grant that shows the session directory", () => {
  test("a read root holding the runtime root shows the set-aside scratches masked", async (t) => {
    if (skipWithoutSandbox(t)) return;
    // Not under /tmp (a reserved mount): the root must be mountable.
    const root = mkdtempSync("/var/tmp/pps-rt-root-");
    t.after(() => rmSync(root, { recursive: true, force: true }));
    const runtimeRoot = join(root, "runtime");
    const fx = await makeFixtureWithoutSpare(t, { runtimeRoot });
    const sb = fx.open();
    const first = await sb.execute(py`open("/scratch/stolen", "w").write("copied-3e7f\n")`);
    assert.equal(first.status, "ok", show(first));
    writeFileSync(join(fx.project, ".env.local"), "TOKEN=x\n");
    // The watch stops it (or, where it has not, the check before the next execution does).
    await waitUntil(() => hostPidsWithCmdline(runtimeRoot).length === 0, 5000);
    assert.equal((await sb.execute("1")).status, "ok");
    const session = dirname(sb.status().paths.scratchDir!);
    const quarantine = join(session, "quarantine");
    assert.equal(readFileSync(join(quarantine, "scratch-1", "stolen"), "utf8"), "copied-3e7f\n", "setup: set aside on the host");
    writeFileSync(join(root, "beside.txt"), "beside\n");
    const change = sb.applyModeEvent({ mode: "manual", readRoots: [root] });
    assert.deepEqual(change.readRoots, [root], "setup: the root is mounted");
    const r = await sb.execute(py`
      import json, os, subprocess
      ls = lambda p: subprocess.run(["ls", "-A", p], capture_output=True, text=True).stdout
      print(json.dumps({"root": ls(${lit(root)}), "runtime": ls(${lit(runtimeRoot)}), "quarantine": ls(${lit(quarantine)})}))
    `);
    const seenIn = jsonOut(r);
    assert.match(seenIn.root, /beside\.txt/, `setup: the read root shows: ${show(r)}`);
    // The whole runtime root (every session's directory) reads as an empty directory.
    assert.equal(seenIn.runtime, "", `the runtime root reads as an empty directory: ${show(r)}`);
    assert.equal(seenIn.quarantine, "", `the set-aside scratches are not there: ${show(r)}`);
    // The interpreter's own read of it is refused as a masked path, not met as an empty directory.
    const own = await sb.execute(py`sorted(os.listdir(${lit(runtimeRoot)}))`);
    assert.equal(own.status, "permission_needed", show(own));
    assert.equal(own.permissionPath, runtimeRoot, show(own));
    assert.equal(own.permissionSecret, true, show(own));
    assert.doesNotMatch(JSON.stringify(own), /copied-3e7f|scratch-1/);
  });
});

/** The background thief: inotify on a directory, the named file's content appended to /scratch/stolen. */
const THIEF = String.raw`
import ctypes, os, struct, sys
where, name = sys.argv[1], sys.argv[2]
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.inotify_init1(0)
IN_CLOSE_WRITE, IN_MOVED_TO, IN_CREATE = 0x8, 0x80, 0x100
if fd < 0 or libc.inotify_add_watch(fd, where.encode(), IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE) < 0:
    sys.exit(1)
open("/scratch/armed", "w").close()
while True:
    buf, off, hit = os.read(fd, 65536), 0, False
    while off < len(buf):
        _, _, _, size = struct.unpack_from("iIII", buf, off)
        hit = hit or buf[off + 16:off + 16 + size].rstrip(b"\0").decode(errors="replace") == name
        off += 16 + size
    if not hit:
        continue
    try:
        data = open(os.path.join(where, name), "rb").read()
    except OSError:
        continue
    if data:
        with open("/scratch/stolen", "ab") as out:
            out.write(data)
        sys.exit(0)
`;
