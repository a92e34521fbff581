/**
 * Test harness: a REAL pi 0.73 agent session (SDK, no TUI, no network, no API key) with extension
 * packages loaded exactly as `pi -e <dir>` would load them, driven by pi-ai's scripted faux model.
 * The same harness drives pi 1.x (`@earendil-works/*`, Node 22) when the tests run with
 * `--import ./__test__/helpers/pi1-host.mjs` (`npm run test:pi1`); see PI_HOST and createHostModel
 * for the two differences (faux provider object and ModelRuntime; `mode` in bindExtensions). The
 * notes below were checked against 0.73; the suites built on them pass on 1.6.0 too.
 *
 * How it maps onto pi 0.73 (checked against node_modules/@mariozechner/pi-coding-agent/dist):
 * - The session is owned by an `AgentSessionRuntime` built with the same kind of factory as
 *   pi's main.js, so `/new`, `/fork` and `/resume` replace the session the way the CLI does
 *   (session_shutdown on the old session, then a new resource loader, a fresh extension
 *   evaluation and session_start on the new one). `harness.session` is a getter for that reason.
 * - `runtime.dispose()` is what fires `session_shutdown` with reason "quit";
 *   `AgentSession.dispose()` alone fires nothing.
 * - `ctx.hasUI` is `runner.uiContext !== noOpUIContext` (ExtensionRunner.hasUI). Any uiContext given
 *   to `bindExtensions` therefore means hasUI = true (TUI/RPC mode), and binding none means false
 *   (print/JSON mode). With hasUI = false, pi swaps in its own no-op UI, so `notify` and `select`
 *   calls are dropped and never reach the recorders below, as in `pi -p`.
 * - The extension event bus (`pi.events`) is the `eventBus` given to the DefaultResourceLoader.
 *   It survives `reload()`, but pi's CLI builds a new loader, and so a new bus, for every new
 *   session (/new, /fork, /resume), and so does this harness. `harness.events` always returns the
 *   current session's bus.
 * - `AgentSession.reload()` calls pi-ai's `resetApiProviders()`, which also deletes the faux
 *   provider's API registration. An inline extension factory registers the faux stream again
 *   through `pi.registerProvider` on every (re)load, the same way a provider extension
 *   survives /reload in the real CLI. That reset is process-global: two live harnesses in one
 *   process break each other's faux model when either reloads, so run them one at a time.
 */
import { randomUUID } from "node:crypto";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import type {
  AgentSession,
  AgentSessionRuntime,
  CreateAgentSessionRuntimeFactory,
  EventBus,
  ExtensionCommandContextActions,
  ExtensionError,
  ExtensionFactory,
  ExtensionUIContext,
  ExtensionUIDialogOptions,
  ResourceLoader,
  Theme,
} from "@mariozechner/pi-coding-agent";
import type { FauxProviderRegistration, ToolResultMessage } from "@mariozechner/pi-ai";
// Namespace imports: the two hosts export different value sets (a missing named import would fail
// at link time). Under pi 1.x these `@mariozechner/*` names resolve to `@earendil-works/*` through
// the resolve hook of ./pi1-host.mjs.
import * as piAgent from "@mariozechner/pi-coding-agent";
import * as piAi from "@mariozechner/pi-ai";

/**
 * The pi the harness drives: "pi0" is @mariozechner/pi-coding-agent 0.73 (the repository's
 * devDependencies), "pi1" is @earendil-works/pi-coding-agent 1.x from .hosts/pi1, selected with
 * `node --import ./__test__/helpers/pi1-host.mjs` (scripts/pi1-host.mjs does that).
 */
export const PI_HOST: "pi0" | "pi1" = "fauxProvider" in piAi ? "pi1" : "pi0";
/** The host's pi-coding-agent version, e.g. "0.73.1" or "1.6.0". */
export const PI_VERSION: string = (piAgent as { VERSION?: string }).VERSION ?? "unknown";
if (process.env.PI_HOST && process.env.PI_HOST !== PI_HOST) {
  throw new Error(
    `PI_HOST=${process.env.PI_HOST} but @mariozechner/pi-ai resolved to a ${PI_HOST} host (pi ${PI_VERSION}); ` +
      "run pi 1.x tests with `node scripts/pi1-host.mjs --test` (it adds --import ./__test__/helpers/pi1-host.mjs)",
  );
}
const { createAgentSession, createAgentSessionRuntime, createEventBus, DefaultResourceLoader, SessionManager, SettingsManager } = piAgent;

export type AgentMessage = AgentSession["messages"][number];
/** The tool as the agent loop calls it: pi's wrapper injects the extension ctx into execute(). */
export type AgentTool = AgentSession["agent"]["state"]["tools"][number];

export interface Notification {
  message: string;
  type?: "info" | "warning" | "error";
}

export interface SelectCall {
  title: string;
  options: string[];
}

/** Answers for the dialogs an extension can open. Unset: select/input resolve undefined, confirm false. */
export interface UIHooks {
  select?: (title: string, options: string[], opts?: ExtensionUIDialogOptions) => Promise<string | undefined>;
  confirm?: (title: string, message: string, opts?: ExtensionUIDialogOptions) => Promise<boolean>;
  input?: (title: string, placeholder?: string, opts?: ExtensionUIDialogOptions) => Promise<string | undefined>;
  /** The multi-line editor, prefilled with `prefill`; unset resolves undefined (cancelled). */
  editor?: (title: string, prefill?: string) => Promise<string | undefined>;
}

export interface PiHarnessOptions {
  /** Working directory of the session (the caller owns it). */
  cwd: string;
  /** Extension package directories or entry files, as for `pi -e`. */
  extensionPaths: string[];
  /** Bind a UI context (TUI/RPC-like, default) or none (print-mode-like). */
  hasUI?: boolean;
  /** Initial dialog answers; can be changed later through `harness.ui`. */
  ui?: UIHooks;
  /** pi's settings for the session (in memory, as `SettingsManager.inMemory(settings)`). */
  settings?: Record<string, unknown>;
  /** Extension load errors that pi's CLI would show and carry on after (e.g. a tool name conflict). */
  tolerateLoadError?: (error: string) => boolean;
}

export interface PiHarness {
  /** The current session. It changes after newSession()/fork(), so don't keep a reference across those. */
  readonly session: AgentSession;
  readonly runtime: AgentSessionRuntime;
  readonly faux: FauxProviderRegistration;
  /** The extension bus (`pi.events`) of the current session, with a count of live subscriptions. */
  readonly events: CountingEventBus;
  readonly resourceLoader: ResourceLoader;
  readonly agentDir: string;
  readonly hasUI: boolean;
  /** Mutable dialog answers. */
  readonly ui: UIHooks;
  readonly notifications: Notification[];
  readonly selects: SelectCall[];
  /** Errors thrown by extension event handlers (pi reports them instead of propagating them). */
  readonly extensionErrors: ExtensionError[];
  /** The active tool `name` as the agent loop sees it; throws if it is missing. */
  getTool(name: string): AgentTool;
  /** One full agent turn. Resolves to the messages it appended; throws if it ended in a model error. */
  prompt(text: string): Promise<AgentMessage[]>;
  /** All tool result messages in the current session context, oldest first. */
  toolResults(): ToolResultMessage[];
  /** `/reload`: session_shutdown(reload), extensions re-evaluated, session_start(reload). */
  reload(): Promise<void>;
  /** `/new`: session_shutdown(new) on the old session, session_start(new) on a new one. */
  newSession(options?: Parameters<AgentSessionRuntime["newSession"]>[0]): Promise<{ cancelled: boolean }>;
  /** `/fork`: session_shutdown(fork), session_start(fork). entryId is a user message entry for the default position "before". */
  fork(entryId: string, options?: Parameters<AgentSessionRuntime["fork"]>[1]): ReturnType<AgentSessionRuntime["fork"]>;
  /** `/tree`: moves the leaf within the same session and fires session_tree; no shutdown/start. */
  navigateTree(targetId: string, options?: Parameters<AgentSession["navigateTree"]>[1]): ReturnType<AgentSession["navigateTree"]>;
  /** session_shutdown(quit), unregister the faux provider, delete agentDir. Idempotent. */
  dispose(): Promise<void>;
}

/** Text parts of a message's content, joined with newlines. */
export function messageText(message: { content: string | ReadonlyArray<{ type: string; text?: string }> }): string {
  if (typeof message.content === "string") return message.content;
  return message.content
    .filter((part) => part.type === "text")
    .map((part) => part.text ?? "")
    .join("\n");
}

function assertExtensionsLoaded(resourceLoader: ResourceLoader, tolerate?: (error: string) => boolean): void {
  const errors = resourceLoader.getExtensions().errors.filter((e) => !tolerate?.(e.error));
  if (errors.length > 0) {
    const lines = errors.map((e) => `  ${e.path}: ${e.error}`).join("\n");
    throw new Error(`pi failed to load extensions:\n${lines}`);
  }
}

/** pi's own `theme` export is a proxy over this global (set by initTheme() in the TUI). */
function currentTheme(): Theme {
  const g = globalThis as Record<symbol, Theme | undefined>;
  const theme = g[Symbol.for("@earendil-works/pi-coding-agent:theme")] ?? g[Symbol.for("@mariozechner/pi-coding-agent:theme")];
  if (!theme) throw new Error("Theme not initialized. Call initTheme() first.");
  return theme;
}

const lazyTheme = new Proxy({} as Theme, {
  get: (_target, prop) => {
    const theme = currentTheme();
    const value = Reflect.get(theme, prop, theme);
    return typeof value === "function" ? value.bind(theme) : value;
  },
});

function createUIContext(hooks: UIHooks, notifications: Notification[], selects: SelectCall[]): ExtensionUIContext {
  const noop = () => {};
  return {
    select: async (title, options, opts) => {
      selects.push({ title, options: [...options] });
      return hooks.select ? hooks.select(title, options, opts) : undefined;
    },
    confirm: async (title, message, opts) => (hooks.confirm ? hooks.confirm(title, message, opts) : false),
    input: async (title, placeholder, opts) => (hooks.input ? hooks.input(title, placeholder, opts) : undefined),
    notify: (message, type) => {
      notifications.push({ message, type });
    },
    onTerminalInput: () => noop,
    setStatus: noop,
    setWorkingMessage: noop,
    setWorkingVisible: noop,
    setWorkingIndicator: noop,
    setHiddenThinkingLabel: noop,
    setWidget: noop,
    setFooter: noop,
    setHeader: noop,
    setTitle: noop,
    custom: async () => undefined as never,
    pasteToEditor: noop,
    setEditorText: noop,
    getEditorText: () => "",
    editor: async (title, prefill) => (hooks.editor ? hooks.editor(title, prefill) : undefined),
    addAutocompleteProvider: noop,
    setEditorComponent: noop,
    getEditorComponent: () => undefined,
    // Like pi's own `theme` export: a proxy that looks the theme up on use. pi 1.x copies the UI
    // context with a spread (reading this getter) even when no theme is initialised.
    get theme() {
      return lazyTheme;
    },
    getAllThemes: () => [],
    getTheme: () => undefined,
    setTheme: () => ({ success: false, error: "UI not available" }),
    getToolsExpanded: () => false,
    setToolsExpanded: noop,
  };
}

/** An extension bus that counts its live subscriptions, to find listeners that outlive a session or a reload. */
export interface CountingEventBus extends EventBus {
  clear(): void;
  /** Subscriptions made through `on` and not yet unsubscribed (or cleared), on `channel` or on all channels. */
  listenerCount(channel?: string): number;
}

function countingEventBus(bus: EventBus & { clear(): void }): CountingEventBus {
  const live = new Map<string, number>();
  return {
    emit: (channel, data) => bus.emit(channel, data),
    on: (channel, handler) => {
      const off = bus.on(channel, handler);
      live.set(channel, (live.get(channel) ?? 0) + 1);
      let done = false;
      return () => {
        if (done) return off();
        done = true;
        live.set(channel, live.get(channel)! - 1);
        return off();
      };
    },
    clear: () => {
      live.clear();
      bus.clear();
    },
    listenerCount: (channel) =>
      channel === undefined ? [...live.values()].reduce((a, b) => a + b, 0) : (live.get(channel) ?? 0),
  };
}

/** The model side of a harness, which differs between the hosts. */
interface HostModel {
  faux: FauxProviderRegistration;
  /** Registers the faux provider on every (re)load of the extensions. */
  fauxExtension: ExtensionFactory;
  /** What createAgentSession needs to find and authorise the model, fresh per session. */
  modelServices(): Promise<Record<string, unknown>>;
  dispose(): void;
}

async function createHostModel(agentDir: string): Promise<HostModel> {
  if (PI_HOST === "pi1") {
    // pi 1.x: a faux provider object, registered through an extension factory, and a ModelRuntime
    // (no network, no models.json) in place of AuthStorage/ModelRegistry.
    const ai = piAi as unknown as { fauxProvider(): FauxProviderRegistration & { provider: unknown } };
    const handle = ai.fauxProvider();
    const ModelRuntime = (piAgent as unknown as {
      ModelRuntime: { create(options: Record<string, unknown>): Promise<unknown> };
    }).ModelRuntime;
    return {
      faux: Object.assign(handle, { unregister: () => {} }),
      fauxExtension: (pi) => {
        (pi.registerProvider as unknown as (provider: unknown) => void)(handle.provider);
      },
      modelServices: async () => ({
        modelRuntime: await ModelRuntime.create({
          authPath: join(agentDir, "auth.json"),
          modelsPath: null,
          allowModelNetwork: false,
          refreshOnCreate: false,
        }),
      }),
      dispose: () => {},
    };
  }
  // pi 0.73: the process-global API registry. See the header: the extension factory registers the
  // faux stream again after every reload's resetApiProviders().
  const faux = piAi.registerFauxProvider();
  const fauxStream = piAi.getApiProvider(faux.api)!.streamSimple;
  const fauxProviderName = `harness-faux-${randomUUID()}`;
  const authStorage = piAgent.AuthStorage.inMemory();
  authStorage.setRuntimeApiKey(faux.getModel().provider, "faux-key");
  return {
    faux,
    fauxExtension: (pi) => {
      pi.registerProvider(fauxProviderName, { api: faux.api, streamSimple: fauxStream });
    },
    modelServices: async () => ({ authStorage, modelRegistry: piAgent.ModelRegistry.inMemory(authStorage) }),
    dispose: () => {
      faux.unregister();
      piAi.unregisterApiProviders(`provider:${fauxProviderName}`);
    },
  };
}

export async function createPiHarness(opts: PiHarnessOptions): Promise<PiHarness> {
  const cwd = resolve(opts.cwd);
  const extensionPaths = opts.extensionPaths.map((p) => resolve(p));
  const hasUI = opts.hasUI ?? true;
  const ui: UIHooks = { ...opts.ui };
  const notifications: Notification[] = [];
  const selects: SelectCall[] = [];
  const extensionErrors: ExtensionError[] = [];
  const uiContext = createUIContext(ui, notifications, selects);

  const agentDir = await mkdtemp(join(tmpdir(), "pi-harness-agent-"));
  const host = await createHostModel(agentDir);
  const faux = host.faux;
  const busBySession = new WeakMap<AgentSession, CountingEventBus>();

  // Same shape as the factory in pi's main.js; the runtime calls it again for /new, /fork, /resume.
  const createRuntime: CreateAgentSessionRuntimeFactory = async ({ cwd, agentDir, sessionManager, sessionStartEvent }) => {
    const eventBus = countingEventBus(createEventBus());
    const settingsManager = SettingsManager.inMemory(opts.settings);
    const resourceLoader = new DefaultResourceLoader({
      cwd,
      agentDir,
      settingsManager,
      eventBus,
      additionalExtensionPaths: extensionPaths,
      extensionFactories: [host.fauxExtension],
      // Hermetic: no discovery in cwd/.pi or agentDir, no skills, prompts, themes or AGENTS.md.
      noExtensions: true,
      noSkills: true,
      noPromptTemplates: true,
      noThemes: true,
      noContextFiles: true,
    });
    await resourceLoader.reload();
    assertExtensionsLoaded(resourceLoader, opts.tolerateLoadError);
    const modelServices = await host.modelServices();
    const created = await createAgentSession({
      cwd,
      agentDir,
      ...modelServices,
      settingsManager,
      resourceLoader,
      sessionManager,
      sessionStartEvent,
      model: faux.getModel(),
    } as Parameters<typeof createAgentSession>[0]);
    busBySession.set(created.session, eventBus);
    const services = { cwd, agentDir, ...modelServices, settingsManager, resourceLoader, diagnostics: [] };
    return { ...created, services, diagnostics: [] } as unknown as Awaited<ReturnType<CreateAgentSessionRuntimeFactory>>;
  };

  let runtime: AgentSessionRuntime | undefined;
  let disposing: Promise<void> | undefined;

  const reload = async () => {
    const rt = runtime!;
    await rt.session.reload();
    assertExtensionsLoaded(rt.services.resourceLoader, opts.tolerateLoadError);
  };

  // What extension commands get as ctx.newSession/fork/... (mirrors pi's print and RPC modes).
  const commandContextActions: ExtensionCommandContextActions = {
    waitForIdle: () => runtime!.session.agent.waitForIdle(),
    newSession: (options) => runtime!.newSession(options),
    fork: async (entryId, options) => ({ cancelled: (await runtime!.fork(entryId, options)).cancelled }),
    navigateTree: async (targetId, options) => ({
      cancelled: (await runtime!.session.navigateTree(targetId, options)).cancelled,
    }),
    switchSession: (sessionPath, options) => runtime!.switchSession(sessionPath, options),
    reload,
  };

  // Fires session_start; rerun by the runtime for every replacement session.
  const bind = async (session: AgentSession) => {
    await session.bindExtensions({
      uiContext: hasUI ? uiContext : undefined,
      // pi 1.x also takes the mode (ctx.mode); the harness stands for RPC mode with a UI, print without.
      ...(PI_HOST === "pi1" ? { mode: hasUI ? "rpc" : "print" } : {}),
      commandContextActions,
      onError: (error) => {
        extensionErrors.push(error);
      },
    });
  };

  const dispose = () =>
    (disposing ??= (async () => {
      try {
        if (runtime) {
          if (runtime.session.isStreaming) await runtime.session.abort();
          await runtime.dispose();
        }
      } finally {
        host.dispose();
        await rm(agentDir, { recursive: true, force: true });
      }
    })());

  try {
    // A persisted session in the temp agentDir: /new and /fork need a session directory
    // (with SessionManager.inMemory() /new writes its file relative to process.cwd()).
    const sessionManager = SessionManager.create(cwd, join(agentDir, "sessions"));
    runtime = await createAgentSessionRuntime(createRuntime, { cwd, agentDir, sessionManager });
    runtime.setRebindSession(bind);
    await bind(runtime.session);
  } catch (error) {
    await dispose().catch(() => {});
    throw error;
  }
  const rt = runtime;

  return {
    get session() {
      return rt.session;
    },
    runtime: rt,
    faux,
    get events() {
      return busBySession.get(rt.session)!;
    },
    get resourceLoader() {
      return rt.services.resourceLoader;
    },
    agentDir,
    hasUI,
    ui,
    notifications,
    selects,
    extensionErrors,
    getTool(name) {
      const tools = rt.session.agent.state.tools;
      const tool = tools.find((t) => t.name === name);
      if (!tool) throw new Error(`tool "${name}" is not active; active tools: ${tools.map((t) => t.name).join(", ")}`);
      return tool;
    },
    async prompt(text) {
      const session = rt.session;
      const before = session.messages.length;
      await session.prompt(text);
      const added = session.messages.slice(before);
      const last = added.findLast((m) => m.role === "assistant");
      if (last && last.role === "assistant" && last.stopReason === "error") {
        throw new Error(`agent turn ended with a model error: ${last.errorMessage ?? "(no message)"}`);
      }
      return added;
    },
    toolResults() {
      return rt.session.messages.filter((m): m is ToolResultMessage => m.role === "toolResult");
    },
    reload,
    newSession: (options) => rt.newSession(options),
    fork: (entryId, options) => rt.fork(entryId, options),
    navigateTree: (targetId, options) => rt.session.navigateTree(targetId, options),
    dispose,
  };
}

/** One agent turn calling python with `args`: the result exactly as the model received it. */
export async function modelSees(h: PiHarness, args: Record<string, unknown>): Promise<ToolResultMessage> {
  let seen: piAi.Context["messages"] | undefined;
  h.faux.setResponses([
    piAi.fauxAssistantMessage([piAi.fauxToolCall("python", args)], { stopReason: "toolUse" }),
    (c: piAi.Context) => {
      seen = structuredClone(c.messages);
      return piAi.fauxAssistantMessage("done");
    },
  ]);
  await h.prompt("run python");
  const results = (seen ?? []).filter((m): m is ToolResultMessage => m.role === "toolResult");
  if (results.length === 0) throw new Error("the model got no tool result");
  return results.at(-1)!;
}
