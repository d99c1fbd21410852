//! The reference pages against the binary: every flag `--help` shows is
//! documented in `docs/`, and every flag the option tables of
//! `docs/usage.md` document exists. Links from the README resolve.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeSet;
use std::fs;
use std::path::Path;

const COMMANDS: [&str; 8] = [
    "run",
    "doctor",
    "demo",
    "forensics",
    "report",
    "replay",
    "attach",
    "completions",
];

/// `--long-flag` words of a text.
fn flags(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let b = text.as_bytes();
    let mut i = 0;
    while i + 2 < b.len() {
        let starts = b[i] == b'-'
            && b[i + 1] == b'-'
            && b[i + 2].is_ascii_lowercase()
            && (i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'-'));
        if starts {
            let mut j = i + 2;
            while j < b.len()
                && (b[j].is_ascii_lowercase() || b[j].is_ascii_digit() || b[j] == b'-')
            {
                j += 1;
            }
            out.insert(text[i..j].trim_end_matches('-').to_string());
            i = j;
        } else {
            i += 1;
        }
    }
    out
}

fn help(cmd: &str) -> String {
    let out = common::oomguard().args([cmd, "--help"]).output().unwrap();
    assert!(out.status.success(), "{cmd} --help failed");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn docs() -> String {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs");
    let mut all = String::new();
    for e in fs::read_dir(dir).unwrap().flatten() {
        if e.path().extension().is_some_and(|x| x == "md") {
            all.push_str(&fs::read_to_string(e.path()).unwrap());
        }
    }
    all
}

#[test]
fn every_flag_in_help_is_documented_and_every_documented_flag_exists() {
    let documented = flags(&docs());
    let mut offered = BTreeSet::new();
    for cmd in COMMANDS {
        let h = help(cmd);
        for f in flags(&h) {
            if f == "--help" || f == "--version" {
                continue;
            }
            assert!(
                documented.contains(&f),
                "`oomguard {cmd} {f}` is not documented in docs/"
            );
            offered.insert(f);
        }
    }
    // The option tables of the usage page: rows that start with a flag.
    let usage =
        fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/usage.md")).unwrap();
    let tabled: BTreeSet<String> = usage
        .lines()
        .filter(|l| l.starts_with("| `--"))
        .flat_map(|l| flags(l.split('|').nth(1).unwrap_or("")))
        .collect();
    assert!(tabled.len() > 20, "the option table is missing: {tabled:?}");
    for f in tabled {
        assert!(
            offered.contains(&f),
            "docs/usage.md documents {f}, which no command has"
        );
    }
}

#[test]
fn the_readme_is_short_and_its_links_resolve() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = fs::read_to_string(root.join("README.md")).unwrap();
    assert!(
        readme.lines().count() <= 320,
        "the README grew past 320 lines"
    );
    for part in readme.split("](").skip(1) {
        let target = part.split([')', '#']).next().unwrap();
        if target.starts_with("http") || target.is_empty() {
            continue;
        }
        assert!(
            root.join(target).exists(),
            "README links to {target}, which is not there"
        );
    }
    assert!(readme.contains("cargo test --locked --no-fail-fast"));
    assert!(readme.contains("cargo run --release -- demo"));
}
