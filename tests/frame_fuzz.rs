//! The frame decoder's fuzz properties on stable Rust, in every `cargo test`:
//! the committed cargo-fuzz corpus replayed, then a bounded, seeded run of
//! random and mutated frames. The oracle is `fuzz/frame_check.rs`, the same
//! one the cargo-fuzz target uses (`npm run fuzz` for the open-ended run).

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../fuzz/frame_check.rs"]
mod frame_check;

use pi_python_sandbox::limits::MAX_FRAME_BYTES;

fn corpus_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/frame")
}

/// The committed corpus, sorted by name so a failure names a stable file.
fn corpus() -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<_> = std::fs::read_dir(corpus_dir())
        .expect("fuzz/corpus/frame exists")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|p| (p.file_name().unwrap().to_string_lossy().into_owned(), std::fs::read(&p).expect("read")))
        .collect()
}

#[test]
fn the_committed_corpus_holds_every_property() {
    let corpus = corpus();
    assert!(corpus.len() >= 10, "the seed corpus is missing ({} files)", corpus.len());
    for (name, data) in &corpus {
        let result = std::panic::catch_unwind(|| frame_check::check(data));
        assert!(result.is_ok(), "corpus file {name} breaks a property");
    }
}

/// xorshift64*: deterministic, so a failure reproduces from the case number.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

fn mutate(rng: &mut Rng, seeds: &[Vec<u8>]) -> Vec<u8> {
    let mut data = seeds[rng.below(seeds.len())].clone();
    for _ in 0..=rng.below(4) {
        match rng.below(9) {
            0 if !data.is_empty() => {
                let i = rng.below(data.len());
                data[i] ^= 1 << rng.below(8);
            }
            1 if !data.is_empty() => {
                let i = rng.below(data.len());
                data[i] = rng.next() as u8;
            }
            2 => {
                let i = rng.below(data.len() + 1);
                data.insert(i, rng.next() as u8);
            }
            3 if !data.is_empty() => {
                data.remove(rng.below(data.len()));
            }
            4 => data.truncate(rng.below(data.len() + 1)),
            5 => data.extend_from_slice(&seeds[rng.below(seeds.len())]),
            6 if data.len() >= 4 => {
                // A length prefix at or around the edges of the limit.
                let len = [0, 1, MAX_FRAME_BYTES as u32, MAX_FRAME_BYTES as u32 + 1, u32::MAX, rng.next() as u32]
                    [rng.below(6)];
                data[..4].copy_from_slice(&len.to_be_bytes());
            }
            7 if data.len() >= 4 => {
                // Make the prefix agree with what follows (a well-framed body).
                let len = (data.len() - 4) as u32;
                data[..4].copy_from_slice(&len.to_be_bytes());
            }
            _ => {}
        }
    }
    data
}

#[test]
fn a_seeded_random_run_holds_every_property() {
    let seeds: Vec<Vec<u8>> = corpus().into_iter().map(|(_, d)| d).collect();
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let cases = 100_000;
    for case in 0..cases {
        let data = if case % 3 == 0 {
            let len = rng.below(48);
            (0..len).map(|_| rng.next() as u8).collect()
        } else {
            mutate(&mut rng, &seeds)
        };
        let result = std::panic::catch_unwind(|| frame_check::check(&data));
        assert!(result.is_ok(), "case {case} breaks a property: {:02x?}", &data[..data.len().min(256)]);
    }
}

#[test]
fn a_body_of_exactly_the_limit_is_read_and_one_more_byte_is_not() {
    let pad = "x".repeat(MAX_FRAME_BYTES - r#"{"type":"error","id":null,"message":""}"#.len());
    let body = format!(r#"{{"type":"error","id":null,"message":"{pad}"}}"#).into_bytes();
    let mut data = (body.len() as u32).to_be_bytes().to_vec();
    data.extend_from_slice(&body);
    frame_check::check(&data);
    assert!(frame_check::model(&data)[0].is_ok());
    data[..4].copy_from_slice(&(MAX_FRAME_BYTES as u32 + 1).to_be_bytes());
    data.push(b' ');
    frame_check::check(&data);
    assert!(frame_check::model(&data)[0].is_err());
}
