//! The reference pages against the binary: every flag `--help` shows is
//! documented in `docs/`, and every flag the option tables of
//! `docs/usage.md` document exists. Links from the README resolve. The man
//! page the binary prints names every subcommand and every flag.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeSet;
use std::fs;
use std::path::Path;

const COMMANDS: [&str; 10] = [
    "run",
    "doctor",
    "checkpoint",
    "demo",
    "forensics",
    "report",
    "replay",
    "attach",
    "completions",
    "man",
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

/// The stdout of `oomguard ARGS…`, which must succeed.
fn stdout(args: &[&str]) -> String {
    let out = common::oomguard().args(args).output().unwrap();
    assert!(out.status.success(), "oomguard {args:?} failed");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn help(cmd: &str) -> String {
    stdout(&[cmd, "--help"])
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

/// The subcommands `oomguard --help` lists.
fn listed_commands() -> Vec<String> {
    let top = stdout(&["--help"]);
    let list = top.split("Commands:").nth(1).unwrap();
    let list = list.split("\n\n").next().unwrap();
    list.lines()
        .filter(|l| l.starts_with("  ") && !l.starts_with("   "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(str::to_string)
        .collect()
}

/// Roff as text: `\-` is a minus, `\fB` a font change.
fn unroff(page: &str) -> String {
    page.replace("\\-", "-")
        .replace("\\fB", "")
        .replace("\\fI", "")
        .replace("\\fR", "")
}

#[test]
fn the_man_page_names_every_subcommand_and_its_flags() {
    let commands = listed_commands();
    let mut known = COMMANDS.to_vec();
    known.sort_unstable();
    let mut listed: Vec<&str> = commands.iter().map(String::as_str).collect();
    listed.sort_unstable();
    assert_eq!(
        listed, known,
        "tests/docs.rs lists other commands than --help"
    );
    let page = stdout(&["man"]);
    assert!(page.contains("\n.TH oomguard 1"), "{page}");
    // Each subcommand has a section; every flag of its --help is in it.
    let sections: Vec<&str> = page.split("\n.SH ").collect();
    for cmd in &commands {
        let title = format!("\"OOMGUARD {}\"", cmd.to_uppercase());
        let section = sections.iter().find(|s| s.starts_with(&title));
        let section = unroff(section.unwrap_or_else(|| panic!("no {title} in the man page")));
        for f in flags(&help(cmd)) {
            assert!(section.contains(&f), "`oomguard man` lacks {cmd} {f}");
        }
    }
    // One subcommand's page alone.
    let run = unroff(&stdout(&["man", "run"]));
    assert!(
        run.contains(".TH oomguard-run 1") && run.contains("--warn-at"),
        "{run}"
    );
    // A subcommand that does not exist is a usage error, not a panic.
    let out = common::oomguard().args(["man", "nope"]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no subcommand"));
}

#[test]
fn man_out_writes_a_page_per_subcommand() {
    let dir = tempfile::tempdir().unwrap();
    let listed = stdout(&["man", "--out", dir.path().to_str().unwrap()]);
    let main = fs::read_to_string(dir.path().join("oomguard.1")).unwrap();
    assert_eq!(main, stdout(&["man"]));
    for cmd in COMMANDS {
        let path = dir.path().join(format!("oomguard-{cmd}.1"));
        assert!(listed.contains(path.to_str().unwrap()), "{listed}");
        let page = fs::read_to_string(&path).unwrap();
        assert!(page.contains(&format!(".TH oomguard-{cmd} 1")), "{page}");
    }
    // A directory that is not there is an error, not a panic.
    let out = common::oomguard()
        .args(["man", "--out", "/nonexistent/man1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
}
