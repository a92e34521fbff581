//! cargo-fuzz target: arbitrary bytes on the worker -> host reply channel.
//! Run with `npm run fuzz` (scripts/fuzz.mjs), or
//! `cargo +nightly fuzz run frame fuzz/corpus/frame -- -max_total_time=60`.
#![no_main]

#[path = "../frame_check.rs"]
mod frame_check;

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    frame_check::check(data);
});
