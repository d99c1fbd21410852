//! The one set of settings for `run`, `attach` and `demo`, and the one place
//! where a value is chosen: a flag beats the settings file, the file beats
//! the subcommand's preset, the preset beats the default (written in the
//! table in `options`). Each source is a [`Layer`] of optional values, so
//! "was this flag given?" is never guessed from a value that clap filled in.
//!
//! The rest of the program sees only [`Settings`]: validated, complete, and
//! the same shape whichever subcommand built it.

pub mod cli;
pub mod options;
pub mod values;

pub mod file;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use file::{ConfigError, FileSettings};

use crate::engine::policy::{Action, Policy};
use crate::settings::cli::{
    AttachArgs, CgroupMode, Cli, DemoArgs, PolicyArgs, PolicyName, RunArgs, RunOnly, TuiArgs,
};
pub use crate::settings::options::{Layer, Values};
use crate::vocab::units::SizeOrPercent;

/// The policy and how its actions are carried out.
#[derive(Debug, Clone, PartialEq)]
pub struct PolicySettings {
    pub policy: Policy,
    /// The settings file that was read, if any.
    pub file: Option<PathBuf>,
}

/// Restarting from a checkpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct RestartSettings {
    pub resume_cmd: Option<String>,
    pub degrade: Vec<crate::job::restart::Degrade>,
    pub restart_on: Vec<crate::job::restart::RestartOn>,
}

/// Validated settings of one supervised job, whichever subcommand asked.
/// The settings of the table in `options` (`cfg.interval`,
/// `cfg.grace`, …) are reached through `values`.
#[derive(Debug, Clone)]
pub struct Settings {
    pub argv: Vec<OsString>,
    pub log: Option<PathBuf>,
    /// Every setting a flag and the file can both set.
    pub values: Values,
    pub quiet: bool,
    pub notify: bool,
    /// Running in CI ([`in_ci`]): no dashboard unless `--tui`, no desktop
    /// notifications.
    pub in_ci: bool,
    pub policy: PolicySettings,
    pub proc_root: PathBuf,
    /// The directory oomguard was started in, read once: a run's resume and
    /// end records live there (without `--checkpoint-dir`); `None` when it
    /// cannot be read.
    pub run_dir: Option<PathBuf>,
    pub tui: TuiArgs,
    pub restart: RestartSettings,
    /// What only `run`'s command line says (`--metrics-addr`,
    /// `--output-log`, …); as given, or its default for `attach` and `demo`.
    pub run: RunOnly,
    /// `attach`: watch this running process instead of launching one.
    pub attach: Option<u32>,
    /// `attach --allow-kill`.
    pub allow_kill: bool,
    /// `attach`: how the job was named, and its cgroup when named by one.
    pub attach_spec: Option<crate::job::attach::AttachSpec>,
    /// `oomguard doctor -- CMD`: end the job once it shows progress, or
    /// after this wait (the finding comes back from `runtime::judge`).
    pub doctor: Option<std::time::Duration>,
    /// `--budget` in bytes (a share of RAM already taken of `MemTotal`).
    pub budget_bytes: Option<u64>,
}

impl Settings {
    /// `None`: no GPU watching; `Some(None)`: the system's NVML.
    pub fn nvml(&self) -> Option<Option<PathBuf>> {
        (!self.run.no_gpu).then(|| self.run.nvml_lib.clone())
    }

    /// The control channel and the Python companion: for a job oomguard
    /// launches, unless `--no-companion`.
    pub fn companion(&self) -> bool {
        !self.run.no_companion && self.attach.is_none()
    }
}

impl std::ops::Deref for Settings {
    type Target = Values;

    fn deref(&self) -> &Values {
        &self.values
    }
}

impl std::ops::DerefMut for Settings {
    fn deref_mut(&mut self) -> &mut Values {
        &mut self.values
    }
}

/// What differs between the subcommands: the preset layer under the file,
/// and what a subcommand never does.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Preset {
    Run,
    /// A job oomguard did not launch: no cgroup of its own, no restarts.
    Attach {
        pid: u32,
        allow_kill: bool,
    },
    /// The embedded demo: fast cadences so a newcomer sees it all in
    /// seconds, no desktop notifications, and no `./oomguard.toml`.
    Demo {
        budget: u64,
    },
}

impl Preset {
    fn layer(self) -> Layer {
        match self {
            Preset::Run | Preset::Attach { .. } => Layer::default(),
            Preset::Demo { budget } => Layer {
                interval: Some(Duration::from_millis(500)),
                pss_interval: Some(Duration::from_secs(1)),
                procs_interval: Some(Duration::from_secs(5)),
                budget: Some(SizeOrPercent::Bytes(budget)),
                ..Layer::default()
            },
        }
    }

    /// Desktop notifications, unless a flag or the file says otherwise.
    fn notify(self) -> bool {
        !matches!(self, Preset::Demo { .. })
    }

    fn reads_local_file(self) -> bool {
        !matches!(self, Preset::Demo { .. })
    }
}

/// What only the command line can say (no file key, no default to merge).
#[derive(Debug, Clone, Default)]
pub struct CommandLine {
    pub argv: Vec<OsString>,
    pub log: Option<PathBuf>,
    pub quiet: bool,
    /// `--no-notify`.
    pub no_notify: bool,
    pub tui: TuiArgs,
    pub config: Option<PathBuf>,
    pub run: RunOnly,
    pub resume_cmd: Option<String>,
    pub degrade: Vec<crate::job::restart::Degrade>,
    pub restart_on: Vec<crate::job::restart::RestartOn>,
}

impl Settings {
    /// `oomguard run`.
    pub fn for_run(a: RunArgs) -> Result<Self, ConfigError> {
        let flags = run_layer(&a);
        let cmd = CommandLine {
            argv: a.command,
            log: a.log,
            quiet: a.quiet,
            no_notify: a.policy.no_notify,
            tui: a.tui,
            config: a.policy.config,
            run: a.only,
            resume_cmd: a.restart.resume_cmd,
            degrade: a.restart.degrade,
            restart_on: a.restart.restart_on,
        };
        Self::resolve(cmd, &flags, Preset::Run)
    }

    /// `oomguard attach`. The job is found here, before anything is
    /// watched: a target that names nothing (or several things) is a usage
    /// error.
    pub fn for_attach(a: AttachArgs) -> Result<Self, ConfigError> {
        // clap requires one of them.
        let target = a.job.target().ok_or_else(|| {
            ConfigError::Flag("attach: name a pid, --cgroup, --slurm-job or --match".into())
        })?;
        let mut spec = crate::job::attach::resolve(&target, Path::new("/proc"))
            .map_err(|e| ConfigError::Flag(e.to_string()))?;
        spec.watch_for = a.watch_for;
        let mut flags = Layer::default();
        a.sampling.fill(&mut flags);
        a.policy.values.fill(&mut flags);
        let cmd = CommandLine {
            argv: vec![OsString::from(&spec.label)],
            log: a.log,
            quiet: a.quiet,
            no_notify: a.policy.no_notify,
            tui: a.tui,
            config: a.policy.config,
            ..CommandLine::default()
        };
        let preset = Preset::Attach {
            pid: spec.pid,
            allow_kill: a.allow_kill,
        };
        let mut s = Self::resolve(cmd, &flags, preset)?;
        s.attach_spec = Some(spec);
        Ok(s)
    }

    /// `oomguard demo`: `argv` is the demo job.
    pub fn for_demo(a: &DemoArgs, argv: Vec<OsString>) -> Result<Self, ConfigError> {
        let cmd = CommandLine {
            argv,
            log: a.log.clone(),
            tui: a.tui,
            // The demo job is no Python trainer and needs no GPU.
            run: RunOnly {
                no_gpu: true,
                no_companion: true,
                ..RunOnly::default()
            },
            ..CommandLine::default()
        };
        Self::resolve(cmd, &Layer::default(), Preset::Demo { budget: a.budget })
    }

    /// Reads the settings file (unless the preset forbids it) and decides
    /// every value: flag > file > preset > default.
    pub fn resolve(cmd: CommandLine, flags: &Layer, preset: Preset) -> Result<Self, ConfigError> {
        let file = if preset.reads_local_file() || cmd.config.is_some() {
            file::read(cmd.config.as_deref(), preset.reads_local_file())?
        } else {
            None
        };
        Self::merge(cmd, flags, file.as_ref(), preset)
    }

    /// The merge itself, on an already read file (testable without files).
    pub fn merge(
        cmd: CommandLine,
        flags: &Layer,
        file: Option<&FileSettings>,
        preset: Preset,
    ) -> Result<Self, ConfigError> {
        let empty = Layer::default();
        let file_layer = file.map_or(&empty, |f| &f.layer);
        let preset_layer = preset.layer();
        let mut values =
            Layer::resolve(&[flags, file_layer, &preset_layer]).map_err(ConfigError::Flag)?;
        let (warn, crit) = (values.warn_at, values.critical_at);
        if crit <= warn {
            return Err(ConfigError::Flag(format!(
                "the critical level ({crit}%) must be above the warning level ({warn}%): both are usage of the nearest ceiling"
            )));
        }
        let on_critical = Action::from(values.on_critical);
        let mut policy = match values.policy {
            PolicyName::None => Policy::none(),
            PolicyName::Default => Policy::default_with(warn, crit, on_critical),
        };
        if let Some(f) = file.filter(|f| !f.rules.is_empty()) {
            if !f.include_defaults {
                policy.rules.clear();
            }
            policy.rules.extend(f.rules.iter().cloned());
        }
        policy.max_pause_seconds = values.max_pause.as_secs_f64();
        policy.after_pause = match on_critical {
            Action::Pause => Action::Stop,
            other => other,
        };
        let mut names = std::collections::HashSet::new();
        if let Some(dup) = policy.rules.iter().find(|r| !names.insert(r.name.as_str())) {
            return Err(ConfigError::Flag(format!(
                "two rules are named '{}': rule names must be unique",
                dup.name
            )));
        }
        if let (false, Some(lib)) = (cmd.run.no_gpu, &cmd.run.nvml_lib)
            && !lib.exists()
        {
            return Err(ConfigError::Flag(format!(
                "--nvml-lib '{}' does not exist (expected the path of libnvidia-ml.so.1)",
                lib.display()
            )));
        }
        let log = match &cmd.log {
            Some(pattern) => {
                let env = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
                let host =
                    crate::sinks::metrics::hostname().unwrap_or_else(|| "localhost".to_string());
                let log = expand_log_pattern(pattern, &env, &host, std::process::id())?;
                check_log_path(&log)?;
                Some(log)
            }
            None => None,
        };
        let in_ci = in_ci();
        let (attach, allow_kill) = match preset {
            Preset::Attach { pid, allow_kill } => (Some(pid), allow_kill),
            _ => (None, false),
        };
        if attach.is_some() {
            // A job oomguard did not launch cannot be put in a cgroup of
            // its own, nor restarted.
            values.cgroup = CgroupMode::Off;
            values.max_restarts = 0;
        }
        let notify = !cmd.no_notify && file.and_then(|f| f.notify).unwrap_or(preset.notify());
        let budget_bytes = budget_in_bytes(values.budget)?;
        Ok(Self {
            budget_bytes,
            argv: cmd.argv,
            log,
            values,
            quiet: cmd.quiet,
            notify: !in_ci && notify,
            in_ci,
            policy: PolicySettings {
                policy,
                file: file.map(|f| f.path.clone()),
            },
            proc_root: PathBuf::from("/proc"),
            run_dir: std::env::current_dir().ok(),
            tui: cmd.tui,
            restart: RestartSettings {
                resume_cmd: cmd.resume_cmd,
                degrade: cmd.degrade,
                restart_on: cmd.restart_on,
            },
            run: cmd.run,
            attach,
            allow_kill,
            attach_spec: None,
            doctor: None,
        })
    }
}

/// `--budget` in bytes: a share of RAM (`75%`) is taken of the machine's
/// `MemTotal` once, here.
fn budget_in_bytes(budget: Option<SizeOrPercent>) -> Result<Option<u64>, ConfigError> {
    let percent = match budget {
        None => return Ok(None),
        Some(SizeOrPercent::Bytes(n)) => return Ok(Some(n)),
        Some(SizeOrPercent::Percent(p)) => p,
    };
    let path = Path::new("/proc/meminfo");
    let total = std::fs::read_to_string(path)
        .ok()
        .and_then(|text| crate::engine::probe::system::parse_meminfo(&text))
        .map(|(total, ..)| total)
        .filter(|t| *t > 0)
        .ok_or_else(|| ConfigError::Read {
            path: path.into(),
            reason: format!(
                "--budget {percent}% needs the machine's MemTotal; give a size instead"
            ),
        })?;
    Ok(Some((total as f64 * percent / 100.0) as u64))
}

/// Whether oomguard runs in CI: `CI` set to anything but empty or
/// `false` (GitHub Actions, GitLab and most others set `CI=true`). The one
/// place it is read.
pub fn in_ci() -> bool {
    std::env::var_os("CI").is_some_and(|v| !v.is_empty() && v != "false")
}

/// `OOMGUARD_DEMO_JOB=builtin`: `oomguard demo` runs this binary's own
/// job even where python3 runs. A test switch, read from the environment
/// only and so never in `--help`; the one place it is read.
pub fn demo_job_builtin() -> bool {
    std::env::var("OOMGUARD_DEMO_JOB").is_ok_and(|v| v == "builtin")
}

/// The policy `oomguard replay` applies: `None` when no policy flag and no
/// `--config` was given (the replay then uses the recorded policy). The
/// working directory's `oomguard.toml` is not read: the recorded policy
/// already reflects it.
pub fn replay_policy(p: &PolicyArgs) -> Result<Option<(Policy, String)>, ConfigError> {
    let flags = policy_layer(p);
    // Only what shapes the rules counts: `--grace` or `--on-warn` change
    // how a stop is carried out, which a replay does not do.
    let given = flags.policy.is_some()
        || flags.warn_at.is_some()
        || flags.critical_at.is_some()
        || flags.on_critical.is_some()
        || flags.max_pause.is_some()
        || p.config.is_some();
    if !given {
        return Ok(None);
    }
    let file = match &p.config {
        Some(path) => file::read(Some(path), false)?,
        None => None,
    };
    let s = Settings::merge(CommandLine::default(), &flags, file.as_ref(), Preset::Run)?;
    let source = match &p.config {
        Some(path) => format!("{} with the flags given", path.display()),
        None => "the flags given".to_string(),
    };
    Ok(Some((s.policy.policy, source)))
}

/// What `run`'s flags say about the values the file can also set.
fn run_layer(a: &RunArgs) -> Layer {
    let mut layer = policy_layer(&a.policy);
    a.sampling.fill(&mut layer);
    a.launch.fill(&mut layer);
    a.restart.values.fill(&mut layer);
    layer
}

/// The policy flags shared by `run`, `attach` and `replay`.
fn policy_layer(p: &PolicyArgs) -> Layer {
    let mut layer = Layer::default();
    p.values.fill(&mut layer);
    layer
}

/// `--log` names one file per node and rank of a job that spans nodes
/// (`srun oomguard run --log run-%N.ndjson …` on a shared file system):
/// `%N` the node (`SLURM_NODEID`, else `NODE_RANK`, else the host name),
/// `%r` the rank (`SLURM_PROCID`, else `RANK`, else 0), `%h` the host
/// name, `%j` the SLURM job (`SLURM_JOB_ID`, else `local`), `%p`
/// oomguard's pid, `%%` a `%`. Anything else after a `%` is refused.
fn expand_log_pattern(
    pattern: &Path,
    env: &dyn Fn(&str) -> Option<String>,
    host: &str,
    pid: u32,
) -> Result<PathBuf, ConfigError> {
    use std::os::unix::ffi::{OsStrExt, OsStringExt};
    let bytes = pattern.as_os_str().as_bytes();
    if !bytes.contains(&b'%') {
        return Ok(pattern.to_path_buf());
    }
    let first = |names: &[&str]| names.iter().find_map(|n| env(n));
    let mut out = Vec::with_capacity(bytes.len() + 16);
    let mut it = bytes.iter();
    while let Some(&b) = it.next() {
        if b != b'%' {
            out.push(b);
            continue;
        }
        let value = match it.next() {
            Some(b'N') => first(&["SLURM_NODEID", "NODE_RANK"]).unwrap_or_else(|| host.to_string()),
            Some(b'r') => first(&["SLURM_PROCID", "RANK"]).unwrap_or_else(|| "0".to_string()),
            Some(b'h') => host.to_string(),
            Some(b'j') => first(&["SLURM_JOB_ID"]).unwrap_or_else(|| "local".to_string()),
            Some(b'p') => pid.to_string(),
            Some(b'%') => "%".to_string(),
            other => {
                let what = other.map_or("a % at the end".to_string(), |c| {
                    format!("'%{}'", char::from(*c))
                });
                return Err(ConfigError::Flag(format!(
                    "--log '{}': {what} is not a pattern (expected %N node, %r rank, %h host, \
                     %j SLURM job, %p pid, %% a percent sign)",
                    pattern.display()
                )));
            }
        };
        // A value never adds a directory level.
        out.extend(value.trim().replace('/', "_").bytes());
    }
    Ok(PathBuf::from(std::ffi::OsString::from_vec(out)))
}

/// A log on a kernel pseudo file system (`/proc/version`, a sysfs or cgroup
/// file) opens but refuses every write: refuse it before the job starts
/// rather than losing the log once it runs.
fn check_log_path(path: &Path) -> Result<(), ConfigError> {
    let probe = if path.exists() {
        path.to_path_buf()
    } else {
        match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        }
    };
    let Ok(fs) = rustix::fs::statfs(&probe) else {
        return Ok(()); // a missing directory is reported when the log is created
    };
    let pseudo = [
        (libc::PROC_SUPER_MAGIC, "proc"),
        (libc::SYSFS_MAGIC, "sysfs"),
        (libc::CGROUP_SUPER_MAGIC, "cgroup"),
        (libc::CGROUP2_SUPER_MAGIC, "cgroup2"),
        (libc::DEBUGFS_MAGIC, "debugfs"),
    ];
    match pseudo.iter().find(|(m, _)| fs.f_type == *m) {
        Some((_, name)) => Err(ConfigError::Flag(format!(
            "--log '{}' is on the {name} pseudo file system, which does not store what is written (expected a regular file, e.g. run.ndjson)",
            path.display()
        ))),
        None => Ok(()),
    }
}

/// The command line with each default from `options`'s table shown in
/// its help (`[default: …]`), so help and code cannot disagree.
pub fn command() -> clap::Command {
    let mut cmd = <Cli as clap::CommandFactory>::command();
    for sub in ["run", "attach", "demo"] {
        // `mut_args` keeps the arguments' order (`mut_arg` would move each
        // to the end), which orders the headings of `--help`.
        cmd = cmd.mut_subcommand(sub, |s| {
            s.mut_args(|a| {
                let default = crate::settings::options::DEFAULTS
                    .iter()
                    .find(|(id, _)| a.get_id() == *id);
                match default {
                    Some((_, shown)) => {
                        let help = a.get_help().map(|h| h.to_string()).unwrap_or_default();
                        a.help(format!("{help} [default: {shown}]"))
                    }
                    None => a,
                }
            })
        });
    }
    cmd
}

/// Parses the process's arguments (exits 2 with clap's message on error,
/// an unknown subcommand with `cli::similar_subcommands`' suggestion).
pub fn parse_cli() -> Cli {
    let cmd = command();
    let matches = match cmd.clone().try_get_matches() {
        Ok(m) => m,
        Err(e) => crate::settings::cli::with_better_suggestions(e, &cmd).exit(),
    };
    match <Cli as clap::FromArgMatches>::from_arg_matches(&matches) {
        Ok(cli) => cli,
        Err(e) => e.exit(),
    }
}

#[cfg(test)]
mod tests;
