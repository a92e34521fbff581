/**
 * The sandboxed `bash` tool: pi's own bash tool definition
 * (`createBashToolDefinition`, so pi's schema, renderer, streaming, truncation,
 * full-output file and result shape stay pi's) with its operations replaced by
 * a sandbox shell, and the user's `!cmd` (`user_bash`) on the host by default
 * or through the same shell when the trusted configuration says so.
 *
 * The shell is injected (`SandboxShell`, made by the native addon); this module
 * owns pi's side of the contract: the user's shell settings, pi's error texts
 * (`Error("aborted")`, `Error("timeout:N")`, an exit code), and never letting a
 * command fall back to the host: a shell that cannot start rejects with its
 * diagnostic. pi's environment (every API key of the pi process) is never
 * handed on; only pi's session variables are.
 */
import { constants } from "node:os";
import type { BashOperations, ExtensionAPI, ExtensionContext } from "@mariozechner/pi-coding-agent";
import { createBashToolDefinition, getAgentDir, SettingsManager } from "@mariozechner/pi-coding-agent";
import { displayLine } from "./display.ts";
import { type NetworkChoice, type NetworkDialog, type NetworkReviewBus, type NetworkReviewRequest, attachNetworkReviewBus, networkDialog } from "./netreview.ts";

export type { NetworkChoice, NetworkDialog, NetworkReviewRequest } from "./netreview.ts";
export { NETWORK_REVIEW_TIMEOUT_MS, networkDialog } from "./netreview.ts";

/** What the native addon provides: one command in a fresh sandbox. */
export interface SandboxShell {
  /**
   * Runs `command` (pi's `shellCommandPrefix` is already prepended, as pi does) with `opts.shellPath`
   * (the user's `shellPath` setting, else bash) inside the sandbox, in `cwd`, streaming its output
   * through `onData`. On `signal` it kills every process of the sandbox; with `timeout` (seconds) it
   * may do the same and reject `Error("timeout:N")` (this module enforces the timeout as well).
   * Resolves the exit code, `128 + signal` for a killed command. Rejects with the diagnostic and its
   * fix when the sandbox cannot start; never runs the command anywhere else.
   *
   * `opts.env` holds only pi's session variables (`PI_SESSION_ID`, ... on pi 1.x), never pi's
   * environment: the sandbox builds its own from an allowlist.
   *
   * `opts.review` opens the dialog about a network destination no entry matches; without it (no
   * UI) such a connection is refused at once. Its signal ends with the command.
   */
  exec(
    command: string,
    cwd: string,
    opts: {
      onData: (data: Buffer) => void;
      signal?: AbortSignal;
      timeout?: number;
      env?: NodeJS.ProcessEnv;
      shellPath?: string;
      review?: (request: NetworkReviewRequest, signal: AbortSignal) => Promise<NetworkChoice>;
    },
  ): Promise<{ exitCode: number | null; signal?: NodeJS.Signals | number | null }>;
}

export interface BashConfig {
  /** "sandbox" (default): this package's `bash`; "host": pi's own. */
  bash: "sandbox" | "host";
  /** "host" (default): the user's `!cmd` runs on the host as pi runs it; "sandbox": through the shell. */
  userBash: "host" | "sandbox";
}

/** The shell for a command in `cwd`, or why there is none (the diagnostic and the fix). */
export type ShellSource = (cwd: string) => SandboxShell | Error;

/** pi 1.x's session variables (its bash tool sets them on the env it hands to exec). */
const SESSION_VARIABLES = ["PI_SESSION_ID", "PI_SESSION_FILE", "PI_PROVIDER", "PI_MODEL", "PI_REASONING_LEVEL"];

/** Whether PI_SANDBOX_BASH turns the sandboxed bash off (0, false, off, no). */
export function sandboxBashDisabled(value = process.env.PI_SANDBOX_BASH): boolean {
  return /^(0|false|off|no)$/i.test(value?.trim() ?? "");
}

interface ShellSettings {
  shellPath?: string;
  shellCommandPrefix?: string;
}

/**
 * The user's shell settings as pi's built-in bash gets them: pi 1.x hands extensions its effective
 * settings; pi 0.73 does not, and its settings manager is made the way pi makes it (the agent
 * dir's settings.json and the project's .pi/settings.json).
 */
function readShellSettings(pi: ExtensionAPI, cwd: string): ShellSettings {
  try {
    const getSettings = (pi as { getSettings?: () => ShellSettings }).getSettings;
    if (typeof getSettings === "function") {
      const s = getSettings.call(pi);
      return { shellPath: s?.shellPath, shellCommandPrefix: s?.shellCommandPrefix };
    }
    const manager = SettingsManager.create(cwd, getAgentDir());
    return { shellPath: manager.getShellPath(), shellCommandPrefix: manager.getShellCommandPrefix() };
  } catch {
    return {};
  }
}

const errorText = (err: unknown) => (err instanceof Error ? err.message : String(err));

/** The shell from `source`, with a throwing source counted as one that cannot start. */
function shellFor(source: ShellSource, cwd: string): SandboxShell | Error {
  try {
    const shell = source(cwd);
    if (shell instanceof Error) return shell;
    if (!shell || typeof shell.exec !== "function") return new Error("the sandboxed bash is unavailable: no shell was provided");
    return shell;
  } catch (err) {
    return new Error(`the sandboxed bash is unavailable: ${errorText(err)}`);
  }
}

/** A signal name or number as `128 + n` (the shell's convention for a killed command). */
function signalExit(signal: NodeJS.Signals | number): number | undefined {
  const n = typeof signal === "number" ? signal : constants.signals[signal];
  return typeof n === "number" ? 128 + n : undefined;
}

/**
 * pi's `BashOperations` over the shell: pi's error contract, whatever the shell does. An abort
 * always rejects `Error("aborted")`, a timeout `Error("timeout:N")` (the shell is stopped through
 * its signal at N seconds), a killed command resolves `128 + signal`, and a missing exit status is
 * a failure (pi 0.73 would count `null` as success).
 */
export function sandboxOperations(source: ShellSource, shellPath: () => string | undefined, dialog?: NetworkDialog): BashOperations {
  return {
    async exec(command, cwd, { onData, signal, timeout, env }) {
      if (signal?.aborted) throw new Error("aborted");
      const shell = shellFor(source, cwd);
      if (shell instanceof Error) throw shell;
      const stop = new AbortController();
      let timedOut = false;
      const onAbort = () => stop.abort();
      signal?.addEventListener("abort", onAbort, { once: true });
      const timer =
        timeout !== undefined && timeout > 0
          ? setTimeout(() => {
              timedOut = true;
              stop.abort();
            }, timeout * 1000)
          : undefined;
      const sessionEnv: NodeJS.ProcessEnv = {};
      for (const name of SESSION_VARIABLES) if (typeof env?.[name] === "string") sessionEnv[name] = env[name];
      try {
        let result: Awaited<ReturnType<SandboxShell["exec"]>>;
        try {
          const review = dialog ? (r: NetworkReviewRequest, s: AbortSignal) => dialog(r, command, s) : undefined;
          result = await shell.exec(command, cwd, { onData, signal: stop.signal, timeout, env: sessionEnv, shellPath: shellPath(), review });
        } catch (err) {
          if (signal?.aborted) throw new Error("aborted");
          if (timedOut || (err instanceof Error && err.message.startsWith("timeout:"))) throw new Error(`timeout:${timeout}`);
          throw err instanceof Error ? err : new Error(String(err));
        }
        if (signal?.aborted) throw new Error("aborted");
        if (timedOut) throw new Error(`timeout:${timeout}`);
        if (typeof result?.exitCode === "number") return { exitCode: result.exitCode };
        const killed = result?.signal != null ? signalExit(result.signal) : undefined;
        if (killed !== undefined) return { exitCode: killed };
        onData(Buffer.from("\n[the command ended without an exit status]\n"));
        return { exitCode: 1 };
      } finally {
        if (timer) clearTimeout(timer);
        signal?.removeEventListener("abort", onAbort);
      }
    },
  };
}

/** What the addon's session offers the bash tool (see `PythonSandbox.execShell`). */
export interface ShellHost {
  execShell(
    callId: number,
    command: string,
    options: { cwd: string; shellPath?: string; timeoutSeconds?: number; env?: Record<string, string> },
    onData: (text: string) => void,
    onReview?: (request: NetworkReviewRequest) => Promise<string>,
  ): Promise<{ exitCode?: number | null; ending: string; notes: string[] }>;
  cancelShell(callId: number): boolean;
}

let nextShellCall = 1;

/**
 * The addon's shell: each command in a sandbox of its own (see `PythonSandbox.execShell`). What the
 * engine adds about the sandbox (a path it does not show, a protected name made inert, the output
 * cap) follows the output as lines of its own, marked `[sandbox]`, after what `once` has to say
 * (the trusted configuration's errors, in the first result).
 */
export function addonShell(host: ShellHost, once: () => string[] = () => []): SandboxShell {
  return {
    async exec(command, cwd, { onData, signal, timeout, env, shellPath, review }) {
      const id = nextShellCall++;
      // The command's open review dialogs close when it ends or is aborted.
      const dialogs = new AbortController();
      const onAbort = () => {
        dialogs.abort();
        host.cancelShell(id);
      };
      signal?.addEventListener("abort", onAbort, { once: true });
      let last = "\n";
      const sessionEnv: Record<string, string> = {};
      for (const [name, value] of Object.entries(env ?? {})) if (typeof value === "string") sessionEnv[name] = value;
      try {
        if (signal?.aborted) throw new Error("aborted");
        const r = await host.execShell(
          id,
          command,
          { cwd, shellPath, timeoutSeconds: timeout !== undefined && timeout > 0 ? timeout : undefined, env: sessionEnv },
          (text) => {
            // The addon's last call is empty: it only marks the end of the output.
            if (text.length === 0) return;
            last = text[text.length - 1];
            // The addon calls this from its queue, where a throw would end pi's process.
            try {
              onData(Buffer.from(text, "utf8"));
            } catch {}
          },
          review ? (request) => review(request, dialogs.signal).catch(() => "cancel") : undefined,
        );
        if (r.ending === "aborted") throw new Error("aborted");
        if (r.ending === "timed_out") throw new Error(`timeout:${timeout}`);
        const notes = [...once(), ...r.notes];
        if (notes.length > 0) {
          const lines = notes.map((n) => `[sandbox] ${displayLine(n)}`).join("\n");
          onData(Buffer.from(`${last === "\n" ? "" : "\n"}${lines}\n`, "utf8"));
        }
        return { exitCode: typeof r.exitCode === "number" ? r.exitCode : null };
      } finally {
        dialogs.abort();
        signal?.removeEventListener("abort", onAbort);
      }
    },
  };
}

/** A `user_bash` result (pi's BashResult) that shows `text` as the command's output. */
function userBashFailure(text: string) {
  return { result: { output: `${text}\n`, exitCode: 126, cancelled: false, truncated: false } };
}

/**
 * Registers the sandboxed `bash` (unless `config.bash` is "host" or PI_SANDBOX_BASH turns it off)
 * and, with `config.userBash` "sandbox", runs the user's `!cmd` through the same shell. `bus`: the
 * extension's network review bus (shared with the python tool).
 */
export function registerSandboxedBash(
  pi: ExtensionAPI,
  source: ShellSource,
  config: BashConfig,
  bus: NetworkReviewBus = attachNetworkReviewBus(pi),
): void {
  if (config.bash === "host" || sandboxBashDisabled()) return;

  let settings: ShellSettings | undefined;
  const shellSettings = (cwd: string) => (settings ??= readShellSettings(pi, cwd));
  let lastCwd = process.cwd();
  const shellPath = () => shellSettings(lastCwd).shellPath;
  const operations = sandboxOperations(source, shellPath);
  /** A network destination no entry matches: a reviewer on the bus first, else with a UI the dialog; else refused. */
  const reviewFor = (ctx: ExtensionContext | undefined, tool: string) =>
    bus.dialogFor(tool, ctx?.hasUI ? networkDialog(ctx.ui, tool) : undefined);

  const definitionFor = (cwd: string, ctx: ExtensionContext | undefined) => {
    const review = reviewFor(ctx, "bash");
    return createBashToolDefinition(cwd, {
      operations: review ? sandboxOperations(source, shellPath, review) : operations,
      commandPrefix: shellSettings(cwd).shellCommandPrefix,
    });
  };
  // The schema, words and renderers (the settings are read at session start, not at load).
  const base = createBashToolDefinition(lastCwd, { operations });
  // A copy of pi's schema object (with its non-enumerable TypeBox keys): pi's built-in bash shares
  // the original, so `getAllTools()` tells this registration apart by it.
  const parameters = Object.defineProperties({}, Object.getOwnPropertyDescriptors(base.parameters)) as typeof base.parameters;

  pi.registerTool({
    ...base,
    parameters,
    label: "bash (sandboxed)",
    promptSnippet: base.promptSnippet,
    promptGuidelines: base.promptGuidelines,
    async execute(toolCallId, params, signal, onUpdate, ctx: ExtensionContext) {
      lastCwd = ctx?.cwd ?? lastCwd;
      // pi's definition for the session's directory, so pi's own code runs the call.
      return definitionFor(lastCwd, ctx).execute(toolCallId, params, signal, onUpdate, ctx);
    },
  });

  let warned = false;
  pi.on("session_start", (_event, ctx) => {
    lastCwd = ctx.cwd;
    settings = readShellSettings(pi, ctx.cwd);
    if (warned) return;
    const winner = pi.getAllTools().find((t) => t.name === "bash");
    if (winner && winner.parameters !== parameters) {
      warned = true;
      const from = winner.sourceInfo?.path ?? "another extension";
      ctx.ui.notify(
        displayLine(`pi-python-sandbox: the sandboxed bash is not in use: the tool "bash" of ${from} was registered first and runs instead (commands are not sandboxed by this package)`),
        "warning",
      );
    }
  });

  if (config.userBash !== "sandbox") return;
  // Never throws: on pi 0.73 a throwing handler makes pi run the command on the host.
  pi.on("user_bash", (event, ctx) => {
    try {
      const cwd = event.cwd;
      lastCwd = cwd ?? lastCwd;
      const shell = shellFor(source, cwd);
      if (shell instanceof Error) return userBashFailure(shell.message);
      // pi prepends the command prefix itself and streams, truncates and records the output.
      const dialog = reviewFor(ctx, "!command");
      const ops = sandboxOperations(() => shell, () => shellSettings(cwd).shellPath, dialog);
      return {
        operations: {
          async exec(command: string, dir: string, opts: Parameters<BashOperations["exec"]>[2]) {
            try {
              return await ops.exec(command, dir, opts);
            } catch (err) {
              if (opts.signal?.aborted) throw err;
              opts.onData(Buffer.from(`${errorText(err)}\n`));
              return { exitCode: 126 };
            }
          },
        },
      };
    } catch (err) {
      return userBashFailure(`the sandboxed bash is unavailable: ${errorText(err)}`);
    }
  });
}
