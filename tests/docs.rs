//! The documentation against the code: the seccomp table in
//! `docs/security.md` is the rendering of `src/seccomp.rs`.
use std::path::Path;

use pi_python_sandbox::seccomp;

const SECCOMP_BEGIN: &str =
    "<!-- BEGIN seccomp table: generated from src/seccomp.rs (seccomp::markdown_table); tests/docs.rs checks it -->";
const SECCOMP_END: &str = "<!-- END seccomp table -->";

fn read(rel: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The text between two marker lines.
fn between<'a>(doc: &'a str, begin: &str, end: &str) -> Option<&'a str> {
    let start = doc.find(begin)? + begin.len();
    let len = doc[start..].find(end)?;
    Some(&doc[start..start + len])
}

#[test]
fn security_md_holds_the_seccomp_table_rendered_from_the_rules() {
    let fresh = seccomp::markdown_table(&seccomp::allowlist(), &seccomp::rules());
    let doc = read("docs/security.md");
    let Some(table) = between(&doc, SECCOMP_BEGIN, SECCOMP_END) else {
        panic!("docs/security.md has no seccomp table between\n{SECCOMP_BEGIN}\nand\n{SECCOMP_END}\n\nThe table:\n\n{fresh}");
    };
    if table.trim() != fresh.trim() {
        panic!(
            "docs/security.md's seccomp table differs from the rules in src/seccomp.rs; paste this between its \
             markers:\n\n{fresh}"
        );
    }
}

#[test]
fn the_seccomp_rendering_merges_one_bit_tests_and_keeps_other_conditions() {
    let t = seccomp::markdown_table(&seccomp::allowlist(), &seccomp::rules());
    assert!(t.contains("| `socket`; `socketpair` | EPERM | no sockets:"), "{t}");
    // Eight namespace flags, one rule each: one mask.
    assert!(t.contains("`unshare` when arg0 & 0x7e020080 != 0; `clone` when arg0 & 0x7e020080 != 0 | EPERM"), "{t}");
    // O_CREAT or O_TMPFILE, with S_ISUID or S_ISGID: four rules, two masks.
    assert!(t.contains("`openat` when arg2 & 0x400040 != 0 and arg3 & 0xc00 != 0"), "{t}");
    // Comparisons that are not one-bit tests stay as they are.
    assert!(t.contains("`ioctl` when arg1 == 0x5412, or arg1 == 0x541c"), "{t}");
    assert!(t.contains("`prctl` when arg0 == 0x4 and arg1 != 0x0"), "{t}");
    assert!(t.contains("`personality` when arg0 != 0x0"), "{t}");
    assert!(t.contains("| `clone3` | ENOSYS |"), "{t}");
    let calls: usize = seccomp::allowlist().iter().map(|a| a.names.len()).sum();
    assert!(t.starts_with(&format!("{calls} calls allowed in ")), "{t}");
}
