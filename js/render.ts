/**
 * What a person sees of the python tool in pi's TUI: the call (the code, highlighted as pi's
 * write tool highlights a file) and the result (pi's bash layout: the tail collapsed with what
 * was left out, everything expanded, the log when output was cut). The model-facing text is not
 * made here (src/outcome.rs); this only lays it out.
 *
 * pi's own helpers do the work where pi has them: `highlightCode`, `keyHint`,
 * `truncateToVisualLines`, `formatSize`, pi-tui's `getCapabilities` and `imageFallback`. Every
 * piece of text from the model or the sandbox goes through `displayText` first (pi's
 * `stripAnsi` would keep DEL, C1 and bidi controls); highlighting runs on the escaped text.
 */
import { readFileSync } from "node:fs";
import { formatSize, highlightCode, keyHint, keyText, type Theme, truncateToVisualLines } from "@mariozechner/pi-coding-agent";
import { type Component, getCapabilities, imageFallback, Text, truncateToWidth } from "@mariozechner/pi-tui";
import type { ExecResult, ImageResult, StatusResult } from "../index.d.ts";
import { displayLine, displayText } from "./display.ts";

/** Lines of code shown by a collapsed call (pi's write tool shows 10 of a file). */
export const CALL_PREVIEW_LINES = 6;
/** Lines of output shown by a collapsed result, from its end (pi's bash shows 5). */
export const RESULT_PREVIEW_LINES = 8;
/** Lines of a status or reset report shown collapsed (on screen, wrapped), from its start. */
const REPORT_PREVIEW_LINES = 10;

/** What the renderers read of pi's render context (both majors pass more). */
export interface RenderContext {
  expanded?: boolean;
  showImages?: boolean;
  state?: Record<string, unknown>;
  /** pi's own verdict on the result (pi 0.73 passes it). */
  isError?: boolean;
}

/** `1 line`, `2 lines`. */
export function count(n: number, noun: string): string {
  return `${n.toLocaleString("en-US")} ${noun}${n === 1 ? "" : "s"}`;
}

/** pi's key hint for expanding tool output (`ctrl+o to expand`), in pi's colours. */
function expandHint(theme: Theme): string {
  try {
    return keyHint("app.tools.expand", "to expand");
  } catch {
    // pi's global theme is not up (a renderer called outside the TUI): the same words, this theme.
    return theme.fg("dim", keyText("app.tools.expand") || "ctrl+o") + theme.fg("muted", " to expand");
  }
}

/** `... (12 more lines, 18 total, ctrl+o to expand)`, muted, as pi's write tool says it. */
function moreHint(theme: Theme, what: string): string {
  return `${theme.fg("muted", `... (${what},`)} ${expandHint(theme)}${theme.fg("muted", ")")}`;
}

/** The lines of `code` (already made safe to show) highlighted as Python; plain if pi's theme is not up. */
function highlightPython(code: string, theme: Theme): string[] {
  try {
    const lines = highlightCode(code, "python");
    if (lines.length === code.split("\n").length) return lines;
  } catch {
    // No initialised theme (not the TUI): plain text.
  }
  return code.split("\n").map((line) => theme.fg("toolOutput", line));
}

/** The call: `python (timeout 5s)`, then the code; collapsed, its first lines and how many more. */
export function renderCall(args: unknown, theme: Theme, context: RenderContext | undefined): Component {
  const a = (args ?? {}) as { action?: unknown; code?: unknown; timeoutSeconds?: unknown };
  const title = (s: string) => theme.fg("toolTitle", theme.bold(s));
  if (a.action === "status" || a.action === "reset") return new Text(title(`python ${a.action}`), 0, 0);
  // Arguments are drawn before pi validates them: whatever they hold is shown escaped.
  const timeout = a.timeoutSeconds !== undefined ? theme.fg("muted", displayText(` (timeout ${String(a.timeoutSeconds)}s)`)) : "";
  // The code comes from the model and can carry terminal sequences too.
  const code = displayText(typeof a.code === "string" ? a.code : "").replace(/\t/g, "   ");
  const plain = code.split("\n");
  while (plain.length > 0 && plain[plain.length - 1].trim() === "") plain.pop();
  if (plain.length === 0) return new Text(`${title("python")}${timeout} ${theme.fg("toolOutput", "...")}`, 0, 0);
  const lines = highlightPython(plain.join("\n"), theme);
  let body: string[];
  let hint = "";
  if (context?.expanded) {
    body = lines;
  } else {
    let first = 0;
    while (plain[first].trim() === "") first++;
    body = lines.slice(first, first + CALL_PREVIEW_LINES);
    const remaining = lines.length - first - body.length;
    if (remaining > 0) hint = "\n" + moreHint(theme, `${count(remaining, "more line")}, ${count(lines.length, "line")} total`);
  }
  return new Text(`${title("python")}${timeout}\n${body.join("\n")}${hint}`, 0, 0);
}

/** An image of a result as pi keeps it: the addon's, without its bytes (pi has them), and its host file. */
export type ImageDetail = Omit<ImageResult, "data"> & { hostPath?: string };

/**
 * What an execute result gives pi as `details` (kept in the session file): the addon's result
 * (`ExecResult`, typed from the Rust side) as it is, without what pi already holds in the
 * content (the text, the images' bytes) and the raw pieces the text shows (the streams, the
 * value, the exception, of which the type is kept).
 */
export type ExecuteDetails = Omit<ExecResult, "text" | "stdout" | "stderr" | "repr" | "exception" | "images"> & {
  action: "execute";
  exceptionType?: string;
  /** The host folder of the sandbox's /scratch, where the images are. */
  scratchDir?: string;
  images: ImageDetail[];
};

/** `details` for an execute result, derived from the addon's: no field copied by hand. */
export function executeDetails(r: ExecResult, scratchDir: string | undefined): ExecuteDetails {
  const { text: _text, stdout: _stdout, stderr: _stderr, repr: _repr, exception, images, ...facts } = r;
  return {
    action: "execute",
    ...facts,
    exceptionType: exception?.type,
    scratchDir,
    images: images.map(({ data: _data, ...image }) => ({ ...image, hostPath: hostImagePath(image.sandboxPath, scratchDir) })),
  };
}

/** What the renderer reads of any result's details: an execute result's, a report's, a wait's. */
type ResultDetails = Partial<Omit<ExecuteDetails, "action" | "status" | "images">> & {
  action?: string;
  status?: string;
  /** A session file is read as it is: an image kept before `sandboxPath` has `path`. */
  images?: Array<Partial<ImageDetail> & { path?: string }>;
  /** A status report's: how many of its text's lines are its short part. */
  report?: Partial<Pick<StatusResult, "summaryLines">>;
  // While running or waiting.
  elapsedMs?: number;
  waitingFor?: string;
};

/**
 * The fields of an execute result the renderer reads (a test checks that the addon's result has
 * each: a field renamed on one side only fails it, and `tsc` fails on a name the type lacks).
 */
export const RENDERED_FIELDS = [
  "status",
  "isError",
  "durationMs",
  "parts",
  "omittedLines",
  "omittedBytes",
  "excerptTruncated",
  "outputLimitExceeded",
  "logPaths",
  "logComplete",
  "stdoutBytes",
  "stderrBytes",
  "images",
] as const satisfies readonly (keyof ExecuteDetails)[];
/** The fields of an image the renderer reads. */
export const RENDERED_IMAGE_FIELDS = ["sandboxPath", "mimeType", "width", "height"] as const satisfies readonly (keyof ImageDetail)[];

/** A stream's log: its lines, counted once per render slot (the log can be 1 MiB). */
function logLines(path: string, state: Record<string, unknown> | undefined): number | undefined {
  const cache = ((state ?? {}) as { logLines?: Map<string, number | undefined> });
  cache.logLines ??= new Map();
  if (!cache.logLines.has(path)) {
    let lines: number | undefined;
    try {
      const data = readFileSync(path);
      lines = 0;
      for (let i = data.indexOf(10); i !== -1; i = data.indexOf(10, i + 1)) lines++;
      if (data.length > 0 && data[data.length - 1] !== 10) lines++;
    } catch {
      lines = undefined; // deleted with its session
    }
    cache.logLines.set(path, lines);
  }
  return cache.logLines.get(path);
}

/** The sandbox path of an image as the host file the user can open. */
export function hostImagePath(sandboxPath: string, scratchDir: string | undefined): string | undefined {
  if (!scratchDir || !sandboxPath.startsWith("/scratch/")) return undefined;
  return `${scratchDir}${sandboxPath.slice("/scratch".length)}`;
}

/** The warning under a result whose output was cut: each log, its size, what the result left out. */
function cutNote(d: ResultDetails, state: Record<string, unknown> | undefined): string | undefined {
  const left = d.omittedBytes ?? 0;
  const cut = d.excerptTruncated || d.outputLimitExceeded || left > 0;
  if (!cut) return undefined;
  const parts: string[] = [];
  for (const [name, bytes] of [["stdout", d.stdoutBytes], ["stderr", d.stderrBytes]] as const) {
    const path = d.logPaths?.[name];
    if (!path) continue;
    const lines = logLines(path, state);
    const size = [lines !== undefined ? count(lines, "line") : undefined, typeof bytes === "number" ? formatSize(bytes) : undefined]
      .filter(Boolean)
      .join(", ");
    parts.push(`${d.logComplete === false ? "Partial" : "Full"} ${name}: ${displayLine(path)}${size ? ` (${size})` : ""}`);
  }
  if (left > 0) parts.push(`${count(d.omittedLines ?? 0, "line")}, ${formatSize(left)} left out of the result`);
  if (d.outputLimitExceeded) parts.push("output limit reached, the sandbox was stopped");
  return parts.length > 0 ? `[${parts.join(". ")}]` : undefined;
}

/** A result laid out for a width: header, body (tail or head when collapsed), notes. */
class ResultView implements Component {
  private cache?: { width: number; lines: string[] };
  private readonly header: string;
  private readonly body: string;
  private readonly collapse: "tail" | "head" | "none";
  private readonly after: string[];
  private readonly theme: Theme;

  constructor(header: string, body: string, collapse: "tail" | "head" | "none", after: string[], theme: Theme) {
    this.header = header;
    this.body = body;
    this.collapse = collapse;
    this.after = after;
    this.theme = theme;
  }

  render(width: number): string[] {
    if (this.cache?.width === width) return this.cache.lines;
    // A blank line between the call and its result, as pi's bash has.
    const lines = ["", ...new Text(this.header, 0, 0).render(width)];
    if (this.body) {
      if (this.collapse === "tail") {
        const preview = truncateToVisualLines(this.body, RESULT_PREVIEW_LINES, width);
        if (preview.skippedCount > 0) {
          lines.push(truncateToWidth(moreHint(this.theme, count(preview.skippedCount, "earlier line")), width, "..."));
        }
        lines.push(...preview.visualLines);
      } else if (this.collapse === "head") {
        const all = new Text(this.body, 0, 0).render(width);
        lines.push(...all.slice(0, REPORT_PREVIEW_LINES));
        const hidden = all.length - REPORT_PREVIEW_LINES;
        if (hidden > 0) lines.push(truncateToWidth(moreHint(this.theme, count(hidden, "more line")), width, "..."));
      } else {
        lines.push(...new Text(this.body, 0, 0).render(width));
      }
    }
    for (const block of this.after) lines.push(...new Text(block, 0, 0).render(width));
    this.cache = { width, lines };
    return lines;
  }

  invalidate(): void {
    this.cache = undefined;
  }
}

/**
 * The text of a result without what the renderer shows its own way, read from the result's parts
 * (never from the text: the sandbox can print any line): the status line (the header), the image
 * lines (shown inline or by their host file), the log line (the warning under the result names
 * the logs); a note names the host file the user can open, not the sandbox's /scratch. The
 * closing paragraph (the diagnostic) comes back apart, to be shown whole also collapsed.
 */
function bodyLines(text: string, d: ResultDetails, apart: boolean): { lines: string[]; closing?: string } {
  const scratch = d.scratchDir ? displayLine(d.scratchDir) : undefined;
  let body = "";
  let closing: string | undefined;
  let at = 0;
  for (const part of Array.isArray(d.parts) ? d.parts : []) {
    body += text.slice(at, part.start);
    at = part.end;
    const piece = text.slice(part.start, part.end);
    if (part.kind === "note" && scratch) body += piece.replaceAll("/scratch/.pi-images/", `${scratch}/.pi-images/`);
    else if (part.kind === "closing" && apart) closing = piece.trim();
    else if (part.kind === "note" || part.kind === "closing") body += piece;
  }
  body += text.slice(at);
  const kept = body.split("\n");
  while (kept[0] === "") kept.shift();
  while (kept.length > 0 && kept[kept.length - 1] === "") kept.pop();
  // Blank lines left doubled by the lines taken out.
  return { lines: kept.filter((l, i) => !(l === "" && kept[i - 1] === "")), closing };
}

/** `⋯ running 1.5s · ...` and the latest output, or what a wait is for. */
function renderPartial(text: string, d: ResultDetails, theme: Theme): Component {
  if (d.status === "waiting") {
    const secs = typeof d.elapsedMs === "number" ? ` ${Math.floor(d.elapsedMs / 1000)}s` : "";
    return new Text(theme.fg("warning", `⋯ ${text}`) + theme.fg("muted", secs), 0, 0);
  }
  const lines = text.split("\n");
  const shown = lines.slice(1).slice(-RESULT_PREVIEW_LINES);
  return new Text([theme.fg("muted", `⋯ ${lines[0]}`), ...shown.map((l) => theme.fg("toolOutput", l))].join("\n"), 0, 0);
}

export function renderResult(
  result: { content: ReadonlyArray<{ type: string; text?: string }>; details?: unknown },
  options: { expanded: boolean; isPartial: boolean },
  theme: Theme,
  context: RenderContext | undefined,
): Component {
  const d = (result.details ?? {}) as ResultDetails;
  const first = result.content.find((c) => c.type === "text");
  // A result restored from a session file was never through the addon.
  const text = displayText(first?.text ?? "");
  if (options.isPartial || d.status === "running" || d.status === "waiting") return renderPartial(text, d, theme);

  // Every result the tool returns says its status; one without is pi's own error result: the
  // arguments were refused (by pi's schema, or by the tool's checks, which throw).
  const refused = d.status === undefined && d.action === undefined;
  const failed = d.isError === true || context?.isError === true || refused;
  const mark = failed ? theme.fg("error", "✗") : theme.fg("success", "✓");
  const report = d.action === "status" || d.action === "reset";
  const label = report ? d.action! : refused ? "refused" : displayText(d.status === "runtime_error" ? "error" : (d.status ?? ""));
  const secs = !report && typeof d.durationMs === "number" ? theme.fg("muted", ` ${(d.durationMs / 1000).toFixed(1)}s`) : "";
  const header = `${mark} ${theme.fg("toolTitle", "python")} ${label}${secs}`;

  const expanded = options.expanded || context?.expanded === true;
  // The closing paragraph (the advice of a refused read, any diagnostic) is shown whole, also collapsed.
  const parted = bodyLines(text, d, !expanded);
  let lines = parted.lines;
  const after: string[] = [];
  if (parted.closing) after.push(theme.fg("warning", parted.closing));
  // A status report collapsed is its short part (the count the report gives): the details,
  // after their `details:` line, are on expand.
  const summary = d.action === "status" && !expanded ? d.report?.summaryLines : undefined;
  const cut = typeof summary === "number" && summary > 0 && summary < lines.length;
  if (cut) {
    const hidden = lines.length - summary - 1;
    lines = lines.slice(0, summary);
    after.push(moreHint(theme, `details: ${count(hidden, "more line")}`));
  }
  const images = d.images ?? [];
  const inline = context?.showImages === true && Boolean(getCapabilities().images);
  if (images.length > 0 && !inline) {
    after.push(
      images
        .map((i) => {
          const host = i.hostPath;
          const path = i.sandboxPath ?? i.path ?? "";
          const dims = i.width && i.height ? { widthPx: i.width, heightPx: i.height } : undefined;
          const name = imageFallback(displayLine(i.mimeType ?? ""), dims, displayLine(host ?? path));
          return theme.fg("accent", name) + theme.fg("muted", host ? " (deleted with the session)" : "");
        })
        .join("\n"),
    );
  }
  const note = cutNote(d, context?.state);
  if (note) after.push(theme.fg("warning", note));
  const body = lines.map((l) => theme.fg(refused ? "error" : "toolOutput", l)).join("\n");
  return new ResultView(header, body, expanded || cut ? "none" : report ? "head" : "tail", after, theme);
}
