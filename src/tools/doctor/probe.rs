//! `oomguard doctor -- CMD`: starts the command the way `oomguard run`
//! starts it (the same supervisor, companion and progress detection, so
//! the answer is the one a real run would give), waits until it shows
//! progress or the wait is over, asks whether a stop would lose its work
//! (the stop path's own check, `runtime::act::stop_verdict`) and ends it
//! gracefully. The verdict comes back through a [`Watch`] the supervisor
//! fills in.

use std::ffi::OsString;
use std::time::Duration;

use serde::Serialize;

pub use crate::vocab::verdict::{Finding, Watch};

/// The outcome of `doctor -- CMD`.
#[derive(Debug, Clone, Serialize)]
pub struct Probed {
    pub command: Vec<String>,
    /// `None`: the command ended (or could not start) before it was judged.
    pub finding: Option<Finding>,
    /// oomguard's exit code for the run (the job's, mostly).
    pub run_exit: i32,
}

/// Runs `argv` under the supervisor until it is judged, then ends it.
/// Settings come from `./oomguard.toml` as for `run` (the checkpoint
/// signal above all); the dashboard, notifications, GPUs and the summary
/// are off.
pub fn probe(argv: &[OsString], wait: Duration) -> Result<Probed, String> {
    let mut args: Vec<OsString> = [
        "oomguard",
        "run",
        "--no-tui",
        "--quiet",
        "--no-notify",
        "--no-gpu",
        "--kill-after",
        "5s",
        "--",
    ]
    .iter()
    .map(OsString::from)
    .collect();
    args.extend(argv.iter().cloned());
    let cli = <crate::settings::cli::Cli as clap::Parser>::try_parse_from(args)
        .map_err(|e| e.to_string())?;
    let crate::settings::cli::Command::Run(run_args) = cli.command else {
        return Err("internal: not a run".into());
    };
    let mut cfg = crate::settings::Settings::for_run(*run_args).map_err(|e| e.to_string())?;
    cfg.doctor = Some(wait);
    let (run_exit, finding) = crate::runtime::judge(cfg);
    Ok(Probed {
        command: argv
            .iter()
            .map(|a| a.to_string_lossy().into_owned())
            .collect(),
        finding,
        run_exit,
    })
}
