/**
 * Text made safe to show in pi's TUI, a notification or a prompt: the
 * addon's `displayText` (src/display.rs), the rule it applies to everything
 * from the sandbox. Where the addon did not load (renderCall still runs),
 * a copy of the same rule in a few lines.
 */
import { loadAddon } from "./addon.ts";

// C0 but tab and newline, DEL, C1, the line and paragraph separators, and the bidi and invisible
// format characters; CRLF first.
const CONTROLS =
  /\r\n|[\0-\x08\x0b-\x1f\x7f-\x9f\u061c\u180e\u200b\u200e\u200f\u2028-\u202e\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb\u{e0000}-\u{e007f}]/gu;

/** The fallback: C0 as control pictures, DEL as U+2421, the others as `<U+202E>`, CRLF as LF. */
export function displayTextFallback(text: string): string {
  // A lone surrogate becomes U+FFFD, as on its way into the addon.
  const whole = (text as string & { toWellFormed(): string }).toWellFormed();
  return whole.replace(CONTROLS, (c) => {
    const code = c.codePointAt(0) ?? 0;
    if (c === "\r\n") return "\n";
    if (code < 0x20) return String.fromCharCode(0x2400 + code);
    if (code === 0x7f) return "\u2421";
    return `<U+${code.toString(16).toUpperCase().padStart(4, "0")}>`;
  });
}

// The same, and tab, newline and CR (each CR, also in CRLF).
const LINE_CONTROLS =
  /[\0-\x1f\x7f-\x9f\u061c\u180e\u200b\u200e\u200f\u2028-\u202e\u2060-\u2064\u2066-\u206f\ufeff\ufff9-\ufffb\u{e0000}-\u{e007f}]/gu;

/** The fallback of `displayLine`: as `displayTextFallback`, and tab, newline and CR as `␉`, `␊`, `␍`. */
export function displayLineFallback(text: string): string {
  const whole = (text as string & { toWellFormed(): string }).toWellFormed();
  return whole.replace(LINE_CONTROLS, (c) => {
    const code = c.codePointAt(0) ?? 0;
    if (code < 0x20) return String.fromCharCode(0x2400 + code);
    if (code === 0x7f) return "\u2421";
    return `<U+${code.toString(16).toUpperCase().padStart(4, "0")}>`;
  });
}

/**
 * `text` as one line: what `displayText` does, and tab, newline and CR shown as `␉`, `␊`, `␍`.
 * For every name, path or note from the sandbox in a notification, a prompt or a status line,
 * where a newline would start a line of its own (`x\nERROR pi: ...`).
 */
export function displayLine(text: string): string {
  const binding = loadAddon().binding;
  return typeof binding?.displayLine === "function" ? binding.displayLine(text) : displayLineFallback(text);
}

/** `text` with every control character shown as a visible stand-in. */
export function displayText(text: string): string {
  const binding = loadAddon().binding;
  return typeof binding?.displayText === "function" ? binding.displayText(text) : displayTextFallback(text);
}
