//! Command-line types (clap derive). Only what the user typed lives here.
//! The settings that the settings file can also set are declared once, in
//! `options`, and flattened in here: each is an `Option` with no clap
//! default, so `settings::Settings` can tell "not given" from "given".

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};

pub use crate::settings::options::{
    CgroupMode, CriticalAction, LaunchFlags, PolicyFlags, PolicyName, RestartFlags, SamplingFlags,
    heading,
};

/// Keep ML training jobs from being killed by the kernel OOM killer.
#[derive(Debug, Parser)]
#[command(
    name = "oomguard",
    version,
    about,
    propagate_version = true,
    after_help = crate::vocab::help::top_after_help()
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Launch a command and supervise its whole process tree.
    #[command(after_help = crate::vocab::help::run_after_help())]
    Run(Box<RunArgs>),
    /// Watch a leaking demo job get stopped before the OOM killer (a Python
    /// job where python3 is installed, a built-in one otherwise).
    Demo(DemoArgs),
    /// Explain kernel OOM kills from a saved log or the live kernel log.
    Forensics(ForensicsArgs),
    /// Turn an NDJSON run log into a post-mortem report with advice.
    Report(ReportArgs),
    /// Watch (and guard) a job that was started without oomguard.
    Attach(Box<AttachArgs>),
    /// Run a recorded log's samples through a policy: what it would have
    /// done, and when, beside what was done.
    Replay(ReplayArgs),
    /// What oomguard can do here, what it cannot, why, and the remedy for
    /// each gap (with `-- CMD`: also whether a stop would lose that
    /// command's work).
    Doctor(DoctorArgs),
    /// Ask a running job (started by `oomguard run`) to save a checkpoint
    /// now; training goes on. Prints the companion's `done` record.
    Checkpoint(CheckpointArgs),
    /// How the last run of this job ended (one line per oomguard of it),
    /// and with `--requeue` whether a batch script should requeue it.
    Ended(EndedArgs),
    /// The demo's job without python3 (started by `oomguard demo`).
    #[command(hide = true)]
    DemoJob {
        /// `trainer` or `worker`.
        role: String,
        /// Where the trainer writes its checkpoint.
        checkpoints: Option<PathBuf>,
    },
    /// The output keeper (started by `oomguard run`, see `keeper`): holds
    /// the job's output channels and passes them on if oomguard dies.
    #[command(hide = true, name = crate::job::keeper::ARG)]
    Keep {
        /// READ_FD:WRITE_FD, one per channel.
        pairs: Vec<std::ffi::OsString>,
    },
    /// Print shell completions.
    Completions {
        /// bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff): oomguard(1), the whole reference.
    Man {
        /// Print this subcommand's page alone (oomguard-run(1), …).
        command: Option<String>,
        /// Write oomguard.1 and one page per subcommand into DIR instead,
        /// and print their paths.
        #[arg(long, value_name = "DIR", conflicts_with = "command")]
        out: Option<PathBuf>,
    },
}

/// A running job, named one of four ways (`attach`, `checkpoint`).
#[derive(Debug, Args)]
#[command(group(
    clap::ArgGroup::new("target")
        .required(true)
        .args(["pid", "cgroup", "slurm_job", "match_cmdline"])
))]
pub struct JobTarget {
    /// The job's process, with everything below it.
    pub pid: Option<u32>,

    /// Every process of this memory cgroup (a directory under a cgroup
    /// mount, or a path inside the hierarchy such as
    /// /slurm/uid_1000/job_42).
    #[arg(long, value_name = "PATH")]
    pub cgroup: Option<String>,

    /// A SLURM job: its cgroup, as SLURM lays it out under cgroup v1
    /// (slurm/uid_U/job_ID) or v2 (…/slurmstepd.scope/job_ID).
    #[arg(long, value_name = "ID")]
    pub slurm_job: Option<String>,

    /// The one process whose command line matches REGEX (with everything
    /// below it).
    #[arg(long = "match", value_name = "REGEX")]
    pub match_cmdline: Option<String>,
}

impl JobTarget {
    /// The target as `attach` finds one; `None` when nothing names it
    /// (clap requires one).
    pub fn target(&self) -> Option<crate::job::attach::Target> {
        use crate::job::attach::Target;
        Some(
            match (
                &self.pid,
                &self.cgroup,
                &self.slurm_job,
                &self.match_cmdline,
            ) {
                (Some(pid), ..) => Target::Pid(*pid),
                (_, Some(c), ..) => Target::Cgroup(c.clone()),
                (_, _, Some(id), _) => Target::SlurmJob(id.clone()),
                (.., Some(re)) => Target::Match(re.clone()),
                _ => return None,
            },
        )
    }
}

#[derive(Debug, Args)]
pub struct AttachArgs {
    /// The job to watch.
    #[command(flatten)]
    pub job: JobTarget,

    /// Stop watching after this long (the job keeps running).
    #[arg(long, value_name = "DURATION", value_parser = duration)]
    pub watch_for: Option<Duration>,

    // The groups in the order of their headings (`options::heading`).
    #[command(flatten)]
    pub policy: PolicyArgs,

    /// Allow oomguard to SIGTERM/SIGKILL processes it did not launch (a
    /// `kill` action, or the end of a stop whose trainer did not exit).
    #[arg(long, help_heading = heading::STOP)]
    pub allow_kill: bool,

    /// Write the NDJSON log (schema oomguard/1) to FILE.
    #[arg(long, value_name = "FILE", help_heading = heading::OUTPUT, display_order = 0)]
    pub log: Option<PathBuf>,

    /// Print no summary and no messages, but warnings about the set-up.
    #[arg(long, short, help_heading = heading::OUTPUT)]
    pub quiet: bool,

    #[command(flatten)]
    pub tui: TuiArgs,

    #[command(flatten)]
    pub sampling: SamplingFlags,
}

/// `oomguard checkpoint`: the job to ask, named as for `attach`.
#[derive(Debug, Args)]
pub struct CheckpointArgs {
    #[command(flatten)]
    pub job: JobTarget,

    /// How long to wait for every rank's save.
    #[arg(long, value_name = "DURATION", value_parser = duration, default_value = "2m")]
    pub timeout: Duration,
}

/// `oomguard ended`: the end records a job's runs left (`vocab::ended`).
#[derive(Debug, Args)]
pub struct EndedArgs {
    /// Exit 0 if the job should be requeued (oomguard's own stop, the time
    /// limit's warning), 1 if not (a scancel, no progress, a finished or
    /// failed job), 2 if no run of it left a record; the reason on stderr.
    #[arg(long)]
    pub requeue: bool,

    /// Where the runs kept their records: the `--checkpoint-dir` they were
    /// given, else the directory they were started in (the default).
    #[arg(long, value_name = "DIR")]
    pub checkpoint_dir: Option<PathBuf>,

    /// The SLURM job whose runs to read (default: $SLURM_JOB_ID; without
    /// either, every record in the directory).
    #[arg(long, value_name = "ID")]
    pub job: Option<String>,
}

#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// Output format.
    #[arg(long, value_enum, default_value_t = ForensicsFormat::Text)]
    pub format: ForensicsFormat,

    /// The NVML library to check.
    #[arg(long, value_name = "PATH")]
    pub nvml_lib: Option<PathBuf>,

    /// With a command: how long to wait for it to show progress before
    /// judging it anyway.
    #[arg(long, value_name = "DURATION", value_parser = duration, default_value = "30s")]
    pub wait: Duration,

    /// A training command to start, watch until it shows progress, judge
    /// (would a stop lose its work?) and end again (after `--`).
    #[arg(last = true, value_name = "COMMAND")]
    pub command: Vec<OsString>,
}

#[derive(Debug, Args)]
pub struct ForensicsArgs {
    /// A saved kernel log (dmesg, dmesg -T, journalctl, syslog, /dev/kmsg
    /// records), or `-` for stdin.
    pub file: Option<PathBuf>,

    /// Only the last DURATION of the live kernel log (e.g. 1h).
    #[arg(long, value_name = "DURATION", value_parser = duration)]
    pub since: Option<Duration>,

    /// Output format.
    #[arg(long, value_enum, default_value_t = ForensicsFormat::Text)]
    pub format: ForensicsFormat,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ForensicsFormat {
    Text,
    Json,
}

#[derive(Debug, Args)]
pub struct ReportArgs {
    /// The NDJSON log written by `oomguard run --log`, or `-` for stdin.
    /// Several logs (or a directory of them), one per node of one job: one
    /// report for the whole job.
    #[arg(required = true, value_name = "LOG")]
    pub logs: Vec<PathBuf>,

    /// Where to write the report.
    #[arg(short, long, value_name = "FILE")]
    pub output: Option<PathBuf>,

    /// Output format.
    #[arg(long, value_enum, default_value_t = ReportFormat::Html)]
    pub format: ReportFormat,

    /// Which run of the log, counting from 1 [default: the last]: a log
    /// that several runs were written to (a job run again, a requeue)
    /// holds each after the one before.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub run: Option<u64>,
}

/// `oomguard report --format`: the command line's own names, so that the
/// report's renderers need not know clap (the caller maps it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum ReportFormat {
    /// One self-contained HTML page with the timeline (the default).
    #[default]
    Html,
    /// Summary and advice for the terminal.
    Text,
    /// The same as data.
    Json,
}

#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// The NDJSON log written by `oomguard run --log`, or `-` for stdin
    /// (with --score: any number of logs).
    #[arg(required = true, value_name = "LOG")]
    pub logs: Vec<PathBuf>,

    /// Score the policy on a corpus of recorded runs: for each run that
    /// ended on its own, whether the policy would have paused, stopped or
    /// killed it; for each the kernel OOM-killed, whether it acts first, with
    /// the headroom left and the seconds before the kill.
    #[arg(long)]
    pub score: bool,

    /// Output format: a side-by-side table, or one JSON object per action.
    #[arg(long, value_enum, default_value_t = ForensicsFormat::Text)]
    pub format: ForensicsFormat,

    /// Which run of the log, counting from 1 [default: the last; with
    /// --score, every run of every log].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub run: Option<u64>,

    /// The policy to replay [default: the one the run recorded].
    #[command(flatten)]
    pub policy: PolicyArgs,
}

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// The demo job's memory budget.
    #[arg(long, value_name = "SIZE", default_value = "1GiB", value_parser = size)]
    pub budget: u64,

    /// Write the NDJSON log to FILE.
    #[arg(long, value_name = "FILE", help_heading = heading::OUTPUT)]
    pub log: Option<PathBuf>,

    #[command(flatten)]
    pub tui: TuiArgs,
}

/// Live dashboard switches.
#[derive(Debug, Args, Default, Clone, Copy)]
pub struct TuiArgs {
    /// Show the live dashboard (default when stdin and stdout are terminals and CI is unset).
    #[arg(long, conflicts_with = "no_tui", help_heading = heading::OUTPUT)]
    pub tui: bool,

    /// Never show the live dashboard.
    #[arg(long, help_heading = heading::OUTPUT)]
    pub no_tui: bool,

    /// When the dashboard's terminal hangs up (SSH dropped, window or tmux
    /// session closed): `end` forwards SIGHUP to the job and ends the run;
    /// `detach` goes on supervising without a terminal (log and metrics only).
    #[arg(
        long,
        value_enum,
        value_name = "WHAT",
        default_value_t = OnHangup::End,
        help_heading = heading::OUTPUT
    )]
    pub on_hangup: OnHangup,
}

/// What a hangup of the dashboard's terminal does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum OnHangup {
    /// As for a job run from a shell: SIGHUP to the job, and the run ends
    /// (SIGKILL after `--kill-after` if the tree outlives it).
    #[default]
    End,
    /// Keep supervising headless; the job's terminal stays open and drained.
    Detach,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    // The groups in the order of their headings (`options::heading`):
    // clap lists the headings in the order their first flag comes.
    #[command(flatten)]
    pub policy: PolicyArgs,

    #[command(flatten)]
    pub restart: RestartArgs,

    /// Write the NDJSON log (schema oomguard/1) to FILE.
    #[arg(long, value_name = "FILE", help_heading = heading::OUTPUT, display_order = 0)]
    pub log: Option<PathBuf>,

    /// Print no summary and no messages, but warnings about the set-up.
    #[arg(long, short, help_heading = heading::OUTPUT)]
    pub quiet: bool,

    #[command(flatten)]
    pub tui: TuiArgs,

    #[command(flatten)]
    pub only: RunOnly,

    #[command(flatten)]
    pub sampling: SamplingFlags,

    #[command(flatten)]
    pub launch: LaunchFlags,

    /// The command to run, after `--`.
    // No `allow_hyphen_values`: a misspelt flag before `--` (`--budjet`)
    // must be an error, not the command to run.
    #[arg(trailing_var_arg = true, required = true, value_name = "COMMAND")]
    pub command: Vec<OsString>,
}

/// What only `run`'s command line says: no file key, no preset. `Settings`
/// keeps the group whole (`cfg.run`), so a new flag here is one field.
#[derive(Debug, Args, Default, Clone)]
pub struct RunOnly {
    /// Serve Prometheus metrics at http://HOST:PORT/metrics during the run
    /// (e.g. 127.0.0.1:9465; other addresses expose them to the network).
    #[arg(long, value_name = "HOST:PORT", value_parser = crate::settings::values::listen_addr, help_heading = heading::METRICS)]
    pub metrics_addr: Option<std::net::SocketAddr>,

    /// Keep the metrics in FILE for node_exporter's textfile collector
    /// (replaced atomically, removed at exit; name it *.prom).
    #[arg(long, value_name = "FILE", help_heading = heading::METRICS)]
    pub metrics_textfile: Option<PathBuf>,

    /// Also append everything the job prints (stdout and stderr, raw) to FILE.
    #[arg(long, value_name = "FILE", help_heading = heading::OUTPUT)]
    pub output_log: Option<PathBuf>,

    /// With --output-log: keep at most SIZE of it on disk, the newest
    /// output (FILE and FILE.1, half each); what goes is counted in
    /// run_end. No cap without it: the job's output is yours.
    #[arg(long, value_name = "SIZE", value_parser = size, requires = "output_log", help_heading = heading::OUTPUT)]
    pub output_log_max: Option<u64>,

    /// Never slow the job down for its readers: when stdout/stderr do not
    /// keep up, drop the oldest output (counted in run_end) instead of
    /// making the job wait, as a pipe would.
    #[arg(long, help_heading = heading::OUTPUT)]
    pub output_drop: bool,

    /// Log every tick's sample line, the fast ticks near a ceiling
    /// included, with every policy input: a recording that `oomguard
    /// replay` can judge any policy on (about 20× the log's usual size).
    #[arg(long, help_heading = heading::OUTPUT)]
    pub log_every_tick: bool,

    /// The NVML library to load.
    #[arg(long, value_name = "PATH", help_heading = heading::METRICS)]
    pub nvml_lib: Option<PathBuf>,

    /// Do not watch GPUs.
    #[arg(long, help_heading = heading::METRICS)]
    pub no_gpu: bool,

    /// Report PyTorch's allocator (allocated, reserved, retries) from inside
    /// the job's Python processes that use CUDA (through a generated
    /// sitecustomize; other processes are untouched).
    #[arg(long, help_heading = heading::METRICS)]
    pub torch_stats: bool,

    /// Do not give Python jobs the checkpoint-on-request companion (its
    /// control directory in OOMGUARD_CONTROL, and the Lightning and
    /// Hugging Face callbacks added at start-up): stops send the
    /// checkpoint signal only.
    #[arg(long, help_heading = heading::STOP)]
    pub no_companion: bool,

    /// Start afresh: do not resume from the save a previous run of this
    /// command left (`.oomguard-resume.json`), and remove its record.
    #[arg(long, help_heading = heading::STOP)]
    pub fresh: bool,
}

/// What oomguard does about memory (see also `--config`).
#[derive(Debug, Args, Default)]
pub struct PolicyArgs {
    #[command(flatten)]
    pub values: PolicyFlags,

    /// TOML file with settings and rules.
    #[arg(long, value_name = "FILE", help_heading = heading::BUDGET)]
    pub config: Option<PathBuf>,

    /// No desktop notifications (they are off anyway when headless or CI=true).
    #[arg(long, help_heading = heading::OUTPUT)]
    pub no_notify: bool,
}

/// Restarting from a checkpoint (`--on-critical restart`).
#[derive(Debug, Args, Default, Clone)]
pub struct RestartArgs {
    #[command(flatten)]
    pub values: RestartFlags,

    /// Command for attempts after the first; {checkpoint} is replaced by the
    /// newest checkpoint.
    #[arg(long, value_name = "CMD", help_heading = heading::STOP)]
    pub resume_cmd: Option<String>,

    /// Change an environment variable on each memory-motivated restart:
    /// NAME=half|dec|VALUE[,min=N] (repeatable), e.g. NUM_WORKERS=half,min=1.
    #[arg(long, value_name = "NAME=HOW", value_parser = crate::job::restart::parse_degrade, help_heading = heading::STOP)]
    pub degrade: Vec<crate::job::restart::Degrade>,

    /// Also restart when memory killed the job anyway (not only after a
    /// `restart` action): `oom-kill` (the kernel OOM killer took a process
    /// of the job), `cuda-oom` (the job failed with a CUDA out-of-memory
    /// error; when the allocator was fragmented the next attempt gets
    /// `expandable_segments:True` in PYTORCH_CUDA_ALLOC_CONF). Repeatable.
    #[arg(long, value_name = "KIND", value_enum, help_heading = heading::STOP)]
    pub restart_on: Vec<crate::job::restart::RestartOn>,
}

/// The subcommands to suggest for a mistyped one, best first.
///
/// clap's own rule (Jaro similarity above 0.7) ranks a long name that
/// shares two scattered letters above a short one a letter away: `rn` got
/// `forensics`, and `run` was not even a candidate. Here a name is similar
/// when it is a small edit away (a letter missing, extra or wrong, or two
/// swapped: one edit for up to 4 letters typed, two beyond) or starts with
/// what was typed (2 letters or more); the closest come first, then the
/// shortest. Nothing is inferred: a similar name is only suggested.
pub fn similar_subcommands<'a>(
    typed: &str,
    names: impl IntoIterator<Item = &'a str>,
) -> Vec<String> {
    let typed = typed.to_lowercase();
    let limit = if typed.chars().count() <= 4 { 1 } else { 2 };
    let mut found: Vec<(usize, usize, &str)> = names
        .into_iter()
        .filter_map(|name| {
            let d = edit_distance(&typed, name);
            let prefix = typed.chars().count() >= 2 && name.starts_with(typed.as_str());
            (d <= limit || prefix).then_some((d, name.len(), name))
        })
        .collect();
    found.sort_unstable();
    found.dedup();
    found.into_iter().map(|(_, _, n)| n.to_string()).collect()
}

/// Edits (insert, delete, substitute, swap two neighbours) from `a` to `b`
/// (the optimal string alignment distance).
fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let mut d = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in d[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (d[i - 1][j] + 1)
                .min(d[i][j - 1] + 1)
                .min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(d[i - 2][j - 2] + 1);
            }
            d[i][j] = best;
        }
    }
    d[a.len()][b.len()]
}

/// `err` with [`similar_subcommands`] in place of clap's suggestions when
/// it is an unknown subcommand of `cmd` (clap's are kept when this rule
/// finds none).
pub fn with_better_suggestions(mut err: clap::Error, cmd: &clap::Command) -> clap::Error {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    if err.kind() != ErrorKind::InvalidSubcommand {
        return err;
    }
    let Some(ContextValue::String(typed)) = err.get(ContextKind::InvalidSubcommand) else {
        return err;
    };
    let names = cmd
        .get_subcommands()
        .filter(|s| !s.is_hide_set())
        .map(clap::Command::get_name)
        .chain(["help"]);
    let similar = similar_subcommands(typed, names);
    if !similar.is_empty() {
        err.insert(
            ContextKind::SuggestedSubcommand,
            ContextValue::Strings(similar),
        );
    }
    err
}

fn duration(s: &str) -> Result<Duration, String> {
    crate::settings::values::positive_duration(s)
}

/// A share of one core: "1%", "0.5%" (up to "100%").
fn size(s: &str) -> Result<u64, String> {
    crate::settings::values::positive_size(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn run_parses() {
        let c = Cli::try_parse_from([
            "oomguard",
            "run",
            "--budget",
            "75%",
            "--interval",
            "500ms",
            "--",
            "bash",
            "-c",
            "echo --log",
        ])
        .unwrap();
        let Command::Run(r) = c.command else {
            panic!("not run")
        };
        assert_eq!(
            r.sampling.budget,
            Some(crate::vocab::units::SizeOrPercent::Percent(75.0))
        );
        assert_eq!(r.sampling.interval, Some(Duration::from_millis(500)));
        assert_eq!(r.launch.kill_after, None);
        assert_eq!(r.command, vec!["bash", "-c", "echo --log"]);
        assert_eq!(r.log, None);
    }

    #[test]
    fn bad_values_are_rejected() {
        assert!(Cli::try_parse_from(["oomguard", "run", "--budget", "lots", "--", "x"]).is_err());
        assert!(Cli::try_parse_from(["oomguard", "run", "--interval", "0", "--", "x"]).is_err());
        assert!(Cli::try_parse_from(["oomguard", "run"]).is_err());
        let misspelt = Cli::try_parse_from(["oomguard", "run", "--budjet", "4G", "--", "true"]);
        assert!(misspelt.is_err(), "a misspelt flag became the command");
        assert!(Cli::try_parse_from(["oomguard", "run", "--budget", "0", "--", "x"]).is_err());
    }

    #[test]
    fn a_mistyped_subcommand_gets_the_nearest_name() {
        let cmd = Cli::command();
        let names: Vec<&str> = cmd.get_subcommands().map(clap::Command::get_name).collect();
        let similar = |typed| similar_subcommands(typed, names.iter().copied());
        assert_eq!(similar("rn"), ["run"]);
        assert_eq!(similar("rnu"), ["run"]);
        assert_eq!(similar("reprot"), ["report"]);
        assert_eq!(similar("forensic"), ["forensics"]);
        assert_eq!(similar("doctr"), ["doctor"]);
        assert_eq!(similar("rep"), ["replay", "report"]);
        assert!(similar("xyzzy").is_empty());
        assert!(similar("r").is_empty(), "one letter is no evidence");
        assert_eq!(edit_distance("ab", "ba"), 1);
        assert_eq!(edit_distance("", "run"), 3);
    }

    #[test]
    fn the_better_suggestion_replaces_clap_s() {
        let cmd = crate::settings::command();
        let err = cmd
            .clone()
            .try_get_matches_from(["oomguard", "rn"])
            .unwrap_err();
        let text = with_better_suggestions(err, &cmd).to_string();
        assert!(
            text.contains("a similar subcommand exists: 'run'"),
            "{text}"
        );
        assert!(!text.contains("forensics"), "{text}");
    }

    #[test]
    fn run_help_lists_the_headings_in_order_with_budget_first() {
        let mut cmd = crate::settings::command();
        let help = cmd
            .find_subcommand_mut("run")
            .unwrap()
            .render_long_help()
            .to_string();
        let at: Vec<usize> = heading::ORDER
            .iter()
            .map(|h| {
                help.find(&format!("\n{h}:\n"))
                    .unwrap_or_else(|| panic!("no {h}\n{help}"))
            })
            .collect();
        assert!(at.windows(2).all(|w| w[0] < w[1]), "{help}");
        let budget = &help[at[0] + 1..at[1]];
        let first = budget.lines().nth(1).unwrap_or_default();
        assert!(first.contains("--budget"), "{budget}");
        let output = &help[at[2] + 1..at[3]];
        assert!(
            output.lines().nth(1).unwrap_or_default().contains("--log"),
            "{output}"
        );
        // Every flag but -h and -V is under a heading.
        let options = help.split("\nOptions:\n").nth(1).unwrap_or_default();
        let options = options.split("\n\n").next().unwrap_or_default();
        let stray: Vec<&str> = options
            .lines()
            .filter(|l| l.trim_start().starts_with('-'))
            .filter(|l| !l.contains("--help") && !l.contains("--version"))
            .collect();
        assert!(stray.is_empty(), "{stray:?}");
        // attach and replay show the headings they have in the same order.
        for sub in ["attach", "replay"] {
            let help = cmd
                .find_subcommand_mut(sub)
                .unwrap()
                .render_long_help()
                .to_string();
            let at: Vec<usize> = heading::ORDER
                .iter()
                .filter_map(|h| help.find(&format!("\n{h}:\n")))
                .collect();
            assert!(at.len() >= 3, "{help}");
            assert!(at.windows(2).all(|w| w[0] < w[1]), "{help}");
        }
    }

    #[test]
    fn hyphenated_commands_still_run_after_the_separator() {
        let c = Cli::try_parse_from(["oomguard", "run", "--", "-weird", "--flag"]).unwrap();
        let Command::Run(r) = c.command else {
            panic!("not run")
        };
        assert_eq!(r.command, vec!["-weird", "--flag"]);
        let c = Cli::try_parse_from(["oomguard", "run", "python", "-u", "train.py"]).unwrap();
        let Command::Run(r) = c.command else {
            panic!("not run")
        };
        assert_eq!(r.command, vec!["python", "-u", "train.py"]);
    }
}
