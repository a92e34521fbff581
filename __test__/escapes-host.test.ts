/**
 * Escapes that end on the host: what a writable sandbox can make the host do with the files it
 * wrote, and what it can make the host keep in memory. One named test per attempt, each driven
 * from inside the sandbox; each says what happened on the host before the defence.
 * Run: node --import tsx --test __test__/escapes-host.test.ts
 */
import assert from "node:assert/strict";
import { execFile, execFileSync } from "node:child_process";
import { existsSync, mkdtempSync, readdirSync, readFileSync, realpathSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { mkdir, readFile, rm, symlink, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { describe, test } from "node:test";
import { skipWithoutSandbox, withEnv } from "./helpers/sandbox-env.ts";
import { addonCpuOver } from "./helpers/host-procs.ts";
import { hostPidsWithCmdline, INDEX_CJS, jsonOut, lit, makeFixture, PythonSandbox, py, show, waitUntil } from "./helpers/sandbox-fixture.ts";

const EROFS = 30;
const EBUSY = 16;

/** Write each path (creating parents) and report "written" or the errno. */
const WRITE = py`
  import json, os
  def write(path):
      try:
          os.makedirs(os.path.dirname(path), exist_ok=True)
          with open(path, "w") as f:
              f.write("pwned\n")
          return "written"
      except OSError as e:
          return e.errno
`;
const writes = (paths: string[]) =>
  `${WRITE}\nprint(json.dumps({p: write("/workspace/" + p) for p in ${JSON.stringify(paths)}}))`;

async function files(project: string, paths: string[]): Promise<void> {
  for (const p of paths) {
    await mkdir(join(project, p, ".."), { recursive: true });
    await writeFile(join(project, p), `original ${p}\n`);
  }
}

function assertUnchanged(project: string, paths: string[]): void {
  for (const p of paths) assert.equal(readFileSync(join(project, p), "utf8"), `original ${p}\n`, `${p} changed on the host`);
}

/** Inert names of `name` in `dir`. */
const inert = (dir: string, name: string) => readdirSync(dir).filter((n) => n.startsWith(`${name}.pi-inert`));

describe("host file operations never follow what the sandbox planted", { concurrency: 2 }, () => {
  test("a /scratch link to a host directory receives nothing when a protected name appears", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb, project, base } = await makeFixture(t);
    // Before: the host moved what appeared at .pi into /scratch/.pi-quarantine, resolving the
    // path on the host, so a link there moved the tree into any directory the user can write.
    const hostDir = join(base, "host-extensions");
    await mkdir(hostDir);
    sb.applyModeEvent({ mode: "yolo", readRoots: [] });
    const r = await sb.execute(py`
      import os
      os.symlink(${lit(hostDir)}, "/scratch/.pi-quarantine")
      os.symlink(${lit(hostDir)}, "/scratch/.pi-images")
      os.makedirs("/workspace/.pi/extensions", exist_ok=True)
      open("/workspace/.pi/extensions/index.ts", "w").write("pwned")
    `);
    assert.notEqual(r.status, "worker_error", show(r));
    assert.deepEqual(readdirSync(hostDir), [], "the host wrote into the directory the link named");
    assert.equal(existsSync(join(project, ".pi")), false);
    assert.deepEqual(inert(project, ".pi"), [".pi.pi-inert"], "the tree was not kept in place, inert");
    assert.match(r.text, /\.pi appeared in the project .* renamed to \.pi\.pi-inert/);
  });

  test("a venv inside the project replaced by a link to a host directory is not mounted", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const minor = execFileSync("/usr/bin/python3", ["-c", "import sys; print('%d.%d' % sys.version_info[:2])"], { encoding: "utf8" }).trim();
    const site = `lib/python${minor}/site-packages`;
    const { open, project, base } = await makeFixture(t);
    await mkdir(join(project, ".venv", site), { recursive: true });
    await writeFile(join(project, ".venv", "pyvenv.cfg"), "home = /usr/bin\n");
    await writeFile(join(project, ".venv", site, "projmod.py"), "X = 'project'\n");
    const secret = join(base, "host-secret");
    await mkdir(join(secret, site), { recursive: true });
    await writeFile(join(secret, "pyvenv.cfg"), "home = /usr/bin\n");
    await writeFile(join(secret, site, "secretmod.py"), "X = 'host secret'\n");
    await writeFile(join(secret, "id_rsa"), "host secret key\n");
    const sb = open({ pythonPackages: join(project, ".venv") });
    sb.applyModeEvent({ mode: "yolo", readRoots: [] });
    // The venv in the project is mounted read-only inside /workspace: this sandbox cannot swap
    // it. A command of the bash tool in a writable mode can (the project is writable there, the
    // venv is not mounted over it): the swap is made as that command would make it.
    const swap = await sb.execute(py`
      import projmod, shutil, os
      try:
          shutil.rmtree("/workspace/.venv")
      except OSError as e:
          print(e.strerror)
      projmod.X
    `);
    assert.equal(swap.repr, "'project'", show(swap));
    assert.match(swap.stdout, /Read-only file system/, show(swap));
    // Before: the next sandbox mounted the venv by its path, and bubblewrap followed the link
    // to the host directory.
    await rm(join(project, ".venv"), { recursive: true, force: true });
    await symlink(secret, join(project, ".venv"));
    await sb.reset();
    const r = await sb.execute(py`
      import json, os
      venv = ${lit(join(project, ".venv"))}
      def read(p):
          try:
              return open(p).read()
          except Exception as e:
              return type(e).__name__
      print(json.dumps({"key": read(venv + "/id_rsa"), "mod": read(venv + "/${site}/secretmod.py")}))
    `);
    const out = jsonOut(r);
    assert.doesNotMatch(JSON.stringify(out), /host secret/, JSON.stringify(out));
    // A new session probes the venv setting again: it must not follow the link either.
    await sb.dispose();
    const later = open({ pythonPackages: join(project, ".venv") });
    const again = jsonOut(await later.execute(py`
      import json, os
      venv = ${lit(join(project, ".venv"))}
      try:
          print(json.dumps(open(venv + "/id_rsa").read()))
      except Exception as e:
          print(json.dumps(type(e).__name__))
    `));
    assert.doesNotMatch(JSON.stringify(again), /host secret/, "a new session mounted the link's target");
    assert.match(JSON.stringify(later.status().pythonNotes), /cannot be used/);
  });
});

describe("git and tool configuration cannot be changed from a writable mode", { concurrency: 2 }, () => {
  test("all of .git is read-only: commondir, refs, info and new files", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb, project } = await makeFixture(t);
    const existing = [".git/config", ".git/HEAD", ".git/refs/heads/main", ".git/info/exclude"];
    await files(project, existing);
    sb.applyModeEvent({ mode: "yolo", readRoots: [] });
    // Before: only .git/config and .git/hooks were read-only; a .git/commondir naming a copied
    // git directory made the host's git run that copy's core.fsmonitor.
    const out = jsonOut(await sb.execute(writes([...existing, ".git/commondir", ".git/objects/info/alternates"])));
    for (const [p, outcome] of Object.entries(out)) assert.equal(outcome, EROFS, `${p}: ${outcome}`);
    assertUnchanged(project, existing);
    assert.equal(existsSync(join(project, ".git/commondir")), false);
  });

  test("a nested repository's .git is read-only and its directory cannot be renamed away", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb, project } = await makeFixture(t);
    const existing = ["sub/.git/config", "sub/.git/HEAD", "vendor/lib/.git"];
    await files(project, existing);
    sb.applyModeEvent({ mode: "yolo", readRoots: [] });
    const r = await sb.execute(`${WRITE}\n${py`
      def rename(a, b):
          try:
              os.rename(a, b)
              return "renamed"
          except OSError as e:
              return e.errno
      print(json.dumps({
          "config": write("/workspace/sub/.git/config"),
          "hooks": write("/workspace/sub/.git/hooks/pre-commit"),
          "gitfile": write("/workspace/vendor/lib/.git"),
          "rename": rename("/workspace/sub", "/workspace/sub-moved"),
      }))
    `}`);
    const out = jsonOut(r);
    assert.deepEqual(out, { config: EROFS, hooks: EROFS, gitfile: EROFS, rename: EBUSY });
    assertUnchanged(project, existing);
  });

  test("core.hooksPath targets are read-only, from the repository's and the user's git config", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb, project, base } = await makeFixture(t);
    // The user's global config names a relative hooks path: it applies to every repository.
    const home = join(base, "home");
    await mkdir(home);
    await writeFile(join(home, ".gitconfig"), "[core]\n\thooksPath = .githooks\n");
    const saved = process.env.HOME;
    process.env.HOME = home;
    t.after(() => {
      if (saved === undefined) delete process.env.HOME;
      else process.env.HOME = saved;
    });
    await files(project, [".git/HEAD", "tools/hooks/pre-commit", ".githooks/pre-push", "src/app.py"]);
    await writeFile(join(project, ".git/config"), "[core]\n\tbare = false\n\thooksPath = tools/hooks\n");
    sb.applyModeEvent({ mode: "yolo", readRoots: [] });
    const out = jsonOut(
      await sb.execute(writes(["tools/hooks/pre-commit", "tools/hooks/post-checkout", ".githooks/pre-push", "src/app.py"])),
    );
    assert.deepEqual(out, {
      "tools/hooks/pre-commit": EROFS,
      "tools/hooks/post-checkout": EROFS,
      ".githooks/pre-push": EROFS,
      "src/app.py": "written",
    });
    assertUnchanged(project, ["tools/hooks/pre-commit", ".githooks/pre-push"]);
  });

  test("a project with 200 nested repositories starts with each read-only and 128 open files", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb, project } = await makeFixture(t);
    // Each protected entry is an fd bubblewrap holds while it sets up the mounts: more than
    // the sandbox's open-file limit used to make bubblewrap itself fail to start.
    await files(project, Array.from({ length: 200 }, (_, i) => `m${i}/.git/config`));
    sb.applyModeEvent({ mode: "yolo", readRoots: [] });
    const r = await sb.execute(`${WRITE}\n${py`
      import resource
      fds = sorted(os.listdir("/proc/self/fd"))
      print(json.dumps({"first": write("/workspace/m0/.git/config"), "last": write("/workspace/m199/.git/config"),
                        "fds": [fd for fd in fds if not 10 <= int(fd) <= 17],
                        "placeholders": sorted({os.readlink(f"/proc/self/fd/{fd}") for fd in fds if 10 <= int(fd) <= 17}),
                        "limit": resource.getrlimit(resource.RLIMIT_NOFILE)}))
    `}`);
    const out = jsonOut(r);
    assert.deepEqual([out.first, out.last], [EROFS, EROFS]);
    assert.deepEqual(out.limit, [128, 128], "the worker did not lower the open-file limit again");
    assert.ok(out.fds.length <= 6, `mount fds reached the sandbox: ${out.fds}`);
    // 10-17 are the worker's own placeholders (for rollback's channels and a call's output pipes).
    assert.deepEqual(out.placeholders, ["/dev/null"]);
  });

  test("agent, editor and package-manager configs are read-only", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb, project } = await makeFixture(t);
    const existing = [
      ".claude/settings.json", ".claude/commands/x.md", ".cursor/rules/a.mdc", ".codex/config.toml", ".npmrc",
      ".yarnrc.yml", ".hg/hgrc", ".husky/pre-commit", ".gitmodules", ".pre-commit-config.yaml", ".cargo/config.toml",
      "pkg/.npmrc", "pkg/.vscode/tasks.json",
    ];
    await files(project, existing);
    sb.applyModeEvent({ mode: "yolo", readRoots: [] });
    const out = jsonOut(await sb.execute(writes([...existing, ".claude/agents/evil.md"])));
    for (const [p, outcome] of Object.entries(out)) assert.equal(outcome, EROFS, `${p}: ${outcome}`);
    assertUnchanged(project, existing);
  });

  test("git inside the sandbox reads the repository but cannot write it", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb, project } = await makeFixture(t);
    const git = (...args: string[]) =>
      execFileSync("git", ["-C", project, "-c", "user.name=t", "-c", "user.email=t@t", ...args], { encoding: "utf8" });
    git("init", "-q");
    git("add", "data.txt");
    git("commit", "-q", "-m", "first");
    sb.applyModeEvent({ mode: "yolo", readRoots: [] });
    const r = await sb.execute(py`
      import json, subprocess
      def run(*args):
          p = subprocess.run(["git", "-c", "user.name=s", "-c", "user.email=s@s", *args], capture_output=True, text=True, cwd="/workspace")
          return [p.returncode, p.stdout.strip()]
      print(json.dumps({"log": run("log", "--format=%s"), "commit": run("commit", "--allow-empty", "-q", "-m", "evil")}))
    `);
    const out = jsonOut(r);
    assert.deepEqual(out.log, [0, "first"], show(r));
    assert.notEqual(out.commit[0], 0, "git could write the repository from the sandbox");
    assert.equal(git("log", "--format=%s").trim(), "first");
  });

  test("a hooks path in a file the user's global config includes is read-only", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb, project, base } = await makeFixture(t);
    // Before: an include in ~/.gitconfig was taken from the project root instead of ~, so the
    // file it names and the hooks path in it were never read.
    const home = join(base, "home");
    await mkdir(join(home, "git"), { recursive: true });
    await writeFile(join(home, ".gitconfig"), "[user]\n\tname = t\n[include]\n\tpath = git/work.gitconfig\n");
    await writeFile(join(home, "git/work.gitconfig"), "[core]\n\thooksPath = .work-hooks\n");
    // git's own choice of the user's files: HOME alone, whatever the runner's environment says.
    const names = ["HOME", "XDG_CONFIG_HOME", "GIT_CONFIG_GLOBAL"];
    const saved = Object.fromEntries(names.map((k) => [k, process.env[k]]));
    process.env.HOME = home;
    delete process.env.XDG_CONFIG_HOME;
    delete process.env.GIT_CONFIG_GLOBAL;
    t.after(() => {
      for (const [k, v] of Object.entries(saved)) {
        if (v === undefined) delete process.env[k];
        else process.env[k] = v;
      }
    });
    await files(project, [".git/HEAD", ".work-hooks/pre-commit", "src/app.py"]);
    sb.applyModeEvent({ mode: "yolo", readRoots: [] });
    const out = jsonOut(await sb.execute(writes([".work-hooks/pre-commit", ".work-hooks/post-checkout", "src/app.py"])));
    assert.deepEqual(out, { ".work-hooks/pre-commit": EROFS, ".work-hooks/post-checkout": EROFS, "src/app.py": "written" });
    assertUnchanged(project, [".work-hooks/pre-commit"]);
  });

  test("an enclosing repository's hooks path into the project is read-only", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb, project, base } = await makeFixture(t);
    // pi run in repo/project: the repository's .git is above the project, where the scan never
    // looks. Before: its core.hooksPath = project/hooks left those hooks writable, and git
    // run anywhere in the repository ran them on the host.
    execFileSync("git", ["init", "-q", base]);
    execFileSync("git", ["-C", base, "config", "core.hooksPath", "project/hooks"]);
    await files(project, ["hooks/pre-commit", "src/app.py"]);
    sb.applyModeEvent({ mode: "yolo", readRoots: [] });
    const out = jsonOut(await sb.execute(writes(["hooks/pre-commit", "hooks/pre-push", "src/app.py"])));
    assert.deepEqual(out, { "hooks/pre-commit": EROFS, "hooks/pre-push": EROFS, "src/app.py": "written" });
    assertUnchanged(project, ["hooks/pre-commit"]);
  });
});

describe("a protected name the sandbox creates never stays active", { concurrency: 2 }, () => {
  test("names a background process creates after the execution are made inert at once", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb, project } = await makeFixture(t);
    sb.applyModeEvent({ mode: "yolo", readRoots: [] });
    // Before: the sweep ran only at the end of each execution and judged by ctime, so
    // .vscode/tasks.json (runOn folderOpen) and .envrc written later survived it. They are
    // written after the drain window (1 s), when no execution runs.
    const r = await sb.execute(py`
      import subprocess
      subprocess.Popen(["sh", "-c", "sleep 1.5; mkdir -p /workspace/.vscode; echo '{}' > /workspace/.vscode/tasks.json; echo 'echo pwned' > /workspace/.envrc; sleep 30"], start_new_session=True)
    `);
    assert.equal(r.status, "ok", show(r));
    const moved = await waitUntil(() => inert(project, ".envrc").length > 0 && inert(project, ".vscode").length > 0, 5000);
    assert.ok(moved, `not made inert without another execution: ${readdirSync(project)}`);
    assert.equal(existsSync(join(project, ".envrc")), false);
    assert.equal(existsSync(join(project, ".vscode")), false);
    assert.equal(readFileSync(join(project, inert(project, ".envrc")[0]), "utf8"), "echo pwned\n", "the content is kept");
    const next = await sb.execute("1");
    assert.match(next.text, /\.envrc appeared in the project .*mv '.*\.envrc\.pi-inert' '.*\.envrc'/);
  });

  test("a repository a background process creates in a new directory between calls is made inert", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb, project } = await makeFixture(t);
    sb.applyModeEvent({ mode: "yolo", readRoots: [] });
    // A new directory is not watched: the whole project is checked every 2 s while the code's
    // processes may still run (an editor scanning sub-folders for repositories would find it).
    const r = await sb.execute(py`
      import subprocess
      subprocess.Popen(["sh", "-c", "sleep 1.5; mkdir -p /workspace/newpkg/.git; echo '[core]' > /workspace/newpkg/.git/config; sleep 30"], start_new_session=True)
    `);
    assert.equal(r.status, "ok", show(r));
    const dir = join(project, "newpkg");
    const done = await waitUntil(() => existsSync(dir) && inert(dir, ".git").length === 1, 8000);
    assert.ok(done, `newpkg/.git was not made inert: ${existsSync(dir) ? readdirSync(dir) : "no newpkg"}`);
    assert.equal(existsSync(join(project, "newpkg/.git")), false);
  });

  test("a repository the code creates deeper in the project is made inert", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb, project } = await makeFixture(t);
    sb.applyModeEvent({ mode: "yolo", readRoots: [] });
    const r = await sb.execute(py`
      import os
      os.makedirs("/workspace/pkg/deep/.git")
      open("/workspace/pkg/deep/.git/config", "w").write("[core]\n\tfsmonitor = /workspace/evil.sh\n")
      os.makedirs("/workspace/pkg/deep/.claude")
    `);
    assert.equal(r.status, "ok", show(r));
    const dir = join(project, "pkg/deep");
    assert.ok(await waitUntil(() => !existsSync(join(dir, ".git")) && !existsSync(join(dir, ".claude")), 5000), readdirSync(dir).join(" "));
    assert.deepEqual(inert(dir, ".git"), [".git.pi-inert"]);
    // The walk after the call may finish before that call's result is built, or after it.
    const next = await sb.execute("1");
    assert.match(`${r.text}\n${next.text}`, /pkg\/deep\/\.git appeared in the project/);
  });

  test("names left by a killed sandbox are made inert on the mode change, and nothing else is touched", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb, project } = await makeFixture(t);
    sb.applyModeEvent({ mode: "yolo", readRoots: [] });
    const r = await sb.execute(
      py`
      import os, time
      os.makedirs("/workspace/a/b/.husky")
      open("/workspace/a/b/.husky/pre-commit", "w").write("evil")
      open("/workspace/a/b/notes.txt", "w").write("kept")
      time.sleep(30)
    `,
      1,
    );
    assert.equal(r.status, "timeout", show(r));
    sb.applyModeEvent({ mode: "manual", readRoots: [] });
    assert.ok(await waitUntil(() => !existsSync(join(project, "a/b/.husky")), 5000));
    assert.deepEqual(inert(join(project, "a/b"), ".husky"), [".husky.pi-inert"]);
    assert.equal(await readFile(join(project, "a/b/notes.txt"), "utf8"), "kept");
  });

  test("dispose makes inert what the last execution left, and says so", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb, project } = await makeFixture(t);
    sb.applyModeEvent({ mode: "yolo", readRoots: [] });
    const r = await sb.execute(py`
      import subprocess
      subprocess.Popen(["sh", "-c", "sleep 1.3; mkdir -p /workspace/x/y; echo evil > /workspace/x/y/.envrc; sleep 30"], start_new_session=True)
    `);
    assert.equal(r.status, "ok", show(r));
    // Dispose once the name is there (the periodic walk may make it inert first: its note waits
    // for the next result, which dispose returns).
    const dir = join(project, "x/y");
    assert.ok(await waitUntil(() => existsSync(join(dir, ".envrc")) || (existsSync(dir) && inert(dir, ".envrc").length > 0), 10_000), "the background process never wrote x/y/.envrc");
    const notes = await sb.dispose("test");
    assert.equal(existsSync(join(project, "x/y/.envrc")), false, "the name survived dispose");
    assert.deepEqual(inert(join(project, "x/y"), ".envrc"), [".envrc.pi-inert"]);
    assert.match(notes.join("\n"), /x\/y\/\.envrc appeared in the project/);
  });
});

describe("what cannot be protected is not made writable", { concurrency: 1 }, () => {

  test("a project flooded past the walk's bound keeps the user's .git protected; a sandbox planned afresh is read-only", async (t) => {
    if (skipWithoutSandbox(t)) return;
    withEnv(t, { PI_PYTHON_TOOL_SCAN_ENTRIES: "300" });
    const { sb, project, open } = await makeFixture(t, { prewarm: false });
    await files(project, [".git/config"]);
    sb.applyModeEvent({ mode: "yolo", readRoots: [] });
    // Before: names beyond the bound were simply not protected; flooding the root pushed the
    // user's own .git past it, and the next sandbox could write .git/config.
    const flood = await sb.execute(py`
      for i in range(400):
          open("/workspace/f%d" % i, "w").close()
    `);
    assert.equal(flood.status, "ok", show(flood));
    await new Promise((resolve) => setTimeout(resolve, 2000));
    // The running sandbox's protection was planned before the flood, and the project's watch
    // sees every name since: .git stays read-only in it (or, where the watch does not cover
    // the project, the walk after the call stops it and the next sandbox is read-only).
    const next = await sb.execute(writes([".git/config"]));
    assert.deepEqual(jsonOut(next), { ".git/config": EROFS }, "the user's .git was writable");
    // A sandbox planned afresh walks to the bound, so its protected names are not all known:
    // the project is read-only in it, and the result says why.
    const again = open();
    again.applyModeEvent({ mode: "yolo", readRoots: [] });
    const fresh = await again.execute(writes([".git/config", "src/app.py"]));
    assert.deepEqual(jsonOut(fresh), { ".git/config": EROFS, "src/app.py": EROFS }, "the project was writable");
    // Said once, by the line that says what the mode change did.
    assert.match(fresh.text, /\/workspace stays read-only although the mode allows writes: the project has more than 300 entries/, fresh.text);
    assertUnchanged(project, [".git/config"]);
  });

  test("more protected entries than can be mounted: the sandbox gets a read-only project", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb, project } = await makeFixture(t, { prewarm: false });
    await files(project, [".git/config", ...Array.from({ length: 1100 }, (_, i) => `d${i}/.vscode/x`)]);
    sb.applyModeEvent({ mode: "yolo", readRoots: [] });
    // Before: after 1,024 binds the rest stayed writable, the user's .git among them.
    const out = jsonOut(await sb.execute(writes([".git/config"])));
    assert.equal(out[".git/config"], EROFS);
    assertUnchanged(project, [".git/config"]);
  });

  test("inert names taken in advance do not keep a protected name active", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb, project } = await makeFixture(t);
    sb.applyModeEvent({ mode: "yolo", readRoots: [] });
    // Before: 64 pre-made NAME.pi-inert-N names made every rename fail with EEXIST.
    const r = await sb.execute(py`
      open("/workspace/.envrc.pi-inert", "w").close()
      for n in range(2, 80):
          open("/workspace/.envrc.pi-inert-%d" % n, "w").close()
      open("/workspace/.envrc", "w").write("evil")
    `);
    assert.equal(r.status, "ok", show(r));
    assert.equal(existsSync(join(project, ".envrc")), false, "the name stayed active");
    assert.match(r.text, /\.envrc appeared in the project .* renamed to \.envrc\.pi-inert-[0-9a-f]{8}/);
  });

  test("a worker that hides its background processes does not stop the periodic check", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { sb, project } = await makeFixture(t);
    sb.applyModeEvent({ mode: "yolo", readRoots: [] });
    // Before: the walk every 2 s ran only when the worker reported processes still running,
    // and the code can make the worker report none.
    const r = await sb.execute(py`
      import subprocess, sys
      sys.modules["__main__"].live_processes = lambda: set()
      subprocess.Popen(["sh", "-c", "sleep 1.5; mkdir -p /workspace/app/.vscode; sleep 30"], start_new_session=True)
    `);
    assert.equal(r.status, "ok", show(r));
    const dir = join(project, "app");
    assert.ok(await waitUntil(() => existsSync(dir) && inert(dir, ".vscode").length === 1, 8000), "app/.vscode stayed active");
  });
});

describe("host memory is bounded whatever the sandbox sends", () => {
  test("frames flooded between calls kill the sandbox and leave host RSS flat", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { project, runtimeRoot } = await makeFixture(t);
    // Before: a thread left by the code wrote valid 127 KiB frames on the reply channel
    // between calls, and the host queued every one of them (1.5 GiB seen).
    const script = `
      const { PythonSandbox } = require(${JSON.stringify(INDEX_CJS)});
      (async () => {
        const sb = new PythonSandbox({ projectDir: ${JSON.stringify(project)}, runtimeRoot: ${JSON.stringify(runtimeRoot)}, prewarm: false });
        await sb.execute("1");
        const before = process.memoryUsage().rss;
        const flood = await sb.execute(${JSON.stringify(py`
          import os, threading, json
          body = json.dumps({"type": "error", "id": None, "message": "x" * (127 * 1024)}).encode()
          frame = len(body).to_bytes(4, "big") + body
          def flood():
              for _ in range(2000):  # bounded: about 250 MiB
                  try:
                      os.write(4, frame)
                  except OSError:
                      return
          threading.Timer(0.2, flood).start()
        `)});
        await new Promise((r) => setTimeout(r, 3000));
        const after = process.memoryUsage().rss;
        const next = await sb.execute("1");
        console.log(JSON.stringify({ grew: after - before, flood: flood.status, next: next.status, reason: next.stateLostReason, generation: [flood.generation, next.generation] }));
        await sb.dispose();
      })();
    `;
    const out = await new Promise<string>((resolve, reject) =>
      execFile(process.execPath, ["-e", script], { timeout: 60_000, encoding: "utf8" }, (err, stdout, stderr) =>
        err ? reject(new Error(`${err.message}\n${stderr}`)) : resolve(stdout),
      ),
    );
    const res = JSON.parse(out.trim().split("\n").at(-1) ?? "{}");
    assert.equal(res.flood, "ok");
    assert.ok(res.grew < 20 * 1024 * 1024, `host RSS grew by ${(res.grew / 1048576).toFixed(1)} MiB`);
    assert.equal(res.next, "ok");
    assert.match(res.reason ?? "", /sent a protocol frame while no execution ran/);
    assert.equal(res.generation[1], res.generation[0] + 1, "the flooding sandbox was not replaced");
  });
});



describe("read grants never follow what the sandbox planted", () => {
  test("allow once and a read root refuse a path through the session's scratch (a planted link)", async (t) => {
    if (skipWithoutSandbox(t)) return;
    // Not under /tmp (a reserved mount, refused for that reason alone).
    const runtimeRoot = mkdtempSync("/var/tmp/pps-grant-rt-");
    const elsewhere = mkdtempSync("/var/tmp/pps-grant-target-");
    const target = join(elsewhere, "private.txt");
    writeFileSync(target, "host-private\n");
    const { sb } = await makeFixture(t, { runtimeRoot });
    // After the fixture's own hook (hooks run in the order registered): the sandbox is disposed
    // before its runtime root is removed, or a sandbox still writing there fails the removal.
    t.after(() => {
      rmSync(runtimeRoot, { recursive: true, force: true });
      rmSync(elsewhere, { recursive: true, force: true });
    });
    sb.applyModeEvent({ mode: "manual", readRoots: [] });
    const planted = await sb.execute(`import os\nos.symlink(${lit(target)}, "/scratch/planted")`);
    assert.equal(planted.status, "ok", planted.text);
    const hostPath = join(sb.status().paths.scratchDir!, "planted");
    // Baseline: resolved on the host, the path is the private file; granting it would mount that.
    assert.equal(realpathSync(hostPath), target);
    const r = await sb.execute(`print(open(${lit(hostPath)}).read())`);
    assert.equal(r.status, "permission_needed", r.text);
    assert.equal(sb.readDecision(hostPath, true).prompt, true);
    const answer = sb.answerRead(hostPath, false, "allow");
    assert.equal(answer.replay, false);
    assert.match(answer.diagnostic ?? "", /inside the session's own directories/);
    assert.deepEqual(sb.status().allowedOnce, []);
    const again = await sb.execute(`print(open(${lit(hostPath)}).read())`);
    assert.doesNotMatch(again.text, /host-private/);
    // The same path as a read root is skipped for the same reason.
    const change = sb.applyModeEvent({ mode: "manual", readRoots: [sb.status().paths.scratchDir!] });
    assert.deepEqual(change.readRoots, []);
    assert.match(change.skipped[0]?.reason ?? "", /inside the session's own directories/);
  });
});

describe("no sandbox reaches the runtime root", () => {
  test("a project that holds the runtime root (pi started in /tmp) starts no sandbox: its /scratch link would bind any host directory", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const elsewhere = mkdtempSync("/var/tmp/pps-rt-target-");
    t.after(() => rmSync(elsewhere, { recursive: true, force: true }));
    // What a sandbox that reaches the session's directory does: the session's scratch becomes a
    // link to a host directory, and the next sandbox binds it, writable, at /scratch.
    const plant = py`
      import glob, os, sys
      scratch = [s for s in glob.glob("/workspace/*/*/scratch") if os.path.isdir(s)]
      for s in scratch:
          os.rename(s, s + ".old")
          os.symlink(${lit(elsewhere)}, s)
      print("planted", len(scratch))
    `;
    const escape = `open("/scratch/escaped", "w").write("pwned")\nprint(sorted(__import__("os").listdir("/scratch")))`;
    // Baseline: the runtime root beside the project; the host plants the link the sandbox would.
    const beside = await makeFixture(t, { workspaceWritable: true, rollback: false });
    assert.equal((await beside.sb.execute("x = 1")).status, "ok");
    const scratch = beside.sb.status().paths.scratchDir!;
    renameSync(scratch, `${scratch}.old`);
    await symlink(elsewhere, scratch);
    await beside.sb.reset();
    const followed = await beside.sb.execute(escape);
    assert.equal(followed.status, "ok", show(followed));
    assert.deepEqual(readdirSync(elsewhere), ["escaped"], "baseline: the next sandbox binds the link's target at /scratch");
    rmSync(join(elsewhere, "escaped"));
    // The attempt: the project holds the runtime root, as the default one under /tmp is held by
    // a project at /tmp; before, the sandbox planted the link itself and the next one wrote here.
    const { base, runtimeRoot } = await makeFixture(t);
    const inside = new PythonSandbox({ projectDir: base, runtimeRoot, workspaceWritable: true, rollback: false, prewarm: false });
    t.after(() => inside.dispose("test end").catch(() => {}));
    const first = await inside.execute(plant);
    assert.notEqual(first.status, "ok", show(first));
    assert.match(first.text, /runtime root .* is inside the project directory/);
    assert.doesNotMatch(first.text, /planted/);
    await inside.reset();
    const second = await inside.execute(escape);
    assert.notEqual(second.status, "ok", show(second));
    assert.deepEqual(readdirSync(elsewhere), [], "nothing reached the host directory");
    // The sandboxed bash tool uses the same session directory: refused the same way.
    const shell = await inside.execShell(1, "ls /workspace", { cwd: base, timeoutSeconds: 10 }, () => {}).then(
      (r) => JSON.stringify(r),
      (e: Error) => e.message,
    );
    assert.match(shell, /inside the project directory/);
  });
  test("a read root that holds the runtime root shows no session's directory: another session's logs and scratch", async (t) => {
    if (skipWithoutSandbox(t)) return;
    // Not under /tmp (a reserved mount, refused as a read root for that reason alone).
    const base = mkdtempSync("/var/tmp/pps-rt-root-");
    t.after(() => rmSync(base, { recursive: true, force: true }));
    const runtimeRoot = join(base, "runtime");
    const project = join(base, "project");
    await mkdir(project);
    writeFileSync(join(base, "granted.txt"), "granted-content\n");
    const other = new PythonSandbox({ projectDir: project, runtimeRoot, prewarm: false });
    t.after(() => other.dispose("test end").catch(() => {}));
    const theirs = await other.execute(`open("/scratch/theirs.txt", "w").write("THEIR-SCRATCH")\nprint("THEIR-OUTPUT")`);
    assert.equal(theirs.status, "ok", show(theirs));
    const theirLog = theirs.logPaths.stdout!;
    const read = py`
      import glob
      print(open(${lit(join(base, "granted.txt"))}).read().strip())
      try:
          found = sorted(glob.glob(${lit(runtimeRoot)} + "/*/*/*"))
      except Exception as e:  # a hidden tree's listing is refused (SandboxReadDenied)
          found = []
          print("listing refused:", type(e).__name__)
      for f in found + [${lit(theirLog)}]:
          try:
              print(f, open(f).read()[:60])
          except Exception as e:
              print(f, type(e).__name__)
    `;
    const sb = new PythonSandbox({ projectDir: project, runtimeRoot, prewarm: false });
    t.after(() => sb.dispose("test end").catch(() => {}));
    // Baseline: the files are there on the host, and the grant shows what else is in the tree.
    assert.match(readFileSync(theirs.logPaths.stdout!, "utf8"), /THEIR-OUTPUT/);
    // Granted at the start, then granted live to a running sandbox.
    for (const live of [false, true]) {
      if (live) {
        sb.applyModeEvent({ mode: "manual", readRoots: [] });
        assert.equal((await sb.execute("x = 1")).status, "ok");
      }
      const change = sb.applyModeEvent({ mode: "manual", readRoots: [base] });
      assert.deepEqual(change.readRoots, [base], JSON.stringify(change));
      const r = await sb.execute(read);
      assert.equal(r.status, "ok", show(r));
      assert.match(r.stdout, /granted-content/, `live ${live}: the grant is in force`);
      // Before: every session's logs and scratch under the granted tree were read.
      assert.doesNotMatch(r.stdout, /THEIR-OUTPUT|THEIR-SCRATCH/, `live ${live}: ${r.stdout}`);
    }
  });
});

describe("host secrets stay out of the sandbox, also when they appear later", () => {
  /** A read root holding `notes.txt`, and a sandbox that mounts it. */
  async function rootFixture(t: import("node:test").TestContext) {
    const root = mkdtempSync("/var/tmp/pps-secret-root-");
    t.after(() => rmSync(root, { recursive: true, force: true }));
    writeFileSync(join(root, "notes.txt"), "notes\n");
    const fx = await makeFixture(t, { prewarm: false });
    fx.sb.applyModeEvent({ mode: "manual", readRoots: [root] });
    return { root, sb: fx.sb };
  }
  /** Start a background process that copies `secret` into scratch once it has content. */
  const thief = (secret: string) => py`
    import subprocess
    subprocess.Popen(["sh", "-c", "while :; do if [ -s ${secret} ]; then cat ${secret} > /scratch/stolen; exit; fi; sleep 0.05; done"])
    print(open(${lit(secret.replace(/\/[^/]+$/, "/notes.txt"))}).read())
  `;

  for (const defended of [false, true]) {
    test(`a secret created in a read root while a background process waits for it is ${defended ? "never read" : "read (baseline: not on the list)"}`, async (t) => {
      if (skipWithoutSandbox(t)) return;
      const { root, sb } = await rootFixture(t);
      // A name no default entry covers (`.vault-token` is one in any granted directory, found by
      // the check before an execution): on the list only through the setting.
      const secret = join(root, "vault-token.txt");
      const old = process.env.PI_PYTHON_TOOL_HOST_SECRETS;
      if (defended) process.env.PI_PYTHON_TOOL_HOST_SECRETS = secret;
      t.after(() => {
        if (old === undefined) delete process.env.PI_PYTHON_TOOL_HOST_SECRETS;
        else process.env.PI_PYTHON_TOOL_HOST_SECRETS = old;
      });
      const first = await sb.execute(thief(secret));
      assert.equal(first.status, "ok", first.text);
      // Created empty first, filled later: the sandbox must be gone by the time it has content.
      writeFileSync(secret, "");
      await new Promise((r) => setTimeout(r, 500));
      writeFileSync(secret, "vault-secret-value\n");
      await new Promise((r) => setTimeout(r, 500));
      const r = await sb.execute(`import os\nprint(open('/scratch/stolen').read() if os.path.exists('/scratch/stolen') else 'nothing stolen')\nprint(repr(open(${lit(secret)}).read()))`);
      if (!defended) {
        assert.match(r.text, /vault-secret-value/, "baseline: the background process copied it");
        return;
      }
      assert.doesNotMatch(r.text, /vault-secret-value/);
      assert.match(r.text, /nothing stolen/);
      // Masked in the new sandbox: the read is refused and says why.
      assert.ok(r.text.includes(`The code tried to read ${secret}, which looks like a secret (PI_SANDBOX_HOST_SECRETS)`), r.text);
      assert.match(r.text, /host secret appeared in a read root/);
      assert.equal(r.stateLost, true);
    });
  }

  test("a secret that arrives with its directory in one rename is never read", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const { root, sb } = await rootFixture(t);
    // A secret in a directory that does not exist yet and appears in one step (a rename).
    const secret = join(root, "deep", ".netrc");
    process.env.PI_PYTHON_TOOL_HOST_SECRETS = secret;
    t.after(() => delete process.env.PI_PYTHON_TOOL_HOST_SECRETS);
    assert.equal((await sb.execute("x = 1")).status, "ok");
    const staging = mkdtempSync("/var/tmp/pps-secret-stage-");
    t.after(() => rmSync(staging, { recursive: true, force: true }));
    writeFileSync(join(staging, ".netrc"), "machine m password p4ss\n");
    renameSync(staging, join(root, "deep"));
    const r = await sb.execute(`print(repr(open(${lit(secret)}).read()))`);
    assert.doesNotMatch(r.text, /p4ss/);
    assert.match(r.text, /host secret appeared in a read root/);
  });

  test("allow once through the user's own link into the project never follows a link the sandbox planted there", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const base = mkdtempSync("/var/tmp/pps-alias-");
    t.after(() => rmSync(base, { recursive: true, force: true }));
    const project = join(base, "proj");
    await mkdir(project);
    writeFileSync(join(base, "private.txt"), "host-private\n");
    await symlink(project, join(base, "work"));
    const runtimeRoot = mkdtempSync("/var/tmp/pps-alias-rt-");
    t.after(() => rmSync(runtimeRoot, { recursive: true, force: true }));
    const { PythonSandbox } = await import("../index.cjs");
    const sb = new PythonSandbox({ projectDir: project, runtimeRoot, prewarm: false });
    t.after(() => sb.dispose());
    sb.applyModeEvent({ mode: "yolo", readRoots: [] });
    const plant = await sb.execute(`import os\nos.symlink(${lit(join(base, "private.txt"))}, "/workspace/report.csv")`);
    assert.equal(plant.status, "ok", plant.text);
    const via = join(base, "work", "report.csv");
    // Baseline: on the host the path leads to the private file.
    assert.equal(realpathSync(via), join(base, "private.txt"));
    const r = await sb.execute(`open(${lit(via)}).read()`);
    assert.equal(r.status, "permission_needed", r.text);
    assert.equal(sb.readDecision(via, true).prompt, true);
    const answer = sb.answerRead(via, false, "allow");
    assert.equal(answer.replay, false);
    assert.match(answer.diagnostic ?? "", /which the sandbox can write/);
    assert.deepEqual(sb.status().allowedOnce, []);
    const change = sb.applyModeEvent({ mode: "yolo", readRoots: [join(base, "work")] });
    assert.deepEqual(change.readRoots, []);
  });

  test("an allow once is used once: twice is no replay, and one whose start failed is gone", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const dir = mkdtempSync("/var/tmp/pps-once-");
    t.after(() => rmSync(dir, { recursive: true, force: true }));
    const file = join(dir, "data.csv");
    writeFileSync(file, "1,2\n");
    const { sb } = await makeFixture(t, { prewarm: false });
    sb.applyModeEvent({ mode: "manual", readRoots: [] });
    const code = `print(open(${lit(file)}).read())`;
    assert.equal((await sb.execute(code)).status, "permission_needed");
    sb.readDecision(file, true);
    assert.equal(sb.answerRead(file, false, "allow").replay, true);
    const replay = await sb.execute(`n = 1\n${code}`);
    assert.match(replay.text, /1,2/);
    // The same path allowed once again (a forged second prompt): nothing to replay on a fresh interpreter.
    sb.readDecision(file, true);
    const again = sb.answerRead(file, false, "allow");
    assert.equal(again.replay, false);
    assert.match(again.diagnostic ?? "", /already mounted/);
    assert.match((await sb.execute("print(n)")).text, /^1$/m, "the interpreter was not replaced");
    // A start that fails takes its allow-once path with it.
    await sb.reset();
    assert.equal((await sb.execute(code)).status, "permission_needed");
    sb.readDecision(file, true);
    assert.equal(sb.answerRead(file, false, "allow").replay, true);
    rmSync(file);
    const failed = await sb.execute(code);
    assert.notEqual(failed.status, "ok");
    assert.deepEqual(sb.status().allowedOnce, []);
    writeFileSync(file, "3,4\n");
    const later = await sb.execute(`import os\nprint(os.path.exists(${lit(file)}))`);
    assert.match(later.text, /^False$/m, "not mounted again");
  });
});

// Alone in its suite and one test at a time: they measure this process's CPU time.
describe("what the host spends on a sandbox's changes to the project is bounded", { concurrency: 1 }, () => {
  /** Inert entries anywhere in `dir` (not entering them). */
  const inertCount = (dir: string): number => {
    let n = 0;
    for (const e of readdirSync(dir, { withFileTypes: true })) {
      if (e.name.includes(".pi-inert")) n++;
      else if (e.isDirectory() && e.name !== ".git") n += inertCount(join(dir, e.name));
    }
    return n;
  };
  /** A background process, started 1.5 s after its call returned, runs `body` in /workspace for ever. */
  const background = (body: string) =>
    [
      "import os, time",
      "if os.fork() == 0:",
      "    try:",
      "        os.setsid()",
      '        os.chdir("/workspace")',
      "        time.sleep(1.5)",
      "        i = 0",
      "        while True:",
      "            try:",
      ...body.split("\n").map((l) => `                ${l}`),
      "            except OSError:",
      "                pass",
      "            i += 1",
      "    finally:",
      "        os._exit(0)",
      '"started"',
    ].join("\n");
  const NAMES_FLOOD = `d = "." if i % 2 else "d%d" % (i % 50)
os.makedirs(d, exist_ok=True)
open(d + "/.envrc", "w").close()
open(d + "/.yarnrc.yml", "w").close()
os.mkdir(d + "/.git")`;
  const UNBOUNDED = { PI_PYTHON_TOOL_MAX_INERT: "100000000", PI_PYTHON_TOOL_WATCH_CPU: "100000000" };

  test("a background flood of protected names stops the sandbox; the host's CPU and the inert names stay bounded", async (t) => {
    if (skipWithoutSandbox(t)) return;
    // Baseline: the same flood with the bounds out of reach. Before: this is what every
    // sandbox cost (the guard renamed thousands of names a second, and the project filled).
    withEnv(t, UNBOUNDED);
    const base = await makeFixture(t, { prewarm: false });
    base.sb.applyModeEvent({ mode: "yolo", readRoots: [] });
    assert.equal((await base.sb.execute(background(NAMES_FLOOD))).repr, "'started'");
    // Measured once the flood runs (it starts 1.5 s after the call, later on a loaded machine).
    assert.ok(await waitUntil(() => inertCount(base.project) > 0, 10_000), "baseline: the flood never started");
    // The busiest of three seconds: on a loaded machine the flood itself gets little CPU in some.
    let baseline = 0;
    for (let i = 0; i < 3; i++) baseline = Math.max(baseline, await addonCpuOver(1000));
    const baselineInert = inertCount(base.project);
    await base.sb.dispose("test");

    withEnv(t, { PI_PYTHON_TOOL_MAX_INERT: undefined, PI_PYTHON_TOOL_WATCH_CPU: undefined });
    const { sb, project, runtimeRoot } = await makeFixture(t, { prewarm: false });
    sb.applyModeEvent({ mode: "yolo", readRoots: [] });
    assert.equal((await sb.execute(background(NAMES_FLOOD))).repr, "'started'");
    // The flood starts after 1.5 s and is stopped at once (within 20 s on a loaded machine);
    // what its end costs (the names it left made inert) is over a second after.
    assert.ok(await waitUntil(() => hostPidsWithCmdline(runtimeRoot).length === 0, 20_000, 250), "the flood was never stopped");
    await new Promise((resolve) => setTimeout(resolve, 1000));
    const after = await addonCpuOver(1000);
    const inert = inertCount(project);
    t.diagnostic(`after the stop ${after.toFixed(1)} ms of CPU in 1 s, ${inert} inert names; baseline ${baseline.toFixed(1)} ms, ${baselineInert} names`);
    assert.ok(baseline > 20, `baseline: the flood costs the host CPU (${baseline.toFixed(0)} ms in 1 s)`);
    assert.ok(baselineInert > 500, `baseline: the project fills with inert names (${baselineInert})`);
    // The pacing alone holds the baseline under 100 ms (it was 500-900 ms a second without it).
    assert.ok(after * 3 < baseline, `after the stop: ${after.toFixed(0)} ms of CPU in 1 s, baseline ${baseline.toFixed(0)} ms`);
    // 256 renames while it ran; then what it left (3 names in each of 51 directories at most).
    assert.ok(inert <= 256 + 3 * 51, `${inert} inert names in the project`);
    const next = await sb.execute("1");
    assert.equal(next.stateLost, true, show(next));
    assert.match(next.stateLostReason ?? "", /^the sandbox was killed between executions: the sandbox made more protected names in the project than the host renames for one sandbox: \d+ renamed to inert names \(the last .*\), the most is 256 \(PI_SANDBOX_MAX_INERT\); it was stopped$/);
    assert.doesNotMatch(next.stateLostReason ?? "", /\n/);
    assert.ok(!existsSync(join(project, ".envrc")) && !existsSync(join(project, "d1/.envrc")), "a name stayed active");
    await new Promise((resolve) => setTimeout(resolve, 500));
    assert.equal(inertCount(project), inert, "the flood ended with the sandbox");
  });

  test("a background flood of new names the watches look at stops the sandbox; the host's CPU stays bounded", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const FLOOD = `open("f%d" % (i % 8), "w").close()\nos.unlink("f%d" % (i % 8))`;
    // Baseline: no bound in reach; before, every sandbox cost this for as long as it flooded.
    withEnv(t, UNBOUNDED);
    const base = await makeFixture(t, { prewarm: false });
    base.sb.applyModeEvent({ mode: "yolo", readRoots: [] });
    assert.equal((await base.sb.execute(background(FLOOD))).repr, "'started'");
    // Measured once the flood runs (it starts 1.5 s after the call, later on a loaded machine):
    // its names are there half of the time.
    assert.ok(await waitUntil(() => readdirSync(base.project).some((n) => /^f[0-7]$/.test(n)), 10_000, 5), "baseline: the flood never started");
    // The busiest of three seconds: on a loaded machine the flood itself gets little CPU in some.
    let baseline = 0;
    for (let i = 0; i < 3; i++) baseline = Math.max(baseline, await addonCpuOver(1000));
    await base.sb.dispose("test");

    // A small budget (2 ms a second, 0.1 s of burst), so that the test is short.
    withEnv(t, { PI_PYTHON_TOOL_MAX_INERT: undefined, PI_PYTHON_TOOL_WATCH_CPU: "2" });
    const { sb, runtimeRoot } = await makeFixture(t, { prewarm: false });
    sb.applyModeEvent({ mode: "yolo", readRoots: [] });
    assert.equal((await sb.execute(background(FLOOD))).repr, "'started'");
    // Stopped within about a second of its start (0.1 s of burst spent at 100 ms a second and more)
    // on an idle machine; on a loaded one the watch gets less CPU and takes longer to spend its
    // burst, hence the wide bound.
    assert.ok(await waitUntil(() => hostPidsWithCmdline(runtimeRoot).length === 0, 60_000, 250), "the flood was never stopped");
    await new Promise((resolve) => setTimeout(resolve, 1000));
    const after = await addonCpuOver(1000);
    t.diagnostic(`after the stop ${after.toFixed(1)} ms of CPU in 1 s; baseline ${baseline.toFixed(1)} ms`);
    // Ten times the budget set below: enough for the budget to stop it. The figure itself varies
    // with the machine (about 300-450 ms idle here, 58 ms in one clean CI run).
    assert.ok(baseline > 20, `baseline: the flood costs the host CPU (${baseline.toFixed(0)} ms in 1 s)`);
    assert.ok(after * 5 < baseline, `after the stop: ${after.toFixed(0)} ms of CPU in 1 s, baseline ${baseline.toFixed(0)} ms`);
    const next = await sb.execute("1");
    assert.equal(next.stateLost, true, show(next));
    assert.match(next.stateLostReason ?? "", /^the sandbox was killed between executions: the sandbox kept the host busy .*: more than 2 ms of CPU a second on average \(over 50 s\), the most for one sandbox \(PI_SANDBOX_WATCH_CPU\); it was stopped$/);
  });

  test("ordinary work does not stop the sandbox: a tree like a checkout, packages with .npmrc, 20 protected names", async (t) => {
    if (skipWithoutSandbox(t)) return;
    withEnv(t, { PI_PYTHON_TOOL_MAX_INERT: undefined, PI_PYTHON_TOOL_WATCH_CPU: undefined });
    const { sb, project } = await makeFixture(t, { prewarm: false });
    sb.applyModeEvent({ mode: "yolo", readRoots: [] });
    const r = await sb.execute(py`
      import os
      for i in range(3000):
          d = "/workspace/src/p%d/q" % i
          os.makedirs(d)
          for j in range(10):
              open(d + "/f%d.py" % j, "w").close()
      for i in range(300):
          d = "/workspace/node_modules/pkg%d" % i
          os.makedirs(d)
          open(d + "/.npmrc", "w").close()
          open(d + "/package.json", "w").close()
      for i in range(20):
          os.makedirs("/workspace/x%d" % i)
          open("/workspace/x%d/.envrc" % i, "w").close()
      kept = 42
    `, 120); // The most a call may have: 36,000 creations take seconds, more under disk load.
    assert.equal(r.status, "ok", show(r));
    // The x*/.envrc are in new directories: the walk after the call makes them inert.
    const envrcs = () => readdirSync(project).filter((n) => /^x\d+$/.test(n)).map((x) => inert(join(project, x), ".envrc").length).reduce((a, b) => a + b, 0);
    assert.ok(await waitUntil(() => envrcs() === 20, 20_000), `${envrcs()} of the 20 .envrc made inert`);
    const next = await sb.execute("kept");
    assert.equal(next.stateLost, false, show(next));
    assert.equal(next.repr, "42");
    assert.equal(inertCount(join(project, "src")) + inertCount(join(project, "node_modules")), 0);
    assert.equal(envrcs(), 20);
  });
});
