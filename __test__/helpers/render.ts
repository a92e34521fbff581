/**
 * The python tool's renderers as pi's TUI calls them: pi's real theme (initTheme), pi's app
 * keybindings (so that key hints name ctrl+o, as in the TUI), and what a terminal would show
 * of a component at a width, with the colours taken out for assertions.
 */
import * as piAgent from "@mariozechner/pi-coding-agent";
import * as piTui from "@mariozechner/pi-tui";
import type { PiHarness } from "./pi-session.ts";

type Component = { render(width: number): string[] };
type Renderers = {
  renderCall(args: unknown, theme: unknown, context: unknown): Component;
  renderResult(result: unknown, options: { expanded: boolean; isPartial: boolean }, theme: unknown, context: unknown): Component;
};

let ready = false;
/** pi's theme and app keybindings, as the interactive mode sets them up. */
export function setupTui(): void {
  if (ready) return;
  ready = true;
  (piAgent as unknown as { initTheme(name?: string, watch?: boolean): void }).initTheme("dark", false);
  const tui = piTui as unknown as {
    KeybindingsManager: new (defs: Record<string, unknown>) => unknown;
    TUI_KEYBINDINGS: Record<string, unknown>;
    setKeybindings(k: unknown): void;
  };
  tui.setKeybindings(
    new tui.KeybindingsManager({ ...tui.TUI_KEYBINDINGS, "app.tools.expand": { defaultKeys: "ctrl+o", description: "Toggle tool output" } }),
  );
}

/** The current pi theme object (what pi passes renderers as `theme`). */
export function theme(): unknown {
  const g = globalThis as Record<symbol, unknown>;
  return g[Symbol.for("@earendil-works/pi-coding-agent:theme")] ?? g[Symbol.for("@mariozechner/pi-coding-agent:theme")];
}

/** The registered python tool definition (its renderers). */
export function pythonRenderers(h: PiHarness): Renderers {
  const runner = (h.session as unknown as { extensionRunner: { getToolDefinition(n: string): Renderers | undefined } }).extensionRunner;
  const def = runner.getToolDefinition("python");
  if (!def?.renderCall || !def.renderResult) throw new Error("the python tool has no renderers");
  return def;
}

/** SGR colours and OSC 8 hyperlinks out: the text a person reads. */
export function plain(s: string): string {
  return s.replace(/\x1b\[[0-9;:]*m/g, "").replace(/\x1b\]8;[^\x07\x1b]*(\x07|\x1b\\)/g, "");
}

/** The lines a component shows at `width`, raw (with colours). */
export function screen(component: Component, width = 100): string[] {
  return component.render(width);
}

/** The lines a component shows at `width`, as text, trailing spaces trimmed. */
export function shown(component: Component, width = 100): string {
  return screen(component, width).map((l) => plain(l).trimEnd()).join("\n").trimEnd();
}

/** A render context like pi's ToolExecutionComponent passes. */
export function context(over: Record<string, unknown> = {}): Record<string, unknown> {
  return {
    args: {},
    toolCallId: "t",
    invalidate: () => {},
    lastComponent: undefined,
    state: {},
    cwd: process.cwd(),
    executionStarted: true,
    argsComplete: true,
    isPartial: false,
    expanded: false,
    showImages: false,
    isError: false,
    ...over,
  };
}

/** A finished result as shown: like `shown`, after the blank line that separates it from the call (as pi's bash has). */
export function shownResult(component: Component, width = 100): string {
  const text = shown(component, width);
  if (!text.startsWith("\n")) throw new Error(`a result starts with a blank line under its call:\n${text}`);
  return text.slice(1);
}
