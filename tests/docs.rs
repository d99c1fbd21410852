//! The reference pages against the binary: every flag `--help` shows is
//! documented in `docs/`, and every flag the option tables of
//! `docs/usage.md` document exists. Links from the README resolve. The man
//! page the binary prints names every subcommand and every flag.

#![allow(clippy::unwrap_used)]

use crate::common;

use std::collections::BTreeSet;
use std::fs;
use std::path::Path;

const COMMANDS: [&str; 11] = [
    "run",
    "doctor",
    "checkpoint",
    "ended",
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

/// `oomguard CMD --help` up to its examples: the command's own flags
/// (the examples name the job's too, `torchrun --nproc-per-node`).
fn help(cmd: &str) -> String {
    let text = stdout(&[cmd, "--help"]);
    match text.find("\nExamples:") {
        Some(at) => text[..at].to_string(),
        None => text,
    }
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
    let _machine = common::machine::beside();
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
    let _machine = common::machine::beside();
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
    let _machine = common::machine::beside();
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
    let _machine = common::machine::beside();
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

/// The headings of `run --help`, in the order it shows them.
const HEADINGS: [&str; 5] = [
    "Budget and policy:",
    "Stop and restart:",
    "Output and logs:",
    "Metrics:",
    "Advanced:",
];

#[test]
fn run_help_is_grouped_under_headings_and_ends_with_examples() {
    let _machine = common::machine::beside();
    let text = stdout(&["run", "--help"]);
    let at: Vec<usize> = HEADINGS
        .iter()
        .map(|h| {
            text.find(&format!("\n{h}\n"))
                .unwrap_or_else(|| panic!("no heading {h:?}\n{text}"))
        })
        .collect();
    assert!(at.windows(2).all(|w| w[0] < w[1]), "{text}");
    // --budget is the first flag of its group.
    let budget = text[at[0] + 1..].lines().nth(1).unwrap();
    assert!(budget.trim_start().starts_with("--budget"), "{budget}");
    // Each group holds what a user would look for there.
    for (i, flags) in [
        &["--budget", "--on-critical", "--fail-above", "--config"][..],
        &[
            "--grace",
            "--checkpoint-signal",
            "--max-restarts",
            "--kill-after",
        ],
        &["--log", "--quiet", "--no-tui", "--output-log"],
        &["--metrics-addr", "--metrics-textfile"],
        &["--interval", "--pss-budget", "--cgroup"],
    ]
    .iter()
    .enumerate()
    {
        let group = &text[at[i]..at.get(i + 1).copied().unwrap_or(text.len())];
        for f in *flags {
            assert!(
                group.contains(&format!(" {f} ")) || group.contains(&format!(" {f}\n")),
                "{f} not under {}",
                HEADINGS[i]
            );
        }
    }
    let examples = text
        .split("\nExamples:\n")
        .nth(1)
        .unwrap_or_else(|| panic!("no examples\n{text}"));
    let runs = examples
        .lines()
        .filter(|l| l.trim_start().starts_with("oomguard run "))
        .count();
    assert!(runs >= 3, "{examples}");
    assert!(examples.contains("oomguard run --budget 40GiB -- python train.py"));
}

/// Whether `text` lists exit code `code`: a line of `--help`'s list
/// (`  75  oomguard stopped …`) or a tagged paragraph of the man page.
fn lists_code(text: &str, code: &str) -> bool {
    text.lines().any(|l| {
        l.strip_prefix("  ")
            .and_then(|l| l.strip_prefix(code))
            .is_some_and(|rest| rest.starts_with("  "))
    }) || text.contains(&format!("\\fB{code}\\fR"))
}

#[test]
fn help_run_help_and_the_man_page_list_the_exit_codes() {
    let _machine = common::machine::beside();
    for args in [
        &["--help"][..],
        &["run", "--help"],
        &["man"],
        &["man", "run"],
    ] {
        let text = stdout(args);
        for code in ["75", "76", "74", "70", "2", "130", "N", "128+S", "127, 126"] {
            assert!(
                lists_code(&text, code),
                "`oomguard {args:?}` lacks exit code {code}\n{text}"
            );
        }
        let prose = unroff(&text).replace('\n', " ");
        let prose = prose.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(
            prose.contains("the stop code, 75 unless --stop-code says otherwise"),
            "`oomguard {args:?}`: {prose}"
        );
    }
    for args in [&["man"][..], &["man", "run"]] {
        let page = stdout(args);
        for section in ["\n.SH \"EXIT STATUS\"\n", "\n.SH EXAMPLES\n"] {
            assert!(
                page.contains(section),
                "`oomguard {args:?}` lacks {section:?}"
            );
        }
        let examples = unroff(page.split("\n.SH EXAMPLES\n").nth(1).unwrap());
        assert!(
            examples.contains("oomguard run --on-critical restart --max-restarts 3"),
            "{examples}"
        );
    }
    let top = stdout(&["--help"]);
    assert!(top.contains("\nExamples:\n") && top.contains("oomguard doctor -- python train.py"));
}

#[test]
fn a_mistyped_subcommand_suggests_the_nearest() {
    let _machine = common::machine::beside();
    let out = common::oomguard().arg("rn").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("a similar subcommand exists: 'run'"), "{err}");
    assert!(!err.contains("forensics"), "{err}");
    // clap's own suggestion where this rule has none.
    let out = common::oomguard().arg("complete").output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("'completions'"), "{err}");
}

#[test]
fn the_readme_states_the_rust_version_and_the_first_build_s_time() {
    let _machine = common::machine::beside();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let manifest = fs::read_to_string(root.join("Cargo.toml")).unwrap();
    let value = |key: &str| {
        manifest
            .lines()
            .find_map(|l| {
                l.strip_prefix(key)?
                    .trim()
                    .strip_prefix('=')?
                    .trim()
                    .strip_prefix('"')?
                    .strip_suffix('"')
            })
            .unwrap_or_else(|| panic!("no {key} in Cargo.toml"))
            .to_string()
    };
    let readme = fs::read_to_string(root.join("README.md")).unwrap();
    let prose = readme.split_whitespace().collect::<Vec<_>>().join(" ");
    let rust = format!("Rust ≥ {}", value("rust-version"));
    let edition = format!("edition {}", value("edition"));
    assert!(prose.contains(&rust), "the README does not say {rust:?}");
    assert!(
        prose.contains(&edition),
        "the README does not say {edition:?}"
    );
    assert!(prose.contains("the first build takes several minutes"));
    // The set-up commands stay as they are.
    assert!(readme.contains("cargo install --locked --path ."));
}
