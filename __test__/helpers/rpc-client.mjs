// A minimal client for `pi --mode rpc`: spawns the real CLI and reads its JSON lines. Plain
// JavaScript so that scripts/pack-test.mjs (no TypeScript loader) and the node:test files share it.
import { spawn } from "node:child_process";
import { readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

export const FAUX_EXTENSION = join(dirname(fileURLToPath(import.meta.url)), "..", "fixtures", "faux-provider");
export const FAUX_MODEL = "faux-rpc/scripted";

/** The `pi` executable of an installed pi-coding-agent package, as `npm install -g` links it. */
export function piCli(packageDir) {
  const pkg = JSON.parse(readFileSync(join(packageDir, "package.json"), "utf8"));
  return join(packageDir, typeof pkg.bin === "string" ? pkg.bin : pkg.bin.pi);
}

/**
 * Starts `node <cli> --mode rpc --no-session --offline --no-extensions -e <each extension>
 * -e <faux provider> --model faux-rpc/scripted` with the faux model's `script` (see
 * fixtures/faux-provider) in `cwd`. `env` is the whole environment; PI_CODING_AGENT_DIR should be
 * a temp dir.
 */
export function startRpcPi({ node = process.execPath, cli, extensions, script, cwd, env, noDiscovery = true }) {
  const args = [cli, "--mode", "rpc", "--no-session", "--offline", ...(noDiscovery ? ["--no-extensions"] : [])];
  for (const e of [...extensions, FAUX_EXTENSION]) args.push("-e", e);
  args.push("--model", FAUX_MODEL);
  const child = spawn(node, args, {
    cwd,
    env: { ...env, PI_FAUX_SCRIPT: JSON.stringify(script) },
    stdio: ["pipe", "pipe", "pipe"],
  });
  return new RpcPi(child);
}

/** pi over RPC: JSON lines out (split on "\n" only, as pi's docs/rpc.md asks), commands in. */
export class RpcPi {
  /** @type {Record<string, any>[]} */
  lines = [];
  /** When each of `lines` arrived (performance.now(), ms), for timing through pi. */
  /** @type {number[]} */
  arrivals = [];
  stderr = "";
  #buffer = "";
  /** @type {(() => void)[]} */
  #waiters = [];

  /** @param {import("node:child_process").ChildProcessWithoutNullStreams} child */
  constructor(child) {
    this.child = child;
    child.stdout.setEncoding("utf8");
    child.stdout.on("data", (chunk) => {
      this.#buffer += chunk;
      let nl;
      while ((nl = this.#buffer.indexOf("\n")) >= 0) {
        const raw = this.#buffer.slice(0, nl).replace(/\r$/, "");
        this.#buffer = this.#buffer.slice(nl + 1);
        if (!raw.trim()) continue;
        this.arrivals.push(performance.now());
        try {
          this.lines.push(JSON.parse(raw));
        } catch {
          this.lines.push({ type: "(not json)", raw });
        }
      }
      this.#wake();
    });
    child.stderr.setEncoding("utf8");
    child.stderr.on("data", (chunk) => {
      this.stderr += chunk;
    });
    /** @type {Promise<{ code: number | null, signal: NodeJS.Signals | null }>} */
    this.exited = new Promise((resolve) => child.once("exit", (code, signal) => resolve({ code, signal })));
    void this.exited.then(() => this.#wake());
  }

  #wake() {
    for (const wake of this.#waiters.splice(0)) wake();
  }

  get running() {
    return this.child.exitCode === null && this.child.signalCode === null;
  }

  send(command) {
    this.child.stdin.write(`${JSON.stringify(command)}\n`);
  }

  /** The first line matching `pred`; throws after `timeoutMs` or when pi exits first. */
  async waitFor(pred, what, timeoutMs = 60_000) {
    const end = Date.now() + timeoutMs;
    for (;;) {
      const found = this.lines.find(pred);
      if (found) return found;
      if (!this.running) throw new Error(`pi exited (${this.child.exitCode ?? this.child.signalCode}) before ${what}\n${this.context()}`);
      const left = end - Date.now();
      if (left <= 0) throw new Error(`no ${what} within ${timeoutMs} ms\n${this.context()}`);
      await new Promise((resolve) => {
        const timer = setTimeout(resolve, Math.min(left, 1000));
        this.#waiters.push(() => {
          clearTimeout(timer);
          resolve();
        });
      });
    }
  }

  /** Sends a prompt and resolves to the first python tool_execution_end line. */
  async runPrompt(message, timeoutMs = 60_000) {
    const id = `prompt-${this.lines.length}`;
    this.send({ id, type: "prompt", message });
    const accepted = await this.waitFor((l) => l.type === "response" && l.id === id, "the prompt response", timeoutMs);
    if (!accepted.success) throw new Error(`prompt refused: ${JSON.stringify(accepted)}`);
    return this.waitFor((l) => l.type === "tool_execution_end", "tool_execution_end", timeoutMs);
  }

  /** Closes stdin (pi's clean shutdown) and waits up to `timeoutMs` for the exit; null when it did not exit. */
  async close(timeoutMs = 10_000) {
    this.child.stdin.end();
    let timer;
    const exit = await Promise.race([this.exited, new Promise((resolve) => (timer = setTimeout(() => resolve(null), timeoutMs)))]);
    clearTimeout(timer);
    return exit;
  }

  /** SIGKILL if still running, then wait for the exit. */
  async kill() {
    if (!this.running) return;
    this.child.kill("SIGKILL");
    await this.exited;
  }

  /** What to print when something goes wrong: the event types seen and stderr. */
  context() {
    return `stdout types: ${this.lines.map((l) => l.type).join(", ")}\nstderr:\n${this.stderr}`;
  }
}

/** The text parts of a tool result or message. */
export function toolText(result) {
  return (result?.content ?? []).filter((c) => c.type === "text").map((c) => c.text ?? "").join("\n");
}

/** Live processes whose command line mentions `needle`. */
export { hostPidsWithCmdline as processesMentioning } from "../../scripts/lib/procs.mjs";

/** Files mapped into process `pid` whose path ends with `suffix` (e.g. ".node"). */
export function mappedFiles(pid, suffix) {
  const files = new Set();
  for (const line of readFileSync(`/proc/${pid}/maps`, "utf8").split("\n")) {
    const path = line.split(/\s+/).slice(5).join(" ");
    if (path.endsWith(suffix)) files.add(path);
  }
  return [...files];
}
