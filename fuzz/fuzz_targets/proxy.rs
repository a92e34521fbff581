//! cargo-fuzz target: arbitrary bytes a sandboxed command sends to the
//! network proxy (an HTTP head, a SOCKS5 exchange, a TLS ClientHello, a
//! host name). Run with `npm run fuzz` (scripts/fuzz.mjs), or
//! `cargo +nightly fuzz run proxy fuzz/corpus/proxy -- -max_total_time=60`.
#![no_main]

#[path = "../proxy_check.rs"]
mod proxy_check;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    proxy_check::check(data);
});
