//! Restarting from a checkpoint: confirming that a checkpoint was written,
//! the degradation of environment variables between attempts
//! (`NUM_WORKERS=half,min=1`), `{checkpoint}` substitution, and the
//! restart budget with its growing delay.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

/// How one variable changes on each memory-motivated restart.
/// What else restarts the job when memory killed it anyway
/// (`--restart-on`), beside a `restart` action.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RestartOn {
    /// The kernel OOM killer took a process of the job.
    OomKill,
    /// The job failed with a CUDA out-of-memory error.
    CudaOom,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Degrade {
    pub name: String,
    pub step: Step,
    pub min: i64,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    Half,
    Dec,
    Set(String),
}

/// Parses `NAME=half|dec|VALUE[,min=N]`.
pub fn parse_degrade(text: &str) -> Result<Degrade, String> {
    let bad =
        || format!("'{text}' is not NAME=half|dec|VALUE[,min=N] (e.g. NUM_WORKERS=half,min=1)");
    let (name, rest) = text.split_once('=').ok_or_else(bad)?;
    let name = name.trim();
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        return Err(bad());
    }
    let mut parts = rest.split(',');
    let how = parts.next().ok_or_else(bad)?.trim();
    let mut min = 1;
    for p in parts {
        let v = p.trim().strip_prefix("min=").ok_or_else(bad)?;
        min = v.parse().map_err(|_| bad())?;
    }
    let step = match how {
        "half" => Step::Half,
        "dec" => Step::Dec,
        "" => return Err(bad()),
        v => Step::Set(v.to_string()),
    };
    Ok(Degrade {
        name: name.to_string(),
        step,
        min,
    })
}

impl Degrade {
    /// The next value, or `None` when the current one cannot be degraded
    /// (unset or not a number for half/dec).
    pub fn next(&self, current: Option<&str>) -> Option<String> {
        match &self.step {
            Step::Set(v) => Some(v.clone()),
            step => {
                let n: i64 = current?.trim().parse().ok()?;
                let next = match step {
                    Step::Half => n / 2,
                    _ => n - 1,
                };
                Some(next.max(self.min).min(n).to_string())
            }
        }
    }
}

/// Matches a file name against a glob with `*` and `?` (no path
/// separators): enough for `step-*.pt` and friends.
pub fn glob_match(pattern: &str, name: &str) -> bool {
    fn go(p: &[u8], n: &[u8]) -> bool {
        match (p.first(), n.first()) {
            (None, None) => true,
            (Some(b'*'), _) => go(&p[1..], n) || (!n.is_empty() && go(p, &n[1..])),
            (Some(b'?'), Some(_)) => go(&p[1..], &n[1..]),
            (Some(a), Some(b)) if a == b => go(&p[1..], &n[1..]),
            _ => false,
        }
    }
    go(pattern.as_bytes(), name.as_bytes())
}

/// The newest complete-looking checkpoint in `dir` (names starting with
/// `.` are temporary files by convention and never count).
pub fn newest(
    dir: &Path,
    glob: &str,
    since: Option<SystemTime>,
) -> Option<(PathBuf, SystemTime, u64)> {
    fs::read_dir(dir)
        .ok()?
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            if name.starts_with('.') || !glob_match(glob, &name) {
                return None;
            }
            let md = e.metadata().ok()?;
            let mtime = md.modified().ok()?;
            if since.is_some_and(|s| mtime < s) {
                return None;
            }
            Some((e.path(), mtime, md.len()))
        })
        .max_by_key(|(_, m, _)| *m)
}

/// Waits for a checkpoint newer than the checkpoint signal to be complete:
/// present under its final name and no longer growing.
#[derive(Debug)]
pub struct CheckpointWatch {
    dir: PathBuf,
    glob: String,
    since: SystemTime,
    seen: Option<(PathBuf, u64, Instant)>,
}

/// How long a checkpoint's size must stay the same to count as written.
const SETTLED: Duration = Duration::from_millis(500);

impl CheckpointWatch {
    pub fn new(dir: PathBuf, glob: String, since: SystemTime) -> Self {
        // mtime has coarse granularity on some file systems.
        let since = since
            .checked_sub(Duration::from_millis(10))
            .unwrap_or(since);
        Self {
            dir,
            glob,
            since,
            seen: None,
        }
    }

    /// The newest checkpoint written since the signal, settled or not (for
    /// when the writer has exited: then it is final).
    pub fn written(&self) -> Option<PathBuf> {
        newest(&self.dir, &self.glob, Some(self.since)).map(|(p, _, _)| p)
    }

    /// Returns the confirmed checkpoint once it is.
    pub fn poll(&mut self, now: Instant) -> Option<PathBuf> {
        let (path, _, size) = newest(&self.dir, &self.glob, Some(self.since))?;
        match &self.seen {
            Some((p, s, at)) if *p == path && *s == size => {
                (now.duration_since(*at) >= SETTLED).then(|| path.clone())
            }
            _ => {
                self.seen = Some((path, size, now));
                None
            }
        }
    }
}

/// Replaces `{checkpoint}` with the path, quoted for `sh -c`.
pub fn substitute(cmd: &str, checkpoint: Option<&Path>) -> String {
    let quoted = checkpoint.map_or_else(
        || "''".to_string(),
        |p| format!("'{}'", p.to_string_lossy().replace('\'', r"'\''")),
    );
    cmd.replace("{checkpoint}", &quoted)
}

/// The restart budget: `max` restarts, a delay that doubles from `base`
/// (capped at `cap`), and a count that resets after an attempt that ran
/// cleanly for `reset_after`.
#[derive(Debug, Clone)]
pub struct Budget {
    pub max: u32,
    pub base: Duration,
    pub cap: Duration,
    pub reset_after: Duration,
    used: u32,
}

impl Budget {
    pub fn new(max: u32, base: Duration, cap: Duration, reset_after: Duration) -> Self {
        Self {
            max,
            base,
            cap,
            reset_after,
            used: 0,
        }
    }

    /// Whether an attempt that has run for `ran` may still be followed by
    /// another (what [`Budget::next`] would answer, without using it).
    pub fn allows(&self, ran: Duration) -> bool {
        ran >= self.reset_after || self.used < self.max
    }

    /// Called when an attempt ended for a memory reason after running for
    /// `ran`. Returns the delay before the next attempt, or `None` when the
    /// restarts are exhausted.
    pub fn next(&mut self, ran: Duration) -> Option<Duration> {
        if ran >= self.reset_after {
            self.used = 0;
        }
        if self.used >= self.max {
            return None;
        }
        let delay = self
            .base
            .saturating_mul(1 << self.used.min(16))
            .min(self.cap);
        self.used += 1;
        Some(delay)
    }

    pub fn used(&self) -> u32 {
        self.used
    }
}

/// How an attempt ended, as far as the restart decision goes.
#[derive(Debug, Clone, Default)]
pub struct AttemptEnd {
    /// The policy's critical action ended it (`stop`, `restart`, `kill`).
    pub policy_end: Option<crate::engine::policy::Action>,
    /// The rule that began the stop, if one did.
    pub stop_reason: Option<String>,
    /// The kernel OOM killer took a process of the job.
    pub kernel_killed: bool,
    /// A worker or rank was SIGKILLed while memory was at the warn level.
    pub memory_death: bool,
    /// The job printed a CUDA OOM (`Some(true)`: with a fragmented cache).
    pub cuda_oom: Option<bool>,
    /// The main process exited with 0.
    pub succeeded: bool,
}

/// What the restart settings allow.
#[derive(Debug, Clone, Default)]
pub struct RestartRules {
    /// A kernel OOM kill (or a memory death) restarts: `--restart-on
    /// oom-kill`, or a policy that restarts anyway.
    pub on_memory: bool,
    /// `--restart-on cuda-oom`.
    pub on_cuda_oom: bool,
}

/// Why the attempt should be followed by another, or `None`. The order is
/// the order of certainty: oomguard's own action, then the kernel's kill,
/// then what the job printed.
pub fn restart_reason(end: &AttemptEnd, rules: &RestartRules) -> Option<String> {
    use crate::engine::policy::Action;
    let cuda = end.cuda_oom.is_some() && rules.on_cuda_oom && !end.succeeded;
    if end.policy_end == Some(Action::Restart) {
        return Some(end.stop_reason.clone().unwrap_or_else(|| "restart".into()));
    }
    if end.kernel_killed && rules.on_memory {
        return Some("kernel OOM kill".into());
    }
    if end.memory_death && rules.on_memory {
        return Some("a worker or rank was SIGKILLed with memory at the warn level".into());
    }
    cuda.then(|| "CUDA out of memory".into())
}

/// One variable changed for the next attempt: name, old value, new value.
pub type EnvChange = (String, Option<String>, String);

/// The environment changes for the next attempt: each `--degrade` applied
/// to the variable's current value (`current`: the last attempt's value,
/// else oomguard's own environment), and `expandable_segments:True` added to
/// `PYTORCH_CUDA_ALLOC_CONF` after a CUDA OOM with a fragmented cache (the
/// cure PyTorch itself suggests). Also returns the variables that could not
/// be degraded, with why.
pub fn degrade_env(
    degrade: &[Degrade],
    current: impl Fn(&str) -> Option<String>,
    cuda_fragmented: bool,
) -> (Vec<EnvChange>, Vec<String>) {
    let mut changes = Vec::new();
    let mut problems = Vec::new();
    for d in degrade {
        let now = current(&d.name);
        match d.next(now.as_deref()) {
            Some(new) => changes.push((d.name.clone(), now, new)),
            None => problems.push(format!(
                "cannot degrade {}: it is {} (half and dec need a number)",
                d.name,
                now.map_or("not set".to_string(), |c| format!("'{c}'"))
            )),
        }
    }
    const ALLOC: &str = "PYTORCH_CUDA_ALLOC_CONF";
    let conf = current(ALLOC);
    let has = conf
        .as_deref()
        .is_some_and(|c| c.contains("expandable_segments"));
    if cuda_fragmented && !has {
        let new = match conf.as_deref() {
            Some(c) if !c.is_empty() => format!("{c},expandable_segments:True"),
            _ => "expandable_segments:True".to_string(),
        };
        changes.push((ALLOC.to_string(), conf, new));
    }
    (changes, problems)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn degrade_parsing_and_floors() {
        let d = parse_degrade("NUM_WORKERS=half,min=1").unwrap();
        assert_eq!(d.next(Some("4")).as_deref(), Some("2"));
        assert_eq!(d.next(Some("2")).as_deref(), Some("1"));
        assert_eq!(d.next(Some("1")).as_deref(), Some("1"));
        assert_eq!(d.next(None), None);
        assert_eq!(d.next(Some("x")), None);
        let d = parse_degrade("PREFETCH_FACTOR=dec,min=0").unwrap();
        assert_eq!(d.next(Some("2")).as_deref(), Some("1"));
        assert_eq!(d.next(Some("0")).as_deref(), Some("0"));
        let d = parse_degrade("BATCH_SIZE=half").unwrap();
        assert_eq!((d.min, d.next(Some("33")).as_deref()), (1, Some("16")));
        let d = parse_degrade("PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True").unwrap();
        assert_eq!(d.next(None).as_deref(), Some("expandable_segments:True"));
        // A floor above the current value never raises it.
        let d = parse_degrade("N=half,min=8").unwrap();
        assert_eq!(d.next(Some("4")).as_deref(), Some("4"));
        for bad in [
            "NUM_WORKERS",
            "=half",
            "A B=half",
            "N=half,max=3",
            "N=",
            "N=half,min=x",
        ] {
            assert!(parse_degrade(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn globs() {
        assert!(glob_match("*", "step-10.ckpt"));
        assert!(glob_match("step-*.ckpt", "step-10.ckpt"));
        assert!(!glob_match("step-*.ckpt", "step-10.ckpt.tmp"));
        assert!(glob_match("ep??.pt", "ep01.pt"));
        assert!(!glob_match("ep??.pt", "ep1.pt"));
    }

    #[test]
    fn substitution_is_quoted() {
        assert_eq!(
            substitute(
                "python t.py --resume {checkpoint}",
                Some(Path::new("/c/it's.pt"))
            ),
            r"python t.py --resume '/c/it'\''s.pt'"
        );
        assert_eq!(substitute("x {checkpoint}", None), "x ''");
    }

    #[test]
    fn budget_backoff_and_reset() {
        let s = Duration::from_secs;
        let mut b = Budget::new(3, s(2), s(5), s(600));
        assert_eq!(b.next(s(10)), Some(s(2)));
        assert_eq!(b.next(s(10)), Some(s(4)));
        assert_eq!(b.next(s(10)), Some(s(5)));
        assert!(!b.allows(s(10)) && b.allows(s(700)));
        assert_eq!(b.next(s(10)), None);
        // A long clean run resets the count.
        assert_eq!(b.next(s(700)), Some(s(2)));
        assert_eq!(b.used(), 1);
    }

    #[test]
    fn checkpoint_confirmation_waits_for_a_settled_file() {
        let dir = tempfile::tempdir().unwrap();
        let since = SystemTime::now();
        let mut w = CheckpointWatch::new(dir.path().into(), "*.ckpt".into(), since);
        let t0 = Instant::now();
        assert_eq!(w.poll(t0), None);
        fs::write(dir.path().join(".tmp-1"), "partial").unwrap();
        assert_eq!(w.poll(t0), None, "temporary files do not count");
        let ck = dir.path().join("step-5.ckpt");
        fs::write(&ck, "5").unwrap();
        assert_eq!(w.poll(t0), None, "just appeared");
        assert_eq!(w.poll(t0 + Duration::from_millis(100)), None);
        assert_eq!(w.poll(t0 + Duration::from_millis(600)), Some(ck));
    }

    use crate::engine::policy::Action;

    fn rules(on_memory: bool, on_cuda_oom: bool) -> RestartRules {
        RestartRules {
            on_memory,
            on_cuda_oom,
        }
    }

    #[test]
    fn restart_reasons_in_order_of_certainty() {
        let ours = AttemptEnd {
            policy_end: Some(Action::Restart),
            stop_reason: Some("critical-headroom".into()),
            kernel_killed: true,
            ..Default::default()
        };
        assert_eq!(
            restart_reason(&ours, &rules(false, false)).as_deref(),
            Some("critical-headroom")
        );
        let stopped = AttemptEnd {
            policy_end: Some(Action::Stop),
            ..Default::default()
        };
        assert_eq!(restart_reason(&stopped, &rules(true, true)), None);
        let kernel = AttemptEnd {
            kernel_killed: true,
            memory_death: true,
            ..Default::default()
        };
        assert_eq!(
            restart_reason(&kernel, &rules(true, false)).as_deref(),
            Some("kernel OOM kill")
        );
        assert_eq!(restart_reason(&kernel, &rules(false, true)), None);
        let death = AttemptEnd {
            memory_death: true,
            ..Default::default()
        };
        assert!(
            restart_reason(&death, &rules(true, false)).is_some_and(|r| r.contains("SIGKILLed"))
        );
        let cuda = AttemptEnd {
            cuda_oom: Some(false),
            ..Default::default()
        };
        assert_eq!(
            restart_reason(&cuda, &rules(false, true)).as_deref(),
            Some("CUDA out of memory")
        );
        assert_eq!(restart_reason(&cuda, &rules(true, false)), None);
        let cuda_but_fine = AttemptEnd {
            cuda_oom: Some(false),
            succeeded: true,
            ..Default::default()
        };
        assert_eq!(restart_reason(&cuda_but_fine, &rules(false, true)), None);
        assert_eq!(
            restart_reason(&AttemptEnd::default(), &rules(true, true)),
            None
        );
    }

    #[test]
    fn degrading_halves_workers_and_fixes_a_fragmented_cache() {
        let d = vec![parse_degrade("NUM_WORKERS=half,min=1").unwrap()];
        let env = |name: &str| match name {
            "NUM_WORKERS" => Some("8".to_string()),
            "PYTORCH_CUDA_ALLOC_CONF" => Some("max_split_size_mb:128".to_string()),
            _ => None,
        };
        let (changes, problems) = degrade_env(&d, env, true);
        assert!(problems.is_empty());
        assert_eq!(
            changes,
            vec![
                ("NUM_WORKERS".into(), Some("8".into()), "4".into()),
                (
                    "PYTORCH_CUDA_ALLOC_CONF".into(),
                    Some("max_split_size_mb:128".into()),
                    "max_split_size_mb:128,expandable_segments:True".into()
                ),
            ]
        );
        let (changes, _) = degrade_env(&d, env, false);
        assert_eq!(changes.len(), 1, "no fragmentation, no allocator change");
        let set = |name: &str| {
            (name == "PYTORCH_CUDA_ALLOC_CONF").then(|| "expandable_segments:True".to_string())
        };
        let (changes, problems) = degrade_env(&d, set, true);
        assert!(changes.is_empty(), "already set: {changes:?}");
        assert_eq!(problems.len(), 1, "NUM_WORKERS unset cannot be halved");
        assert!(problems[0].contains("not set"));
    }
}
