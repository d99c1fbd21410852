//! GitHub Actions output: annotations decoded the way the Actions runner
//! decodes workflow commands (for arbitrary titles and messages), the step
//! summary as a well-formed Markdown table, and, once `oomguard run` is
//! wired to it, the end-to-end behaviour with `GITHUB_ACTIONS=true`.

// The helpers below are test code too; a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

use crate::common;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Stdio;

use oomguard::sinks::github::{
    Annotator, Level, RunSummaryData, annotation, append_step_summary, step_summary,
};
use oomguard::sinks::log::{Outcome, Peak};
use oomguard::vocab::model::{Ceiling, CeilingSource};
use proptest::prelude::*;

use common::MemCgroup;

/// A workflow command as the runner reads it: `::name k=v,k=v::data`.
#[derive(Debug, PartialEq)]
struct Command {
    name: String,
    properties: BTreeMap<String, String>,
    data: String,
}

fn unescape_data(s: &str) -> String {
    s.replace("%0D", "\r")
        .replace("%0A", "\n")
        .replace("%25", "%")
}

fn unescape_property(s: &str) -> String {
    s.replace("%0D", "\r")
        .replace("%0A", "\n")
        .replace("%3A", ":")
        .replace("%2C", ",")
        .replace("%25", "%")
}

/// Parses one line the way the runner does: the command ends at the first
/// `::` after the leading one; properties split at `,`, then at the first
/// `=`.
fn parse(line: &str) -> Option<Command> {
    let rest = line.strip_prefix("::")?;
    let end = rest.find("::")?;
    let (head, data) = (&rest[..end], &rest[end + 2..]);
    let (name, props) = head.split_once(' ').unwrap_or((head, ""));
    let properties = props
        .split(',')
        .filter(|p| !p.is_empty())
        .filter_map(|p| p.split_once('='))
        .map(|(k, v)| (k.to_string(), unescape_property(v)))
        .collect();
    Some(Command {
        name: name.to_string(),
        properties,
        data: unescape_data(data),
    })
}

/// The cells of a Markdown table row, honouring `\|`.
fn cells(row: &str) -> Vec<String> {
    let mut out = vec![String::new()];
    let mut chars = row.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&'|') => {
                out.last_mut().unwrap().push('|');
                chars.next();
            }
            '|' => out.push(String::new()),
            c => out.last_mut().unwrap().push(c),
        }
    }
    // A row starts and ends with a pipe: drop the empty outer parts.
    out.remove(0);
    out.pop();
    out
}

fn summary_data(command: &str) -> RunSummaryData {
    RunSummaryData {
        command: command.to_string(),
        outcome: Outcome::OomKilled,
        exit_code: 137,
        duration_seconds: 3600.0,
        attempts: 3,
        peak: Peak {
            tree_pss_bytes: 7 << 30,
            tree_rss_bytes: 20 << 30,
            swap_used_bytes: 1 << 30,
            gpu_used_bytes: 40 << 30,
            t: 3500.0,
            largest_process_rss_bytes: 6 << 30,
            footprint_bytes: 6 << 30,
            footprint_t: 3400.0,
            shm: None,
        },
        ceilings: vec![Ceiling {
            source: CeilingSource::Cgroup,
            bytes: 8 << 30,
        }],
        least_headroom_bytes: Some(0),
        actions: [("warn".to_string(), 4), ("restart".to_string(), 2)]
            .into_iter()
            .collect(),
        fail_above_bytes: Some(6 << 30),
    }
}

proptest! {
    #[test]
    fn annotations_decode_to_what_was_given(title in any::<String>(), message in any::<String>()) {
        let _machine = crate::common::machine::beside();
        for (level, name) in [(Level::Warning, "warning"), (Level::Error, "error")] {
            let line = annotation(level, &title, &message);
            prop_assert!(!line.contains('\n') && !line.contains('\r'), "{}", line);
            let cmd = parse(&line).expect("a workflow command");
            prop_assert_eq!(&cmd.name, name);
            prop_assert_eq!(&cmd.data, &message);
            if title.is_empty() {
                prop_assert!(cmd.properties.is_empty());
            } else {
                prop_assert_eq!(cmd.properties.len(), 1);
                prop_assert_eq!(cmd.properties.get("title"), Some(&title));
            }
        }
    }

    #[test]
    fn step_summary_rows_have_two_cells(command in any::<String>()) {
        let _machine = crate::common::machine::beside();
        let text = step_summary(&summary_data(&command));
        let rows: Vec<&str> = text.lines().filter(|l| l.starts_with('|')).collect();
        prop_assert!(rows.len() >= 10);
        for row in rows {
            prop_assert!(row.ends_with('|'), "{}", row);
            prop_assert_eq!(cells(row).len(), 2, "{}", row);
        }
    }
}

#[test]
fn an_oom_run_summary() {
    let _machine = common::machine::beside();
    let text = step_summary(&summary_data("torchrun --nproc-per-node 8 train.py"));
    assert!(
        text.starts_with(
            "### oomguard: the job was killed by the kernel OOM killer (exit code 137) \
             and exceeded its memory limit (`--fail-above`)\n"
        ),
        "{text}"
    );
    let rows: BTreeMap<String, String> = text
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| |"))
        .map(|l| {
            let c = cells(l);
            (c[0].trim().to_string(), c[1].trim().to_string())
        })
        .collect();
    assert_eq!(rows["Outcome"], "`oom_killed`");
    assert_eq!(rows["Exit code"], "137");
    assert_eq!(rows["Attempts"], "3");
    assert_eq!(rows["Peak PSS sum"], "**7.0 GiB** at 58m 20s");
    assert_eq!(
        rows["Peak footprint (what the ceilings were compared with)"],
        "**6.0 GiB** at 56m 40s"
    );
    assert_eq!(rows["Peak GPU memory"], "40.0 GiB");
    assert_eq!(rows["Ceilings"], "cgroup 8.0 GiB");
    assert_eq!(rows["Least headroom"], "0 B");
    assert_eq!(rows["`--fail-above`"], "6.0 GiB: **exceeded** by 1.0 GiB");
    assert_eq!(rows["Actions"], "restart 2, warn 4");

    // Appended after another step's summary, which stays.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("step_summary.md");
    std::fs::write(&path, "## Tests\n\nall green\n").unwrap();
    append_step_summary(&path, &text).unwrap();
    let file = std::fs::read_to_string(&path).unwrap();
    assert_eq!(file, format!("## Tests\n\nall green\n\n{text}"));
}

#[test]
fn a_day_of_firing_rules_makes_a_few_annotations() {
    let _machine = common::machine::beside();
    let mut a = Annotator::default();
    let mut lines = Vec::new();
    // Two rules firing on every 1 s tick for 24 h, an OOM kill every hour.
    for t in 0..86_400u32 {
        let t = f64::from(t);
        lines.extend(a.offer(t, "low-headroom", Level::Warning, "headroom", "5% left"));
        lines.extend(a.offer(t, "swap", Level::Warning, "swap", "swapping"));
        if t % 3600.0 == 0.0 {
            lines.extend(a.offer(t, "oom_kill", Level::Error, "OOM kill", "pid 1 killed"));
        }
    }
    let warnings = lines.iter().filter(|l| l.starts_with("::warning")).count();
    let errors = lines.iter().filter(|l| l.starts_with("::error")).count();
    assert_eq!((warnings, errors), (10, 10), "{lines:#?}");
    assert_eq!(a.suppressed(), 2 * 86_400 + 24 - 20);
}

/// A job that allocates 4 MiB every `argv[1]` seconds until stopped.
const HOG: &str = r#"
import sys, time
chunks = []
while True:
    chunks.append(b"\x01" * (4 << 20))
    time.sleep(float(sys.argv[1]))
"#;

/// Workflow commands of one level on stderr.
fn commands(stderr: &[u8], name: &str) -> Vec<Command> {
    String::from_utf8_lossy(stderr)
        .lines()
        .filter_map(parse)
        .filter(|c| c.name == name)
        .collect()
}

#[test]
fn github_actions_end_to_end() {
    // One of its runs is killed by the kernel and another races it: alone
    // (common::machine).
    let _alone = common::machine::alone();
    // Outside Actions: no workflow commands, no summary.
    let dir = tempfile::tempdir().unwrap();
    let summary = dir.path().join("summary.md");
    let out = common::oomguard()
        .args(["run", "--", "sh", "-c", "exit 3"])
        .env("GITHUB_STEP_SUMMARY", &summary)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    assert!(!String::from_utf8_lossy(&out.stderr).contains("::"));
    assert!(!summary.exists());

    // In Actions, a plain failure: the summary table, and stdout untouched.
    std::fs::write(&summary, "## earlier step\n").unwrap();
    let out = common::oomguard()
        .args(["run", "-q", "--", "sh", "-c", "echo out; exit 3"])
        .env("GITHUB_ACTIONS", "true")
        .env("GITHUB_STEP_SUMMARY", &summary)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(String::from_utf8_lossy(&out.stdout), "out\n");
    let text = std::fs::read_to_string(&summary).unwrap();
    assert!(
        text.starts_with("## earlier step\n\n### oomguard: the job exited with code 3"),
        "{text}"
    );
    assert!(text.contains("| Exit code | 3 |"), "{text}");
    assert!(text.contains("| Outcome | `exited` |"), "{text}");

    // A job that succeeds above --fail-above: the step fails (76), the
    // summary says the job succeeded, and an error annotation says why.
    std::fs::remove_file(&summary).unwrap();
    let out = common::oomguard()
        .args([
            "run",
            "-q",
            "--cgroup",
            "off",
            "--fail-above",
            "20MiB",
            "--",
        ])
        .args([
            "python3",
            "-c",
            "b = b'x' * (60 << 20); import time; time.sleep(1.5)",
        ])
        .env("GITHUB_ACTIONS", "true")
        .env("GITHUB_STEP_SUMMARY", &summary)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(76), "{err}");
    let errors = commands(&out.stderr, "error");
    assert_eq!(errors.len(), 1, "{err}");
    assert!(
        errors[0].data.contains("exceeded --fail-above 20.0 MiB"),
        "{errors:?}"
    );
    let text = std::fs::read_to_string(&summary).unwrap();
    assert!(
        text.starts_with(
            "### oomguard: the job succeeded but exceeded its memory limit (`--fail-above`): the step fails with exit code 76"
        ),
        "{text}"
    );
    assert!(text.contains("| Exit code | 76 |"), "{text}");

    let oomguard = Path::new(env!("CARGO_BIN_EXE_oomguard"));
    let hog = common::script(dir.path(), "hog.py", HOG);
    let hog = hog.to_str().unwrap();

    // A kernel OOM kill (no policy to prevent it): one error annotation.
    let Some(cg) = MemCgroup::or_skip("github-oom", 128 << 20) else {
        return;
    };
    std::fs::remove_file(&summary).unwrap();
    let out = cg
        .command(
            oomguard,
            &[
                "run",
                "--policy",
                "none",
                "--interval",
                "100ms",
                "--",
                "python3",
                hog,
                "0.01",
            ],
        )
        .env("GITHUB_ACTIONS", "true")
        .env("GITHUB_STEP_SUMMARY", &summary)
        .stdout(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(137));
    let errors = commands(&out.stderr, "error");
    assert_eq!(errors.len(), 1, "{}", String::from_utf8_lossy(&out.stderr));
    assert!(errors[0].data.to_lowercase().contains("oom"), "{errors:?}");
    let text = std::fs::read_to_string(&summary).unwrap();
    assert!(text.contains("`oom_killed`"), "{text}");
    assert!(text.contains("| Exit code | 137 |"), "{text}");
    drop(cg);

    // The default policy warns, then stops the job before the OOM killer:
    // warnings, then one error annotation for the stop; a few, not one per
    // tick.
    let Some(cg) = MemCgroup::or_skip("github-stop", 256 << 20) else {
        return;
    };
    std::fs::remove_file(&summary).unwrap();
    let out = cg
        .command(
            oomguard,
            &[
                "run",
                "--interval",
                "100ms",
                "--grace",
                "5s",
                "--",
                "python3",
                hog,
                "0.05",
            ],
        )
        .env("GITHUB_ACTIONS", "true")
        .env("GITHUB_STEP_SUMMARY", &summary)
        .stdout(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(75), "{err}");
    let warnings = commands(&out.stderr, "warning");
    let errors = commands(&out.stderr, "error");
    assert!((1..=3).contains(&warnings.len()), "{err}");
    assert_eq!(errors.len(), 1, "{err}");
    assert!(errors[0].data.contains("stop"), "{errors:?}");
    let text = std::fs::read_to_string(&summary).unwrap();
    assert!(text.contains("`stopped_by_policy`"), "{text}");
    assert!(text.contains("stop 1"), "{text}");
}
