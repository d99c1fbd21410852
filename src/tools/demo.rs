//! `oomguard demo`: an embedded workload that needs nothing installed. A
//! trainer-like parent holds "weights" and 4 workers leak like a DataLoader
//! with an unbounded per-worker cache, under a 1 GiB budget with the
//! default policy. A newcomer sees the tree grow, the warning, the graceful
//! stop after the "checkpoint", and the summary. With python3 the job is
//! `demo.py` (real forked workers sharing the weights copy-on-write);
//! without it, the same job built into this binary (`demo_job`).

use std::ffi::OsString;
use std::fs;
use std::path::Path;
use std::process::{Command, Stdio};

use crate::runtime::run;
use crate::settings::Settings;
use crate::settings::cli::DemoArgs;
use crate::vocab::exit::POLICY as EXIT_POLICY;

const SCRIPT: &str = include_str!("demo.py");

/// The demo job: `python3 demo.py` where python3 runs, else this binary's
/// own (`OOMGUARD_DEMO_JOB=builtin` forces it).
fn demo_argv(dir: &Path, ckpt: &Path) -> Result<Vec<OsString>, String> {
    let builtin = crate::settings::demo_job_builtin();
    let python = !builtin
        && Command::new("python3")
            .arg("-c")
            .arg("")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
    if python {
        let script = dir.join("demo_train.py");
        fs::write(&script, SCRIPT)
            .map_err(|e| format!("cannot write '{}': {e}", script.display()))?;
        return Ok(vec![
            "python3".into(),
            "-u".into(),
            script.into_os_string(),
            ckpt.as_os_str().to_owned(),
        ]);
    }
    let exe = std::env::current_exe().map_err(|e| format!("cannot find oomguard itself: {e}"))?;
    Ok(vec![
        exe.into_os_string(),
        "demo-job".into(),
        "trainer".into(),
        ckpt.as_os_str().to_owned(),
    ])
}

/// Runs the demo; exits 0 when oomguard stopped the leak before the OOM
/// killer, as designed.
pub fn demo(args: DemoArgs) -> i32 {
    let dir = std::env::temp_dir().join(format!("oomguard-demo-{}", std::process::id()));
    if let Err(e) = fs::create_dir_all(&dir) {
        eprintln!("oomguard: cannot create '{}': {e}", dir.display());
        return 2;
    }
    let ckpt = dir.join("checkpoints");
    let argv = match demo_argv(&dir, &ckpt) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("oomguard: {e}");
            return 2;
        }
    };
    eprintln!(
        "oomguard demo: a trainer with 4 leaking DataLoader workers under a {} budget.\n\
         oomguard warns at 80% of the budget and stops the job gracefully before it runs out (at 92% at the latest), before any OOM kill.\n",
        crate::vocab::units::HumanBytes(args.budget)
    );
    let cfg = match Settings::for_demo(&args, argv) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("oomguard: {e}");
            return 2;
        }
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
        other => {
            eprintln!("\noomguard demo: unexpected end (exit {other})");
            if other == 0 { 1 } else { other }
        }
    }
}
