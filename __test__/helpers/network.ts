/**
 * Host-side origins and pi sessions for the network tests: origins listen on the address this
 * machine's own name resolves to (a loopback or private address, reached from a sandbox only
 * through an `allowPrivate` entry), and a session's bash gets a trusted configuration's `network`
 * part. Also the rerun of a whole test file as `nobody` (live-grants.test.ts's way).
 */
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { lookup } from "node:dns/promises";
import { once } from "node:events";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { createServer as createHttpServer, type RequestListener, type Server } from "node:http";
import { createServer as createHttpsServer } from "node:https";
import type { AddressInfo } from "node:net";
import { hostname } from "node:os";
import { join } from "node:path";
import { after, type TestContext } from "node:test";
import { fileURLToPath } from "node:url";
import { configureClient } from "../fixtures/permissions-client/index.ts";
import { createPiHarness, messageText, type PiHarness, type UIHooks } from "./pi-session.ts";
import { skipWithoutSandbox } from "./sandbox-env.ts";

const PACKAGE = fileURLToPath(new URL("../..", import.meta.url));
const CLIENT = fileURLToPath(new URL("../fixtures/permissions-client", import.meta.url));

const SAVED = { PI_CODING_AGENT_DIR: process.env.PI_CODING_AGENT_DIR, PI_SANDBOX_BASH: process.env.PI_SANDBOX_BASH };
after(() => {
  for (const [name, value] of Object.entries(SAVED)) {
    if (value === undefined) delete process.env[name];
    else process.env[name] = value;
  }
});

/** This machine's name and the IPv4 address it resolves to. */
export async function machine(): Promise<{ name: string; address: string }> {
  const name = hostname().toLowerCase();
  const found = await lookup(name, { family: 4 }).catch((e) => assert.fail(`this machine's name ${name} does not resolve: ${e}`));
  return { name, address: found.address };
}

export interface Origin {
  name: string;
  address: string;
  port: number;
  /** Requests it answered. */
  hits(): number;
}

async function listening(t: TestContext, server: Server, address: string, counter: { n: number }): Promise<Origin> {
  server.listen(0, address);
  await once(server, "listening");
  t.after(() => new Promise<void>((resolve) => server.close(() => resolve())));
  const { name } = await machine();
  return { name, address, port: (server.address() as AddressInfo).port, hits: () => counter.n };
}

/** An HTTP origin answering `body` (or what `handler` answers). */
export async function httpOrigin(t: TestContext, body = "ORIGIN-BODY\n", handler?: RequestListener): Promise<Origin> {
  const { address } = await machine();
  const counter = { n: 0 };
  const server = createHttpServer((req, res) => {
    counter.n++;
    if (handler) handler(req, res);
    else res.end(body);
  });
  return listening(t, server, address, counter);
}

/**
 * An HTTPS origin with a self-signed certificate for this machine's name, made here with
 * openssl; the certificate is written to `certPath` (for `curl --cacert`).
 */
export async function tlsOrigin(t: TestContext, certPath: string, body = "TLS-ORIGIN-BODY\n"): Promise<Origin> {
  const { name, address } = await machine();
  const dir = mkdtempSync("/var/tmp/pps-net-cert-");
  t.after(() => rmSync(dir, { recursive: true, force: true }));
  const made = spawnSync(
    "openssl",
    ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", `/CN=${name}`, "-addext", `subjectAltName=DNS:${name}`,
      "-keyout", join(dir, "key.pem"), "-out", join(dir, "cert.pem")],
    { encoding: "utf8" },
  );
  assert.equal(made.status, 0, `openssl: ${made.stderr}`);
  const cert = readFileSync(join(dir, "cert.pem"));
  writeFileSync(certPath, cert);
  const counter = { n: 0 };
  const server = createHttpsServer({ key: readFileSync(join(dir, "key.pem")), cert }, (_req, res) => {
    counter.n++;
    res.end(body);
  });
  return listening(t, server as unknown as Server, address, counter);
}

export interface NetSession {
  h: PiHarness;
  project: string;
  /** Runs `command` with the bash tool; its text (the network summary included). */
  bash(command: string, opts?: { signal?: AbortSignal; timeout?: number }): Promise<string>;
  /** Runs `code` with the python tool; its text. */
  python(code: string): Promise<string>;
  /** Runs `command` as the user's `!command`, as pi's RPC and interactive modes do; its output. */
  userBash(command: string): Promise<string>;
}

export interface NetSessionOptions {
  ui?: UIHooks;
  hasUI?: boolean;
  /** The permission mode pi-tool-permissions' stand-in announces. */
  mode?: string;
  project?: string;
  /** More keys of the trusted configuration (beside `network`). */
  config?: Record<string, unknown>;
  /** More extension packages, loaded after pi-tool-permissions' stand-in and before this package. */
  extensions?: string[];
}

/** A pi session whose trusted configuration has `network`; undefined where no sandbox can run. */
export async function netSession(t: TestContext, network: Record<string, unknown>, opts: NetSessionOptions = {}): Promise<NetSession | undefined> {
  if (skipWithoutSandbox(t)) return undefined;
  const base = mkdtempSync("/var/tmp/pps-net-");
  t.after(() => rmSync(base, { recursive: true, force: true }));
  const project = opts.project ?? join(base, "project");
  mkdirSync(project, { recursive: true });
  const agent = join(base, "agent");
  mkdirSync(join(agent, "extensions", "pi-python-sandbox"), { recursive: true });
  writeFileSync(join(agent, "extensions", "pi-python-sandbox", "config.json"), JSON.stringify({ ...opts.config, network }));
  // The trusted configuration is read when the extension loads.
  process.env.PI_CODING_AGENT_DIR = agent;
  delete process.env.PI_SANDBOX_BASH;
  configureClient(opts.mode ?? "manual", []);
  const h = await createPiHarness({ cwd: project, extensionPaths: [CLIENT, ...(opts.extensions ?? []), PACKAGE], ui: opts.ui, hasUI: opts.hasUI });
  t.after(() => h.dispose());
  let n = 0;
  return {
    h,
    project,
    async bash(command, { signal, timeout } = {}) {
      const r = await h.getTool("bash").execute(`bash-${++n}`, { command, ...(timeout ? { timeout } : {}) }, signal, undefined);
      return messageText(r);
    },
    async python(code) {
      const r = await h.getTool("python").execute(`python-${++n}`, { code }, undefined, undefined);
      return messageText(r);
    },
    async userBash(command) {
      const session = h.session;
      const event = { type: "user_bash" as const, command, excludeFromContext: false, cwd: session.sessionManager.getCwd() };
      const handled = await session.extensionRunner.emitUserBash(event);
      assert.ok(handled?.operations, "the user's command goes through this package's shell");
      const r = await session.executeBash(command, undefined, { operations: handled.operations });
      return r.output;
    },
  };
}

/**
 * A local package index for pip: a one-file wheel (`netdemo` 1.0, made here) on a file host, and
 * its simple page on another origin (as PyPI's pages and files are on two hosts).
 */
export async function pipIndex(t: TestContext): Promise<{ index: Origin; files: Origin; wheelName: string }> {
  const base = mkdtempSync("/var/tmp/pps-net-pip-");
  t.after(() => rmSync(base, { recursive: true, force: true }));
  // A one-file wheel, made here, on a file host; its index page on another origin.
  const wheelName = "netdemo-1.0-py3-none-any.whl";
  const made = spawnSync("python3", ["-c", `
import base64, hashlib, sys, zipfile
files = {
    "netdemo/__init__.py": b"VALUE = 1\\n",
    "netdemo-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\\nName: netdemo\\nVersion: 1.0\\n",
    "netdemo-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\\nGenerator: test\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n",
}
def digest(b):
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(b).digest()).rstrip(b"=").decode()
record = "".join(f"{n},{digest(b)},{len(b)}\\n" for n, b in files.items()) + "netdemo-1.0.dist-info/RECORD,,\\n"
with zipfile.ZipFile(sys.argv[1], "w") as z:
    for n, b in files.items():
        z.writestr(n, b)
    z.writestr("netdemo-1.0.dist-info/RECORD", record)
`, join(base, wheelName)], { encoding: "utf8" });
  assert.equal(made.status, 0, made.stderr);
  const wheel = readFileSync(join(base, wheelName));
  const files = await httpOrigin(t, "", (req, res) => {
    if (req.url === `/files/${wheelName}`) res.end(wheel);
    else {
      res.statusCode = 404;
      res.end();
    }
  });
  const index = await httpOrigin(t, "", (req, res) => {
    if ((req.url ?? "").replace(/\/$/, "") === "/simple/netdemo") {
      res.setHeader("Content-Type", "text/html");
      res.end(`<html><body><a href="http://${files.name}:${files.port}/files/${wheelName}">${wheelName}</a></body></html>`);
    } else {
      res.statusCode = 404;
      res.end();
    }
  });
  return { index, files, wheelName };
}
