//! Where a run reports: the NDJSON log, Prometheus metrics, the dashboard
//! and GitHub's annotations and step summary.

pub mod github;
pub mod log;
pub mod metrics;
pub mod tui;
