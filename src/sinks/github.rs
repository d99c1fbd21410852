//! GitHub Actions output: workflow-command annotations and the Markdown
//! step summary.
//!
//! Pure functions and a small rate limiter; the binary decides where the
//! text goes. Annotations belong on oomguard's stderr: the runner scans
//! both stdout and stderr for workflow commands, and stdout belongs to the
//! job. The summary is appended to the file `$GITHUB_STEP_SUMMARY` names.
//!
//! GitHub shows at most 10 warning and 10 error annotations per step and
//! drops the rest, so a run that annotated every tick would bury the one
//! that matters. [`Annotator`] therefore lets each kind through at most
//! once per interval and caps each level at that same 10.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::sinks::log::{Outcome, Peak};
use crate::vocab::exit::FAIL_ABOVE as EXIT_FAIL_ABOVE;
use crate::vocab::model::Ceiling;
use crate::vocab::units::{HumanBytes, human_duration};

/// The severity of an annotation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Level {
    /// `::warning`: shown in yellow; does not fail the step.
    Warning,
    /// `::error`: shown in red; does not fail the step either (the exit
    /// code does that).
    Error,
}

impl Level {
    fn command(self) -> &'static str {
        match self {
            Level::Warning => "warning",
            Level::Error => "error",
        }
    }
}

/// Whether this process runs as a GitHub Actions step (`GITHUB_ACTIONS` is
/// `true` there), from an environment given as `(name, value)` pairs.
pub fn in_github_actions<I, K, V>(env: I) -> bool
where
    I: IntoIterator<Item = (K, V)>,
    K: AsRef<str>,
    V: AsRef<str>,
{
    env.into_iter()
        .any(|(k, v)| k.as_ref() == "GITHUB_ACTIONS" && v.as_ref() == "true")
}

/// The step summary file (`GITHUB_STEP_SUMMARY`), when set and not empty.
pub fn step_summary_path<I, K, V>(env: I) -> Option<PathBuf>
where
    I: IntoIterator<Item = (K, V)>,
    K: AsRef<str>,
    V: AsRef<str>,
{
    env.into_iter()
        .find(|(k, v)| k.as_ref() == "GITHUB_STEP_SUMMARY" && !v.as_ref().is_empty())
        .map(|(_, v)| PathBuf::from(v.as_ref()))
}

/// A workflow command line (without the trailing newline):
/// `::warning title=T::message` or `::error title=T::message`; no
/// `title=` when `title` is empty.
///
/// Escaping follows the runner's parser (the same as `@actions/core`):
/// in the message `%`, CR and LF become `%25`, `%0D`, `%0A`, so a
/// multi-line message stays one command; in a property `:` and `,` are
/// escaped too (`%3A`, `%2C`), because they delimit properties.
pub fn annotation(level: Level, title: &str, message: &str) -> String {
    let mut out = format!("::{}", level.command());
    if !title.is_empty() {
        out.push_str(" title=");
        out.push_str(&escape_property(title));
    }
    out.push_str("::");
    out.push_str(&escape_data(message));
    out
}

fn escape_data(s: &str) -> String {
    s.replace('%', "%25")
        .replace('\r', "%0D")
        .replace('\n', "%0A")
}

fn escape_property(s: &str) -> String {
    escape_data(s).replace(':', "%3A").replace(',', "%2C")
}

/// Lets annotations through sparingly: each `key` (a rule name, or a kind
/// such as `oom_kill`) at most once per interval, and at most `cap`
/// annotations per level over the whole run. Time is the run's clock in
/// seconds (`Sample::t`), so it is tested without waiting.
#[derive(Debug, Clone)]
pub struct Annotator {
    interval: f64,
    cap: usize,
    last: HashMap<String, f64>,
    warnings: usize,
    errors: usize,
    suppressed: usize,
}

impl Default for Annotator {
    /// One per key every 5 minutes, 10 per level.
    fn default() -> Self {
        Self::new(Annotator::DEFAULT_INTERVAL, Annotator::DEFAULT_CAP)
    }
}

impl Annotator {
    /// How often one key may annotate by default.
    pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(300);
    /// Annotations per level by default: what GitHub displays per step.
    pub const DEFAULT_CAP: usize = 10;

    /// A limiter with its own interval and per-level cap.
    pub fn new(interval: Duration, cap: usize) -> Self {
        Self {
            interval: interval.as_secs_f64(),
            cap,
            last: HashMap::new(),
            warnings: 0,
            errors: 0,
            suppressed: 0,
        }
    }

    /// The annotation line for this event at run time `t`, or `None` when
    /// it is held back (same key too recently, or the level's cap reached).
    pub fn offer(
        &mut self,
        t: f64,
        key: &str,
        level: Level,
        title: &str,
        message: &str,
    ) -> Option<String> {
        let recent = self
            .last
            .get(key)
            .is_some_and(|&last| t - last < self.interval);
        let count = match level {
            Level::Warning => &mut self.warnings,
            Level::Error => &mut self.errors,
        };
        if recent || *count >= self.cap {
            self.suppressed += 1;
            return None;
        }
        *count += 1;
        self.last.insert(key.to_string(), t);
        Some(annotation(level, title, message))
    }

    /// How many annotations were held back so far.
    pub fn suppressed(&self) -> usize {
        self.suppressed
    }
}

/// What the step summary reports about one run; the caller fills it from
/// `run_start` / `run_end` data.
#[derive(Debug, Clone)]
pub struct RunSummaryData {
    /// The job's command line, as one string.
    pub command: String,
    pub outcome: Outcome,
    /// oomguard's own exit code (what fails the step).
    pub exit_code: i32,
    pub duration_seconds: f64,
    /// Launches of the job: restarts + 1.
    pub attempts: u32,
    pub peak: Peak,
    /// Every ceiling that applied (`run_start.ceilings`).
    pub ceilings: Vec<Ceiling>,
    /// The least headroom seen under the nearest ceiling, if known.
    pub least_headroom_bytes: Option<u64>,
    /// Count per action (`run_end.actions`).
    pub actions: BTreeMap<String, u32>,
    /// `--fail-above`, when given: the peak tree PSS the job may not exceed.
    pub fail_above_bytes: Option<u64>,
}

impl RunSummaryData {
    /// Whether the peak tree PSS went over `--fail-above`.
    pub fn fail_above_exceeded(&self) -> bool {
        self.fail_above_bytes
            .is_some_and(|limit| self.peak.tree_pss_bytes > limit)
    }
}

fn outcome_words(d: &RunSummaryData) -> String {
    let code = d.exit_code;
    match d.outcome {
        // The gate turned the job's success into the step's failure.
        Outcome::Exited if d.fail_above_exceeded() && code == EXIT_FAIL_ABOVE => {
            "succeeded".to_string()
        }
        Outcome::Exited if code == 0 => "succeeded".to_string(),
        Outcome::Exited => format!("exited with code {code}"),
        Outcome::Signaled => format!("was killed by a signal (exit code {code})"),
        Outcome::StoppedByPolicy => format!("was stopped by oomguard's policy (exit code {code})"),
        Outcome::StoppedBySignal => {
            format!("saved and stopped on a signal oomguard received (exit code {code})")
        }
        Outcome::OomKilled => {
            format!("was killed by the kernel OOM killer (exit code {code})")
        }
        Outcome::RestartLimit => format!(
            "ran out of restarts after {} attempts (exit code {code})",
            d.attempts
        ),
        Outcome::InternalError => format!("ended with an oomguard error (exit code {code})"),
        Outcome::Detached => "was watched until oomguard stopped; it is still running".to_string(),
    }
}

fn outcome_name(o: Outcome) -> &'static str {
    match o {
        Outcome::Exited => "exited",
        Outcome::Signaled => "signaled",
        Outcome::StoppedByPolicy => "stopped_by_policy",
        Outcome::StoppedBySignal => "stopped_by_signal",
        Outcome::OomKilled => "oom_killed",
        Outcome::RestartLimit => "restart_limit",
        Outcome::InternalError => "internal_error",
        Outcome::Detached => "detached",
    }
}

/// Text for a table cell: one line, pipes escaped.
fn cell(s: &str) -> String {
    s.replace(['\r', '\n'], " ").replace('|', "\\|")
}

/// A code span that survives any backticks in `s` (the fence is one longer
/// than the longest run inside), for a table cell.
fn code_cell(s: &str) -> String {
    const MAX: usize = 200;
    let mut s: String = s.replace(['\r', '\n'], " ");
    if s.chars().count() > MAX {
        s = s.chars().take(MAX).collect::<String>() + "…";
    }
    let mut longest = 0;
    let mut run = 0;
    for c in s.chars() {
        run = if c == '`' { run + 1 } else { 0 };
        longest = longest.max(run);
    }
    let fence = "`".repeat(longest + 1);
    let pad = if s.starts_with('`') || s.ends_with('`') {
        " "
    } else {
        ""
    };
    format!("{fence}{pad}{}{pad}{fence}", s.replace('|', "\\|"))
}

/// The Markdown step summary: a heading with the verdict and a table of
/// peaks, ceilings, actions, attempts and outcome.
pub fn step_summary(d: &RunSummaryData) -> String {
    let mut out = String::new();
    let gate = match d.fail_above_exceeded() {
        true if d.outcome == Outcome::Exited && d.exit_code == EXIT_FAIL_ABOVE => format!(
            " but exceeded its memory limit (`--fail-above`): the step fails with exit code {EXIT_FAIL_ABOVE}"
        ),
        true => " and exceeded its memory limit (`--fail-above`)".to_string(),
        false => String::new(),
    };
    let _ = writeln!(out, "### oomguard: the job {}{gate}\n", outcome_words(d));
    out.push_str("| | |\n|:--|:--|\n");
    let mut row = |k: &str, v: String| {
        let _ = writeln!(out, "| {k} | {v} |");
    };
    row("Command", code_cell(&d.command));
    row("Outcome", format!("`{}`", outcome_name(d.outcome)));
    row("Exit code", d.exit_code.to_string());
    row(
        "Duration",
        human_duration(Duration::from_secs_f64(d.duration_seconds.max(0.0))),
    );
    row("Attempts", d.attempts.to_string());
    let peak_at = |bytes: u64, t: f64| {
        let at = human_duration(Duration::from_secs_f64(t.max(0.0)));
        format!("**{}** at {at}", HumanBytes(bytes))
    };
    row(
        "Peak footprint (what the ceilings were compared with)",
        peak_at(d.peak.footprint_bytes, d.peak.footprint_t),
    );
    row("Peak PSS sum", peak_at(d.peak.tree_pss_bytes, d.peak.t));
    row(
        "Peak tree RSS (sum, counts shared pages per process)",
        HumanBytes(d.peak.tree_rss_bytes).to_string(),
    );
    row(
        "Peak swap used (machine)",
        HumanBytes(d.peak.swap_used_bytes).to_string(),
    );
    if d.peak.gpu_used_bytes > 0 {
        row(
            "Peak GPU memory",
            HumanBytes(d.peak.gpu_used_bytes).to_string(),
        );
    }
    let ceilings = if d.ceilings.is_empty() {
        "none known".to_string()
    } else {
        d.ceilings
            .iter()
            .map(|c| format!("{} {}", c.source.as_str(), HumanBytes(c.bytes)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    row("Ceilings", cell(&ceilings));
    if let Some(h) = d.least_headroom_bytes {
        row("Least headroom", HumanBytes(h).to_string());
    }
    if let Some(limit) = d.fail_above_bytes {
        let verdict = if d.fail_above_exceeded() {
            format!(
                "**exceeded** by {}",
                HumanBytes(d.peak.tree_pss_bytes - limit)
            )
        } else {
            "within".to_string()
        };
        row(
            "`--fail-above`",
            format!("{}: {verdict}", HumanBytes(limit)),
        );
    }
    let actions: Vec<String> = d
        .actions
        .iter()
        .filter(|(_, n)| **n > 0)
        .map(|(a, n)| format!("{} {n}", cell(a)))
        .collect();
    row(
        "Actions",
        if actions.is_empty() {
            "none".to_string()
        } else {
            actions.join(", ")
        },
    );
    out
}

/// Why the step summary could not be written.
#[derive(Debug, thiserror::Error)]
#[error("cannot append to the step summary '{path}': {source}")]
pub struct StepSummaryError {
    pub path: PathBuf,
    #[source]
    pub source: std::io::Error,
}

/// Appends `text` to the step summary file (other steps' content stays),
/// separated from what is already there by a blank line.
pub fn append_step_summary(path: &Path, text: &str) -> Result<(), StepSummaryError> {
    let err = |source| StepSummaryError {
        path: path.to_path_buf(),
        source,
    };
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(err)?;
    let mut chunk = String::with_capacity(text.len() + 2);
    if f.metadata().map_err(err)?.len() > 0 {
        chunk.push('\n');
    }
    chunk.push_str(text);
    if !chunk.ends_with('\n') {
        chunk.push('\n');
    }
    f.write_all(chunk.as_bytes()).map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vocab::model::CeilingSource;

    #[test]
    fn annotation_format_and_escaping() {
        assert_eq!(annotation(Level::Warning, "", "plain"), "::warning::plain");
        assert_eq!(
            annotation(Level::Error, "OOM kill", "killed"),
            "::error title=OOM kill::killed"
        );
        assert_eq!(
            annotation(
                Level::Warning,
                "headroom: 5%, falling",
                "50% used\r\nnext: 100%, soon"
            ),
            "::warning title=headroom%3A 5%25%2C falling::50%25 used%0D%0Anext: 100%25, soon"
        );
        // Already-escaped looking text is escaped again, not passed through.
        assert_eq!(annotation(Level::Error, "", "%0A"), "::error::%250A");
        // One line whatever the input.
        let a = annotation(Level::Error, "a\nb", "c\nd\re");
        assert!(!a.contains('\n') && !a.contains('\r'), "{a}");
    }

    #[test]
    fn annotator_limits_per_key_interval() {
        let mut a = Annotator::new(Duration::from_secs(60), 10);
        let w = |a: &mut Annotator, t: f64, key: &str| {
            a.offer(t, key, Level::Warning, "t", "m").is_some()
        };
        assert!(w(&mut a, 0.0, "low-headroom"));
        // Every tick for a minute: nothing more from that rule.
        for i in 1..60 {
            assert!(!w(&mut a, f64::from(i), "low-headroom"));
        }
        // Another rule is not held back by the first.
        assert!(w(&mut a, 30.0, "swap"));
        assert!(w(&mut a, 60.0, "low-headroom"));
        assert_eq!(a.suppressed(), 59);
    }

    #[test]
    fn annotator_caps_each_level() {
        let mut a = Annotator::new(Duration::from_secs(1), 3);
        let mut warned = 0;
        // A day of ticks with a rule firing all the time.
        for i in 0..86_400 {
            if a.offer(f64::from(i), "rule", Level::Warning, "t", "m")
                .is_some()
            {
                warned += 1;
            }
        }
        assert_eq!(warned, 3);
        // The warnings did not use up the errors' share.
        let e = a.offer(86_400.0, "oom_kill", Level::Error, "OOM", "killed");
        assert_eq!(e.as_deref(), Some("::error title=OOM::killed"));
    }

    #[test]
    fn default_annotator_is_sparse() {
        let mut a = Annotator::default();
        let n = (0..3600)
            .filter(|&i| {
                a.offer(f64::from(i), "rule", Level::Warning, "", "m")
                    .is_some()
            })
            .count();
        // One hour, one rule firing every second: one per 5 minutes would
        // be 12; the cap stops it at 10.
        assert_eq!(n, 10);
    }

    #[test]
    fn environment() {
        assert!(in_github_actions([("GITHUB_ACTIONS", "true")]));
        assert!(!in_github_actions([("GITHUB_ACTIONS", "false")]));
        assert!(!in_github_actions(Vec::<(String, String)>::new()));
        assert_eq!(
            step_summary_path([("GITHUB_STEP_SUMMARY", "/tmp/s.md")]),
            Some(PathBuf::from("/tmp/s.md"))
        );
        assert_eq!(step_summary_path([("GITHUB_STEP_SUMMARY", "")]), None);
    }

    fn data() -> RunSummaryData {
        RunSummaryData {
            command: "python3 train.py --name a|b".into(),
            outcome: Outcome::StoppedByPolicy,
            exit_code: 75,
            duration_seconds: 125.4,
            attempts: 2,
            peak: Peak {
                tree_pss_bytes: 3 << 30,
                tree_rss_bytes: 5 << 30,
                swap_used_bytes: 0,
                gpu_used_bytes: 0,
                t: 61.0,
                largest_process_rss_bytes: 0,
                footprint_bytes: 2 << 30,
                footprint_t: 60.0,
                shm: None,
            },
            ceilings: vec![
                Ceiling {
                    source: CeilingSource::Cgroup,
                    bytes: 4 << 30,
                },
                Ceiling {
                    source: CeilingSource::System,
                    bytes: 16 << 30,
                },
            ],
            least_headroom_bytes: Some(300 << 20),
            actions: [("warn", 2), ("pause", 0), ("stop", 1)]
                .into_iter()
                .map(|(a, n)| (a.to_string(), n))
                .collect(),
            fail_above_bytes: Some(2 << 30),
        }
    }

    #[test]
    fn step_summary_table() {
        let text = step_summary(&data());
        let expected = "\
### oomguard: the job was stopped by oomguard's policy (exit code 75) and exceeded its memory limit (`--fail-above`)

| | |
|:--|:--|
| Command | `python3 train.py --name a\\|b` |
| Outcome | `stopped_by_policy` |
| Exit code | 75 |
| Duration | 2m 05s |
| Attempts | 2 |
| Peak footprint (what the ceilings were compared with) | **2.0 GiB** at 1m 00s |
| Peak PSS sum | **3.0 GiB** at 1m 01s |
| Peak tree RSS (sum, counts shared pages per process) | 5.0 GiB |
| Peak swap used (machine) | 0 B |
| Ceilings | cgroup 4.0 GiB, system 16.0 GiB |
| Least headroom | 300 MiB |
| `--fail-above` | 2.0 GiB: **exceeded** by 1.0 GiB |
| Actions | stop 1, warn 2 |
";
        assert_eq!(text, expected, "got:\n{text}");
    }

    #[test]
    fn step_summary_success_and_optional_rows() {
        let mut d = data();
        d.outcome = Outcome::Exited;
        d.exit_code = 0;
        d.attempts = 1;
        d.actions.clear();
        d.fail_above_bytes = Some(4 << 30);
        d.peak.gpu_used_bytes = 1 << 30;
        d.least_headroom_bytes = None;
        d.ceilings.clear();
        let text = step_summary(&d);
        assert!(
            text.starts_with("### oomguard: the job succeeded\n\n"),
            "{text}"
        );
        assert!(
            text.contains("| `--fail-above` | 4.0 GiB: within |"),
            "{text}"
        );
        assert!(text.contains("| Peak GPU memory | 1.0 GiB |"), "{text}");
        assert!(text.contains("| Actions | none |"), "{text}");
        // The gate failed a job that succeeded: the heading says both.
        d.fail_above_bytes = Some(1 << 30);
        d.exit_code = 76;
        assert!(
            step_summary(&d).starts_with(
                "### oomguard: the job succeeded but exceeded its memory limit (`--fail-above`): the step fails with exit code 76\n"
            ),
            "{}",
            step_summary(&d)
        );
        d.fail_above_bytes = Some(4 << 30);
        d.exit_code = 0;
        assert!(text.contains("| Ceilings | none known |"), "{text}");
        assert!(!text.contains("Least headroom"), "{text}");
        for (outcome, words) in [
            (Outcome::OomKilled, "killed by the kernel OOM killer"),
            (
                Outcome::RestartLimit,
                "ran out of restarts after 1 attempts",
            ),
            (Outcome::Signaled, "killed by a signal"),
            (Outcome::InternalError, "oomguard error"),
        ] {
            d.outcome = outcome;
            assert!(step_summary(&d).contains(words), "{outcome:?}");
        }
    }

    #[test]
    fn command_cells_survive_backticks_and_newlines() {
        assert_eq!(code_cell("a`b"), "``a`b``");
        assert_eq!(code_cell("`x`"), "`` `x` ``");
        assert_eq!(code_cell("a\nb"), "`a b`");
        let long = "x".repeat(500);
        assert_eq!(code_cell(&long).chars().count(), 200 + 1 + 2);
        // Every row of the table is one line.
        let mut d = data();
        d.command = "sh -c 'echo a\necho b'".into();
        let text = step_summary(&d);
        assert!(
            text.lines()
                .filter(|l| l.starts_with('|'))
                .all(|l| l.ends_with('|'))
        );
    }

    #[test]
    fn append_keeps_other_steps_content() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("summary.md");
        append_step_summary(&path, "first").unwrap();
        std::fs::write(&path, "# earlier step\n").unwrap();
        append_step_summary(&path, "### ours\n").unwrap();
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "# earlier step\n\n### ours\n"
        );
        let err = append_step_summary(&dir.path().join("no/such.md"), "x").unwrap_err();
        assert!(err.to_string().contains("no/such.md"), "{err}");
    }
}
