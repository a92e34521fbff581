// The demo: builds what is needed, then runs a few snippets in the sandbox
// through the addon's JS API and prints what the model would see.
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { prepare, root } from "./prepare.mjs";

prepare();
const { PythonSandbox, toolSettings } = createRequire(import.meta.url)(join(root, "index.cjs"));
// The headings follow the setting in force (PI_PYTHON_TOOL_ROLLBACK, on by default).
const rollback = toolSettings().rollback;
const project = mkdtempSync(join(tmpdir(), "pi-python-demo-"));
writeFileSync(join(project, "numbers.csv"), "n\n3\n1\n4\n1\n5\n9\n2\n6\n");
const sandbox = new PythonSandbox({ projectDir: project });

const snippets = [
  ["State persists between calls", "import csv, statistics\nrows = [int(r['n']) for r in csv.DictReader(open('numbers.csv'))]\nlen(rows)"],
  ["...and is used by the next call", "print('mean', statistics.mean(rows))\nsorted(rows)"],
  ["The project is read-only", "open('/workspace/out.txt', 'w')"],
  ["/scratch is writable", "open('/scratch/out.txt', 'w').write('hello'); import os; os.listdir('/scratch')"],
  ["No network", "import socket; socket.socket()"],
  ...(rollback
    ? [
        ["A timeout rolls the interpreter back to its state before the call", "while True: pass"],
        ["The variables survive it", "'rows' in globals()"],
      ]
    : [
        ["A timeout kills the sandbox (rollback is off: PI_PYTHON_TOOL_ROLLBACK=0)", "while True: pass"],
        ["A fresh interpreter after it: the variables are gone", "'rows' in globals()"],
      ]),
];
try {
  for (const [title, code] of snippets) {
    const timeout = code.startsWith("while") ? 1 : 30;
    const r = await sandbox.execute(code, timeout);
    console.log(`\n=== ${title}\n>>> ${code.split("\n").join("\n... ")}\n${r.text}`);
  }
  console.log(`\n=== status\n${sandbox.status().text}`);
} finally {
  await sandbox.dispose();
  rmSync(project, { recursive: true, force: true });
}
