//! Why `oomguard report` could not make a report: its one error type, below
//! every module that reads or writes one, so the loader need not reach up
//! into the command's own module for it.

use std::path::PathBuf;

/// Why a report could not be made.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// A line of another schema (a newer oomguard, or another tool).
    #[error(
        "line {line}: schema '{found}' is not {schema}; this oomguard reads {schema} logs only",
        schema = crate::sinks::log::SCHEMA
    )]
    Schema { line: usize, found: String },
    /// A JSON line without a `schema` field: not an oomguard log.
    #[error("line {line}: no \"schema\" field: this is not an oomguard log")]
    NotALog { line: usize },
    /// Nothing readable at all.
    #[error("no oomguard/1 line found: the log is empty or not an oomguard log")]
    Empty,
    #[error("cannot read log '{path}': {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write report '{path}': {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// `--run N` beyond the runs the log holds.
    #[error("{path}: {source}")]
    NoSuchRun {
        path: PathBuf,
        #[source]
        source: crate::sinks::log::runs::NoSuchRun,
    },
    /// A parse error, with the file it came from.
    #[error("{path}: {source}")]
    InLog {
        path: PathBuf,
        #[source]
        source: Box<ReportError>,
    },
}
