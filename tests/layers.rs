//! The crate's layers: every top-level module sits in one, a module uses
//! only its own layer and those below (`use crate::…` and `crate::…` paths
//! outside `#[cfg(test)]` code), and no modules use each other in a circle.
//! A new module must be given its layer here.

#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::Path;

/// Lowest first.
const LAYERS: &[&[&str]] = &[
    // Vocabulary and parsers with no I/O of their own.
    &[
        "units",
        "clock",
        "exit",
        "help",
        "growth",
        "verdict",
        "companion",
        "forensics",
        "pty",
        "demo_job",
        "model",
    ],
    // Readers, the engine, process control, the log and the screen.
    &[
        "probe",
        "policy",
        "metrics",
        "tui",
        "supervise",
        "keeper",
        "systemd",
        "attach",
        "restart",
        "log",
    ],
    // What is built on them: the relay, CI output, replay, reports, values
    // and the command line.
    &[
        "relay", "github", "replay", "report", "values", "options", "cli",
    ],
    &["settings"],
    &["runtime", "manpage"],
    &["demo", "doctor", "ask"],
];

fn top_modules(src: &Path) -> BTreeSet<String> {
    fs::read_dir(src)
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let path = e.path();
            if path.is_dir() {
                Some(name)
            } else {
                name.strip_suffix(".rs")
                    .filter(|m| *m != "lib" && *m != "main")
                    .map(str::to_string)
            }
        })
        .collect()
}

/// Every `crate::NAME` a module's non-test code names, by module.
fn uses(src: &Path, modules: &BTreeSet<String>) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in fs::read_dir(&dir).unwrap().flatten() {
            let path = e.path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().is_none_or(|x| x != "rs") {
                continue;
            }
            let rel = path.strip_prefix(src).unwrap();
            let first = rel
                .components()
                .next()
                .unwrap()
                .as_os_str()
                .to_string_lossy();
            let top = first.trim_end_matches(".rs").to_string();
            if !modules.contains(&top) {
                continue;
            }
            let text = fs::read_to_string(&path).unwrap();
            // Test code may reach anywhere.
            let code = strip_test_items(&text);
            let code = code.as_str();
            for (i, _) in code.match_indices("crate::") {
                let name: String = code[i + 7..]
                    .chars()
                    .take_while(|c| c.is_ascii_lowercase() || *c == '_' || c.is_ascii_digit())
                    .collect();
                if name != top && modules.contains(&name) {
                    out.entry(top.clone()).or_default().insert(name);
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

#[test]
fn modules_use_only_their_layer_and_those_below_and_never_in_a_circle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let modules = top_modules(&src);
    let layer: BTreeMap<&str, usize> = LAYERS
        .iter()
        .enumerate()
        .flat_map(|(i, l)| l.iter().map(move |m| (*m, i)))
        .collect();
    let unplaced: Vec<&String> = modules
        .iter()
        .filter(|m| !layer.contains_key(m.as_str()))
        .collect();
    assert!(
        unplaced.is_empty(),
        "modules with no layer in tests/layers.rs: {unplaced:?}"
    );
    let graph = uses(&src, &modules);
    let mut upward = Vec::new();
    for (from, tos) in &graph {
        for to in tos {
            if layer[to.as_str()] > layer[from.as_str()] {
                upward.push(format!(
                    "{from} (layer {}) uses {to} (layer {})",
                    layer[from.as_str()],
                    layer[to.as_str()]
                ));
            }
        }
    }
    assert!(upward.is_empty(), "upward imports:\n{}", upward.join("\n"));
    // A circle within a layer: a depth-first search that meets a module on
    // its own path.
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
    for m in &modules {
        let mut path = Vec::new();
        if let Some(circle) = visit(m, &graph, &mut path, &mut done) {
            panic!("modules use each other in a circle: {circle}");
        }
    }
}

/// The check itself can fail: a circle and an upward import are found in
/// a graph that has them.
#[test]
fn the_layer_check_sees_what_it_looks_for() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    fs::write(src.join("units.rs"), "use crate::runtime::X;\n").unwrap();
    fs::create_dir(src.join("runtime")).unwrap();
    fs::write(
        src.join("runtime/mod.rs"),
        "use crate::units;\n#[cfg(test)]\nuse crate::doctor;\n\
         #[cfg(test)]\nmod tests {\n    fn f() { crate::doctor::x(); }\n}\n\
         fn after_the_tests() { crate::relay::y(); }\n",
    )
    .unwrap();
    fs::write(src.join("doctor.rs"), "").unwrap();
    fs::write(src.join("relay.rs"), "").unwrap();
    let modules = top_modules(src);
    let graph = uses(src, &modules);
    assert_eq!(graph["units"], BTreeSet::from(["runtime".to_string()]));
    assert_eq!(
        graph["runtime"],
        BTreeSet::from(["relay".to_string(), "units".to_string()]),
        "test code is left out, and the code after it is read"
    );
}
