/**
 * The host-secret list wherever a host path shows, from inside the sandbox: a fake home (with
 * fake credential stores and histories) used as the project, held by the project as another
 * user's home, mounted as a read root; and a grant of one file inside a masked directory, which
 * opens that file alone. Each attempt is one named test; its baseline is the same read outside
 * the defence (plain bubblewrap over the same directory), which returns the content.
 * Run: PI_PYTHON_TOOL_ROLLBACK=0 node --import tsx --test __test__/hostsecrets.test.ts
 */
import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { mkdir, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { describe, type TestContext, test } from "node:test";
import { skipWithoutSandbox } from "./helpers/sandbox-env.ts";
import { type ExecResult, jsonOut, makeFixture, makeFixtureWithoutSpare, py, show } from "./helpers/sandbox-fixture.ts";
import { unfiltered } from "./helpers/unfiltered.ts";

/** Fake credential stores of a home, each with a marker of its own. */
const STORES: Record<string, string> = {
  ".ssh/id_ed25519": "hs-ssh-key-01",
  ".aws/credentials": "hs-aws-02",
  ".git-credentials": "hs-gitcred-03",
  ".config/git/credentials": "hs-xdg-gitcred-04",
  ".config/gh/hosts.yml": "hs-gh-05",
  ".pi/agent/auth.json": "hs-pi-auth-06",
  ".pi/agent/models.json": "hs-pi-models-07",
  ".claude/.credentials.json": "hs-claude-08",
  ".codex/auth.json": "hs-codex-09",
  ".gemini/oauth_creds.json": "hs-gemini-10",
  ".kube/config": "hs-kube-11",
  ".docker/config.json": "hs-docker-12",
  ".pgpass": "hs-pgpass-13",
  ".my.cnf": "hs-mycnf-14",
  ".terraform.d/credentials.tfrc.json": "hs-tf-15",
  ".mozilla/firefox/a1b2.default/logins.json": "hs-firefox-16",
  ".config/google-chrome/Default/Login Data": "hs-chrome-17",
  ".subversion/auth/svn.simple/0123abcd": "hs-svn-18",
  ".hgrc": "hs-hgrc-19",
  ".config/sops/age/keys.txt": "hs-sops-20",
  ".config/configstore/firebase-tools.json": "hs-firebase-26",
  ".yarnrc.yml": "hs-yarn-27",
  ".config/io.datasette.llm/keys.json": "hs-llm-28",
  ".continue/config.json": "hs-continue-29",
  ".qwen/oauth_creds.json": "hs-qwen-30",
  ".ethereum/keystore/UTC--2024": "hs-eth-31",
  ".ansible/vault_pass.txt": "hs-ansible-32",
  ".config/filezilla/sitemanager.xml": "hs-filezilla-33",
  ".config/Code/User/globalStorage/state.vscdb": "hs-vscode-34",
  ".claude/projects/-home-u-app/0a1b.jsonl": "hs-claude-log-40",
  ".codex/sessions/2026/rollout.jsonl": "hs-codex-log-41",
  ".gemini/tmp/abc/logs.json": "hs-gemini-log-42",
  ".config/pnpm/rc": "hs-pnpm-43",
  ".minikube/profiles/minikube/client.key": "hs-minikube-44",
  ".cloudflared/cert.pem": "hs-cloudflared-45",
  ".local/share/Trash/files/.env": "hs-trash-46",
};
/** Shell and REPL histories. */
const HISTORIES: Record<string, string> = {
  ".bash_history": "hs-bash-hist-21",
  ".zsh_history": "hs-zsh-hist-22",
  ".python_history": "hs-py-hist-23",
  ".local/share/fish/fish_history": "hs-fish-hist-24",
  ".psql_history": "hs-psql-hist-25",
  ".Rhistory": "hs-r-hist-35",
  ".julia/logs/repl_history.jl": "hs-julia-hist-36",
  ".ipython/profile_work/history.sqlite": "hs-ipython-hist-37",
  ".local/share/nvim/shada/main.shada": "hs-nvim-hist-38",
  ".bash_sessions/0A1B.history": "hs-bash-sess-39",
  ".config/zsh/.zsh_history": "hs-zdotdir-hist-47",
  ".local/state/zsh/history": "hs-zsh-state-hist-48",
  ".mongodb/mongosh/history": "hs-mongosh-hist-49",
};
const MARKER = /hs-[a-z-]+-\d\d/;

async function put(dir: string, files: Record<string, string>): Promise<void> {
  for (const [p, content] of Object.entries(files)) {
    await mkdir(join(dir, p, ".."), { recursive: true });
    await writeFile(join(dir, p), `${content}\n`);
  }
}

/** Python that prints {path: content or the error} for each path, read by a subprocess `cat`. */
function catAll(paths: string[]): string {
  return py`
    import json, subprocess
    out = {}
    for p in ${JSON.stringify(paths)}:
        r = subprocess.run(["cat", p], capture_output=True, text=True)
        out[p] = r.stdout.strip() or r.stderr.strip()
    print(json.dumps(out))
  `;
}

const seen = (r: ExecResult) => JSON.stringify({ ...r, images: undefined });

/** Baseline: plain bubblewrap over `dir` at /workspace reads every `files` marker. */
async function baselineReads(dir: string, files: Record<string, string>, prefix = ""): Promise<void> {
  const paths = Object.keys(files).map((p) => `/workspace/${prefix}${p}`);
  const out = JSON.parse((await unfiltered(catAll(paths), { project: dir })).trim().split("\n").pop() ?? "{}");
  for (const [p, marker] of Object.entries(files)) {
    assert.equal(out[`/workspace/${prefix}${p}`], marker, `baseline: ${p} reads outside the defence`);
  }
}

function assertNoneRead(r: ExecResult, paths: string[]): void {
  assert.equal(r.status, "ok", show(r));
  assert.doesNotMatch(seen(r), MARKER, `a host secret leaked: ${show(r)}`);
  const out = jsonOut(r) as Record<string, string>;
  assert.deepEqual(Object.keys(out).sort(), [...paths].sort());
}

describe("pi started in a home directory: its credential stores are masked in the project", () => {
  for (const mode of ["manual", "yolo"]) {
    test(`each store of a home that is the project reads empty (${mode})`, async (t: TestContext) => {
      if (skipWithoutSandbox(t)) return;
      const fx = await makeFixtureWithoutSpare(t);
      await put(fx.project, STORES);
      await baselineReads(fx.project, STORES);
      fx.sb.applyModeEvent({ mode, readRoots: [] });
      const paths = Object.keys(STORES).map((p) => `/workspace/${p}`);
      assertNoneRead(await fx.sb.execute(catAll(paths)), paths);
      // The masks are listed, and open() of one is refused as a host secret, without a prompt.
      const s = fx.sb.status();
      assert.ok(s.maskedPaths.includes("/workspace/.pi/agent/auth.json"), JSON.stringify(s.maskedPaths));
      const verdict = fx.sb.readDecision("/workspace/.codex/auth.json", true);
      assert.equal(verdict.prompt, false);
      assert.match(verdict.diagnostic ?? "", /is a host secret/);
    });
  }

  test("the home's histories read empty", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const fx = await makeFixtureWithoutSpare(t);
    await put(fx.project, HISTORIES);
    await baselineReads(fx.project, HISTORIES);
    const paths = Object.keys(HISTORIES).map((p) => `/workspace/${p}`);
    assertNoneRead(await fx.sb.execute(catAll(paths)), paths);
  });

  test("another user's home inside the project is masked too", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const fx = await makeFixtureWithoutSpare(t);
    await put(join(fx.project, "home", "alice"), STORES);
    await baselineReads(fx.project, STORES, "home/alice/");
    const paths = Object.keys(STORES).map((p) => `/workspace/home/alice/${p}`);
    assertNoneRead(await fx.sb.execute(catAll(paths)), paths);
  });

  test("the host-secret masks hold with the project's secret patterns off", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const fx = await makeFixtureWithoutSpare(t);
    await put(fx.project, { ".pi/agent/auth.json": "hs-pi-auth-06", ".aws/credentials": "hs-aws-02" });
    const old = process.env.PI_PYTHON_TOOL_SECRETS;
    process.env.PI_PYTHON_TOOL_SECRETS = "";
    t.after(() => {
      if (old === undefined) delete process.env.PI_PYTHON_TOOL_SECRETS;
      else process.env.PI_PYTHON_TOOL_SECRETS = old;
    });
    const paths = ["/workspace/.pi/agent/auth.json", "/workspace/.aws/credentials"];
    assertNoneRead(await fx.sb.execute(catAll(paths)), paths);
  });
});

describe("a home granted as a read root", () => {
  test("each store and history of a home that is a read root reads empty", async (t) => {
    if (skipWithoutSandbox(t)) return;
    // Not under /tmp (a reserved mount): the root must be mountable.
    const home = mkdtempSync("/var/tmp/pps-fake-home-");
    t.after(() => rmSync(home, { recursive: true, force: true }));
    const files = { ...STORES, ...HISTORIES };
    await put(home, files);
    await baselineReads(home, files);
    const fx = await makeFixture(t, { prewarm: false });
    const change = fx.sb.applyModeEvent({ mode: "manual", readRoots: [home] });
    assert.deepEqual(change.readRoots, [home]);
    assert.match(change.notification ?? "", /host secrets masked: .*\.claude\/\.credentials\.json/);
    const paths = Object.keys(files).map((p) => join(home, p));
    assertNoneRead(await fx.sb.execute(catAll(paths)), paths);
  });
});

describe("allow once opens exactly the path it names", () => {
  test("allowing one file under a masked directory unmasks that file alone", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const fx = await makeFixtureWithoutSpare(t);
    await put(fx.project, { "secrets/README.md": "readme-ok", "secrets/prod.env": "hs-prod-env-31", "secrets/deep/key": "hs-deep-key-32" });
    fx.sb.applyModeEvent({ mode: "manual", readRoots: [] });
    const r = await fx.sb.execute("print(open('/workspace/secrets/README.md').read())");
    assert.equal(r.status, "permission_needed", show(r));
    assert.equal(fx.sb.readDecision("/workspace/secrets/README.md", true).prompt, true);
    const answer = fx.sb.answerRead("/workspace/secrets/README.md", false, "allow");
    assert.equal(answer.replay, true, answer.diagnostic ?? "");
    const code = py`
      import json, os, subprocess
      cat = lambda p: subprocess.run(["cat", p], capture_output=True, text=True).stdout.strip()
      print(json.dumps({"readme": cat("/workspace/secrets/README.md"), "prod": cat("/workspace/secrets/prod.env"),
                        "deep": cat("/workspace/secrets/deep/key"), "names": sorted(os.listdir("/workspace/secrets"))}))
    `;
    const after = await fx.sb.execute(code);
    assert.doesNotMatch(seen(after), MARKER, `more than the allowed file was unmasked: ${show(after)}`);
    assert.deepEqual(jsonOut(after), { readme: "readme-ok", prod: "", deep: "", names: ["README.md"] });
  });

  test("a read root naming one file under a masked directory unmasks that file alone", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const fx = await makeFixtureWithoutSpare(t);
    await put(fx.project, { "secrets/README.md": "readme-ok", "secrets/prod.env": "hs-prod-env-31" });
    const change = fx.sb.applyModeEvent({ mode: "manual", readRoots: [join(fx.project, "secrets", "README.md")] });
    assert.match(change.notification ?? "", /secrets no longer masked at or under: .*secrets\/README\.md/);
    const r = await fx.sb.execute(catAll(["/workspace/secrets/README.md", "/workspace/secrets/prod.env"]));
    assert.doesNotMatch(seen(r), MARKER, show(r));
    assert.deepEqual(jsonOut(r), { "/workspace/secrets/README.md": "readme-ok", "/workspace/secrets/prod.env": "cat: /workspace/secrets/prod.env: No such file or directory" });
  });

  test("a host secret inside the project is never unmasked by allow once", async (t) => {
    if (skipWithoutSandbox(t)) return;
    const fx = await makeFixtureWithoutSpare(t);
    await put(fx.project, { ".aws/credentials": "hs-aws-02" });
    fx.sb.applyModeEvent({ mode: "manual", readRoots: [] });
    const first = await fx.sb.execute("print(open('/workspace/.aws/credentials').read())");
    assert.equal(first.status, "permission_needed", show(first));
    assert.doesNotMatch(seen(first), MARKER, show(first));
    const answer = fx.sb.answerRead("/workspace/.aws/credentials", false, "allow");
    assert.equal(answer.replay, false);
    assert.match(answer.diagnostic ?? "", /is a host secret/);
    const r = await fx.sb.execute(catAll(["/workspace/.aws/credentials"]));
    assert.doesNotMatch(seen(r), MARKER, show(r));
  });
});
