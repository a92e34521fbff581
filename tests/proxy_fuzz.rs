//! The proxy parsers' fuzz properties on stable Rust, in every `cargo
//! test`: the committed cargo-fuzz corpus replayed (each seed also checked
//! for the verdict it was written for), then a bounded, seeded run of
//! random and mutated inputs. The oracle is `fuzz/proxy_check.rs`, the same
//! one the cargo-fuzz target uses (`npm run fuzz` for the open-ended run).

#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../fuzz/proxy_check.rs"]
mod proxy_check;

use pi_python_sandbox::network::wire::{http, socks, tls};

fn corpus() -> Vec<(String, Vec<u8>)> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/proxy");
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .expect("fuzz/corpus/proxy exists")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|p| (p.file_name().unwrap().to_string_lossy().into_owned(), std::fs::read(&p).expect("read")))
        .collect()
}

fn seed(name: &str) -> Vec<u8> {
    corpus().into_iter().find(|(n, _)| n == name).unwrap_or_else(|| panic!("no seed {name}")).1
}

#[test]
fn the_committed_corpus_holds_every_property() {
    let corpus = corpus();
    assert!(corpus.len() >= 30, "the seed corpus is missing ({} files)", corpus.len());
    for (name, data) in &corpus {
        let result = std::panic::catch_unwind(|| proxy_check::check(data));
        assert!(result.is_ok(), "corpus file {name} breaks a property");
    }
}

#[test]
fn the_seeds_give_the_verdicts_they_were_written_for() {
    let http_ok = |name: &str| matches!(http::parse_request(&seed(name)), Ok(Some(_)));
    for name in ["http-connect", "http-connect-ipv6", "http-get-absolute", "http-post-length", "http-post-chunked"] {
        assert!(http_ok(name), "{name}");
    }
    for name in
        ["http-connect-host-mismatch", "http-get-host-mismatch", "http-smuggle", "http-origin-form", "http-userinfo"]
    {
        assert!(http::parse_request(&seed(name)).is_err(), "{name}");
    }
    assert_eq!(http::parse_request(&seed("http-partial")), Ok(None));
    assert!(matches!(socks::parse_request(&seed("socks-connect-domain")), Ok(Some(_))));
    assert!(socks::parse_request(&seed("socks-connect-nul")).is_err());
    assert!(socks::parse_request(&seed("socks-bind")).is_err());
    let sni = |name: &str| tls::parse_client_hello(&seed(name)).map(|h| h.and_then(|h| h.sni));
    assert_eq!(sni("tls-hello-sni"), Ok(Some("example.com".into())));
    assert_eq!(sni("tls-hello-split"), Ok(Some("a.example.com".into())));
    assert_eq!(sni("tls-hello-no-sni"), Ok(None));
    assert!(sni("tls-hello-dup-sni").is_err() && sni("tls-hello-sni-address").is_err());
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

/// Bytes that matter to the parsers, for insertions.
const INTERESTING: &[u8] = b"\0\r\n :[]./@%?#*\x05\x16\x03\x01\xff";

fn mutate(rng: &mut Rng, seeds: &[Vec<u8>]) -> Vec<u8> {
    let mut data = seeds[rng.below(seeds.len())].clone();
    for _ in 0..=rng.below(4) {
        match rng.below(8) {
            0 if !data.is_empty() => {
                let i = rng.below(data.len());
                data[i] ^= 1 << rng.below(8);
            }
            1 if !data.is_empty() => {
                let i = rng.below(data.len());
                data[i] = INTERESTING[rng.below(INTERESTING.len())];
            }
            2 => {
                let i = rng.below(data.len() + 1);
                data.insert(i, rng.next() as u8);
            }
            3 if !data.is_empty() => {
                data.remove(rng.below(data.len()));
            }
            4 => data.truncate(rng.below(data.len() + 1)),
            5 => {
                // Splice a piece of another seed in.
                let other = &seeds[rng.below(seeds.len())];
                let from = rng.below(other.len() + 1);
                let to = from + rng.below(other.len() - from + 1);
                let at = rng.below(data.len() + 1);
                data.splice(at..at, other[from..to].iter().copied());
            }
            6 if !data.is_empty() => {
                let i = rng.below(data.len());
                data[i] = data[i].to_ascii_uppercase();
            }
            _ => {}
        }
    }
    data
}

#[test]
fn a_seeded_random_run_holds_every_property() {
    let seeds: Vec<Vec<u8>> = corpus().into_iter().map(|(_, d)| d).collect();
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let cases = 50_000;
    for case in 0..cases {
        let data = if case % 5 == 0 {
            let len = rng.below(64);
            (0..len).map(|_| rng.next() as u8).collect()
        } else {
            mutate(&mut rng, &seeds)
        };
        let result = std::panic::catch_unwind(|| proxy_check::check(&data));
        assert!(result.is_ok(), "case {case} breaks a property: {:02x?}", &data[..data.len().min(256)]);
    }
}
