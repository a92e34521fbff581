/**
 * The order of a result, through a real pi session: the final value (the repr of the last
 * expression) comes after stdout and stderr, as a notebook shows Out[] last, in the text the
 * model receives and in what pi's TUI shows of it, collapsed (the tail) and expanded.
 */
import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type TestContext, test } from "node:test";
import { fileURLToPath } from "node:url";
import { type Context, fauxAssistantMessage, fauxToolCall, type ToolResultMessage } from "@mariozechner/pi-ai";
import { createPiHarness, messageText, type PiHarness } from "./helpers/pi-session.ts";
import { context, pythonRenderers, setupTui, shownResult, theme } from "./helpers/render.ts";
import { skipWithoutSandbox } from "./helpers/sandbox-env.ts";

const PACKAGE = fileURLToPath(new URL("..", import.meta.url));

async function setup(t: TestContext): Promise<PiHarness> {
  const cwd = mkdtempSync(join(tmpdir(), "pps-order-"));
  t.after(() => rmSync(cwd, { recursive: true, force: true }));
  const h = await createPiHarness({ cwd, extensionPaths: [PACKAGE] });
  t.after(() => h.dispose());
  return h;
}

/** One model turn that calls the tool with `code`: the tool result as the model received it. */
async function modelSees(h: PiHarness, code: string): Promise<ToolResultMessage> {
  const seen: Context["messages"][] = [];
  h.faux.setResponses([
    fauxAssistantMessage([fauxToolCall("python", { code })], { stopReason: "toolUse" }),
    (context: Context) => {
      seen.push(structuredClone(context.messages));
      return fauxAssistantMessage("done");
    },
  ]);
  await h.prompt("run it");
  const result = seen[0]?.findLast((m): m is ToolResultMessage => m.role === "toolResult");
  assert.ok(result, "the model received the tool result");
  return result;
}

const TWENTY_LINES = "import sys\nfor i in range(20):\n    print('line', i)\nprint('warned', file=sys.stderr)\n'finished'";

test("the final value is the last line of the model's text and of the collapsed TUI tail, after stdout and stderr", async (t) => {
  if (skipWithoutSandbox(t)) return;
  setupTui();
  const h = await setup(t);
  const result = await modelSees(h, TWENTY_LINES);
  assert.equal(result.isError, false, messageText(result));
  const text = messageText(result);
  const lines = text.split("\n");
  assert.equal(lines.at(-1), "result: 'finished'", text);
  assert.ok(text.indexOf("line 19") < text.indexOf("--- stderr ---"), text);
  assert.ok(text.indexOf("warned") < text.indexOf("result: 'finished'"), text);

  // The TUI lays out the same text: collapsed, the tail keeps the value as its last line.
  const { renderResult } = pythonRenderers(h);
  const r = h.toolResults().at(-1)!;
  const render = (expanded: boolean) =>
    shownResult(renderResult({ content: r.content, details: r.details }, { expanded, isPartial: false }, theme(), context({ expanded })));
  const collapsed = render(false).split("\n");
  assert.match(collapsed[1], /^\.\.\. \(\d+ earlier lines, ctrl\+o to expand\)$/, collapsed.join("\n"));
  assert.equal(collapsed.at(-1), "result: 'finished'", collapsed.join("\n"));
  assert.ok(collapsed.includes("warned"), collapsed.join("\n"));
  assert.ok(!collapsed.includes("line 0"), "the head is among the earlier lines");
  const expanded = render(true).split("\n");
  assert.equal(expanded.at(-1), "result: 'finished'");
  assert.ok(expanded.indexOf("line 0") < expanded.indexOf("result: 'finished'"));
});

test("a value alone, and a value after output cut to its log, still come after the streams", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const h = await setup(t);
  const tool = h.getTool("python");
  const alone = messageText(await tool.execute("a", { code: "6 * 7" }, undefined, undefined));
  assert.match(alone, /^status: ok [^\n]*\n\nresult: 42$/, alone);
  const cut = messageText(await tool.execute("c", { code: "for i in range(20000): print('row', i)\n'end'" }, undefined, undefined));
  const value = cut.indexOf("result: 'end'");
  assert.ok(value > cut.indexOf("row 19999"), cut.slice(-400));
  // The log line names where the streams went, under them; the value closes the text.
  assert.match(cut, /row 19999\nFull output saved to: [^\n]+\n\nresult: 'end'$/, cut.slice(-400));
});

/** Lines of `text` from its first `--- stdout ---` or `--- stderr ---` on, each prefixed by the stream it sits under. */
function streamLines(text: string): string[] {
  let stream = "";
  const out: string[] = [];
  for (const line of text.split("\n")) {
    const header = /^--- (stdout|stderr) ---$/.exec(line);
    if (header) stream = header[1];
    else if (stream && line !== "" && !line.startsWith("result: ")) out.push(`${stream}: ${line}`);
  }
  return out;
}

const ALTERNATING =
  "import sys\nfor i in range(150):\n    print('out', i)\n    print('err', i, file=sys.stderr)\nprint('done')\n'finished'";

test("stdout and stderr read in the order written, in the model's text and the TUI, the value last", async (t) => {
  if (skipWithoutSandbox(t)) return;
  setupTui();
  const h = await setup(t);
  const result = await modelSees(h, ALTERNATING);
  assert.equal(result.isError, false, messageText(result));
  const text = messageText(result);
  const want = [...Array.from({ length: 150 }, (_, i) => [`stdout: out ${i}`, `stderr: err ${i}`]).flat(), "stdout: done"];
  assert.deepEqual(streamLines(text), want, text);
  assert.equal(text.split("\n").at(-1), "result: 'finished'", text);

  // The TUI shows the same text: collapsed, its tail holds both streams and the value last.
  const { renderResult } = pythonRenderers(h);
  const r = h.toolResults().at(-1)!;
  const render = (expanded: boolean) =>
    shownResult(renderResult({ content: r.content, details: r.details }, { expanded, isPartial: false }, theme(), context({ expanded })));
  const collapsed = render(false).split("\n");
  assert.equal(collapsed.at(-1), "result: 'finished'", collapsed.join("\n"));
  assert.ok(collapsed.includes("out 149") && collapsed.includes("err 149") && collapsed.includes("done"), collapsed.join("\n"));
  assert.ok(collapsed.indexOf("out 149") < collapsed.indexOf("err 149"), collapsed.join("\n"));
  const expanded = render(true);
  assert.deepEqual(streamLines(expanded), want, expanded);

  // A subprocess's lines arrive in its own order on each stream; every line is there.
  const sub = messageText(
    await modelSees(
      h,
      "import subprocess, sys\nprint('before', flush=True)\n" +
        "subprocess.run([sys.executable, '-c', \"import sys\\nprint('child out')\\nprint('child err', file=sys.stderr)\"])\nprint('after')",
    ),
  );
  const lines = streamLines(sub);
  assert.deepEqual(lines.filter((l) => l.startsWith("stdout")), ["stdout: before", "stdout: child out", "stdout: after"], sub);
  assert.ok(lines.includes("stderr: child err"), sub);
});

test("terminal output reads as a terminal shows it: colour dropped, \\r progress at its last state, other controls escaped", async (t) => {
  if (skipWithoutSandbox(t)) return;
  setupTui();
  const h = await setup(t);
  const code =
    "import sys\nprint('\\x1b[31mred\\x1b[0m and \\x1b[1;32mgreen\\x1b[m')\n" +
    "for p in range(0, 101, 20):\n    sys.stderr.write('\\rdownloading %3d%%' % p)\nsys.stderr.write('\\n')\n" +
    "print('title \\x1b]0;pwned\\x07 bell \\x07 nul \\x00 end')";
  const result = await modelSees(h, code);
  const text = messageText(result);
  assert.match(text, /\nred and green\n/, text);
  assert.match(text, /\n--- stderr ---\ndownloading 100%\n--- stdout ---\n/, text);
  assert.ok(text.includes("title \u241B]0;pwned\u2407 bell \u2407 nul \u2400 end"), text);
  assert.doesNotMatch(text, /[\x00-\x08\x0b-\x1f\x7f]/, "no raw control reaches the model");
  assert.doesNotMatch(text, /\u241B\[|\u240D|downloading {2}0%/, "no colour stand-in, no CR stand-in, no overwritten progress");

  const { renderResult } = pythonRenderers(h);
  const r = h.toolResults().at(-1)!;
  for (const expanded of [false, true]) {
    const shown = shownResult(
      renderResult({ content: r.content, details: r.details }, { expanded, isPartial: false }, theme(), context({ expanded })),
    );
    const lines = shown.split("\n");
    assert.ok(lines.includes("red and green") && lines.includes("downloading 100%"), shown);
    assert.ok(lines.includes("title \u241B]0;pwned\u2407 bell \u2407 nul \u2400 end"), shown);
    assert.doesNotMatch(shown, /\u241B\[|\u240D/, shown);
  }
});
