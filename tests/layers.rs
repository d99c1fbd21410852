//! The crate's layers, as `src/`'s folders: every top-level entry is a
//! layer named here, a layer uses only itself and the layers below it, and
//! inside every folder (a layer's, or any module's below) no two modules
//! use each other in a circle. A use is a `crate::…`, `super::…` or
//! `self::…` path (braced imports included) in code that is not test-only
//! (`#[cfg(test)]` items are removed one by one) and not a comment.
//! A new top-level entry must be given its layer here.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;

/// Lowest first: each layer's folder may use those above it in this list.
const LAYERS: &[&str] = &[
    // Vocabulary and parsers with no I/O of their own.
    "vocab",    // The readers (process tree, PSS, cgroup, PSI, GPU) and the policy.
    "engine",   // Launching, signalling and watching the job's processes.
    "job",      // The log, metrics, dashboard and CI output.
    "sinks",    // The command line, the config file and the settings they make.
    "settings", // The supervisor's loop.
    "runtime",  // The commands built on it: report, replay, demo, doctor, ask, manpage.
    "tools",
];

/// A module's path below `crate`, from its file (`a/b/mod.rs` and
/// `a/b.rs` are both `a::b`).
fn module_of(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .with_extension("")
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    parts
}

/// Every `.rs` file below `src` (not `lib.rs` or `main.rs`) with its module path.
fn files(src: &Path) -> Vec<(Vec<String>, String)> {
    let mut out = Vec::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in fs::read_dir(&dir).unwrap().flatten() {
            let path = e.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|x| x == "rs") {
                let module = module_of(path.strip_prefix(src).unwrap());
                if module != ["lib"] && module != ["main"] {
                    out.push((module, fs::read_to_string(&path).unwrap()));
                }
            }
        }
    }
    out
}

/// `text` without its `#[cfg(test)]` items, each removed on its own (a
/// `mod x;` or `use …;` to its semicolon, a braced item to its closing
/// brace), so that the code after a test module is still read.
fn strip_test_items(text: &str) -> String {
    const MARK: &str = "#[cfg(test)]";
    let mut out = String::new();
    let mut rest = text;
    while let Some(i) = rest.find(MARK) {
        out.push_str(&rest[..i]);
        let after = &rest[i + MARK.len()..];
        let end = match (after.find(';'), after.find('{')) {
            (Some(semi), Some(brace)) if semi < brace => semi + 1,
            (Some(semi), None) => semi + 1,
            (_, Some(brace)) => {
                let mut depth = 0usize;
                let mut end = after.len();
                for (k, c) in after[brace..].char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' => {
                            depth -= 1;
                            if depth == 0 {
                                end = brace + k + 1;
                                break;
                            }
                        }
                        _ => {}
                    }
                }
                end
            }
            (None, None) => after.len(),
        };
        rest = &after[end..];
    }
    out.push_str(rest);
    out
}

/// `text` without `//` comments (doc links are not uses).
fn strip_comments(text: &str) -> String {
    text.lines()
        .map(|l| l.find("//").map_or(l, |i| &l[..i]))
        .collect::<Vec<_>>()
        .join("\n")
}

fn ident_path(s: &str) -> Vec<String> {
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .unwrap_or(s.len());
    s[..end]
        .split("::")
        .filter(|p| !p.is_empty())
        .map(str::to_string)
        .collect()
}

/// The absolute module paths a file of module `at` names.
fn uses_of(at: &[String], code: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let bytes = code.as_bytes();
    let word = |i: usize| i > 0 && (bytes[i - 1].is_ascii_alphanumeric() || bytes[i - 1] == b'_');
    let mut i = 0;
    while i < code.len() {
        let rest = &code[i..];
        let (mut base, mut len) = if rest.starts_with("crate::") && !word(i) {
            (Vec::new(), 7)
        } else if rest.starts_with("self::") && !word(i) {
            (at.to_vec(), 6)
        } else if rest.starts_with("super::") && !word(i) {
            (at.to_vec(), 0)
        } else {
            i += rest.chars().next().map_or(1, char::len_utf8);
            continue;
        };
        while code[i + len..].starts_with("super::") {
            base.pop();
            len += 7;
        }
        let tail = &code[i + len..];
        if let Some(group) = tail.strip_prefix('{') {
            let mut depth = 1;
            let mut item = String::new();
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    _ => {}
                }
                if depth == 0 || (depth == 1 && c == ',') {
                    let mut p = base.clone();
                    p.extend(ident_path(item.trim_start()));
                    out.push(p);
                    item.clear();
                    if depth == 0 {
                        break;
                    }
                } else {
                    item.push(c);
                }
            }
        } else {
            let mut p = base;
            p.extend(ident_path(tail));
            out.push(p);
        }
        i += len;
    }
    out
}

/// For every folder (a module path; empty for `src/`), which of its child
/// modules use which.
type Graphs = BTreeMap<Vec<String>, BTreeMap<String, BTreeSet<String>>>;

fn graphs(src: &Path) -> Graphs {
    let files = files(src);
    let modules: BTreeSet<Vec<String>> = files.iter().map(|(m, _)| m.clone()).collect();
    let mut out = Graphs::new();
    for (module, text) in &files {
        let code = strip_comments(&strip_test_items(text));
        for target in uses_of(module, &code) {
            for k in 0..module.len() {
                let folder = &module[..k];
                if target.len() <= k || target[..k] != *folder || target[k] == module[k] {
                    continue;
                }
                let mut child = folder.to_vec();
                child.push(target[k].clone());
                if modules.contains(&child) {
                    out.entry(folder.to_vec())
                        .or_default()
                        .entry(module[k].clone())
                        .or_default()
                        .insert(target[k].clone());
                }
            }
        }
    }
    out
}

/// A circle in `graph`, if there is one: a depth-first search that meets
/// a module on its own path.
fn circle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<String> {
    fn visit<'a>(
        m: &'a str,
        graph: &'a BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<&'a str>,
        done: &mut BTreeSet<&'a str>,
    ) -> Option<String> {
        if let Some(i) = path.iter().position(|p| *p == m) {
            return Some(format!("{} -> {m}", path[i..].join(" -> ")));
        }
        if !done.insert(m) {
            return None;
        }
        path.push(m);
        for next in graph.get(m).into_iter().flatten() {
            if let Some(c) = visit(next, graph, path, done) {
                return Some(c);
            }
        }
        path.pop();
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|m| visit(m, graph, &mut Vec::new(), &mut done))
}

fn src() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

#[test]
fn src_holds_only_the_layers() {
    let _machine = crate::common::machine::beside();
    let entries: BTreeSet<String> = fs::read_dir(src())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n != "lib.rs" && n != "main.rs")
        .collect();
    let layers: BTreeSet<String> = LAYERS.iter().map(|l| l.to_string()).collect();
    assert_eq!(
        entries, layers,
        "src/'s entries are the layers, and only them"
    );
    assert!(entries.len() <= 12);
}

#[test]
fn a_layer_uses_only_itself_and_those_below() {
    let _machine = crate::common::machine::beside();
    let graphs = graphs(&src());
    let rank = |m: &str| LAYERS.iter().position(|l| *l == m);
    let mut upward = Vec::new();
    for (from, tos) in graphs.get(&Vec::new()).into_iter().flatten() {
        for to in tos {
            if rank(to) > rank(from) {
                upward.push(format!("{from} uses {to}"));
            }
        }
    }
    assert!(upward.is_empty(), "upward uses:\n{}", upward.join("\n"));
}

#[test]
fn no_folder_holds_a_circle() {
    let _machine = crate::common::machine::beside();
    let circles: Vec<String> = graphs(&src())
        .iter()
        .filter_map(|(folder, g)| circle(g).map(|c| format!("src/{}: {c}", folder.join("/"))))
        .collect();
    assert!(
        circles.is_empty(),
        "modules use each other in a circle:\n{}",
        circles.join("\n")
    );
}

/// The checks themselves can fail: a circle inside a folder, an upward use
/// and a braced import are found in a tree that has them, and test code
/// and comments are left out.
#[test]
fn the_layer_check_sees_what_it_looks_for() {
    let _machine = crate::common::machine::beside();
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    fs::create_dir_all(src.join("vocab")).unwrap();
    fs::create_dir_all(src.join("runtime/act")).unwrap();
    fs::write(src.join("vocab/mod.rs"), "pub mod units;\n").unwrap();
    fs::write(
        src.join("vocab/units.rs"),
        "use crate::{runtime::X, vocab::units};\n",
    )
    .unwrap();
    fs::write(
        src.join("runtime/mod.rs"),
        "use crate::vocab;\n#[cfg(test)]\nuse crate::tools;\n\
         #[cfg(test)]\nmod tests {\n    fn f() { crate::tools::x(); }\n}\n\
         // crate::tools is only named in a comment\n\
         fn after_the_tests() { crate::sinks::y(); }\n",
    )
    .unwrap();
    fs::write(src.join("runtime/act/mod.rs"), "mod peers;\n").unwrap();
    fs::write(
        src.join("runtime/act/peers.rs"),
        "use super::super::tick::T;\n",
    )
    .unwrap();
    fs::write(src.join("runtime/tick.rs"), "use super::act::A;\n").unwrap();
    fs::write(src.join("sinks.rs"), "").unwrap();
    fs::write(src.join("tools.rs"), "").unwrap();
    let g = graphs(src);
    assert_eq!(
        g[&Vec::new()]["vocab"],
        BTreeSet::from(["runtime".to_string()]),
        "a braced import is read, and a module's use of itself is not a use"
    );
    assert_eq!(
        g[&Vec::new()]["runtime"],
        BTreeSet::from(["sinks".to_string(), "vocab".to_string()]),
        "test code and comments are left out, and the code after them is read"
    );
    let runtime = &g[&vec!["runtime".to_string()]];
    assert_eq!(
        circle(runtime).as_deref(),
        Some("act -> tick -> act"),
        "{runtime:?}"
    );
}
