/**
 * Exhausting the network proxy from inside a sandbox, through a real pi session's bash: a thousand
 * connections, slow heads, and a large upload through a CONNECT to a host-side origin that accepts
 * and never reads. The pi host is this process: its resident memory (VmRSS) is sampled while each
 * attack runs, against a bound that a proxy buffering what the sandbox sends would break, and the
 * proxy serves a normal request during and after each attack. The proxy has no path that depends
 * on the user; network-inside.test.ts runs the listener and the session as `nobody`.
 */
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { createServer, type Socket } from "node:net";
import { once } from "node:events";
import type { AddressInfo } from "node:net";
import { test, type TestContext } from "node:test";
import { httpOrigin, machine, netSession, type Origin } from "./helpers/network.ts";

const PROXY_PORT = 3128;
/** The proxy's connections served at once (src/network/proxy.rs MAX_CONNECTIONS). */
const MAX_CONNECTIONS = 64;
const MIB = 1024;

/** This process's resident memory, in KiB. */
function rssKib(): number {
  const line = readFileSync("/proc/self/status", "utf8").split("\n").find((l) => l.startsWith("VmRSS:"));
  return Number(line?.split(/\s+/)[1]);
}

/** Samples this process's resident memory every 20 ms until `during` settles; its result and the peak growth in KiB. */
async function peakGrowth<T>(during: Promise<T>): Promise<{ value: T; grewKib: number; beforeKib: number }> {
  const beforeKib = rssKib();
  let peak = beforeKib;
  const timer = setInterval(() => {
    peak = Math.max(peak, rssKib());
  }, 20);
  try {
    const value = await during;
    peak = Math.max(peak, rssKib());
    return { value, grewKib: peak - beforeKib, beforeKib };
  } finally {
    clearInterval(timer);
  }
}

/** The entries that let `o` be reached by name. */
const reach = (...os: { name: string; address: string; port: number }[]) => ({
  allowedDomains: os.map((o) => `${o.name}:${o.port}`),
  allowPrivate: os.map((o) => `${o.address}:${o.port}`),
});

/** A normal request through the proxy, from inside the sandbox (a shell fragment printing `normal <body> rc=<rc>`). */
const normal = (o: Origin) => `printf 'normal '; curl -sS -m 25 http://${o.name}:${o.port}/ 2>&1; echo "rc=$?"`;
/** The same, as Python lines (with `subprocess` imported). */
const pyNormal = (o: Origin) =>
  `r = subprocess.run(["curl", "-sS", "-m", "25", "http://${o.name}:${o.port}/"], capture_output=True, text=True)\n` +
  `print("normal " + r.stdout + r.stderr + "rc=" + str(r.returncode), flush=True)`;

/** A host-side origin that accepts and never reads (its sockets paused and held until the test ends). */
async function stalledOrigin(t: TestContext): Promise<Origin & { accepted(): number }> {
  const { name, address } = await machine();
  const held: Socket[] = [];
  const server = createServer({ pauseOnConnect: true }, (c) => {
    held.push(c);
    c.on("error", () => {});
  });
  server.listen(0, address);
  await once(server, "listening");
  t.after(() => {
    for (const c of held) c.destroy();
    return new Promise<void>((resolve) => server.close(() => resolve()));
  });
  return { name, address, port: (server.address() as AddressInfo).port, hits: () => held.length, accepted: () => held.length };
}

test("a thousand connections from inside: host memory stays bounded and the proxy serves during and after", async (t) => {
  const o = await httpOrigin(t);
  const s = await netSession(t, { ...reach(o), deniedDomains: ["*:22"] });
  if (!s) return;
  // A thousand connections opened at once, each with a whole CONNECT to a denied port, all held
  // open (their answers unread) while a normal request goes through; then every answer read. The
  // sandbox allows 128 open files a process: ten processes hold a hundred each.
  const flood = `python3 - <<'EOF'
import os, selectors, socket, subprocess, time
ready_r, ready_w = os.pipe()
go_r, go_w = os.pipe()
kids = []
for k in range(10):
    out_r, out_w = os.pipe()
    pid = os.fork()
    if pid:
        os.close(out_w); kids.append((pid, out_r)); continue
    os.close(ready_r); os.close(go_w)
    socks = [socket.socket() for _ in range(100)]
    sel = selectors.DefaultSelector()
    for i, c in enumerate(socks):
        c.setblocking(False); c.connect_ex(("127.0.0.1", ${PROXY_PORT})); sel.register(c, selectors.EVENT_WRITE, i)
    sent, until = 0, time.time() + 20
    while sent < 100 and time.time() < until:
        for key, _ in sel.select(timeout=0.5):
            try: key.fileobj.send(b"CONNECT ${o.name}:22 HTTP/1.1\\r\\n\\r\\n"); sent += 1
            except OSError: pass
            sel.unregister(key.fileobj)
    os.write(ready_w, b"x")
    os.read(go_r, 1)
    refused = 0
    for c in socks:
        c.setblocking(True); c.settimeout(max(0.1, until + 10 - time.time()))
        try: refused += b'refused by network.deniedDomains "*:22"' in c.recv(4096)
        except OSError: pass
    os.write(out_w, f"{sent} {refused}".encode()); os._exit(0)
os.close(ready_w); os.close(go_r)
got = b""
while len(got) < 10:
    more = os.read(ready_r, 10)
    if not more: break
    got += more
${pyNormal(o)}
os.close(go_w)
sent = refused = 0
for pid, out_r in kids:
    a, b = os.read(out_r, 64).split(); sent += int(a); refused += int(b); os.waitpid(pid, 0)
print("sent", sent, "refused", refused)
EOF
${normal(o)}`;
  const { value: out, grewKib, beforeKib } = await peakGrowth(s.bash(flood, { timeout: 60 }));
  t.diagnostic(`1,000 connections: resident memory grew ${grewKib} KiB (from ${beforeKib} KiB)`);
  assert.match(out, /sent 1000 refused 1000\n/, out);
  // During (all thousand open) and after: served.
  assert.equal(out.match(/normal ORIGIN-BODY\nrc=0/g)?.length, 2, out);
  assert.equal(o.hits(), 2);
  // A proxy that kept each of the thousand connections with its buffers (a 16 KiB head, two 64 KiB
  // relay buffers) would hold about 140 MiB; this one serves at most 64 at once and frees each
  // refusal (measured: a few MiB, the noise of this process's own heap).
  assert.ok(grewKib < 32 * MIB, `grew ${grewKib} KiB`);
});

test("slow heads from inside: they hold their slots only until the head deadline; a normal request is served meanwhile and after", async (t) => {
  const o = await httpOrigin(t);
  const s = await netSession(t, reach(o));
  if (!s) return;
  // More slow heads than slots, each a byte every 250 ms and never ending; a normal request started
  // after they took every slot; the slow ones counted as they are cut.
  const slow = `python3 - <<'EOF' &
import socket, time
socks = []
for i in range(${MAX_CONNECTIONS + 8}):
    c = socket.create_connection(("127.0.0.1", ${PROXY_PORT}), timeout=5); c.sendall(b"GET http://"); socks.append(c)
print("opened", len(socks), flush=True)
cut, until = set(), time.time() + 14
while time.time() < until:
    time.sleep(0.25)
    for i, c in enumerate(socks):
        if i in cut: continue
        try: c.send(b"a")
        except OSError: cut.add(i)
print("cut", len(cut), flush=True)
EOF
sleep 1.5
${normal(o)}
wait
${normal(o)}`;
  const { value: out, grewKib } = await peakGrowth(s.bash(slow, { timeout: 60 }));
  t.diagnostic(`${MAX_CONNECTIONS + 8} slow heads: resident memory grew ${grewKib} KiB`);
  assert.match(out, new RegExp(`opened ${MAX_CONNECTIONS + 8}\\n`), out);
  const cut = Number(/cut (\d+)/.exec(out)?.[1]);
  // Every slot's slow head was cut at the deadline (those still queued had no slot to lose).
  assert.ok(cut >= MAX_CONNECTIONS, out);
  assert.equal(out.match(/normal ORIGIN-BODY\nrc=0/g)?.length, 2, out);
  assert.equal(o.hits(), 2);
  // Slow heads hold a slot and at most a 16 KiB head each: about 1 MiB for all the slots.
  assert.ok(grewKib < 16 * MIB, `grew ${grewKib} KiB`);
});

/** Shell: upload up to 512 MiB (generated, never stored) through a CONNECT to `o`, for at most `secs`; prints `uploaded <bytes>`. */
const upload = (o: Origin, secs: number, during?: Origin) => `python3 - <<'EOF'
import socket, subprocess, time
c = socket.create_connection(("127.0.0.1", ${PROXY_PORT}), timeout=10)
c.sendall(b"CONNECT ${o.name}:${o.port} HTTP/1.1\\r\\nHost: ${o.name}:${o.port}\\r\\n\\r\\n")
head = b""
while b"\\r\\n\\r\\n" not in head:
    got = c.recv(1)
    if not got: break
    head += got
print(head.split(b"\\r\\n")[0].decode(), flush=True)
chunk, sent, until = b"x" * 65536, 0, time.time() + ${secs}
c.settimeout(0.5)
while sent < (512 << 20) and time.time() < until:
    try: sent += c.send(chunk)
    except socket.timeout: pass
    except OSError: break
print("uploaded", sent, flush=True)
${during ? pyNormal(during) : ""}
EOF`;

test("a 512 MiB upload from inside through a CONNECT to an origin that never reads: it stops at the buffers, host memory bounded", async (t) => {
  const stalled = await stalledOrigin(t);
  // Baseline: an origin that reads everything, to which the same upload flows.
  let readBytes = 0;
  const { name, address } = await machine();
  const readers: Socket[] = [];
  const reading = createServer((c) => {
    readers.push(c);
    c.on("data", (d) => {
      readBytes += d.length;
    });
    c.on("error", () => {});
  });
  reading.listen(0, address);
  await once(reading, "listening");
  t.after(() => {
    for (const c of readers) c.destroy();
    return new Promise<void>((resolve) => reading.close(() => resolve()));
  });
  const flowing = { name, address, port: (reading.address() as AddressInfo).port, hits: () => 0 };
  const o = await httpOrigin(t);
  const s = await netSession(t, reach(stalled, flowing, o));
  if (!s) return;
  const base = await s.bash(upload(flowing, 4), { timeout: 60 });
  assert.match(base, /HTTP\/1.1 200/, base);
  const flowed = Number(/uploaded (\d+)/.exec(base)?.[1]);
  const { value: out, grewKib } = await peakGrowth(s.bash(`${upload(stalled, 4, o)}\n${normal(o)}`, { timeout: 60 }));
  const stuck = Number(/uploaded (\d+)/.exec(out)?.[1]);
  t.diagnostic(`upload in 4 s to a reading origin: ${flowed >> 20} MiB; to a stalled one: ${stuck >> 20} MiB (kernel buffers); the reading origin read ${readBytes >> 20} MiB; resident memory grew ${grewKib} KiB`);
  assert.match(out, /HTTP\/1.1 200/, out);
  assert.equal(stalled.accepted(), 1);
  // The baseline shows the upload would flow: what the stalled one took is the kernel's buffers
  // and the proxy's pipe (64 KiB, at most 1 MiB grown), not the 512 MiB offered.
  assert.ok(flowed > 4 * Math.max(stuck, 1 << 20), `flowing ${flowed} stuck ${stuck}`);
  assert.ok(stuck < 64 << 20, `stuck ${stuck}`);
  // A proxy that read the upload into memory would grow by what it took (up to 512 MiB).
  assert.ok(grewKib < 32 * MIB, `grew ${grewKib} KiB`);
  // Served while the stalled tunnel holds its slot, and after.
  assert.equal(out.match(/normal ORIGIN-BODY\nrc=0/g)?.length, 2, out);
  assert.equal(o.hits(), 2);
});
