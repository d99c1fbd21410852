//! `oomguard demo`: an embedded workload that needs nothing installed. A
//! trainer-like parent holds "weights" and 4 workers leak like a DataLoader
//! with an unbounded per-worker cache, under a 1 GiB budget with the
//! default policy. A newcomer sees the tree grow, the warning, the graceful
//! stop after the "checkpoint", and the summary. With python3 the job is
//! `demo.py` (real forked workers sharing the weights copy-on-write);
//! without it, the same job built into this binary (`demo_job`).

use std::ffi::OsString;
use std::fs;
use std::path::{Path, PathBuf};
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

/// A new directory of this user's, mode 0700, in `base`, named by the
/// first of `names` that is free. `mkdir` creates it or fails: a name that
/// exists (a directory or a symlink another user planted in a shared temp
/// directory) is never followed or written through, only passed over.
fn private_dir(base: &Path, names: impl Iterator<Item = String>) -> std::io::Result<PathBuf> {
    use std::os::unix::fs::DirBuilderExt as _;
    let mut taken = None;
    for name in names {
        let dir = base.join(name);
        match fs::DirBuilder::new().mode(0o700).create(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => taken = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(taken.unwrap_or_else(|| std::io::Error::other("no name to try")))
}

/// Names no other user can guess ahead: the pid and the clock's
/// nanoseconds, new for each try.
fn demo_names() -> impl Iterator<Item = String> {
    (0..64).map(|_| {
        let nanos = crate::vocab::clock::nonce();
        format!("oomguard-demo-{}-{nanos:08x}", std::process::id())
    })
}

/// Runs the demo; exits 0 when oomguard stopped the leak before the OOM
/// killer, as designed.
pub fn demo(args: DemoArgs) -> i32 {
    let base = std::env::temp_dir();
    let dir = match private_dir(&base, demo_names()) {
        Ok(d) => d,
        Err(e) => {
            eprintln!(
                "oomguard: cannot create a directory for the demo in '{}': {e}",
                base.display()
            );
            return 2;
        }
    };
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};

    #[test]
    fn a_planted_directory_or_symlink_is_passed_over_and_never_written_through() {
        let t = tempfile::tempdir().unwrap();
        let elsewhere = t.path().join("elsewhere");
        fs::create_dir(&elsewhere).unwrap();
        std::os::unix::fs::symlink(&elsewhere, t.path().join("a")).unwrap();
        fs::create_dir(t.path().join("b")).unwrap();
        let dir = private_dir(t.path(), ["a", "b", "c"].map(String::from).into_iter()).unwrap();
        assert_eq!(dir, t.path().join("c"));
        let meta = fs::symlink_metadata(&dir).unwrap();
        assert!(meta.is_dir());
        let mode = meta.permissions().mode();
        assert_eq!(mode & 0o077, 0, "mode {mode:o}");
        assert_eq!(meta.uid(), rustix::process::geteuid().as_raw());
        assert_eq!(fs::read_dir(&elsewhere).unwrap().count(), 0);
        // Every name taken: an error, and nothing created.
        let e = private_dir(t.path(), ["a", "b"].map(String::from).into_iter()).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::AlreadyExists);
        assert_eq!(fs::read_dir(t.path()).unwrap().count(), 4);
    }

    #[test]
    fn the_demos_names_differ_from_try_to_try() {
        let names: Vec<String> = demo_names().take(3).collect();
        assert!(names.iter().all(|n| n.starts_with("oomguard-demo-")));
        assert!(names[0] != names[1] || names[1] != names[2], "{names:?}");
    }
}
