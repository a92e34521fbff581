/**
 * What the model is told about the python tool before it calls it: the description, the line in
 * pi's system prompt and the guidelines, built from the settings in force when the tool is
 * registered (rollback on or off, packages beyond the standard library) and from the addon's
 * limits (src/limits.rs, through `sandboxLimits()`). Pure: the values come in as parameters.
 */

export interface ToolFacts {
  /** A failed call (timeout, cancel, output flood, crash) rolls back instead of losing state. */
  rollback: boolean;
  /** Packages beyond the standard library are mounted (PI_PYTHON_TOOL_VENV, PI_PYTHON_TOOL_SYSTEM_SITE). */
  pythonPackages: boolean;
  maxCodeBytes: number;
  defaultTimeoutSeconds: number;
  maxTimeoutSeconds: number;
  outputBudgetBytes: number;
  rlimitAsBytes: number;
}

export interface ToolWords {
  description: string;
  /** pi prints it after the tool's name (`- python: <snippet>`). */
  promptSnippet: string;
  promptGuidelines: string[];
}

/** `64 KiB`, `1 MiB`, `512 MiB`. */
function size(bytes: number): string {
  if (bytes >= 1024 * 1024 && bytes % (1024 * 1024) === 0) return `${bytes / (1024 * 1024)} MiB`;
  if (bytes >= 1024 && bytes % 1024 === 0) return `${bytes / 1024} KiB`;
  return `${bytes} bytes`;
}

export function toolWords(f: ToolFacts): ToolWords {
  const failures = "a timeout, a cancel, an output overflow or a crash";
  const state = f.rollback
    ? `- State (variables, imports, functions, classes) persists across calls until a reset. A failed call (${failures}) is rolled back: the interpreter is as it was before the call, while files it wrote stay. An ordinary exception keeps what ran before it (execution is not transactional).`
    : `- State (variables, imports, functions, classes) persists across calls until a reset, ${failures}; ordinary exceptions keep it (execution is not transactional).`;
  const packages = f.pythonPackages
    ? "The standard library and the user's installed packages (read-only)"
    : "Standard library only";
  const description = [
    "Run Python code in a persistent, sandboxed interpreter (Linux, bubblewrap + seccomp).",
    state,
    "- The project is mounted at /workspace (read-only unless the permission mode allows edits); /scratch is writable and kept across calls and resets; /tmp is private.",
    `- ${packages}; no network and no sockets; input() gets EOF; no top-level await.`,
    "- The final expression's repr is shown automatically; print json.dumps(...) for JSON.",
    `- Limits: ${size(f.maxCodeBytes)} of code, timeoutSeconds 1-${f.maxTimeoutSeconds} (default ${f.defaultTimeoutSeconds}), ${size(f.outputBudgetBytes)} of output per call, ${size(f.rlimitAsBytes)} address space per process.`,
    '- action "reset" discards interpreter state (scratch is kept); action "status" reports the sandbox without starting it.',
  ].join("\n");
  const timeout = f.rollback
    ? `Keep long-running work under timeoutSeconds (max ${f.maxTimeoutSeconds}); a timeout rolls the interpreter back to its state before the call.`
    : `Keep long-running work under timeoutSeconds (max ${f.maxTimeoutSeconds}); a timeout loses interpreter state.`;
  return {
    description,
    promptSnippet: "Run Python in a persistent sandboxed interpreter (state persists; /workspace, /scratch)",
    promptGuidelines: ["Write files to /scratch; /workspace is read-only unless the permission mode allows edits.", timeout],
  };
}
