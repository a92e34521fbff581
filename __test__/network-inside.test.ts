/**
 * The network from inside a sandbox, through a real pi session's bash: host-side origins on the
 * address this machine's name resolves to, reached only through `allowPrivate` entries, and no
 * internet. Allowed: curl over https (CONNECT to a local TLS origin, its self-signed certificate
 * made here), Python's urllib, `git clone` over http, `pip download` from a local index (the file
 * host refused, with its line, when only the index is allowed). Refused with the rule named: a denied
 * domain, a denied port (`*:22`), an IP literal, a name that resolves to a private address
 * without `allowPrivate`, a Host header other than the authority, an SNI other than the CONNECT
 * host, a SOCKS name with a NUL byte, an empty allowlist. Bypass attempts: `curl --noproxy '*'`,
 * a raw connect to the host's service, UDP to port 53, AF_NETLINK / AF_PACKET / SOCK_RAW, an
 * in-sandbox relay of CONNECTs, another sandbox's proxy. Each next to its baseline (the same
 * attempt where it works). Both majors (scripts/pi1-host.mjs lists it); as root, the whole file
 * runs again as `nobody`.
 */
import assert from "node:assert/strict";
import { spawnSync } from "node:child_process";
import { mkdirSync, mkdtempSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { connect } from "node:net";
import { join, normalize } from "node:path";
import { test } from "node:test";
import { httpOrigin, netSession, pipIndex, tlsOrigin } from "./helpers/network.ts";
import { rerunAsNobody } from "./helpers/as-nobody.ts";
import { unfiltered } from "./helpers/unfiltered.ts";

const PROXY_PORT = 3128;
const curl = (url: string, extra = "") => `curl -sS -m 20 ${extra} ${url} 2>&1; echo "rc=$?"`;
/** The private entries and the allow entry that let `o` be reached by name. */
const byName = (o: { name: string; address: string; port: number }) => ({
  allowedDomains: [`${o.name}:${o.port}`],
  allowPrivate: [`${o.address}:${o.port}`],
});

test("allowed: curl over https (CONNECT to a local TLS origin), Python's urllib, git clone over http", async (t) => {
  const base = mkdtempSync("/var/tmp/pps-net-inside-");
  t.after(() => rmSync(base, { recursive: true, force: true }));
  const project = join(base, "project");
  mkdirSync(project);
  const tls = await tlsOrigin(t, join(project, "origin-ca.crt"));
  const web = await httpOrigin(t, "URLLIB-BODY\n");
  // A bare repository served over git's dumb http protocol (static files).
  const repos = join(base, "repos");
  const git = (...args: string[]) => {
    const r = spawnSync("git", ["-c", "user.name=t", "-c", "user.email=t@example.org", "-c", "init.defaultBranch=main", ...args], { encoding: "utf8" });
    assert.equal(r.status, 0, `git ${args.join(" ")}: ${r.stderr}`);
  };
  git("init", "-q", join(base, "work"));
  writeFileSync(join(base, "work", "README"), "CLONED-CONTENT\n");
  git("-C", join(base, "work"), "add", "README");
  git("-C", join(base, "work"), "commit", "-qm", "one");
  git("clone", "-q", "--bare", join(base, "work"), join(repos, "repo.git"));
  git("-C", join(repos, "repo.git"), "update-server-info");
  const gitOrigin = await httpOrigin(t, "", (req, res) => {
    const path = normalize(join(repos, decodeURIComponent((req.url ?? "/").split("?")[0])));
    if (!path.startsWith(`${repos}/`) || !statSync(path, { throwIfNoEntry: false })?.isFile()) {
      res.statusCode = 404;
      res.end();
      return;
    }
    res.end(readFileSync(path));
  });
  const network = {
    allowedDomains: [`${tls.name}:${tls.port}`, `${web.name}:${web.port}`, `${gitOrigin.name}:${gitOrigin.port}`],
    allowPrivate: [tls, web, gitOrigin].map((o) => `${o.address}:${o.port}`),
  };
  const s = await netSession(t, network, { project });
  if (!s) return;
  const https = await s.bash(curl(`https://${tls.name}:${tls.port}/`, `--cacert ${join(project, "origin-ca.crt")}`));
  assert.match(https, /TLS-ORIGIN-BODY\nrc=0/, https);
  assert.ok(https.includes(`network: allowed ${tls.name}:${tls.port}.`), https);
  const py = await s.bash(`python3 -c 'import urllib.request; print(urllib.request.urlopen("http://${web.name}:${web.port}/", timeout=20).read().decode(), end="")'; echo "rc=$?"`);
  assert.match(py, /URLLIB-BODY\nrc=0/, py);
  const cloned = await s.bash(`cd /tmp && git clone -q http://${gitOrigin.name}:${gitOrigin.port}/repo.git r 2>&1 && cat r/README; echo "rc=$?"`);
  assert.match(cloned, /CLONED-CONTENT\nrc=0/, cloned);
  assert.ok(gitOrigin.hits() > 0 && tls.hits() === 1 && web.hits() === 1);
});

test("allowed: pip download from a local package index (its simple page and its file host)", async (t) => {
  const { index, files, wheelName } = await pipIndex(t);
  const network = {
    allowedDomains: [`${index.name}:${index.port}`, `${files.name}:${files.port}`],
    allowPrivate: [index, files].map((o) => `${o.address}:${o.port}`),
  };
  const s = await netSession(t, network);
  if (!s) return;
  const pip = (host: string) =>
    `python3 -m pip download --no-cache-dir --disable-pip-version-check --retries 0 --timeout 20 ` +
    `--index-url http://${index.name}:${index.port}/simple/ --trusted-host ${host} --dest /tmp/dl netdemo 2>&1 | tail -n 3; ` +
    `ls /tmp/dl 2>&1; echo "rc=$?"`;
  const got = await s.bash(pip(index.name));
  assert.ok(got.includes(`${wheelName}\nrc=0`), got);
  assert.ok(got.includes(`network: allowed ${index.name}:${index.port}, ${files.name}:${files.port}.`), got);
  assert.ok(index.hits() >= 1 && files.hits() === 1, `index ${index.hits()}, files ${files.hits()}`);
  // The index alone is not enough: the file host is refused, and the refusal names the line to add.
  const indexOnly = await netSession(t, { ...network, allowedDomains: [`${index.name}:${index.port}`] });
  if (!indexOnly) return;
  const refused = await indexOnly.bash(pip(index.name));
  assert.ok(!refused.includes(`${wheelName}\nrc=0`), refused);
  assert.ok(refused.includes(`(to allow it: network.allowedDomains "${files.name}:${files.port}")`), refused);
  assert.equal(files.hits(), 1);
});

test("refused, naming the rule: a denied domain and a denied port, next to the same destination allowed", async (t) => {
  const o = await httpOrigin(t);
  const allowed = await netSession(t, byName(o));
  if (!allowed) return;
  assert.match(await allowed.bash(curl(`http://${o.name}:${o.port}/`)), /ORIGIN-BODY\nrc=0/);
  const denied = await netSession(t, { ...byName(o), deniedDomains: [o.name] });
  if (!denied) return;
  const out = await denied.bash(curl(`http://${o.name}:${o.port}/`));
  assert.ok(out.includes(`refused by network.deniedDomains "${o.name}"`), out);
  // Port 22: the same name, allowed on every port, except by `*:22`.
  const anyPort = { allowedDomains: [o.name], allowPrivate: [o.address] };
  const open = await netSession(t, anyPort);
  if (!open) return;
  assert.match(await open.bash(curl(`http://${o.name}:${o.port}/`)), /ORIGIN-BODY\nrc=0/);
  const ssh = await netSession(t, { ...anyPort, deniedDomains: ["*:22"] });
  if (!ssh) return;
  const out22 = await ssh.bash(curl(`http://${o.name}:22/`));
  assert.ok(out22.includes(`refused by network.deniedDomains "*:22"`), out22);
  assert.equal(o.hits(), 2);
});

test("refused, naming the rule: an IP literal no entry names, and a name that resolves to a private address without allowPrivate", async (t) => {
  const o = await httpOrigin(t);
  const s = await netSession(t, { allowedDomains: [`${o.name}:${o.port}`] });
  if (!s) return;
  const literal = await s.bash(curl(`http://${o.address}:${o.port}/`));
  assert.ok(literal.includes(`${o.address}:${o.port} is an IP address that no allow entry names`), literal);
  const priv = await s.bash(curl(`http://${o.name}:${o.port}/`));
  assert.ok(priv.includes(`resolves to ${o.address}`) && priv.includes(`network.allowPrivate "${o.address}:${o.port}"`), priv);
  assert.equal(o.hits(), 0);
  // Baseline: with the address in allowPrivate, both go through.
  const b = await netSession(t, byName(o));
  if (!b) return;
  assert.match(await b.bash(curl(`http://${o.address}:${o.port}/`)), /ORIGIN-BODY\nrc=0/);
  assert.match(await b.bash(curl(`http://${o.name}:${o.port}/`)), /ORIGIN-BODY\nrc=0/);
});

test("refused, naming the rule: a Host header other than the authority; an empty allowlist (CVE-2025-66479)", async (t) => {
  const o = await httpOrigin(t);
  const s = await netSession(t, byName(o), { hasUI: false });
  if (!s) return;
  assert.match(await s.bash(curl(`http://${o.name}:${o.port}/`)), /ORIGIN-BODY\nrc=0/);
  const host = await s.bash(curl(`http://${o.name}:${o.port}/`, "-H 'Host: other.example'"));
  assert.doesNotMatch(host, /ORIGIN-BODY/);
  assert.match(host, /the Host header names `other\.example`, not the request's/, host);
  assert.equal(o.hits(), 1);
  // `allowedDomains: []` is no restriction in sandbox-runtime's bug; here it allows nothing.
  const empty = await netSession(t, { allowedDomains: [], allowPrivate: [`${o.address}:${o.port}`] }, { hasUI: false });
  if (!empty) return;
  const out = await empty.bash(curl(`http://${o.name}:${o.port}/`));
  assert.ok(out.includes(`${o.name}:${o.port} matches no network.allowedDomains entry and no one can review it`), out);
  assert.equal(o.hits(), 1);
});

/** CONNECT through the proxy, then TLS with `sni`; prints the proxy's line and what TLS gave. */
const SNI_PROBE = `
import os, socket, ssl, sys
name, port, sni, ca = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
s = socket.create_connection(("127.0.0.1", int(os.environ["HTTPS_PROXY"].rsplit(":", 1)[1])), timeout=20)
s.sendall(f"CONNECT {name}:{port} HTTP/1.1\\r\\nHost: {name}:{port}\\r\\n\\r\\n".encode())
head = b""
while b"\\r\\n\\r\\n" not in head:
    d = s.recv(1)
    if not d:
        break
    head += d
print("proxy:", head.split(b"\\r\\n")[0].decode())
ctx = ssl.create_default_context(cafile=ca)
ctx.check_hostname = False
try:
    t = ctx.wrap_socket(s, server_hostname=sni)
    t.sendall(b"GET / HTTP/1.0\\r\\n\\r\\n")
    print("tls:", t.recv(4096).decode().split("\\r\\n\\r\\n")[-1], end="")
except Exception as e:
    print("tls-failed:", type(e).__name__)
`;

/** A SOCKS5 CONNECT for `name` (with a NUL and an attacker's name in front when asked). */
const SOCKS_PROBE = `
import os, socket, sys
name, port, nul = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "nul"
host = (b"evil.example\\x00." + name.encode()) if nul else name.encode()
s = socket.create_connection(("127.0.0.1", int(os.environ["ALL_PROXY"].rsplit(":", 1)[1])), timeout=20)
s.sendall(b"\\x05\\x01\\x00")
assert s.recv(2) == b"\\x05\\x00"
s.sendall(b"\\x05\\x01\\x00\\x03" + bytes([len(host)]) + host + port.to_bytes(2, "big"))
r = s.recv(10)
print("socks-reply", r[1])
if r[1] == 0:
    s.sendall(b"GET / HTTP/1.0\\r\\n\\r\\n")
    print(s.recv(4096).decode().split("\\r\\n\\r\\n")[-1], end="")
`;

test("refused: an SNI other than the CONNECT host, and a SOCKS name with a NUL byte; each next to its baseline", async (t) => {
  const base = mkdtempSync("/var/tmp/pps-net-inside-");
  t.after(() => rmSync(base, { recursive: true, force: true }));
  const project = join(base, "project");
  mkdirSync(project);
  const cert = join(project, "origin-ca.crt"); // a *.pem of the project would be masked as a secret
  const tls = await tlsOrigin(t, cert);
  const web = await httpOrigin(t);
  writeFileSync(join(project, "sni.py"), SNI_PROBE);
  writeFileSync(join(project, "socks.py"), SOCKS_PROBE);
  const s = await netSession(
    t,
    { allowedDomains: [`${tls.name}:${tls.port}`, web.name], allowPrivate: [`${tls.address}:${tls.port}`, `${web.address}:${web.port}`] },
    { project },
  );
  if (!s) return;
  const sni = (name: string) => s.bash(`python3 ${join(project, "sni.py")} ${tls.name} ${tls.port} ${name} ${cert}; echo "rc=$?"`);
  const same = await sni(tls.name);
  assert.match(same, /proxy: HTTP\/1.1 200.*\ntls: TLS-ORIGIN-BODY/, same);
  const other = await sni("other.example");
  assert.match(other, /proxy: HTTP\/1.1 200/, other);
  assert.match(other, /tls-failed/, other);
  assert.doesNotMatch(other, /TLS-ORIGIN-BODY/);
  assert.match(other, /other\.example/, `the summary names the SNI: ${other}`);
  assert.equal(tls.hits(), 1);
  const socks = (nul: string) => s.bash(`python3 ${join(project, "socks.py")} ${web.name} ${web.port} ${nul}; echo "rc=$?"`);
  const clean = await socks("plain");
  assert.match(clean, /socks-reply 0\nORIGIN-BODY/, clean);
  const withNul = await socks("nul");
  assert.match(withNul, /socks-reply [1-9]/, withNul);
  assert.match(withNul, /NUL/, `the summary names the NUL: ${withNul}`);
  assert.equal(web.hits(), 1);
});

/** socket() of each kind a command might try around the proxy: "ok" or the error's name. */
const SOCKET_PROBE = `
import socket
for label, args in [("tcp", (socket.AF_INET, socket.SOCK_STREAM)), ("udp", (socket.AF_INET, socket.SOCK_DGRAM)),
                    ("netlink", (socket.AF_NETLINK, socket.SOCK_RAW, 0)), ("packet", (socket.AF_PACKET, socket.SOCK_RAW, 0)),
                    ("raw", (socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)), ("unix", (socket.AF_UNIX, socket.SOCK_STREAM))]:
    try:
        s = socket.socket(*args)
        if label == "udp":
            s.sendto(b"\\x00" * 12, ("127.0.0.1", 53))
        s.close()
        print(label, "ok")
    except OSError as e:
        print(label, type(e).__name__)
`;

test("bypasses fail: curl --noproxy, a raw connect to the host's service, UDP 53, AF_NETLINK, AF_PACKET, SOCK_RAW", async (t) => {
  const o = await httpOrigin(t);
  const s = await netSession(t, byName(o));
  if (!s) return;
  // Baseline: through the proxy the origin answers.
  assert.match(await s.bash(curl(`http://${o.name}:${o.port}/`)), /ORIGIN-BODY\nrc=0/);
  const noproxy = await s.bash(curl(`http://${o.name}:${o.port}/`, "--noproxy '*'"));
  assert.match(noproxy, /rc=(6|7)\b/, noproxy);
  // A raw connect to the origin's address: from the host it connects; from the sandbox it never
  // reaches the host (its loopback is its own, and it has no route elsewhere).
  await new Promise<void>((resolve, reject) => {
    const c = connect(o.port, o.address, () => {
      c.destroy();
      resolve();
    });
    c.on("error", reject);
  });
  const raw = await s.bash(
    `python3 -c 'import socket
try:
    socket.create_connection(("${o.address}", ${o.port}), timeout=5); print("connected")
except OSError as e:
    print("raw", type(e).__name__)'; echo "rc=$?"`,
  );
  assert.match(raw, /raw (ConnectionRefusedError|OSError|TimeoutError)/, raw);
  assert.doesNotMatch(raw, /connected/);
  assert.equal(o.hits(), 1);
  // The socket kinds: the same probe without the filter (plain bubblewrap, a network namespace of
  // its own) makes each; the command's filter allows TCP only.
  // Unprivileged, bubblewrap cannot give the baseline CAP_NET_RAW, which AF_PACKET and SOCK_RAW
  // need: there the kernel refuses them too, and the root run shows the filter's part.
  const baseline = await unfiltered(SOCKET_PROBE);
  const made = process.getuid?.() === 0 ? ["tcp", "udp", "netlink", "packet", "raw", "unix"] : ["tcp", "udp", "netlink", "unix"];
  for (const label of made) assert.match(baseline, new RegExp(`^${label} ok$`, "m"), baseline);
  const inside = await s.bash(`python3 -c '${SOCKET_PROBE.replaceAll("'", "'\\''")}'`);
  assert.match(inside, /^tcp ok$/m, inside);
  for (const label of ["udp", "netlink", "packet", "raw", "unix"]) assert.match(inside, new RegExp(`^${label} PermissionError$`, "m"), inside);
});

/** A relay inside the sandbox: 127.0.0.1:9999 to the command's proxy, both ways. */
const RELAY = `
import os, socket, threading, time
P = int(os.environ["HTTP_PROXY"].rsplit(":", 1)[1])
l = socket.socket()
l.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
l.bind(("127.0.0.1", 9999))
l.listen(8)
def pipe(a, b):
    try:
        while True:
            d = a.recv(65536)
            if not d:
                break
            b.sendall(d)
    except OSError:
        pass
    try:
        b.shutdown(socket.SHUT_WR)
    except OSError:
        pass
def serve():
    while True:
        c, _ = l.accept()
        u = socket.create_connection(("127.0.0.1", P))
        threading.Thread(target=pipe, args=(c, u), daemon=True).start()
        threading.Thread(target=pipe, args=(u, c), daemon=True).start()
threading.Thread(target=serve, daemon=True).start()
print("relay up", flush=True)
time.sleep(60)
`;

test("bypasses fail: an in-sandbox relay of CONNECTs meets the same policy; another sandbox, and the host, cannot reach a command's proxy", async (t) => {
  const base = mkdtempSync("/var/tmp/pps-net-inside-");
  t.after(() => rmSync(base, { recursive: true, force: true }));
  const project = join(base, "project");
  mkdirSync(project);
  writeFileSync(join(project, "relay.py"), RELAY);
  const o = await httpOrigin(t);
  const s = await netSession(t, { ...byName(o), deniedDomains: [`denied.${o.name}.test`] }, { project });
  if (!s) return;
  const viaRelay = (url: string) =>
    s.bash(`python3 ${join(project, "relay.py")} & for i in $(seq 50); do (echo > /dev/tcp/127.0.0.1/9999) 2>/dev/null && break; sleep 0.1; done; ` +
      `${curl(url, "-x http://127.0.0.1:9999")}; kill %1; wait; true`);
  // Baseline: the relay carries an allowed connection.
  assert.match(await viaRelay(`http://${o.name}:${o.port}/`), /ORIGIN-BODY\nrc=0/);
  const denied = await viaRelay(`http://denied.${o.name}.test:${o.port}/`);
  assert.ok(denied.includes(`refused by network.deniedDomains "denied.${o.name}.test"`), denied);
  // While a command with the proxy runs, its port exists in its own namespace only: the proxy
  // answers that command's CONNECT (baseline); the host and a command without the network, run
  // meanwhile, reach nothing there.
  const probe = `python3 -c 'import socket
try:
    s = socket.create_connection(("127.0.0.1", ${PROXY_PORT}), timeout=5); s.sendall(b"CONNECT denied.${o.name}.test:1 HTTP/1.1\\r\\n\\r\\n"); print("answer", s.recv(12))
except OSError as e:
    print("probe", type(e).__name__)'`;
  const own = await s.bash(probe);
  assert.match(own, /answer b'HTTP\/1.1 403'/, own);
  const off = await netSession(t, { mode: "off" });
  if (!off) return;
  const holder = s.bash(`${probe}; sleep 3; echo held`);
  await new Promise((r) => setTimeout(r, 1000));
  const other = await off.bash(probe);
  assert.match(other, /probe (PermissionError|ConnectionRefusedError)/, other);
  const host = await new Promise<string>((resolve) => {
    const c = connect(PROXY_PORT, "127.0.0.1", () => {
      c.destroy();
      resolve("connected");
    });
    c.on("error", (e: NodeJS.ErrnoException) => resolve(e.code ?? "error"));
  });
  assert.equal(host, "ECONNREFUSED");
  assert.match(await holder, /answer b'HTTP\/1.1 403'[\s\S]*held/);
});

const AS_NOBODY_ENV = "PPS_NET_INSIDE_AS_NOBODY";
test("as nobody: every test above passes unprivileged", { skip: process.env[AS_NOBODY_ENV] === "1" ? "this is the nobody run" : false }, (t) => {
  rerunAsNobody(t, "__test__/network-inside.test.ts", AS_NOBODY_ENV, 8);
});
