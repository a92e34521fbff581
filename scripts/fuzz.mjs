// `npm run fuzz [-- SECONDS]`: fuzz each target for a bounded time (default 60 s each) with
// cargo-fuzz (libFuzzer + AddressSanitizer, nightly Rust): `frame`, the worker -> host frame
// decoder (src/frame.rs), and `proxy`, the network proxy's parsers (src/network/wire/: HTTP,
// SOCKS5, the TLS ClientHello) and its canonical host form (src/network/addr.rs).
//
// The targets are fuzz/fuzz_targets/NAME.rs; their oracles (fuzz/frame_check.rs,
// fuzz/proxy_check.rs) are the same ones that tests/frame_fuzz.rs and tests/proxy_fuzz.rs run on
// stable in every `cargo test`. The committed seeds in fuzz/corpus/NAME are read-only here; what
// the fuzzer finds grows fuzz/work-corpus/NAME (ignored by git: cache it between CI runs to keep
// the corpus). A crash leaves its input in fuzz/artifacts/NAME/ and fails the run with the
// command that reproduces it.
//
// Without cargo-fuzz or a nightly toolchain the script says which is missing and how to get it,
// runs the stable property test instead, and exits 0 (1 with --require, for a CI that must fuzz).
import { spawnSync } from "node:child_process";
import { mkdirSync, readdirSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

const root = fileURLToPath(new URL("..", import.meta.url));
const args = process.argv.slice(2);
const require = args.includes("--require");
const seconds = Number(args.find((a) => /^\d+$/.test(a)) ?? process.env.FUZZ_SECONDS ?? 60);
const targets = [
  { name: "frame", what: "the frame decoder", stable: "frame_fuzz" },
  { name: "proxy", what: "the proxy's parsers", stable: "proxy_fuzz" },
];

function probe(cmd, argv) {
  const r = spawnSync(cmd, argv, { cwd: root, encoding: "utf8" });
  return r.status === 0 ? r.stdout.trim() : null;
}

function missing() {
  const why = [];
  if (probe("cargo", ["--version"]) === null) return ["cargo is not installed (https://rustup.rs)"];
  const nightly = probe("cargo", ["+nightly", "--version"]);
  if (nightly === null) why.push("no nightly toolchain: `rustup toolchain install nightly` (libFuzzer needs -Zsanitizer)");
  if (probe("cargo", ["fuzz", "--version"]) === null) why.push("cargo-fuzz is not installed: `cargo install cargo-fuzz`");
  return why;
}

function run(cmd, argv, env = {}) {
  console.log(`$ ${cmd} ${argv.join(" ")}`);
  const r = spawnSync(cmd, argv, { cwd: root, stdio: ["ignore", "inherit", "pipe"], encoding: "utf8", env: { ...process.env, ...env } });
  process.stderr.write(r.stderr ?? "");
  return r;
}

const why = missing();
if (why.length > 0) {
  console.log(`# cargo fuzz cannot run here: ${why.join("; ")}.`);
  console.log("# Running the stable property tests of the same oracles instead (tests/frame_fuzz.rs, tests/proxy_fuzz.rs).");
  const r = run("cargo", ["test", "--locked", ...targets.flatMap((t) => ["--test", t.stable])]);
  if (r.status !== 0) process.exit(r.status ?? 1);
  process.exit(require ? 1 : 0);
}

for (const { name, what } of targets) {
  const seeds = join(root, `fuzz/corpus/${name}`);
  const work = join(root, `fuzz/work-corpus/${name}`);
  mkdirSync(work, { recursive: true });
  const before = readdirSync(work).length;
  console.log(`# fuzzing ${what} for ${seconds} s (seeds: ${readdirSync(seeds).length} files; work corpus: ${before} files)`);
  const r = run("cargo", [
    "+nightly", "fuzz", "run", name, work, seeds, "--",
    `-max_total_time=${seconds}`, "-timeout=10", "-rss_limit_mb=2048", "-print_final_stats=1",
  ]);
  const done = /Done (\d+) runs in (\d+) second/.exec(r.stderr ?? "");
  const after = readdirSync(work).length;
  if (r.status !== 0) {
    const crash = /Test unit written to (\S+)/.exec(r.stderr ?? "");
    console.log(`# the fuzzer failed on ${name} (exit ${r.status}).`);
    if (crash) console.log(`# reproduce: cargo +nightly fuzz run ${name} ${crash[1]}`);
    process.exit(1);
  }
  console.log(`# ${name}: ${done ? `${done[1]} runs in ${done[2]} s` : "done"}, no crash; work corpus ${before} -> ${after} files`);
}
