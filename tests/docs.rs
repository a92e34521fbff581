//! The documentation against the code: the seccomp table in
//! `docs/security.md` is the rendering of `src/seccomp.rs`, the module map
//! in `docs/architecture.md` names every source file and no other, and
//! every relative link of README.md and docs/*.md reaches a file and, where
//! it names one, a heading.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

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
            "docs/security.md's seccomp table differs from the lists in src/seccomp/; paste this between its \
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

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Files under `dir` (relative to the root) whose names end with one of `exts`.
fn sources(dir: &str, exts: &[&str], recursive: bool) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut todo = vec![root().join(dir)];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
            let path = entry.unwrap().path();
            if path.is_dir() {
                if recursive {
                    todo.push(path);
                }
            } else if exts.iter().any(|x| path.to_string_lossy().ends_with(x)) {
                found.insert(path.strip_prefix(root()).unwrap().to_string_lossy().into_owned());
            }
        }
    }
    found
}

/// The source paths the module map names: `src/...` and `js/...` in backticks.
fn named_in_map(doc: &str) -> BTreeSet<String> {
    let mut named = BTreeSet::new();
    for piece in doc.split('`').skip(1).step_by(2) {
        let source = [".rs", ".py", ".ts"].iter().any(|x| piece.ends_with(x));
        if source && (piece.starts_with("src/") || piece.starts_with("js/")) && !piece.contains(' ') {
            named.insert(piece.to_string());
        }
    }
    named
}

#[test]
fn architecture_md_names_every_source_file_and_no_missing_one() {
    let doc = read("docs/architecture.md");
    let named = named_in_map(&doc);
    let mut files = sources("src", &[".rs", ".py"], true);
    files.extend(sources("js", &[".ts"], false));
    assert!(files.contains("src/lib.rs") && files.contains("src/worker/worker.py") && files.contains("js/index.ts"));
    let missing: Vec<&String> = files.difference(&named).collect();
    assert!(
        missing.is_empty(),
        "docs/architecture.md's module map does not name {missing:?}: add a row with what each does"
    );
    let gone: Vec<&String> = named.difference(&files).collect();
    assert!(gone.is_empty(), "docs/architecture.md names files that do not exist: {gone:?}");
}

/// The files the module map's rows are about: the first cell of each row
/// that names one source file.
fn map_rows(doc: &str) -> Vec<String> {
    doc.lines()
        .filter_map(|line| line.strip_prefix("| `"))
        .filter_map(|rest| rest.split_once('`').map(|(file, _)| file.to_string()))
        .filter(|file| named_in_map(&format!("`{file}`")).contains(file))
        .collect()
}

#[test]
fn architecture_md_has_one_row_per_source_file() {
    let rows = map_rows(&read("docs/architecture.md"));
    assert!(rows.len() > 100 && rows.contains(&"src/lib.rs".to_string()), "{} rows", rows.len());
    let mut seen = BTreeSet::new();
    let twice: Vec<&String> = rows.iter().filter(|f| !seen.insert(*f)).collect();
    assert!(twice.is_empty(), "docs/architecture.md's module map has more than one row for {twice:?}: keep one");
    let doubled =
        "| `src/a.rs` | one |\n| `src/b.rs` | two |\n| `src/a.rs` | again |\n| `Cargo.toml`, `src/` | the crate |\n";
    assert_eq!(map_rows(doubled), ["src/a.rs", "src/b.rs", "src/a.rs"]);
}

/// README.md is the user's guide; the reference is in docs/.
const README_MAX_LINES: usize = 350;

#[test]
fn readme_md_stays_a_guide_under_its_bound() {
    let lines = read("README.md").lines().count();
    assert!(lines > 100, "README.md has {lines} lines");
    assert!(
        lines < README_MAX_LINES,
        "README.md has {lines} lines; it stays under {README_MAX_LINES}: move reference to docs/"
    );
}

/// GitHub's anchor for a heading: lower case, punctuation dropped, spaces
/// as hyphens.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a markdown file's headings (a repeated one gets `-1`, `-2`, ...).
fn anchors(doc: &str) -> BTreeSet<String> {
    let mut seen = BTreeSet::new();
    let mut fence = false;
    for line in doc.lines() {
        if line.starts_with("```") {
            fence = !fence;
        }
        if fence || !line.starts_with('#') {
            continue;
        }
        let base = slug(line.trim_start_matches('#'));
        let mut anchor = base.clone();
        let mut n = 0;
        while seen.contains(&anchor) {
            n += 1;
            anchor = format!("{base}-{n}");
        }
        seen.insert(anchor);
    }
    seen
}

/// The targets of the inline links `[text](target)` outside code.
fn links(doc: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut fence = false;
    for line in doc.lines() {
        if line.starts_with("```") {
            fence = !fence;
        }
        if fence {
            continue;
        }
        // Drop inline code, whose brackets are not links.
        let text: String = line.split('`').step_by(2).collect::<Vec<_>>().join(" ");
        let mut rest = text.as_str();
        while let Some(i) = rest.find("](") {
            let after = &rest[i + 2..];
            let Some(end) = after.find(')') else { break };
            out.push(after[..end].to_string());
            rest = &after[end..];
        }
    }
    out
}

#[test]
fn every_relative_link_in_the_docs_reaches_its_file_and_heading() {
    let mut files = vec![root().join("README.md")];
    files.extend(sources("docs", &[".md"], false).iter().map(|f| root().join(f)));
    assert!(files.len() >= 8, "README.md and docs/*.md: {files:?}");
    let mut broken = Vec::new();
    let mut checked = 0;
    for file in &files {
        let doc = std::fs::read_to_string(file).unwrap();
        for target in links(&doc) {
            if target.starts_with("http://") || target.starts_with("https://") || target.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (path, anchor) = target.split_once('#').unwrap_or((&target, ""));
            let dest = if path.is_empty() { file.clone() } else { file.parent().unwrap().join(path) };
            let name = file.strip_prefix(root()).unwrap().display();
            if !dest.exists() {
                broken.push(format!("{name}: {target}: no such file"));
                continue;
            }
            if !anchor.is_empty() && !anchors(&std::fs::read_to_string(&dest).unwrap_or_default()).contains(anchor) {
                broken.push(format!("{name}: {target}: no such heading"));
            }
        }
    }
    assert!(checked > 20, "only {checked} relative links found");
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn anchors_and_links_are_read_as_github_does() {
    assert_eq!(slug(" Secret masks, in every mode"), "secret-masks-in-every-mode");
    assert_eq!(slug(" The worker's compiled form"), "the-workers-compiled-form");
    assert_eq!(slug(" `status` and /scratch"), "status-and-scratch");
    let a = anchors("# A\n## Limits\n```\n# not a heading\n```\n## Limits\n");
    assert_eq!(a, ["a", "limits", "limits-1"].iter().map(|s| s.to_string()).collect());
    let l = links("see [x](a.md#b) and `[no](c.md)`, [y](#z)\n```\n[no](d.md)\n```\n");
    assert_eq!(l, ["a.md#b", "#z"]);
}

#[test]
fn settings_md_s_table_is_the_list_status_names_the_sources_of() {
    let doc = read("docs/settings.md");
    let rows: Vec<&str> = doc
        .lines()
        .filter_map(|line| line.strip_prefix("| `"))
        .filter_map(|rest| rest.split_once('`').map(|(name, _)| name))
        .filter(|name| name.starts_with("PI_"))
        .collect();
    assert_eq!(rows, pi_python_sandbox::options::SETTINGS, "docs/settings.md's rows and options::SETTINGS, in order");
}

#[test]
fn settings_md_names_every_environment_variable_the_code_reads() {
    let doc = read("docs/settings.md");
    let mut names = BTreeSet::new();
    let mut files = sources("src", &[".rs"], true);
    files.extend(sources("js", &[".ts"], false));
    for file in &files {
        let text = read(file);
        // `pub const X_ENV: &str = "NAME";` in Rust, `process.env.NAME` in TypeScript.
        for line in text.lines() {
            if let Some(rest) = line.split_once("_ENV: &str = \"").map(|(_, r)| r) {
                names.insert(rest.split('"').next().unwrap_or_default().to_string());
            }
            if let Some((_, rest)) = line.split_once("process.env.") {
                names.insert(rest.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect());
            }
        }
    }
    assert!(names.contains("PI_PYTHON_TOOL_ROLLBACK") && names.len() >= 18, "{names:?}");
    let missing: Vec<&String> = names.iter().filter(|n| !doc.contains(&format!("| `{n}` |"))).collect();
    assert!(missing.is_empty(), "docs/settings.md has no row for {missing:?}");
}
