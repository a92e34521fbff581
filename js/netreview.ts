/**
 * The network review of a destination no entry matches: pi's select dialog, and the review over
 * pi's event bus. Over the bus, another extension (a reviewer, such as an automatic
 * reviewer or a team's policy service) announces itself, and from then on a destination no entry
 * matches is sent to it first, as `sandbox:network-review`; its `sandbox:network-decision` answers,
 * and `sandbox:network-cancel` tells it that nobody waits any more (the command ended, was aborted,
 * or the 60 s ran out). A reviewer may hand the decision to the user (`"ask"`): then pi's dialog
 * opens as it does when no reviewer is there. The payloads are in docs/network.md.
 *
 * The engine keeps the decisions (a grant of one connection, of the command, of the session): this
 * module only carries the question and the answer.
 */
import type { ExtensionAPI, ExtensionUIContext } from "@mariozechner/pi-coding-agent";
import { displayLine } from "./display.ts";

/** What a network review dialog is about (the addon's `NetworkReviewRequest`). */
export interface NetworkReviewRequest {
  /** The canonical `host:port`. */
  authority: string;
  host: string;
  port: number;
  /** The Unicode form of an `xn--` name. */
  unicode?: string | null;
  /** That form mixes Latin letters with another script's in one label. */
  mixedScripts: boolean;
}

/** The answer the addon takes: `once`, `command`, `session`, `deny`; anything else is a cancelled dialog. */
export type NetworkChoice = "once" | "command" | "session" | "deny" | "cancel";

/** Opens the review dialog about one destination of `command`; `signal` closes it (the command ended). */
export type NetworkDialog = (request: NetworkReviewRequest, command: string, signal: AbortSignal) => Promise<NetworkChoice>;

/** How long a review dialog stays open (the addon's own deadline is the same: then it refuses). */
export const NETWORK_REVIEW_TIMEOUT_MS = 60_000;

/**
 * The review dialog through pi's `ctx.ui.select`: titled with the tool, the destination (and the
 * Unicode form of an `xn--` name, with a warning when it mixes scripts or uses letters that look like Latin ones) and the command (for the
 * python tool: the code, and its grants are "for this call"). A dismissed or timed-out dialog is a
 * cancel (the addon refuses the connection).
 */
export function networkDialog(ui: Pick<ExtensionUIContext, "select">, tool: string): NetworkDialog {
  const [what, unit] = tool === "python" ? ["code", "call"] : ["command", "command"];
  return async (r, command, signal) => {
    const authority = displayLine(r.authority);
    const lines = [`${tool}: the ${what} asks to connect to ${authority}`];
    if (r.unicode) {
      const warn = r.mixedScripts ? " (WARNING: it mixes scripts or uses letters that look like Latin ones, and may imitate another name)" : "";
      lines.push(`that name is ${displayLine(r.unicode)}${warn}`);
    }
    const shown = command.length > 500 ? `${command.slice(0, 500)}...` : command;
    lines.push(`${what}: ${displayLine(shown)}`);
    const options = [
      "Allow this connection",
      `Allow ${authority} for this ${unit}`,
      `Allow ${authority} for this session`,
      "Deny",
    ];
    const choices: NetworkChoice[] = ["once", "command", "session", "deny"];
    if (signal.aborted) return "cancel";
    try {
      const picked = await ui.select(lines.join("\n"), options, { signal, timeout: NETWORK_REVIEW_TIMEOUT_MS });
      const i = picked === undefined ? -1 : options.indexOf(picked);
      return i < 0 || signal.aborted ? "cancel" : choices[i];
    } catch {
      return "cancel";
    }
  };
}

export const REVIEW_CHANNEL = "sandbox:network-review";
export const DECISION_CHANNEL = "sandbox:network-decision";
export const CANCEL_CHANNEL = "sandbox:network-cancel";
/** A reviewer announces itself (`{ name }`) or withdraws (`{ name, active: false }`). */
export const REVIEWER_CHANNEL = "sandbox:network-reviewer";
/** Sent at session start: reviewers loaded earlier announce themselves again. */
export const REVIEWERS_QUERY_CHANNEL = "sandbox:network-reviewers";

/** At most this many reviewers are remembered (names up to 100 characters). */
const MAX_REVIEWERS = 8;
const DECISIONS: readonly string[] = ["once", "command", "session", "deny", "ask"];

/** What goes out on `sandbox:network-review`. */
export interface NetworkReviewPayload {
  id: number;
  kind: "network";
  /** `bash`, `!command` (the user's own command) or `python`. */
  tool: string;
  /** The canonical `host:port`, and its parts. */
  authority: string;
  host: string;
  port: number;
  /**
   * The Unicode form of an `xn--` name (on one line, escaped as the dialog shows it), and whether
   * a label of it mixes scripts or is spelt wholly in letters that look like Latin ones.
   */
  unicode: string | null;
  mixedScripts: boolean;
  /**
   * The command (or the python code) that asks, on one line with every control, bidi and other
   * invisible character escaped, as the dialog shows it: safe to show a person.
   */
  command: string;
  /** The same command exactly as the model wrote it, for a reviewer that parses it: never show it unescaped. */
  commandExact: string;
  /** The answers `sandbox:network-decision` may give. */
  decisions: string[];
  /** After this long (ms) the connection is refused and `sandbox:network-cancel` goes out. */
  timeoutMs: number;
}

export interface NetworkReviewBus {
  /** The review for `tool`: over the bus when a reviewer announced itself, else `fallback` (pi's dialog, with a UI). */
  dialogFor(tool: string, fallback: NetworkDialog | undefined): NetworkDialog | undefined;
  /** Asks reviewers loaded earlier to announce themselves (at session start). */
  query(): void;
  /** Session end: unsubscribes, forgets the reviewers and cancels what is open. */
  close(): void;
}

/**
 * The review over pi's event bus, one per extension (the bash tool, the user's `!command` and the
 * python tool share it). `timeoutMs`: how long a review waits for a decision (the product's is
 * NETWORK_REVIEW_TIMEOUT_MS; tests make it short).
 */
export function networkReviewBus(pi: Pick<ExtensionAPI, "events">, timeoutMs = NETWORK_REVIEW_TIMEOUT_MS): NetworkReviewBus {
  const reviewers = new Set<string>();
  const pending = new Map<number, (decision: string) => void>();
  let nextId = 1;

  const unsubscribe = [
    pi.events.on(REVIEWER_CHANNEL, (payload: unknown) => {
      const p = payload as { name?: unknown; active?: unknown } | null;
      if (!p || typeof p.name !== "string" || p.name.length === 0 || p.name.length > 100) return;
      if (p.active === false) reviewers.delete(p.name);
      else if (reviewers.size < MAX_REVIEWERS) reviewers.add(p.name);
    }),
    pi.events.on(DECISION_CHANNEL, (payload: unknown) => {
      const p = payload as { id?: unknown; decision?: unknown } | null;
      if (!p || typeof p.id !== "number" || typeof p.decision !== "string" || !DECISIONS.includes(p.decision)) return;
      // The first decision wins; a later one (another reviewer's) finds nothing open.
      pending.get(p.id)?.(p.decision);
    }),
  ];

  /** One question on the bus; resolves with the decision, or "cancel" (then the cancel went out). */
  const ask = (payload: Omit<NetworkReviewPayload, "id">, signal: AbortSignal): Promise<string> => {
    const id = nextId++;
    return new Promise((resolve) => {
      const finish = (decision: string, cancelled?: "timeout" | "aborted" | "closed") => {
        if (!pending.delete(id)) return;
        clearTimeout(timer);
        signal.removeEventListener("abort", onAbort);
        if (cancelled) pi.events.emit(CANCEL_CHANNEL, { id, reason: cancelled });
        resolve(decision);
      };
      const onAbort = () => finish("cancel", "aborted");
      const timer = setTimeout(() => finish("cancel", "timeout"), timeoutMs);
      signal.addEventListener("abort", onAbort, { once: true });
      // Registered before the emit: a synchronous bus may answer inside it.
      pending.set(id, (decision) => finish(decision, decision === "cancel" ? "closed" : undefined));
      if (signal.aborted) return onAbort();
      pi.events.emit(REVIEW_CHANNEL, { id, ...payload } satisfies NetworkReviewPayload);
    });
  };

  return {
    dialogFor(tool, fallback) {
      if (reviewers.size === 0) return fallback;
      return async (r, command, signal): Promise<NetworkChoice> => {
        if (signal.aborted) return "cancel";
        const decision = await ask(
          {
            kind: "network",
            tool,
            authority: r.authority,
            host: r.host,
            port: r.port,
            unicode: r.unicode ? displayLine(r.unicode) : null,
            mixedScripts: r.mixedScripts,
            command: displayLine(command),
            commandExact: command,
            decisions: [...DECISIONS],
            timeoutMs,
          },
          signal,
        );
        if (decision === "ask") return fallback && !signal.aborted ? fallback(r, command, signal) : "cancel";
        return decision === "once" || decision === "command" || decision === "session" || decision === "deny" ? decision : "cancel";
      };
    },
    query() {
      pi.events.emit(REVIEWERS_QUERY_CHANNEL, {});
    },
    close() {
      for (const off of unsubscribe.splice(0)) off();
      reviewers.clear();
      for (const finish of [...pending.values()]) finish("cancel");
    },
  };
}

/**
 * The extension's bus: made once, it asks reviewers loaded earlier to announce themselves at each
 * session start and closes at session end.
 */
export function attachNetworkReviewBus(pi: ExtensionAPI): NetworkReviewBus {
  const bus = networkReviewBus(pi);
  pi.on("session_start", () => bus.query());
  pi.on("session_shutdown", () => bus.close());
  return bus;
}
