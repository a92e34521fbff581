/**
 * The python tool's network, through a real pi session: none by default (no proxy, no socket, the
 * same configuration giving bash its network), and with `network.python: true` the same proxy as
 * bash: an allowed destination is reached with `urllib`, an unmatched one is reviewed as a bash
 * command's (a reviewer on pi's event bus, else the dialog, else refused at once; yolo allows it),
 * and a direct connection that skips the proxy reaches nothing.
 *
 * Origins listen on the address this machine's name resolves to, reached only through
 * `allowPrivate` entries, as in network-inside.test.ts. Both majors (scripts/pi1-host.mjs lists
 * it); run as root, the last test runs this file again as `nobody`.
 */
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import { test } from "node:test";
import { fileURLToPath } from "node:url";
import { configureReviewer } from "./fixtures/network-reviewer/index.ts";
import { rerunAsNobody } from "./helpers/as-nobody.ts";
import { httpOrigin, type NetSession, netSession, type Origin, pipIndex } from "./helpers/network.ts";
import { messageText, type UIHooks } from "./helpers/pi-session.ts";

interface Setup extends NetSession {
  o: Origin;
  other: Origin;
}

const REVIEWER = fileURLToPath(new URL("./fixtures/network-reviewer", import.meta.url));

/** `o` allowed by name and address; `other` reachable by its address only (its name is unmatched). */
async function setup(
  t: import("node:test").TestContext,
  python?: boolean,
  ui?: UIHooks,
  opts: { mode?: string; reviewYolo?: string; extensions?: string[] } = {},
): Promise<Setup | undefined> {
  const o = await httpOrigin(t);
  const other = await httpOrigin(t, "OTHER-BODY\n");
  const network = {
    mode: "proxy",
    allowedDomains: [`${o.name}:${o.port}`],
    deniedDomains: [],
    allowPrivate: [`${o.address}:${o.port}`, `${other.address}:${other.port}`],
    ...(python === undefined ? {} : { python }),
    ...(opts.reviewYolo ? { review: { yolo: opts.reviewYolo } } : {}),
  };
  const s = await netSession(t, network, { ...(ui ? { ui } : { hasUI: false }), mode: opts.mode, extensions: opts.extensions });
  return s && { ...s, o, other };
}

/** Python that fetches `url` with urllib and prints the body or the error. */
const fetch = (url: string) => `
import urllib.request, urllib.error
try:
    print("BODY", urllib.request.urlopen(${JSON.stringify(url)}, timeout=20).read().decode().strip())
except urllib.error.HTTPError as e:
    print("HTTP", e.code, e.read().decode(errors="replace").strip())
except Exception as e:
    print("FAILED", type(e).__name__, e)
`;

/** Python that connects straight to `address:port`, skipping the proxy. */
const direct = (address: string, port: number) => `
import socket
try:
    s = socket.create_connection((${JSON.stringify(address)}, ${port}), timeout=5)
    print("CONNECTED")
except OSError as e:
    print("DIRECT-FAILED", type(e).__name__, e.errno)
`;

test("by default the python tool has no network: no proxy variables, no socket; bash in the same session has one", async (t) => {
  const s = await setup(t);
  if (!s) return;
  const env = await s.python(`import os; print("PROXY", os.environ.get("HTTP_PROXY"), os.environ.get("ALL_PROXY"))`);
  assert.match(env, /PROXY None None/, env);
  const got = await s.python(fetch(`http://${s.o.name}:${s.o.port}/`));
  assert.match(got, /FAILED URLError/, got);
  const sock = await s.python(direct(s.o.address, s.o.port));
  assert.match(sock, /DIRECT-FAILED PermissionError 1\b/, sock);
  assert.equal(s.o.hits(), 0);
  // Baseline: the same configuration gives bash the origin.
  const bash = await s.bash(`curl -sS -m 20 http://${s.o.name}:${s.o.port}/`);
  assert.match(bash, /ORIGIN-BODY/, bash);
  assert.equal(s.o.hits(), 1);
});

test("network.python false is the default's: no network", async (t) => {
  const s = await setup(t, false);
  if (!s) return;
  const got = await s.python(fetch(`http://${s.o.name}:${s.o.port}/`));
  assert.match(got, /FAILED URLError/, got);
  assert.equal(s.o.hits(), 0);
});

test("with network.python true, urllib reaches an allowed origin through the proxy; an unmatched name is refused at once", async (t) => {
  const s = await setup(t, true);
  if (!s) return;
  const env = await s.python(`import os; print("PROXY", os.environ.get("HTTP_PROXY"), os.environ.get("ALL_PROXY"))`);
  assert.match(env, /PROXY http:\/\/127\.0\.0\.1:\d+ socks5h:\/\/127\.0\.0\.1:\d+/, env);
  const got = await s.python(fetch(`http://${s.o.name}:${s.o.port}/`));
  assert.match(got, /BODY ORIGIN-BODY/, got);
  assert.equal(s.o.hits(), 1);
  // The other origin's name matches no entry: with no review for the python tool, a 403 naming why.
  const refused = await s.python(fetch(`http://${s.other.name}:${s.other.port}/`));
  assert.match(refused, /HTTP 403 .*no one can review it/s, refused);
  assert.ok(refused.includes(`add "${s.other.name}:${s.other.port}" to network.allowedDomains`), refused);
  assert.equal(s.other.hits(), 0);
  // The interpreter keeps its network across calls (one proxy for the sandbox's life).
  assert.match(await s.python(fetch(`http://${s.o.name}:${s.o.port}/`)), /BODY ORIGIN-BODY/);
  assert.equal(s.o.hits(), 2);
});

test("a python result ends with its call's network summary: allowed and refused with the line to allow it, bounded, escaped", async (t) => {
  const s = await setup(t, true);
  if (!s) return;
  const allowed = `note: network: allowed ${s.o.name}:${s.o.port}.`;
  const both = await s.python(`${fetch(`http://${s.o.name}:${s.o.port}/`)}\n${fetch(`http://${s.other.name}:${s.other.port}/`)}`);
  assert.match(both, /BODY ORIGIN-BODY[\s\S]*HTTP 403/, both);
  assert.ok(both.includes(allowed), both);
  const refusal = both.split("\n").find((l) => l.startsWith("note: network: ") && l.includes(`${s.other.name}:${s.other.port}`));
  assert.ok(refusal?.includes("no one can review it"), both);
  assert.ok(refusal?.includes(`(to allow it: network.allowedDomains "${s.other.name}:${s.other.port}")`), both);
  // The next call's summary is its own: the allowed origin only; a call with no connection has none.
  const again = await s.python(fetch(`http://${s.o.name}:${s.o.port}/`));
  assert.ok(again.includes(allowed), again);
  assert.ok(!again.includes(`${s.other.name}:${s.other.port}`), again);
  const quiet = await s.python(`print("NO-NETWORK")`);
  assert.match(quiet, /NO-NETWORK/);
  assert.ok(!quiet.includes("network:"), quiet);
  // Hostile requests straight to the proxy: a Host header holding a bidi override, then 100 distinct
  // unmatched names. The note shows the override escaped; the summary stays bounded.
  const flood = await s.python(`
import os, socket
host, port = os.environ["HTTP_PROXY"].rsplit("/", 1)[1].split(":")
def send(head):
    c = socket.create_connection((host, int(port)), timeout=20)
    c.sendall(head.encode())
    print("ANSWER", c.recv(64).split(b"\\r\\n")[0].decode())
    c.close()
send("GET http://${s.o.name}:${s.o.port}/ HTTP/1.1\\r\\nHost: evil\u202e.test\\r\\n\\r\\n")
for i in range(100):
    send(f"GET http://n{i}.invalid/ HTTP/1.1\\r\\nHost: n{i}.invalid\\r\\n\\r\\n")
`);
  assert.match(flood, /ANSWER HTTP\/1\.1 403/, flood);
  assert.ok(!flood.includes("\u202e"), "the bidi override reached the result unescaped");
  const notes = flood.split("\n").filter((l) => l.startsWith("note: network: "));
  assert.ok(notes.some((l) => l.includes("Host header names `evil")), flood);
  assert.ok(notes.length <= 33, `${notes.length} network notes`);
  assert.ok(notes.some((l) => /network: \d+ more connection outcomes not listed\./.test(l)), flood);
  assert.equal(s.o.hits(), 2);
});

test("with network.python true, a direct connection skipping the proxy reaches nothing; UDP and raw sockets are refused", async (t) => {
  const s = await setup(t, true);
  if (!s) return;
  // Baseline: through the proxy the origin answers.
  assert.match(await s.python(fetch(`http://${s.o.address}:${s.o.port}/`)), /BODY ORIGIN-BODY/);
  const sock = await s.python(direct(s.o.address, s.o.port));
  assert.match(sock, /DIRECT-FAILED \w+ (101|111)\b/, sock);
  const others = await s.python(`
import socket
for name, family, kind in [("udp", socket.AF_INET, socket.SOCK_DGRAM), ("raw", socket.AF_INET, socket.SOCK_RAW),
                           ("netlink", socket.AF_NETLINK, socket.SOCK_RAW), ("unix", socket.AF_UNIX, socket.SOCK_STREAM)]:
    try:
        socket.socket(family, kind)
        print(name, "MADE")
    except OSError as e:
        print(name, "REFUSED", e.errno)
`);
  for (const name of ["udp", "raw", "netlink", "unix"]) assert.match(others, new RegExp(`^${name} REFUSED 1$`, "m"), others);
  assert.equal(s.o.hits(), 1);
});

/** A stream socket of each protocol but TCP that the kernel may offer with SOCK_STREAM (MPTCP, SCTP). */
const OTHER_STREAM_PROTOCOLS = `
import socket
for name, proto in [("tcp", 0), ("tcp6", socket.IPPROTO_TCP), ("mptcp", 262), ("sctp", 132)]:
    family = socket.AF_INET6 if name == "tcp6" else socket.AF_INET
    try:
        socket.socket(family, socket.SOCK_STREAM, proto).close()
        print(name, "MADE")
    except OSError as e:
        print(name, "REFUSED", e.errno)
`;

test("with network.python true, a stream socket of another protocol than TCP (MPTCP, SCTP) is refused; the host makes the MPTCP one", async (t) => {
  // Baseline: the same code unsandboxed makes an MPTCP socket (this kernel has MPTCP).
  const host = execFileSync("python3", ["-c", OTHER_STREAM_PROTOCOLS], { encoding: "utf8" });
  assert.match(host, /^mptcp MADE$/m, `the baseline needs a kernel with MPTCP: ${host}`);
  const s = await setup(t, true);
  if (!s) return;
  const got = await s.python(OTHER_STREAM_PROTOCOLS);
  assert.match(got, /^tcp MADE$/m, got);
  assert.match(got, /^tcp6 MADE$/m, got);
  assert.match(got, /^mptcp REFUSED 1$/m, got);
  assert.match(got, /^sctp REFUSED 1$/m, got);
  // The bash tool's network profile is the same rule.
  const shell = await s.bash(`python3 -c '${OTHER_STREAM_PROTOCOLS.replaceAll("'", "'\\''")}'`);
  assert.match(shell, /^tcp MADE$/m, shell);
  assert.match(shell, /^mptcp REFUSED 1$/m, shell);
  assert.match(shell, /^sctp REFUSED 1$/m, shell);
});

/** Python that connects a TCP socket on its own loopback and attaches upper-layer protocols (TCP_ULP, 31) to it. */
const ULP = `
import socket
srv = socket.socket()
srv.bind(("127.0.0.1", 0))
srv.listen(1)
c = socket.create_connection(srv.getsockname(), timeout=5)
c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
print("nodelay SET")
for name in ("tls", "mptcp", "smc", "espintcp"):
    try:
        c.setsockopt(socket.IPPROTO_TCP, 31, name.encode())
        print(name, "SET")
    except OSError as e:
        print(name, "REFUSED", e.errno)
`;

test("with a network, setsockopt(TCP_ULP) is refused before the kernel's upper-layer protocols (kernel TLS); on the host the kernel answers", async (t) => {
  // Baseline: unsandboxed, the kernel's ULP code takes the request (and answers with what it has:
  // set, or ENOENT / EINVAL where that ULP is missing or kernel-only), never EPERM.
  const host = execFileSync("python3", ["-c", ULP], { encoding: "utf8" });
  assert.match(host, /^nodelay SET$/m, host);
  for (const name of ["tls", "mptcp", "smc", "espintcp"]) {
    assert.match(host, new RegExp(`^${name} (SET|REFUSED (?!1$)\\d+)$`, "m"), host);
  }
  const s = await setup(t, true);
  if (!s) return;
  const got = await s.python(ULP);
  const shell = await s.bash(`python3 -c '${ULP.replaceAll("'", "'\\''")}'`);
  for (const out of [got, shell]) {
    assert.match(out, /^nodelay SET$/m, out);
    for (const name of ["tls", "mptcp", "smc", "espintcp"]) assert.match(out, new RegExp(`^${name} REFUSED 1$`, "m"), out);
  }
});

test("a session grant the user gave a bash command reaches the python tool's network", async (t) => {
  // python's dialog is denied, bash's allows for the session.
  const s = await setup(t, true, { select: async (title, options) => (title.startsWith("bash:") ? options.find((o) => o.endsWith("for this session")) : "Deny") });
  if (!s) return;
  const url = `http://${s.other.name}:${s.other.port}/`;
  // Baseline: unmatched and denied at review, refused for python.
  assert.match(await s.python(fetch(url)), /HTTP 403/);
  assert.match(await s.bash(`curl -sS -m 20 ${url}`), /OTHER-BODY/);
  assert.equal(s.h.selects.length, 2);
  const got = await s.python(fetch(url));
  assert.match(got, /BODY OTHER-BODY/, got);
  assert.equal(s.other.hits(), 2);
});

test("with a UI, the python tool's unmatched destination is reviewed in a dialog during the call: allowed once, then denied", async (t) => {
  const answers = ["Allow this connection", "Deny"];
  const s = await setup(t, true, { select: async () => answers.shift() });
  if (!s) return;
  const url = `http://${s.other.name}:${s.other.port}/`;
  const allowed = await s.python(fetch(url));
  assert.match(allowed, /BODY OTHER-BODY/, allowed);
  assert.equal(s.h.selects.length, 1);
  const { title, options } = s.h.selects[0];
  assert.ok(title.startsWith(`python: the code asks to connect to ${s.other.name}:${s.other.port}`), title);
  assert.match(title, /^code: .*urllib\.request\.urlopen/m, title);
  // Its grants last for the call, and the options say so.
  assert.deepEqual(options.slice(1, 3), [
    `Allow ${s.other.name}:${s.other.port} for this call`,
    `Allow ${s.other.name}:${s.other.port} for this session`,
  ]);
  // The grant was for one connection: the next call asks again, and a denial is a 403.
  const denied = await s.python(fetch(url));
  assert.match(denied, /HTTP 403/, denied);
  assert.equal(s.h.selects.length, 2);
  assert.equal(s.other.hits(), 1);
});

test("a reviewer on pi's event bus reviews the python tool's destination as a bash command's: tool python, the code; no dialog", async (t) => {
  const log = configureReviewer((r) => (r.tool === "python" && log.reviews.length === 1 ? "once" : "deny"));
  const s = await setup(t, true, { select: async () => "Allow this connection" }, { extensions: [REVIEWER] });
  if (!s) return;
  const url = `http://${s.other.name}:${s.other.port}/`;
  const allowed = await s.python(fetch(url));
  assert.match(allowed, /BODY OTHER-BODY/, allowed);
  assert.equal(log.reviews.length, 1);
  const [review] = log.reviews;
  assert.equal(review.tool, "python");
  assert.equal(review.authority, `${s.other.name}:${s.other.port}`);
  assert.match(String(review.command), /urllib\.request\.urlopen/);
  // The reviewer's deny is a 403, still with no dialog (the dialog would have allowed it).
  const denied = await s.python(fetch(url));
  assert.match(denied, /HTTP 403 .*refused at review/, denied);
  assert.equal(log.reviews.length, 2);
  assert.equal(s.h.selects.length, 0, "the reviewer decided: no dialog");
  assert.equal(s.other.hits(), 1);
});

test("in yolo mode the python tool's unmatched destination is allowed without review, as bash's; review.yolo \"review\" asks", async (t) => {
  const s = await setup(t, true, { select: async () => "Deny" }, { mode: "yolo" });
  if (!s) return;
  const url = (o: Origin) => `http://${o.name}:${o.port}/`;
  const got = await s.python(fetch(url(s.other)));
  assert.match(got, /BODY OTHER-BODY/, got);
  assert.equal(s.h.selects.length, 0);
  await s.h.dispose();
  // Baseline: with review.yolo "review" the same call is reviewed, and the dialog's Deny refuses.
  const r = await setup(t, true, { select: async () => "Deny" }, { mode: "yolo", reviewYolo: "review" });
  if (!r) return;
  const denied = await r.python(fetch(url(r.other)));
  assert.match(denied, /HTTP 403 .*refused at review/, denied);
  assert.equal(r.h.selects.length, 1);
  assert.equal(r.other.hits(), 0);
});

test("/sandbox allow reaches the running python sandbox: the interpreter's state is kept", async (t) => {
  const s = await setup(t, true);
  if (!s) return;
  const url = `http://${s.other.name}:${s.other.port}/`;
  assert.match(await s.python(`kept = 42\n${fetch(url)}`), /HTTP 403/);
  await s.h.prompt(`/sandbox allow ${s.other.name}:${s.other.port}`);
  const got = await s.python(`print("KEPT", kept)\n${fetch(url)}`);
  assert.match(got, /KEPT 42\nBODY OTHER-BODY/, got);
  assert.equal(s.other.hits(), 1);
});

test("with network.python true, pip installs into a venv in /scratch from an allowed local index; without it, nothing is fetched", { timeout: 300_000 }, async (t) => {
  const { index, files } = await pipIndex(t);
  const pip = (python: boolean) =>
    netSession(t, {
      mode: "proxy",
      allowedDomains: [index, files].map((o) => `${o.name}:${o.port}`),
      allowPrivate: [index, files].map((o) => `${o.address}:${o.port}`),
      python,
    }, { hasUI: false });
  const code = `
import subprocess, sys
subprocess.run([sys.executable, "-m", "venv", "/scratch/venv"], check=True, capture_output=True)
r = subprocess.run(["/scratch/venv/bin/python", "-m", "pip", "install", "--no-cache-dir", "--disable-pip-version-check",
    "--retries", "0", "--timeout", "20", "--index-url", "http://${index.name}:${index.port}/simple/",
    "--trusted-host", "${index.name}", "--trusted-host", "${files.name}", "netdemo"], capture_output=True, text=True)
print("PIP", r.returncode, r.stdout[-300:], r.stderr[-300:])
r = subprocess.run(["/scratch/venv/bin/python", "-c", "import netdemo; print('VALUE', netdemo.VALUE)"], capture_output=True, text=True)
print(r.stdout.strip() or "NOT-INSTALLED")
`;
  const run = async (s: NetSession) =>
    s.h.getTool("python").execute("pip", { code, timeoutSeconds: 120 }, undefined, undefined).then((r) => messageText(r));
  // Baseline: the default (no network for python): pip fetches nothing.
  const off = await pip(false);
  if (!off) return;
  const none = await run(off);
  assert.match(none, /PIP [1-9]/, none);
  assert.match(none, /NOT-INSTALLED/, none);
  assert.equal(index.hits() + files.hits(), 0);
  await off.h.dispose();
  const on = await pip(true);
  if (!on) return;
  const got = await run(on);
  assert.match(got, /PIP 0 /, got);
  assert.match(got, /^VALUE 1$/m, got);
  assert.ok(index.hits() >= 1 && files.hits() === 1, `index ${index.hits()}, files ${files.hits()}`);
});

const AS_NOBODY_ENV = "PPS_NET_PYTHON_AS_NOBODY";
test("as nobody: every test above passes unprivileged", { skip: process.env[AS_NOBODY_ENV] === "1" ? "this is the nobody run" : false }, (t) => {
  rerunAsNobody(t, "__test__/network-python.test.ts", AS_NOBODY_ENV, 13);
});
