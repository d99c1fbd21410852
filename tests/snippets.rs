//! The companion's snippets run as written: the Python block of
//! docs/companion.md and the one of python/README.md, taken from the
//! markdown, each run under `oomguard run` by the `python3` on PATH (the
//! companion needs nothing but the standard library): once to its end,
//! and once stopped by a rule, when it saves the checkpoint it was asked
//! for and leaves. python/README.md's also resumes from its checkpoint
//! after a restart.

#![allow(clippy::unwrap_used)]

use crate::common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Output;

use common::schema::Event;

/// The one ```python block of `file` (relative to the repository) that
/// uses the companion.
fn snippet(file: &str) -> String {
    let text = fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(file)).unwrap();
    let blocks: Vec<&str> = text
        .split("```python\n")
        .skip(1)
        .filter_map(|b| b.split("```").next())
        .filter(|b| b.contains("oomguard.guard()"))
        .collect();
    assert_eq!(blocks.len(), 1, "{file}: one snippet expected: {blocks:?}");
    blocks[0].to_string()
}

/// A rule that stops the job once it has run 3 s (any Python is above
/// 1 MiB), with the default rules left out: on a busy machine Python may
/// take 2 s to reach the snippet's first step (a stop before the companion
/// has spoken saves nothing, rightly), and the snippet's 100 steps take at
/// least 5 s, so the stop comes mid-run.
const STOP_RULE: &str = r#"
include_defaults = false

[[rule]]
name = "snippet-stop"
metric = "tree_pss"
above = "1MiB"
for = "3s"
action = "stop"
"#;

struct Ran {
    out: Output,
    log: Vec<common::schema::Line>,
    dir: tempfile::TempDir,
}

impl Ran {
    fn why(&self) -> String {
        format!(
            "exit {:?}\nstdout:\n{}\nstderr:\n{}",
            self.out.status.code(),
            String::from_utf8_lossy(&self.out.stdout),
            String::from_utf8_lossy(&self.out.stderr)
        )
    }

    /// The checkpoints in the job's directory.
    fn checkpoints(&self) -> Vec<PathBuf> {
        let mut found: Vec<PathBuf> = fs::read_dir(self.dir.path())
            .unwrap()
            .flatten()
            .map(|e| e.path())
            // The snippet's files, not oomguard's resume and end records.
            .filter(|p| {
                let name = p.file_name().unwrap_or_default().to_string_lossy();
                name.ends_with(".json") && !name.starts_with(".oomguard-")
            })
            .collect();
        found.sort();
        found
    }
}

/// The same rule, restarting the job instead.
const RESTART_RULE: &str = r#"
include_defaults = false

[[rule]]
name = "snippet-restart"
metric = "tree_pss"
above = "1MiB"
for = "3s"
action = "restart"
"#;

/// `code` saved as `snippet.py` in a fresh directory and run there by
/// `oomguard run [--config RULES] [extra] -- python3 snippet.py`.
fn run(code: &str, rules: Option<&str>) -> Ran {
    run_with(code, rules, &[])
}

fn run_with(code: &str, rules: Option<&str>, extra: &[&str]) -> Ran {
    let dir = tempfile::tempdir().unwrap();
    let script = common::script(dir.path(), "snippet.py", code);
    let log = dir.path().join("log.ndjson");
    let mut c = common::oomguard();
    c.args(["run", "--no-tui", "--no-notify", "--cgroup", "off", "--log"])
        .arg(&log);
    // The rules live outside the job's directory, which holds only what
    // the snippet writes.
    let config = tempfile::NamedTempFile::new().unwrap();
    if let Some(rules) = rules {
        fs::write(config.path(), rules).unwrap();
        c.arg("--config").arg(config.path());
    }
    c.args(extra);
    c.arg("--")
        .arg("python3")
        .arg(&script)
        .current_dir(dir.path());
    let out = c.output().unwrap();
    let log = common::read_log(&log);
    Ran { out, log, dir }
}

/// The snippet runs to its end (exit 0, nothing saved), and a stop asks
/// it for a checkpoint, which it writes and reports before it leaves.
fn runs_and_saves_on_a_stop(file: &str) {
    let code = snippet(file);
    let whole = run(&code, None);
    assert_eq!(whole.out.status.code(), Some(0), "{}", whole.why());
    assert!(whole.checkpoints().is_empty(), "{:?}", whole.checkpoints());

    let stopped = run(&code, Some(STOP_RULE));
    assert_eq!(stopped.out.status.code(), Some(75), "{}", stopped.why());
    let done = stopped
        .log
        .iter()
        .find_map(|l| match &l.event {
            Event::CheckpointDone(v) => Some(v.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("{file}: no checkpoint_done\n{}", stopped.why()));
    let step = done["step"].as_u64().unwrap();
    let path = stopped.dir.path().join(format!("ckpt-{step}.json"));
    assert_eq!(done["paths"], serde_json::json!([path]), "{done}");
    assert_eq!(stopped.checkpoints(), vec![path.clone()]);
    let saved: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(saved["step"], step);
    // The summary names the checkpoint the companion reported.
    let err = String::from_utf8_lossy(&stopped.out.stderr);
    assert!(
        err.contains(&format!("checkpoint at step {step} (")),
        "{}",
        stopped.why()
    );
}

#[test]
fn the_snippet_of_docs_companion_md_runs() {
    let _machine = common::machine::beside();
    runs_and_saves_on_a_stop("docs/companion.md");
}

#[test]
fn the_snippet_of_python_readme_md_runs() {
    let _machine = common::machine::beside();
    runs_and_saves_on_a_stop("python/README.md");
}

/// After a restart, python/README.md's snippet goes on from the step its
/// checkpoint holds: the second attempt reports no step before it.
#[test]
fn the_snippet_of_python_readme_md_resumes_after_a_restart() {
    let _machine = common::machine::beside();
    let code = snippet("python/README.md");
    let r = run_with(
        &code,
        Some(RESTART_RULE),
        &[
            "--max-restarts",
            "1",
            "--restart-delay",
            "100ms",
            "--interval",
            "100ms",
        ],
    );
    let first = r
        .log
        .iter()
        .find_map(|l| match &l.event {
            Event::CheckpointDone(v) if l.attempt == 1 => v["step"].as_u64(),
            _ => None,
        })
        .unwrap_or_else(|| panic!("no checkpoint in the first attempt\n{}", r.why()));
    let restarted = r.log.iter().any(|l| matches!(l.event, Event::Restart(_)));
    assert!(restarted, "{}", r.why());
    // Every step the second attempt reached comes after the checkpoint.
    let steps: Vec<u64> = r
        .log
        .iter()
        .filter(|l| l.attempt == 2)
        .filter_map(|l| l.progress.as_ref()?.step)
        .collect();
    assert!(
        !steps.is_empty(),
        "no progress in the second attempt\n{}",
        r.why()
    );
    assert!(
        steps.iter().all(|&s| s >= first),
        "the second attempt started over: steps {steps:?}, checkpoint at {first}\n{}",
        r.why()
    );
}
