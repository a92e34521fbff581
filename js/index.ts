/**
 * pi extension entry: registers the `python` tool and ties each pi session
 * to one sandbox session of the native addon.
 *
 * The wrapper stays small: it checks parameters, forwards calls, aborts and
 * lifecycle events to the addon, and hands pi the text the addon renders.
 * Nothing is started at load time, and nothing here throws at load time: a
 * missing addon, bubblewrap or interpreter is reported by the tool itself.
 * Everything it shows (results, progress, the call line, notifications,
 * prompts) goes through `displayText`, so that no control character from the
 * sandbox or the model reaches the terminal. The TUI layout of a call and its
 * result is js/render.ts.
 */
import { realpathSync } from "node:fs";
import { resolve } from "node:path";
import type { ExtensionAPI } from "@mariozechner/pi-coding-agent";
import { getAgentDir } from "@mariozechner/pi-coding-agent";
import { Type } from "typebox";
import type { ExecProgress, TrustedConfig } from "../index.d.ts";
import { loadAddon, type PythonSandbox, type ToolPermissions } from "./addon.ts";
import { addonShell, type BashConfig, registerSandboxedBash } from "./bash.ts";
import { allowDestination } from "./netallow.ts";
import { attachNetworkReviewBus, networkDialog } from "./netreview.ts";
import { displayLine, displayText } from "./display.ts";
import { toolWords } from "./describe.ts";
import { ACTIONS, parseParams, toolFacts } from "./params.ts";
import { executeDetails, renderCall, renderResult } from "./render.ts";

const TOOL = "python";

const MODE_CHANNEL = "tool-permissions:mode";
const PROMPT_CHANNEL = "tool-permissions:prompt";
const PROMPT_RESULT_CHANNEL = "tool-permissions:promptResult";
/** Optional extension of the contract: the tool stopped waiting for prompt `id`. */
const PROMPT_CANCEL_CHANNEL = "tool-permissions:promptCancel";
const PROMPT_TIMEOUT_MS = 30_000;
/** At most this many prompts nobody waits for are remembered for a late answer. */
const MAX_ABANDONED = 16;

type PromptOutcome = "allow" | "deny" | "timeout" | "aborted" | "shutdown";
type UI = { notify(message: string, type?: "info" | "warning" | "error"): void };

/** One registration's state (pi evaluates the module again on /reload). */
interface State {
  sandbox?: PythonSandbox;
  projectDir?: string;
  /** The sandbox's scratch directory on the host, once it has one (fixed for its life). */
  scratchDir?: string;
  nextCallId: number;
  /** The pi session's mode event, denials and abandoned prompts (kept by the addon). */
  permissions?: ToolPermissions;
  cwd?: string;
  ui?: UI;
  nextPromptId: number;
  pending: Map<number, (outcome: PromptOutcome) => void>;
  /** Prompts the tool stopped waiting for (timeout, abort), by id: the path asked about. */
  abandoned: Map<number, string>;
}

function formatBytes(n: number): string {
  if (n < 1024) return `${n} B`;
  if (n < 1024 * 1024) return `${(n / 1024).toFixed(1)} KiB`;
  return `${(n / (1024 * 1024)).toFixed(1)} MiB`;
}

/** `running 12.5s · stdout 3.2 KiB · stderr 0 B` */
export function progressLine(p: ExecProgress): string {
  return `running ${(p.elapsedMs / 1000).toFixed(1)}s · stdout ${formatBytes(p.stdoutBytes)} · stderr ${formatBytes(p.stderrBytes)}`;
}

type Content = { type: "text"; text: string } | { type: "image"; data: string; mimeType: string };

function textResult(text: string, details: Record<string, unknown>, images: Content[] = []) {
  return { content: [{ type: "text" as const, text: displayText(text) } as Content, ...images], details };
}

function unavailable(action: string, diagnostic: string) {
  const head = "status: unavailable";
  return textResult(`${head}\n\npython tool unavailable: ${diagnostic}`, {
    action,
    status: "unavailable",
    isError: true,
    diagnostic,
    parts: [{ kind: "status", start: 0, end: head.length }],
  });
}

/**
 * The trusted configuration (`<agent dir>/extensions/pi-python-sandbox/config.json`, never the
 * project's), read once at load; where the addon cannot load, the defaults (bash sandboxed, and a
 * command then refused, never run on the host).
 */
export function trustedConfig(projectDir: string): TrustedConfig | undefined {
  const binding = loadAddon().binding;
  if (!binding?.loadTrustedConfig) return undefined;
  try {
    return binding.loadTrustedConfig(resolve(getAgentDir()), projectDir);
  } catch {
    return undefined;
  }
}

/** The trusted configuration's bash keys. */
export function bashConfig(trusted: TrustedConfig | undefined): BashConfig {
  return { bash: trusted?.bash ?? "sandbox", userBash: trusted?.userBash ?? "host" };
}

export default function pythonSandboxExtension(pi: ExtensionAPI): void {
  const state: State = { nextCallId: 1, nextPromptId: 1, pending: new Map(), abandoned: new Map() };

  /** The pi session's permission state, made with the addon (undefined while it cannot load). */
  function permissions(): ToolPermissions | undefined {
    if (!state.permissions) {
      const binding = loadAddon().binding;
      if (binding) state.permissions = new binding.ToolPermissions();
    }
    return state.permissions;
  }

  /** Ask pi-tool-permissions about a read; resolves with the verdict. */
  function askToRead(
    path: string,
    isDirectory: boolean,
    cost: string,
    signal: AbortSignal | undefined,
  ): Promise<PromptOutcome> {
    if (signal?.aborted) return Promise.resolve("aborted");
    const id = state.nextPromptId++;
    return new Promise((resolve) => {
      const finish = (outcome: PromptOutcome) => {
        if (!state.pending.delete(id)) return;
        clearTimeout(timer);
        signal?.removeEventListener("abort", onAbort);
        // The client may still show its dialog: say that nobody waits for it.
        if (outcome !== "allow" && outcome !== "deny") {
          pi.events.emit(PROMPT_CANCEL_CHANNEL, { id });
          // Its answer may still come (the client's dialog stays open): remembered, a few at most.
          if (outcome === "timeout" || outcome === "aborted") {
            state.abandoned.set(id, path);
            for (const old of state.abandoned.keys()) if (state.abandoned.size > MAX_ABANDONED) state.abandoned.delete(old);
          }
        }
        resolve(outcome);
      };
      const onAbort = () => finish("aborted");
      const timer = setTimeout(() => finish("timeout"), PROMPT_TIMEOUT_MS);
      signal?.addEventListener("abort", onAbort, { once: true });
      // Registered before the emit: a synchronous bus may answer inside it.
      state.pending.set(id, finish);
      pi.events.emit(PROMPT_CHANNEL, { id, path: displayLine(path), isDirectory, cost });
    });
  }

  /** Dispose the current sandbox (its scratch and logs go with it). */
  async function disposeSandbox(reason: string): Promise<void> {
    const sandbox = state.sandbox;
    state.sandbox = undefined;
    state.projectDir = undefined;
    state.scratchDir = undefined;
    if (!sandbox) return;
    // Protected names the last checks made inert, with how to restore them.
    const notes = await sandbox.dispose(reason);
    for (const note of notes) state.ui?.notify(displayLine(note), "warning");
  }

  /** The sandbox for `cwd`, replacing the current one when the project changed. */
  function sandboxFor(cwd: string): PythonSandbox | { error: string } {
    const addon = loadAddon();
    if (!addon.binding) return { error: addon.error ?? "the native addon is unavailable" };
    let projectDir: string;
    try {
      projectDir = realpathSync(cwd);
    } catch (err) {
      return { error: `Working directory ${cwd} is not accessible: ${(err as Error).message}` };
    }
    if (state.sandbox && state.projectDir === projectDir) return state.sandbox;
    if (state.sandbox) void disposeSandbox("project_dir_changed");
    // The pi session's mode event, if any, sets its mounts. The working directory as pi names it
    // goes too: in the sandbox it is a link to /workspace, like the resolved path.
    const projectNames = cwd !== projectDir ? [resolve(cwd)] : [];
    const sandbox = new addon.binding.PythonSandbox({ projectDir, projectNames }, permissions());
    // The trusted configuration's part for commands and, with `network.python`, the python tool's network.
    sandbox.setShellConfig(shellConfig());
    state.sandbox = sandbox;
    state.projectDir = projectDir;
    state.scratchDir = undefined;
    return sandbox;
  }

  // The bash tool: each command in a sandbox of its own, with this session's mode, read roots and
  // protections; where the addon cannot load, a command is refused (never run on the host).
  let trusted = trustedConfig(process.cwd());
  const shellConfig = () => ({
    additionalAllowRead: trusted?.additionalAllowRead ?? [],
    envPassthrough: trusted?.envPassthrough ?? [],
    configPath: trusted?.path,
    network: trusted?.network,
  });
  let configTold = false;
  // The network review over pi's event bus, for bash, the user's !command and the python tool.
  const reviewBus = attachNetworkReviewBus(pi);
  registerSandboxedBash(
    pi,
    (cwd) => {
      const sandbox = sandboxFor(cwd);
      if ("error" in sandbox) {
        return new Error(`The command was not run (the sandbox is unavailable; it never runs on the host): ${sandbox.error}`);
      }
      sandbox.setShellConfig(shellConfig());
      return addonShell(sandbox, () => {
        // The trusted configuration's errors, in the first result as well as at session start.
        if (configTold || !trusted?.errors.length) return [];
        configTold = true;
        return trusted.errors.map((e) => `configuration: ${e}`);
      });
    },
    bashConfig(trusted),
    reviewBus,
  );

  // What the model is told follows the settings and limits in force at registration.
  const facts = toolFacts();
  const words = toolWords(facts);
  pi.registerTool({
    name: TOOL,
    label: "Python (sandboxed)",
    description: words.description,
    promptSnippet: words.promptSnippet,
    promptGuidelines: words.promptGuidelines,
    executionMode: "sequential",
    parameters: Type.Object({
      action: Type.Optional(
        Type.Unsafe<"execute" | "reset" | "status">({
          type: "string",
          enum: [...ACTIONS],
          description: "Operation to perform. Default: execute.",
        }),
      ),
      code: Type.Optional(
        Type.String({ description: `Python source to run. Required for action=execute; at most ${facts.maxCodeBytes / 1024} KiB UTF-8.` }),
      ),
      timeoutSeconds: Type.Optional(
        Type.Integer({
          minimum: 1,
          maximum: facts.maxTimeoutSeconds,
          description: `Wall-time limit for execute (1 to ${facts.maxTimeoutSeconds} seconds). Default ${facts.defaultTimeoutSeconds}.`,
        }),
      ),
    }),

    async execute(_toolCallId, rawParams, signal, onUpdate, ctx) {
      const params = parseParams(rawParams);
      const target = sandboxFor(ctx.cwd);
      if ("error" in target) return unavailable(params.action, target.error);

      if (params.action === "status") {
        const report = target.status();
        return textResult(report.text, { action: "status", status: "ok", isError: false, report });
      }
      if (params.action === "reset") {
        const reset = await target.reset();
        return textResult(reset.text, { action: "reset", status: "ok", isError: false, scratchDir: reset.scratchDir });
      }

      const callId = state.nextCallId++;
      const reviews = new AbortController();
      const onAbort = () => {
        reviews.abort();
        target.cancel(callId);
      };
      if (signal?.aborted) target.cancel(callId);
      else signal?.addEventListener("abort", onAbort, { once: true });
      // Partial output for the UI while the code runs (about twice a second).
      const onProgress = onUpdate
        ? (p: ExecProgress) => {
            const tail = p.outputTail.trim() === "" ? "" : p.outputTail.trimEnd();
            // The addon calls this from its queue, where a throw would end pi's process.
            try {
              onUpdate({
                content: [{ type: "text", text: displayText(`${progressLine(p)}${tail ? `\n${tail}` : ""}`) }],
                details: { action: "execute", status: "running", ...p },
              });
            } catch {}
          }
        : undefined;
      /** Ask about `path` on the bus, telling the UI what the call waits for (once a second, for the count). */
      const ask = async (path: string, isDirectory: boolean): Promise<PromptOutcome> => {
        const since = Date.now();
        // What allowing costs: nothing where the grant reaches the running sandbox.
        const why = target.grantCost();
        const cost = why
          ? `allowing restarts the python sandbox: its interpreter state (variables, imports, loaded data) will be lost, because ${displayLine(why)}`
          : "allowing keeps the python interpreter's state: the grant is added to the running sandbox";
        if (why) state.ui?.notify(`python: may the code read ${displayLine(path)}? ${cost}.`, "warning");
        // Also run from a timer, where a throw would end pi's process.
        const tell = () => {
          try {
            onUpdate?.({
              content: [{ type: "text", text: `waiting for your answer: may the code read ${displayLine(path)}? (${cost}; no answer in ${PROMPT_TIMEOUT_MS / 1000} s counts as no)` }],
              details: { action: "execute", status: "waiting", waitingFor: displayLine(path), elapsedMs: Date.now() - since },
            });
          } catch {}
        };
        tell();
        const ticker = setInterval(tell, 1000);
        try {
          return await askToRead(path, isDirectory, cost, signal);
        } finally {
          clearInterval(ticker);
        }
      };
      try {
        // A read outside the mounts goes through the addon's grant loop: it
        // decides, asks through `ask`, applies the answer and runs again.
        // With network.python: a destination no entry matches is reviewed while the call runs, as a
        // bash command's: by a reviewer on the bus first, else in the dialog (without either,
        // refused at once; in yolo mode allowed unless network.review.yolo is "review"); the
        // call's open reviews close when it ends.
        const dialog = reviewBus.dialogFor("python", ctx.hasUI ? networkDialog(ctx.ui, "python") : undefined);
        target.setNetworkReview(dialog ? (request) => dialog(request, params.code, reviews.signal).catch(() => "cancel") : undefined);
        const r = await target.execute(params.code, params.timeoutSeconds, callId, onProgress, ask, ctx.hasUI);
        // The scratch directory is the session directory's, made at the first start and kept
        // (a scratch set aside is made again at the same path): asked once, not at each call.
        if (target === state.sandbox) state.scratchDir ??= target.status().paths.scratchDir ?? undefined;
        const scratchDir = target === state.sandbox ? state.scratchDir : (target.status().paths.scratchDir ?? undefined);
        const images = r.images.map((i) => ({ type: "image" as const, data: i.data, mimeType: i.mimeType }));
        return textResult(r.text, executeDetails(r, scratchDir), images);
      } finally {
        reviews.abort();
        signal?.removeEventListener("abort", onAbort);
      }
    },

    renderCall(args, theme, context) {
      return renderCall(args, theme, context);
    },

    renderResult(result, options, theme, context) {
      return renderResult(result, options, theme, context);
    },
  });

  // /sandbox: what this session's sandbox has mounted, granted, masked and denied, and the
  // subcommands that change it (`/sandbox clear-denials`, `/sandbox allow host[:port]`). Another
  // subcommand is one more entry.
  const subcommands: Record<string, { description: string; run: (args: string) => string }> = {
    "clear-denials": {
      description: "forget this session's denied reads (the next read there asks again)",
      run: () => {
        const n = permissions()?.clearDenials() ?? 0;
        return n === 0 ? "No denied reads to clear." : `Cleared ${n === 1 ? "1 denied directory" : `${n} denied directories`}: a read there asks again.`;
      },
    },
    allow: {
      description: "allow a network destination (host[:port]) without review: adds it to network.allowedDomains of the trusted configuration",
      run: (args) => {
        if (!trusted) return "Nothing was allowed: the native addon, which reads the configuration, is unavailable.";
        const done = allowDestination(args, trusted.path, trusted.errors, () => trustedConfig(process.cwd()));
        if (done.config) {
          trusted = done.config;
          // The python sandbox's proxy reads the lists at each connection; each command reads them anew.
          state.sandbox?.setShellConfig(shellConfig());
        }
        return done.message;
      },
    },
  };
  pi.registerCommand("sandbox", {
    description: "What the sandbox mounts, grants, masks and denies in this session; /sandbox clear-denials; /sandbox allow host[:port]",
    getArgumentCompletions: (prefix) =>
      Object.entries(subcommands)
        .filter(([name]) => name.startsWith(prefix.trim()))
        .map(([name, s]) => ({ value: name, label: name, description: s.description })),
    handler: async (args, ctx) => {
      const [name = "", ...rest] = args.trim().split(/\s+/);
      const sub = subcommands[name];
      if (name && !sub) {
        ctx.ui.notify(displayText(`Unknown /sandbox subcommand ${displayLine(name)}; one of: ${Object.keys(subcommands).join(", ")}.`), "warning");
        return;
      }
      if (sub) {
        ctx.ui.notify(displayText(sub.run(rest.join(" "))), "info");
        return;
      }
      ctx.ui.notify(displayText(sandboxReport(ctx.cwd)), "info");
    },
  });

  /** The /sandbox report: the status's short part, then the session's denials. */
  function sandboxReport(cwd: string): string {
    const target = sandboxFor(cwd);
    const lines: string[] = [];
    if ("error" in target) lines.push(`python sandbox: unavailable: ${target.error}`);
    else {
      const report = target.status();
      lines.push(...report.text.split("\n").slice(0, report.summaryLines));
    }
    const denied = permissions()?.denials() ?? [];
    if (denied.length === 0) lines.push("denied this session: none");
    else {
      lines.push(`denied this session (reads there are refused without asking): ${denied.join(", ")}`);
      lines.push("/sandbox clear-denials forgets them.");
    }
    return lines.join("\n");
  }

  // pi 0.73 ignores an `isError` returned by execute; this marks failures
  // on every version while keeping the details.
  pi.on("tool_result", (event) => {
    if (event.toolName !== TOOL) return undefined;
    const details = event.details as { isError?: boolean } | undefined;
    return details?.isError ? { isError: true } : undefined;
  });

  /** Settle every open prompt as a denial. */
  function settlePrompts(): void {
    for (const finish of [...state.pending.values()]) finish("shutdown");
  }

  const unsubscribe = [
    pi.events.on(MODE_CHANNEL, (payload: unknown) => {
      // The sandbox object starts nothing; make it first so that it sees
      // this payload as a change and the user is told what it did. Before
      // session_start there is no project yet: the payload is kept.
      const sandbox = state.sandbox ?? (state.cwd ? sandboxFor(state.cwd) : undefined);
      if (!sandbox || "error" in sandbox) {
        permissions()?.setMode(payload);
        return;
      }
      const change = sandbox.applyModeEvent(payload);
      if (change.notification) state.ui?.notify(displayLine(change.notification), "info");
    }),
    pi.events.on(PROMPT_RESULT_CHANNEL, (payload: unknown) => {
      const p = payload as { id?: unknown; outcome?: unknown } | null;
      if (!p || typeof p.id !== "number" || (p.outcome !== "allow" && p.outcome !== "deny")) return;
      const late = state.abandoned.get(p.id);
      if (late !== undefined) {
        state.abandoned.delete(p.id);
        // An "Allow once" after the wait (a grant with a mode event was applied by that event).
        const shown = p.outcome === "allow" ? permissions()?.allowLate(late) : undefined;
        if (shown) {
          state.ui?.notify(
            displayLine(
              `pi-python-sandbox: your allow of the read of ${shown} came after the tool had stopped waiting ` +
                `(${PROMPT_TIMEOUT_MS / 1000} s, or the call was aborted): the denial that made is lifted, and the next ` +
                "read of it is allowed without asking. Run the code again.",
            ),
            "info",
          );
        }
        return;
      }
      state.pending.get(p.id)?.(p.outcome);
    }),
  ];

  let told = false;
  pi.on("session_start", (_event, ctx) => {
    state.cwd = ctx.cwd;
    state.ui = ctx.hasUI ? ctx.ui : undefined;
    // Once per registration: what stands in the way and what is wrong with the configuration.
    const first = !told;
    told = true;
    // Where no sandbox can start here, say so now (with the fix), not at the first call.
    const addon = loadAddon();
    const cannot = (why: string) =>
      ctx.ui.notify(displayLine(`pi-python-sandbox: the python and bash tools cannot run here (commands are refused, never run on the host): ${why}`), "warning");
    if (first && !addon.binding) cannot(addon.error ?? "the native addon is unavailable");
    if (first && addon.binding?.sandboxProbe) {
      addon.binding.sandboxProbe().then(
        (why) => {
          if (why) cannot(why);
        },
        () => {},
      );
    }
    // What is wrong with the trusted configuration, and a project's file that is ignored.
    if (first && trusted) {
      for (const e of trusted.errors) ctx.ui.notify(displayLine(`pi-python-sandbox configuration: ${e}`), "error");
      for (const n of trusted.notices) ctx.ui.notify(displayLine(n), "info");
    }
    // pi-tool-permissions announces its mode in its own session_start, which
    // may run before this one: what that did is said now.
    if (state.permissions?.hasMode) {
      const sandbox = sandboxFor(ctx.cwd);
      const report = "error" in sandbox ? null : sandbox.modeReport();
      if (report) state.ui?.notify(displayLine(report), "info");
    }
    // The first sandbox starts now, while the model writes its first answer, not on the first
    // call's path: the spare, which the first call takes (or waits for while it starts). Nothing
    // starts where prewarming is off or the project is writable; a failure is the first call's.
    const sandbox = sandboxFor(ctx.cwd);
    if (!("error" in sandbox)) sandbox.prestart().catch(() => {});
  });
  pi.on("session_shutdown", async () => {
    settlePrompts();
    for (const off of unsubscribe.splice(0)) off();
    state.permissions?.clear();
    await disposeSandbox("session_shutdown");
    state.ui = undefined;
  });
  pi.on("session_tree", async () => {
    settlePrompts();
    await disposeSandbox("session_tree");
  });
}
