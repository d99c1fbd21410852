//! `oomguard report`: turns a run's NDJSON log into a post-mortem, either one
//! self-contained HTML page with a timeline, a terminal summary, or JSON.
//!
//! The pipeline is `load` (tolerant NDJSON reader) → `diagnose` (findings
//! with the numbers they cite) → a renderer (`html` with `svg`, `text`). All
//! of it works on text and data; only [`run_report`] touches files, and
//! nothing here prints: the caller decides where output goes.

mod attempts;
mod diagnose;
mod did;
mod error;
mod finding;
mod fit;
mod html;
mod job;
mod load;
mod run_log;
mod shm;
mod svg;
mod text;
mod trainer;
mod workers;

use std::path::{Path, PathBuf};

use crate::sinks::log::runs::{self, RunPick};

pub use diagnose::diagnose;
pub use error::ReportError;
pub use finding::{Cited, FIT_SHARE, Finding, ProcSummary, Severity, Unit, processes};
pub use fit::{WorkerFit, nearest_ceiling, worker_fit_numbers};
pub use html::render_html;
pub use job::{JobReport, job_report, render_job_html, render_job_json, render_job_text};
pub use load::{
    Attempt, CeilingInfo, EndInfo, GpuPoint, LISTED_WARNINGS, LoadError, PeakInfo, PolicyRule,
    ProcPoint, RunLog, SamplePoint, Snapshot, StartInfo, Timed, load, load_from,
};
pub use text::{render_json, render_text};

/// Output formats of `oomguard report`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Format {
    /// One self-contained HTML page with the timeline (the default).
    #[default]
    Html,
    /// Summary and advice for the terminal.
    Text,
    /// The same as data.
    Json,
}

/// Where [`run_report`] put the report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Destination {
    /// Written to this file.
    File(PathBuf),
    /// For the caller to print on stdout.
    Stdout(String),
}

/// What [`run_report`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReportOutput {
    pub destination: Destination,
    /// Lines of the log that were skipped (also shown in the report).
    pub warnings: Vec<String>,
}

/// The whole `oomguard report` command.
///
/// - `input`: the NDJSON log; `-` reads stdin.
/// - `output`: where to write. For HTML without `output`, next to the
///   input as `<stem>.html` (`run.ndjson` → `run.html`; `report.html` for
///   stdin; `<stem>.report.html` if that would overwrite the input). Text
///   and JSON without `output`, and any format with `output` = `-`, come
///   back as [`Destination::Stdout`] for the caller to print.
///
/// Nothing is printed; errors name the file and, for bad content, the line.
pub fn run_report(
    input: &Path,
    output: Option<&Path>,
    format: Format,
    pick: RunPick,
) -> Result<ReportOutput, ReportError> {
    let log = load_path(input, pick)?;
    let findings = diagnose(&log);
    let body = match format {
        Format::Html => render_html(&log, &findings),
        Format::Text => render_text(&log, &findings),
        Format::Json => json_text(&render_json(&log, &findings)),
    };
    let mut warnings = log.warnings;
    if log.unlisted_warnings > 0 {
        warnings.push(format!(
            "… and {} more line{} skipped",
            log.unlisted_warnings,
            if log.unlisted_warnings == 1 { "" } else { "s" }
        ));
    }
    let html_path = || default_html_path(input);
    deliver(body, output, format, html_path, warnings)
}

/// `oomguard report` of several inputs: logs, or directories whose
/// `*.ndjson` files are the logs (one per node of one job). One log is the
/// single-run report; several make the job report (`job.html` next to
/// the first log when HTML has no `output`).
pub fn run_reports(
    inputs: &[PathBuf],
    output: Option<&Path>,
    format: Format,
    pick: RunPick,
) -> Result<ReportOutput, ReportError> {
    let mut files = Vec::new();
    for input in inputs {
        if input.is_dir() {
            let read = std::fs::read_dir(input).map_err(|source| ReportError::Read {
                path: input.clone(),
                source,
            })?;
            let mut found: Vec<PathBuf> = read
                .filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "ndjson"))
                .collect();
            found.sort();
            files.extend(found);
        } else {
            files.push(input.clone());
        }
    }
    match files.as_slice() {
        [] => Err(ReportError::Empty),
        [one] => run_report(one, output, format, pick),
        _ => {
            let mut logs = Vec::new();
            let mut warnings = Vec::new();
            for f in &files {
                let log = load_path(f, pick)?;
                let name = f
                    .file_stem()
                    .map_or_else(|| f.display().to_string(), |s| s.to_string_lossy().into());
                warnings.extend(log.warnings.iter().map(|w| format!("{name}: {w}")));
                logs.push((name, log));
            }
            job::name_tasks(&mut logs);
            let report = job_report(&logs);
            let body = match format {
                Format::Html => render_job_html(&report),
                Format::Text => render_job_text(&report),
                Format::Json => json_text(&render_job_json(&report)),
            };
            let html_path = || files[0].with_file_name("job.html");
            deliver(body, output, format, html_path, warnings)
        }
    }
}

/// Reads run `pick` of one log (`-`: stdin), errors naming the file.
fn load_path(input: &Path, pick: RunPick) -> Result<RunLog, ReportError> {
    let err = |source| ReportError::Read {
        path: input.to_path_buf(),
        source,
    };
    let run = runs::open(input, pick).map_err(|e| match e {
        runs::OpenRunError::Read(source) => err(source),
        runs::OpenRunError::NoSuchRun(source) => ReportError::NoSuchRun {
            path: input.to_path_buf(),
            source,
        },
    })?;
    let mut log = load_from(run.reader).map_err(|e| match e {
        LoadError::Read(source) => err(source),
        LoadError::Log(e) => ReportError::InLog {
            path: input.to_path_buf(),
            source: Box::new(e),
        },
    })?;
    log.run_of = (run.index, run.of);
    Ok(log)
}

fn json_text(v: &serde_json::Value) -> String {
    let mut s = serde_json::to_string_pretty(v).unwrap_or_else(|_| "{}".to_string());
    s.push('\n');
    s
}

/// Writes `body` where `output` says (HTML without one: `html_path`), or
/// hands it back for stdout.
fn deliver(
    body: String,
    output: Option<&Path>,
    format: Format,
    html_path: impl FnOnce() -> PathBuf,
    warnings: Vec<String>,
) -> Result<ReportOutput, ReportError> {
    let target = match (output, format) {
        (Some(p), _) if p == Path::new("-") => None,
        (Some(p), _) => Some(p.to_path_buf()),
        (None, Format::Html) => Some(html_path()),
        (None, _) => None,
    };
    let destination = match target {
        Some(path) => {
            std::fs::write(&path, body).map_err(|source| ReportError::Write {
                path: path.clone(),
                source,
            })?;
            Destination::File(path)
        }
        None => Destination::Stdout(body),
    };
    Ok(ReportOutput {
        destination,
        warnings,
    })
}

/// The HTML path used when `-o` is not given.
pub fn default_html_path(input: &Path) -> PathBuf {
    if input == Path::new("-") {
        return PathBuf::from("report.html");
    }
    let stem = input
        .file_stem()
        .map_or_else(|| "report".into(), |s| s.to_string_lossy().into_owned());
    let candidate = input.with_file_name(format!("{stem}.html"));
    if candidate == input {
        input.with_file_name(format!("{stem}.report.html"))
    } else {
        candidate
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_paths() {
        assert_eq!(
            default_html_path(Path::new("/x/run.ndjson")),
            PathBuf::from("/x/run.html")
        );
        assert_eq!(
            default_html_path(Path::new("run")),
            PathBuf::from("run.html")
        );
        assert_eq!(
            default_html_path(Path::new("a/r.html")),
            PathBuf::from("a/r.report.html")
        );
        assert_eq!(
            default_html_path(Path::new("-")),
            PathBuf::from("report.html")
        );
    }

    #[test]
    fn errors_name_the_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("other.ndjson");
        std::fs::write(&p, "{\"schema\":\"other/3\",\"event\":\"x\"}\n").unwrap();
        let e = run_report(&p, None, Format::Text, RunPick::Last).unwrap_err();
        let msg = e.to_string();
        assert!(
            msg.contains("other.ndjson") && msg.contains("line 1"),
            "{msg}"
        );
        assert!(msg.contains("other/3"), "{msg}");
        let missing = dir.path().join("missing.ndjson");
        let e = run_report(&missing, None, Format::Html, RunPick::Last).unwrap_err();
        assert!(e.to_string().contains("missing.ndjson"), "{e}");
    }
}
