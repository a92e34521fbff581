#!/usr/bin/env node
// The README's screen ("What it looks like"), captured from the real TUI: pi 0.73 in tmux,
// 100 columns, with the scripted model of __test__/fixtures/faux-provider (no network, no key).
// Prints the screen from the prompt down; the README shows it as it is.
//   node scripts/readme-screen.mjs [--width 100]
import { execFileSync } from "node:child_process";
import { mkdirSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { FAUX_EXTENSION, FAUX_MODEL, piCli } from "../__test__/helpers/rpc-client.mjs";

const ROOT = fileURLToPath(new URL("..", import.meta.url));
const at = process.argv.indexOf("--width");
const WIDTH = at > 0 ? Number(process.argv[at + 1]) : 100;
const HEIGHT = 90;

const FIRST = [
  "import statistics",
  "data = [3, 1, 4, 1, 5, 9, 2, 6]",
  'print("mean", statistics.mean(data))',
  "for i in range(30):",
  '    print("row", i)',
  "def f(x):",
  "    # a later call's traceback shows this line",
  "    y = x * 2",
  "    return y / x",
  "statistics.median(data)",
].join("\n");
const SCRIPT = [
  { toolCalls: [{ name: "python", arguments: { code: FIRST } }] },
  { toolCalls: [{ name: "bash", arguments: { command: "for i in $(seq 0 29); do echo row $i; done" } }] },
  { toolCalls: [{ name: "python", arguments: { code: "f(0)" } }] },
  { text: "Done." },
];

const tmux = (...args) => execFileSync("tmux", args, { encoding: "utf8" });
const base = mkdtempSync(join(tmpdir(), "pi-python-screen-"));
const session = `pps-screen-${process.pid}`;
try {
  const agentDir = join(base, "agent");
  const cwd = join(base, "project");
  const tmp = join(base, "tmp");
  for (const d of [agentDir, cwd, tmp]) mkdirSync(d);
  const env = {
    PI_CODING_AGENT_DIR: agentDir,
    TMPDIR: tmp,
    PI_FAUX_SCRIPT: JSON.stringify(SCRIPT),
    TERM: "xterm-256color",
  };
  const argv = [process.execPath, piCli(join(ROOT, "node_modules", "@mariozechner", "pi-coding-agent")), "--no-session", "--offline",
    "--no-extensions", "-e", ROOT, "-e", FAUX_EXTENSION, "--model", FAUX_MODEL, "run the demo"];
  const quote = (s) => `'${String(s).replaceAll("'", "'\\''")}'`;
  const command = `cd ${quote(cwd)} && env ${Object.entries(env).map(([k, v]) => `${k}=${quote(v)}`).join(" ")} ${argv.map(quote).join(" ")}`;
  // pi warns when tmux does not pass modified keys: set before pi starts.
  tmux("new-session", "-d", "-s", session, "-x", String(WIDTH), "-y", String(HEIGHT), "sleep 600");
  tmux("set-option", "-s", "extended-keys", "on");
  tmux("respawn-pane", "-k", "-t", session, command);
  const deadline = Date.now() + 120_000;
  let screen = "";
  while (Date.now() < deadline) {
    execFileSync("sleep", ["0.5"]);
    screen = tmux("capture-pane", "-p", "-t", session);
    if (/^ Done\.$/m.test(screen)) break;
  }
  if (!/^ Done\.$/m.test(screen)) throw new Error(`pi did not finish the script:\n${screen}`);
  execFileSync("sleep", ["0.5"]);
  screen = tmux("capture-pane", "-p", "-t", session);
  const lines = screen.split("\n").map((l) => l.trimEnd());
  const from = lines.findIndex((l) => l.trim() === "run the demo");
  const to = lines.findIndex((l) => l.trim() === "Done.");
  process.stdout.write(`${lines.slice(from, to).join("\n").trimEnd()}\n`);
} finally {
  try {
    tmux("kill-session", "-t", session);
  } catch {}
  rmSync(base, { recursive: true, force: true });
}
