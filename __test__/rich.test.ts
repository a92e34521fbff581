/**
 * Rich results and the user's own Python packages, through real pi sessions:
 * a matplotlib plot reaches the model as a PNG image block, numpy from a
 * user venv works under the sandbox's limits, and image paths can never make
 * the host read a file outside the scratch directory.
 */
import assert from "node:assert/strict";
import { existsSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { type TestContext, test } from "node:test";
import { fileURLToPath } from "node:url";
import { type Context, fauxAssistantMessage, fauxToolCall, type ToolResultMessage } from "@mariozechner/pi-ai";
import * as piAgent from "@mariozechner/pi-coding-agent";
import * as piTui from "@mariozechner/pi-tui";
import { createPiHarness, messageText, type PiHarness } from "./helpers/pi-session.ts";
import { context, pythonRenderers, setupTui, shownResult, theme } from "./helpers/render.ts";
import { skipWithoutSandbox } from "./helpers/sandbox-env.ts";
import { venvOrSkip } from "./helpers/test-venv.ts";

const PACKAGE = fileURLToPath(new URL("..", import.meta.url));
const PNG_SIGNATURE = Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]);

async function setup(t: TestContext, env: Record<string, string> = {}): Promise<PiHarness> {
  const saved = Object.fromEntries(Object.keys(env).map((k) => [k, process.env[k]]));
  Object.assign(process.env, env);
  t.after(() => {
    for (const [k, v] of Object.entries(saved)) {
      if (v === undefined) delete process.env[k];
      else process.env[k] = v;
    }
  });
  const cwd = mkdtempSync(join(tmpdir(), "pps-rich-"));
  t.after(() => rmSync(cwd, { recursive: true, force: true }));
  const h = await createPiHarness({ cwd, extensionPaths: [PACKAGE] });
  t.after(() => h.dispose());
  return h;
}

async function call(h: PiHarness, code: string) {
  const r = await h.getTool("python").execute(`c-${Math.random()}`, { code }, undefined, undefined);
  return { r, text: messageText(r), details: r.details as Record<string, any> };
}

/** A tiny valid PNG made with the standard library. */
const PNG_PY = `
import struct, zlib
def png(w, h):
    raw = b"".join(b"\\x00" + b"\\xff\\x00\\x00" * w for _ in range(h))
    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xffffffff)
    return (b"\\x89PNG\\r\\n\\x1a\\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b""))
class Pic:
    def __init__(self, w, h): self.w, self.h = w, h
    def _repr_png_(self): return png(self.w, self.h)
`;

test("a matplotlib plot reaches the model as a PNG image block; numpy from the user's venv works", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const venv = venvOrSkip(t);
  if (!venv) return;
  const h = await setup(t, { PI_PYTHON_TOOL_VENV: venv });
  const np = await call(h, "import numpy as np\nint(np.arange(12).reshape(3, 4).sum(axis=0)[-1])");
  assert.equal(np.details.status, "ok", np.text);
  assert.match(np.text, /result: 21/);
  const status = await h.getTool("python").execute("s", { action: "status" }, undefined, undefined);
  assert.match(messageText(status), new RegExp(`python packages \\(read-only\\): ${venv}/lib/python3\\.\\d+/site-packages`));

  const seen: Context["messages"][] = [];
  h.faux.setResponses([
    fauxAssistantMessage(
      [fauxToolCall("python", { code: "import matplotlib.pyplot as plt\nplt.plot([1, 4, 9])\nplt.title('squares')\nplt.show()" })],
      { stopReason: "toolUse" },
    ),
    (context: Context) => {
      seen.push(structuredClone(context.messages));
      return fauxAssistantMessage("done");
    },
  ]);
  await h.prompt("plot it");
  const result = seen[0].findLast((m): m is ToolResultMessage => m.role === "toolResult");
  assert.ok(result, "the model received the tool result");
  assert.equal(result.isError, false, messageText(result));
  const images = result.content.filter((c) => c.type === "image") as { data: string; mimeType: string }[];
  assert.equal(images.length, 1);
  assert.equal(images[0].mimeType, "image/png");
  const bytes = Buffer.from(images[0].data, "base64");
  assert.ok(bytes.subarray(0, 8).equals(PNG_SIGNATURE), "a real PNG");
  assert.ok(bytes.readUInt32BE(16) > 100 && bytes.readUInt32BE(20) > 100, "a real plot size");
  const text = messageText(result);
  assert.match(text, /image 1: \/scratch\/\.pi-images\/\d{4}-1\.png \(\d+x\d+ PNG, [\d.]+KB\), attached/);
  assert.doesNotMatch(text, /Fontconfig error/);
});

test("display() and final values with _repr_png_ become images; SVG and overflow are saved with a note", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const h = await setup(t);
  const one = await call(h, `${PNG_PY}\nPic(3, 2)`);
  assert.equal(one.details.status, "ok", one.text);
  assert.equal(one.r.content.filter((c: { type: string }) => c.type === "image").length, 1);
  assert.deepEqual(one.details.images.map((i: any) => [i.width, i.height, i.mimeType]), [[3, 2, "image/png"]]);
  assert.doesNotMatch(one.text, /result:/, "an image is shown instead of its repr");

  const many = await call(h, "for i in range(6):\n    display(Pic(i + 1, 1))\ndisplay('plain text')");
  assert.equal(many.r.content.filter((c: { type: string }) => c.type === "image").length, 4, "at most four images");
  assert.equal((many.text.match(/note: image saved as \/scratch\/\.pi-images\/\d+-\d\.png but not sent: at most 4/g) ?? []).length, 2);
  assert.match(many.text, /note: image saved as \/scratch\/\.pi-images\/\d+-5\.png but not sent/);
  assert.match(many.text, /note: image saved as \/scratch\/\.pi-images\/\d+-6\.png but not sent/);
  assert.match(many.text, /--- stdout ---\n'plain text'/, "other objects are shown as their repr, as in a notebook");

  const svg = await call(h, "class S:\n    def _repr_svg_(self): return '<svg xmlns=\"http://www.w3.org/2000/svg\"/>'\nS()");
  assert.equal(svg.r.content.filter((c: { type: string }) => c.type === "image").length, 0);
  assert.match(svg.text, /note: SVG saved as \/scratch\/\.pi-images\/\d+-1\.svg \(not sent to the model/);

  const md = await call(h, "class M:\n    def _repr_markdown_(self): return '**bold** text'\nM()");
  assert.match(md.text, /result: \*\*bold\*\* text/);
});

test("images in pi's TUI: inline where pi shows images, else the host file and that it goes with the session", async (t) => {
  if (skipWithoutSandbox(t)) return;
  setupTui();
  const h = await setup(t);
  const one = await call(h, `${PNG_PY}\nprint('made')\ndisplay(Pic(3, 2))\nfor i in range(4):\n    display(Pic(1, 1))`);
  assert.equal(one.details.status, "ok", one.text);
  const scratchDir = one.details.scratchDir as string;
  const host = one.details.images[0].hostPath as string;
  assert.equal(host, `${scratchDir}/.pi-images/0001-1.png`);
  assert.ok(existsSync(host), "the named host file exists");
  const { renderResult } = pythonRenderers(h);
  const render = (showImages: boolean) =>
    shownResult(renderResult(one.r, { expanded: false, isPartial: false }, theme(), context({ showImages })), 400);

  // No inline images (a terminal without them, or pi's showImages off): one line per image.
  const lines = render(false).split("\n");
  assert.ok(lines.includes(`[Image: ${host} [image/png] 3x2] (deleted with the session)`), lines.join("\n"));
  assert.equal(lines.filter((l) => l.startsWith("[Image: ")).length, 4);
  assert.ok(lines.some((l) => l.startsWith(`note: image saved as ${scratchDir}/.pi-images/0001-5.png but not sent`)));
  assert.doesNotMatch(lines.join("\n"), /(^|[\s(])\/scratch\//m, "no path the user cannot open");
  assert.match(one.text, /image 1: \/scratch\/\.pi-images\/0001-1\.png/, "the model keeps the sandbox path it can use");

  // A terminal with images: pi's own tool row draws them, the renderer adds no line of its own.
  const tui = piTui as unknown as { setCapabilities(c: object): void; resetCapabilitiesCache(): void };
  tui.setCapabilities({ images: "kitty", trueColor: true, hyperlinks: false });
  t.after(() => tui.resetCapabilitiesCache());
  assert.doesNotMatch(render(true), /\[Image: |(^|[\s(])\/scratch\//m);
  const Row = (piAgent as unknown as { ToolExecutionComponent: new (...a: unknown[]) => { updateResult(r: unknown, p: boolean): void; render(w: number): string[] } }).ToolExecutionComponent;
  const def = (h.session as never as { extensionRunner: { getToolDefinition(n: string): unknown } }).extensionRunner.getToolDefinition("python");
  const row = new Row("python", "img-1", { code: "display(Pic(3, 2))" }, { showImages: true }, def, { requestRender() {} }, process.cwd());
  row.updateResult({ ...one.r, isError: false }, false);
  const drawn = row.render(120).join("\n");
  assert.match(drawn, /\x1b_G/, "pi draws the image inline (kitty graphics)");
  assert.doesNotMatch(drawn, /\[Image: /);
});

test("an image path never makes the host read outside the scratch directory", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const h = await setup(t);
  const secret = mkdtempSync("/var/tmp/pps-secret-");
  t.after(() => rmSync(secret, { recursive: true, force: true }));
  writeFileSync(join(secret, "secret.png"), Buffer.concat([PNG_SIGNATURE, Buffer.from("host-secret")]));
  // User code rewires the worker so that its result names planted paths:
  // a symlink to a host file, a path through a symlinked directory, and a
  // path outside /scratch.
  const r = await call(
    h,
    `import __main__, os
os.symlink(${JSON.stringify(join(secret, "secret.png"))}, "/scratch/evil.png")
os.symlink(${JSON.stringify(secret)}, "/scratch/evil-dir")
def planted(self):
    for p in ("/scratch/evil.png", "/scratch/evil-dir/secret.png", "/etc/passwd", "/scratch/../etc/passwd"):
        self.images.append({"path": p, "mime": "image/png", "width": 1, "height": 1, "bytes": 10})
__main__.Rich.collect_figures = planted`,
  );
  assert.equal(r.details.status, "ok", r.text);
  assert.equal(r.r.content.filter((c: { type: string }) => c.type === "image").length, 0, "nothing was attached");
  assert.equal((r.text.match(/was not sent/g) ?? []).length, 4, r.text);
  assert.doesNotMatch(JSON.stringify(r.r), /aG9zdC1zZWNyZXQ|host-secret/);
});

test("bad package settings are reported and the tool still works", async (t) => {
  if (skipWithoutSandbox(t)) return;
  const h = await setup(t, { PI_PYTHON_TOOL_VENV: "/nonexistent/venv:relative/dir" });
  const r = await call(h, "1 + 1");
  assert.equal(r.details.status, "ok", r.text);
  const status = messageText(await h.getTool("python").execute("s", { action: "status" }, undefined, undefined));
  assert.match(status, /python packages: PI_PYTHON_TOOL_VENV: \/nonexistent\/venv cannot be used/);
  assert.match(status, /python packages: PI_PYTHON_TOOL_VENV: relative\/dir is not an absolute path; ignored/);
});
