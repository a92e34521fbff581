//! The layout of the code against its rules: no import cycle among the
//! top-level modules of `src/` (a module's `crate::<name>` references
//! outside its test modules are its imports), no file in `src/` over
//! [`MAX_LINES`] lines before its test module, and, outside test modules,
//! no `Result<_, String>` (errors are typed) and no allowance of
//! `clippy::too_many_arguments` (arguments that go together are a struct);
//! and the in-sandbox init (`src/worker/init.py`) knows nothing of the
//! python worker that runs on it (checked by `tests/layout/init_check.py`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

/// Most lines of a source file before its `#[cfg(test)] mod`, comments
/// included.
const MAX_LINES: usize = 700;

/// Files over [`MAX_LINES`] that are being reworked now; each is to be
/// split next, and then taken off this list. No other file may be over.
const OVER_FOR_NOW: &[&str] = &[];

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Every `.rs` file under `src/`, relative to the root, with its text.
fn sources() -> BTreeMap<String, String> {
    let mut found = BTreeMap::new();
    let mut todo = vec![root().join("src")];
    while let Some(dir) = todo.pop() {
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.unwrap().path();
            if path.is_dir() {
                todo.push(path);
            } else if path.extension().is_some_and(|x| x == "rs") {
                let rel = path.strip_prefix(root()).unwrap().to_string_lossy().into_owned();
                found.insert(rel, std::fs::read_to_string(&path).unwrap());
            }
        }
    }
    found
}

/// Whether line `i` starts a test module: `#[cfg(test)]` then `mod`.
fn test_module_at(lines: &[&str], i: usize) -> bool {
    lines[i].trim() == "#[cfg(test)]"
        && lines.get(i + 1).is_some_and(|next| {
            let next = next.trim_start();
            next.starts_with("mod ") || next.starts_with("pub mod ") || next.starts_with("pub(crate) mod ")
        })
}

/// Lines before the file's first test module (all of them without one).
fn lines_before_tests(text: &str) -> usize {
    let lines: Vec<&str> = text.lines().collect();
    (0..lines.len()).find(|&i| test_module_at(&lines, i)).unwrap_or(lines.len())
}

/// The text without what only tests compile: each `#[cfg(test)]` item (a
/// line ending in `;`, or up to the `}` at the item's own indentation, as
/// rustfmt writes it), and without `//` comments.
fn non_test_code(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = String::new();
    let mut i = 0;
    while i < lines.len() {
        if lines[i].trim() == "#[cfg(test)]" {
            let mut j = i + 1;
            while j < lines.len() && lines[j].trim_start().starts_with("#[") {
                j += 1;
            }
            let Some(item) = lines.get(j) else { break };
            if !item.trim_end().ends_with(';') {
                let indent = &item[..item.len() - item.trim_start().len()];
                let close = format!("{indent}}}");
                while j < lines.len() && !lines[j].trim_end().starts_with(&close) {
                    j += 1;
                }
            }
            i = j + 1;
            continue;
        }
        let line = lines[i];
        out.push_str(line.find("//").map_or(line, |at| &line[..at]));
        out.push('\n');
        i += 1;
    }
    out
}

/// The top-level module a source file belongs to: `src/a.rs` and
/// `src/a/...` are `a`; `src/lib.rs` is the crate root (`None`).
fn top_module(rel: &str) -> Option<String> {
    let first = rel.strip_prefix("src/")?.split('/').next()?;
    let name = first.strip_suffix(".rs").unwrap_or(first);
    (name != "lib").then(|| name.to_string())
}

/// The names `text` reaches as `crate::name` or inside `crate::{...}`.
fn crate_references(text: &str) -> BTreeSet<String> {
    let ident = |s: &str| -> String { s.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect() };
    let mut names = BTreeSet::new();
    for (at, _) in text.match_indices("crate::") {
        if text[..at].ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_' || c == '$') {
            continue; // `$crate::`, `other_crate::`
        }
        let rest = &text[at + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let group = &group[..group.find('}').unwrap_or(group.len())];
            for part in group.split(',') {
                names.insert(ident(part.trim()));
            }
        } else {
            names.insert(ident(rest));
        }
    }
    names.remove("");
    names
}

/// Which top-level modules each one imports, and through which files.
fn module_graph(files: &BTreeMap<String, String>) -> BTreeMap<String, BTreeMap<String, BTreeSet<String>>> {
    let modules: BTreeSet<String> = files.keys().filter_map(|rel| top_module(rel)).collect();
    let mut graph: BTreeMap<String, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for (rel, text) in files {
        let Some(from) = top_module(rel) else { continue };
        let edges = graph.entry(from.clone()).or_default();
        for to in crate_references(&non_test_code(text)) {
            if to != from && modules.contains(&to) {
                edges.entry(to).or_default().insert(rel.clone());
            }
        }
    }
    graph
}

/// One cycle of `graph`, as the modules along it (first = last), if any.
fn find_cycle<V>(graph: &BTreeMap<String, BTreeMap<String, V>>) -> Option<Vec<String>> {
    fn visit<V>(
        node: &str,
        graph: &BTreeMap<String, BTreeMap<String, V>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| n == node) {
            let mut cycle = path[at..].to_vec();
            cycle.push(node.to_string());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_string());
        for next in graph.get(node).into_iter().flat_map(|e| e.keys()) {
            if let Some(cycle) = visit(next, graph, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    graph.keys().find_map(|start| visit(start, graph, &mut Vec::new(), &mut done))
}

/// Imports allowed to close a cycle, each until its step is done.
const KNOWN_EDGES: &[(&str, &str)] = &[];

#[test]
fn no_import_cycle_among_the_top_level_modules() {
    let files = sources();
    let mut graph = module_graph(&files);
    // The parse sees the imports that are there.
    let edge = |g: &BTreeMap<String, BTreeMap<String, BTreeSet<String>>>, a: &str, b: &str| {
        g.get(a).is_some_and(|e| e.contains_key(b))
    };
    assert!(
        edge(&graph, "protected", "secrets") && edge(&graph, "spawn", "bwrap") && edge(&graph, "bwrap", "hostsecrets"),
        "{graph:?}"
    );
    // An import allowed to close a cycle is named, so that it cannot hide
    // another; the test fails once it is gone, so that its allowance goes
    // with it.
    for (from, to) in KNOWN_EDGES {
        assert!(edge(&graph, from, to), "{from} -> {to} is gone: remove it from KNOWN_EDGES");
        graph.get_mut(*from).map(|e| e.remove(*to));
    }
    if let Some(cycle) = find_cycle(&graph) {
        let steps: Vec<String> =
            cycle.windows(2).map(|w| format!("{} -> {} (in {:?})", w[0], w[1], graph[&w[0]][&w[1]])).collect();
        panic!(
            "an import cycle among the top-level modules of src/:\n  {}\nmove what both use into the lower module",
            steps.join("\n  ")
        );
    }
}

#[test]
fn the_cycle_check_sees_a_cycle_and_skips_test_modules_and_comments() {
    let graph = |edges: &[(&str, &str)]| {
        let mut g: BTreeMap<String, BTreeMap<String, ()>> = BTreeMap::new();
        for (a, b) in edges {
            g.entry(a.to_string()).or_default().insert(b.to_string(), ());
            g.entry(b.to_string()).or_default();
        }
        g
    };
    assert_eq!(find_cycle(&graph(&[("a", "b"), ("b", "c")])), None);
    assert_eq!(find_cycle(&graph(&[("a", "b"), ("b", "c"), ("c", "a")])).map(|c| c.len()), Some(4));
    let text = "use crate::{alpha, beta::X};\n\
                // crate::comment\n\
                fn f() { crate::gamma::g(); $crate::macro_only(); }\n\
                #[cfg(test)]\n\
                use crate::delta;\n\
                #[cfg(test)]\n\
                mod tests {\n    use crate::epsilon;\n}\n\
                fn g() { crate::zeta::z() }\n";
    let seen: Vec<String> = crate_references(&non_test_code(text)).into_iter().collect();
    assert_eq!(seen, ["alpha", "beta", "gamma", "zeta"]);
    assert_eq!(lines_before_tests(text), 5);
    assert_eq!(top_module("src/protected/guard.rs").as_deref(), Some("protected"));
    assert_eq!(top_module("src/lib.rs"), None);
}

#[test]
fn no_source_file_is_over_the_bound_before_its_test_module() {
    let files = sources();
    for allowed in OVER_FOR_NOW {
        assert!(files.contains_key(*allowed), "{allowed} is on OVER_FOR_NOW but does not exist: take it off");
    }
    let over: Vec<String> = files
        .iter()
        .map(|(rel, text)| (rel, lines_before_tests(text)))
        .filter(|(rel, n)| *n > MAX_LINES && !OVER_FOR_NOW.contains(&rel.as_str()))
        .map(|(rel, n)| format!("{rel}: {n} lines before its test module"))
        .collect();
    assert!(
        over.is_empty(),
        "over {MAX_LINES} lines before the test module (split along a real seam, tests moving with their code):\n  {}",
        over.join("\n  ")
    );
}

/// Files outside test modules that still have a `Result<_, String>` or a
/// `too_many_arguments` allowance, each until its step is done; the test
/// fails once one is clean, so that its allowance goes with it.
const UNTYPED_FOR_NOW: &[&str] = &[];

/// The `Result<T, E>` types of `code` whose error type `E` is `String`.
fn string_errors(code: &str) -> Vec<String> {
    let mut found = Vec::new();
    for (at, _) in code.match_indices("Result<") {
        if code[..at].ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_') {
            continue; // `MyResult<`
        }
        let body = &code[at + "Result<".len()..];
        let (mut depth, mut last_comma, mut end) = (1, None, None);
        for (i, c) in body.char_indices() {
            match c {
                '<' | '(' | '[' => depth += 1,
                '>' | ')' | ']' => depth -= 1,
                ',' if depth == 1 => last_comma = Some(i),
                _ => {}
            }
            if depth == 0 {
                end = Some(i);
                break;
            }
        }
        let (Some(end), Some(comma)) = (end, last_comma) else { continue };
        let error = body[comma + 1..end].trim();
        if error == "String" || error.ends_with("::String") {
            found.push(format!("Result<{}>", &body[..end]));
        }
    }
    found
}

#[test]
fn the_untyped_check_sees_a_string_error_and_only_that() {
    let code = "fn a() -> Result<(), String> {}\n\
                fn b() -> Result<Vec<(u8, String)>, Error> {}\n\
                fn c() -> io::Result<String> {}\n\
                fn d() -> Result<HashMap<String, u8>, std::string::String> {}\n\
                fn e() -> MyResult<u8, String> {}\n";
    assert_eq!(string_errors(code), ["Result<(), String>", "Result<HashMap<String, u8>, std::string::String>"]);
    let tests_only = "fn f() {}\n#[cfg(test)]\nmod tests {\n    fn g() -> Result<(), String> { Ok(()) }\n}\n";
    assert!(string_errors(&non_test_code(tests_only)).is_empty());
}

#[test]
fn no_result_with_a_string_error_and_no_too_many_arguments_allowance() {
    let files = sources();
    for allowed in UNTYPED_FOR_NOW {
        assert!(files.contains_key(*allowed), "{allowed} is on UNTYPED_FOR_NOW but does not exist: take it off");
    }
    let mut untyped = Vec::new();
    for (rel, text) in &files {
        let code = non_test_code(text);
        let mut found = string_errors(&code);
        if code.contains("too_many_arguments") {
            found.push("#[allow(clippy::too_many_arguments)]".into());
        }
        let allowed = UNTYPED_FOR_NOW.contains(&rel.as_str());
        if allowed && found.is_empty() {
            untyped.push(format!("{rel} is clean: take it off UNTYPED_FOR_NOW"));
        } else if !allowed {
            untyped.extend(found.into_iter().map(|f| format!("{rel}: {f}")));
        }
    }
    assert!(
        untyped.is_empty(),
        "an untyped error or a too_many_arguments allowance outside test modules (a thiserror enum for the error; a \
         struct for arguments that go together):\n  {}",
        untyped.join("\n  ")
    );
}

/// What `tests/layout/init_check.py` finds in an init and a worker text:
/// (problems, the names the init defines).
fn init_check(init: &str, worker: &str) -> (Vec<String>, Vec<String>) {
    use std::io::Write;
    let mut child = std::process::Command::new("python3")
        .arg(root().join("tests/layout/init_check.py"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("python3 on PATH (the sandbox tests need it too)");
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(format!("{init}\0{worker}").as_bytes()).unwrap();
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "init_check.py failed: {}", out.status);
    let found: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let list = |key: &str| -> Vec<String> {
        found[key].as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_string()).collect()
    };
    (list("problems"), list("defines"))
}

#[test]
fn the_init_knows_nothing_of_the_python_worker() {
    let init = std::fs::read_to_string(root().join("src/worker/init.py")).unwrap();
    let worker = std::fs::read_to_string(root().join("src/worker/worker.py")).unwrap();
    let (problems, defines) = init_check(&init, &worker);
    assert!(problems.is_empty(), "the init and the worker are not apart:\n  {}", problems.join("\n  "));
    // The init's pieces are the init's: PID 1, reaping, descriptors, end
    // marks, kill, frames, the open-files limit.
    for piece in [
        "start_keeper",
        "keeper",
        "reap",
        "reserve",
        "prepare_process",
        "end_streams",
        "kill_all",
        "kill_now",
        "fresh_channels",
        "prepare_streams",
        "send",
        "read_request",
        "limit_files",
    ] {
        assert!(defines.iter().any(|d| d == piece), "init.py does not define {piece}: {defines:?}");
    }
    // The addon runs the two as one file, the init first.
    let shipped = pi_python_sandbox::launch::WORKER_SOURCE;
    assert_eq!(shipped.len(), init.len() + worker.len());
    assert!(shipped.starts_with(&init) && shipped.ends_with(&worker));
}

#[test]
fn the_init_check_sees_the_worker_s_knowledge_in_the_init() {
    let init = "import os\nimport marshal\nimport sys\nPREPARED = False\nNULL_ID = None\n\n\
                def reap():\n    serve()\n    exec('x')\n    return repr(os.getpid())\n\n\
                def hook():\n    sys.addaudithook(print)\n";
    let worker = "def reap():\n    pass\n\n\
                  def call():\n    global PREPARED, NULL_ID\n    PREPARED = True\n    NULL_ID = 1\n";
    let (problems, defines) = init_check(init, worker);
    assert_eq!(
        problems,
        [
            "init.py reads serve, which it does not define (in reap)",
            "init.py uses exec (in reap)",
            "init.py uses repr (in reap)",
            "init.py imports marshal",
            "init.py uses .addaudithook",
            "worker.py defines reap again",
            "worker.py's call sets the init's NULL_ID",
        ],
    );
    assert_eq!(defines, ["NULL_ID", "PREPARED", "hook", "reap"]);
    let (clean, _) =
        init_check("import os\n\ndef reap():\n    return os.getpid()\n", "def call():\n    return reap()\n");
    assert!(clean.is_empty(), "{clean:?}");
}
