//! `oomguard demo`: an embedded workload that needs nothing installed but
//! python3. A trainer-like parent holds shared "weights" and forks 4
//! workers that leak like a DataLoader with an unbounded per-worker cache,
//! under a 1 GiB budget with the default policy. A newcomer sees the tree
//! grow, the warning, the graceful stop after the "checkpoint", and the
//! summary.

use std::ffi::OsString;
use std::fs;
use std::path::PathBuf;
use std::time::Duration;

use crate::cli::{CgroupMode, DemoArgs};
use crate::config::{PolicyFlags, resolve_text};
use crate::run::{EXIT_POLICY, RunConfig, run};
use crate::units::SizeOrPercent;

const SCRIPT: &str = include_str!("demo.py");

/// Runs the demo; exits 0 when oomguard stopped the leak before the OOM
/// killer, as designed.
pub fn demo(args: DemoArgs) -> i32 {
    let dir = std::env::temp_dir().join(format!("oomguard-demo-{}", std::process::id()));
    if let Err(e) = fs::create_dir_all(&dir) {
        eprintln!("oomguard: cannot create '{}': {e}", dir.display());
        return 2;
    }
    let script = dir.join("demo_train.py");
    if let Err(e) = fs::write(&script, SCRIPT) {
        eprintln!("oomguard: cannot write '{}': {e}", script.display());
        return 2;
    }
    let ckpt = dir.join("checkpoints");
    let policy = match resolve_text(&PolicyFlags::default(), None, None) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("oomguard: {e}");
            return 2;
        }
    };
    eprintln!(
        "oomguard demo: a trainer with 4 leaking DataLoader workers under a {} budget.\n\
         oomguard warns at 80% of the budget and stops the job gracefully at 92%, before any OOM kill.\n",
        crate::units::HumanBytes(args.budget)
    );
    let cfg = RunConfig {
        argv: vec![
            OsString::from("python3"),
            OsString::from("-u"),
            script.clone().into_os_string(),
            ckpt.clone().into_os_string(),
        ],
        log: args.log.clone(),
        interval: Duration::from_millis(500),
        pss_interval: Duration::from_secs(1),
        pss_budget: crate::probe::pss::SweepConfig::DEFAULT_BUDGET,
        procs_interval: Duration::from_secs(5),
        budget: Some(SizeOrPercent::Bytes(args.budget)),
        cgroup: CgroupMode::Auto,
        kill_after: Duration::from_secs(10),
        quiet: false,
        notify: false,
        policy,
        proc_root: PathBuf::from("/proc"),
        tui: args.tui,
        restart: crate::cli::RestartArgs::default(),
        metrics_addr: None,
        metrics_textfile: None,
        fail_above: None,
        nvml: None,
        torch_stats: false,
        attach: None,
        allow_kill: false,
        output_log: None,
    };
    let code = run(cfg);
    let saved = fs::read_dir(&ckpt).map(|d| d.count()).unwrap_or(0);
    let _ = fs::remove_dir_all(&dir);
    match code {
        EXIT_POLICY => {
            eprintln!(
                "\noomguard demo: the leak was stopped before the kernel OOM killer ({} checkpoint saved).\n\
                 `oomguard run` exits 75 in this case (EX_TEMPFAIL: safe to requeue).\n\
                 Try it on your job:  oomguard run --log run.ndjson -- bash train.sh",
                saved
            );
            0
        }
        127 => {
            eprintln!("oomguard demo needs python3 on PATH");
            127
        }
        other => {
            eprintln!("\noomguard demo: unexpected end (exit {other})");
            if other == 0 { 1 } else { other }
        }
    }
}
