//! Every setting that both a flag and `oomguard.toml` can set, declared
//! once in the table at the end of this file: its flag (help text, value
//! name), its file key, the rule that reads its text and its default. From
//! that one table `settings_table!` makes the clap groups that `run`,
//! `attach` and `replay` flatten, the [`Layer`] of optional values that
//! each source fills, the file keys and the resolved [`Values`].
//!
//! A new setting is one entry in the table; its default, when it has one,
//! is written in that entry as a user would type it (`default "10s"`), so
//! `--help` shows exactly the text the resolver reads, and the heading it
//! is listed under in `--help` and the man page (`under BUDGET`, one of
//! [`heading`]).
//!
//! Which source wins (flag > file > preset > default) is decided in
//! `settings`; this module only says what a setting is.

use std::marker::PhantomData;
use std::path::PathBuf;
use std::time::Duration;

use clap::ValueEnum;
use clap::builder::{EnumValueParser, ValueParser};

use crate::settings::values;
use crate::vocab::units::SizeOrPercent;

/// The headings that `run --help` lists its flags under (`attach` and
/// `replay` flatten some of the same groups, and use the same headings).
/// clap shows a command's headings in the order their first flag was
/// declared: `RunArgs` and `AttachArgs` declare their groups so that this
/// is the order below (a test in `cli` checks it). Within a heading, flags
/// keep their declaration order, but for those with `display_order = 0`,
/// which come first (`--budget`, `--log`).
pub mod heading {
    /// The ceiling, the rules and what they do.
    pub const BUDGET: &str = "Budget and policy";
    /// How a stop goes (signal, grace, checkpoints) and restarts.
    pub const STOP: &str = "Stop and restart";
    /// The log, the job's output, the summary, the dashboard.
    pub const OUTPUT: &str = "Output and logs";
    /// Prometheus metrics, GPUs and PyTorch's allocator.
    pub const METRICS: &str = "Metrics";
    /// How the job is measured: intervals, PSS budget, cgroup.
    pub const ADVANCED: &str = "Advanced";
    /// Every heading, in the order `--help` shows them.
    pub const ORDER: [&str; 5] = [BUDGET, STOP, OUTPUT, METRICS, ADVANCED];
}

/// How a setting's text becomes its value. The command line and the file
/// use the same rule, so both refuse a value with the same words.
pub trait Rule<T> {
    /// The value, or a message naming the text and what is expected.
    fn read(&self, text: &str) -> Result<T, String>;
    /// The same rule for clap.
    fn parser(&self) -> ValueParser;
}

impl<T, F> Rule<T> for F
where
    F: Fn(&str) -> Result<T, String> + Clone + Send + Sync + 'static,
    T: Clone + Send + Sync + 'static,
{
    fn read(&self, text: &str) -> Result<T, String> {
        self(text)
    }

    fn parser(&self) -> ValueParser {
        ValueParser::new(self.clone())
    }
}

/// One of a fixed set of names (a clap `ValueEnum`): clap lists them in
/// the help and the shell completions, and the file refuses anything else
/// with the list.
pub struct Choice<T>(PhantomData<T>);

/// The rule for a `ValueEnum` setting.
pub const fn choice<T>() -> Choice<T> {
    Choice(PhantomData)
}

impl<T: ValueEnum + Clone + Send + Sync + 'static> Rule<T> for Choice<T> {
    fn read(&self, text: &str) -> Result<T, String> {
        T::from_str(text.trim(), false).map_err(|_| {
            let names: Vec<String> = T::value_variants()
                .iter()
                .filter_map(|v| v.to_possible_value())
                .map(|p| p.get_name().to_string())
                .collect();
            format!("unknown value '{text}' (expected {})", names.join(", "))
        })
    }

    fn parser(&self) -> ValueParser {
        EnumValueParser::<T>::new().into()
    }
}

/// Whether oomguard runs the job in a memory cgroup of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CgroupMode {
    /// Create one where permitted (root with cgroup v1, or a delegated v2
    /// subtree), otherwise follow the job through /proc.
    Auto,
    /// Never create a cgroup.
    Off,
}

/// Actions a critical rule may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CriticalAction {
    Pause,
    Stop,
    Kill,
    Restart,
}

/// The built-in policies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PolicyName {
    /// Warn, then act before the OOM killer.
    Default,
    /// Observe only.
    None,
}

/// A resolved setting's type: the value itself when the setting has a
/// default, `Option` when it has none.
macro_rules! resolved {
    ($ty:ty) => { Option<$ty> };
    ($ty:ty, $default:literal) => { $ty };
}

/// The first source that gives the setting, else its default (read by the
/// setting's own rule).
macro_rules! pick {
    ($layers:expr, $field:ident, $rule:expr) => {
        $layers.iter().find_map(|l| l.$field.clone())
    };
    ($layers:expr, $field:ident, $rule:expr, $default:literal) => {
        match $layers.iter().find_map(|l| l.$field.clone()) {
            Some(v) => v,
            None => Rule::read(&$rule, $default).map_err(|e| {
                format!("the default of {} ({}): {e}", stringify!($field), $default)
            })?,
        }
    };
}

/// Makes, from the table: one clap group per `group` (each flag under its
/// `--help` heading), [`Layer`], [`Values`], the file keys and the
/// defaults shown in `--help`.
macro_rules! settings_table {
    ($(
        $(#[$group_meta:meta])*
        group $group:ident {
            $(
                $(#[$meta:meta])*
                $field:ident: $ty:ty = $rule:expr $(, default $default:literal)?, under $heading:ident;
            )*
        }
    )*) => {
        $(
            $(#[$group_meta])*
            #[derive(Debug, Clone, Default, PartialEq, clap::Args)]
            pub struct $group {
                $(
                    $(#[$meta])*
                    #[arg(long, help_heading = heading::$heading, value_parser = Rule::parser(&$rule))]
                    pub $field: Option<$ty>,
                )*
            }

            impl $group {
                /// Puts what this group's flags gave into `layer`.
                pub fn fill(&self, layer: &mut Layer) {
                    $(
                        if self.$field.is_some() {
                            layer.$field.clone_from(&self.$field);
                        }
                    )*
                }
            }
        )*

        /// Values from one source; `None` where that source is silent.
        #[derive(Debug, Clone, Default, PartialEq)]
        pub struct Layer {
            $($( pub $field: Option<$ty>, )*)*
        }

        /// Every setting of the table, decided.
        #[derive(Debug, Clone, PartialEq)]
        pub struct Values {
            $($( pub $field: resolved!($ty $(, $default)?), )*)*
        }

        impl Layer {
            /// The file keys, one per setting.
            pub const KEYS: &'static [&'static str] = &[$($( stringify!($field), )*)*];

            /// Sets `key` from its text; `None` when no setting has that key.
            pub fn set(&mut self, key: &str, text: &str) -> Option<Result<(), String>> {
                match key {
                    $($(
                        stringify!($field) => Some(
                            Rule::read(&$rule, text)
                                .map(|v| self.$field = Some(v))
                                .map_err(|e| format!("{key}: {e}")),
                        ),
                    )*)*
                    _ => None,
                }
            }

            /// Each setting from the first layer that gives it, else its
            /// default. Fails only if a default in the table does not read.
            pub fn resolve(layers: &[&Layer]) -> Result<Values, String> {
                Ok(Values {
                    $($( $field: pick!(layers, $field, $rule $(, $default)?), )*)*
                })
            }
        }

        /// `(argument id, default as written)` for every setting with one;
        /// `--help` shows these.
        pub const DEFAULTS: &[(&str, &str)] = &[$($($( (stringify!($field), $default), )?)*)*];
    };
}

settings_table! {
    /// How often and how closely the job is measured (`run` and `attach`).
    group SamplingFlags {
        /// Time between samples.
        #[arg(value_name = "DURATION")]
        interval: Duration = values::positive_duration, default "1s", under ADVANCED;

        /// How soon a process family whose memory moved is re-read from
        /// smaps_rollup (in the background, within --pss-budget; one whose
        /// memory did not move: every 12 intervals; between readings PSS
        /// follows RSS changes).
        #[arg(value_name = "DURATION")]
        pss_interval: Duration = values::positive_duration, default "5s", under ADVANCED;

        /// CPU the PSS readings may use, as a share of one core. Readings
        /// after a fork or exit come first; large trees are read less often.
        #[arg(value_name = "PCT")]
        pss_budget: f64 = values::core_share, default "1%", under ADVANCED;

        /// A memory budget for the job: bytes (40GiB) or a share of RAM (75%).
        #[arg(value_name = "SIZE|PCT", display_order = 0)]
        budget: SizeOrPercent = values::budget, under BUDGET;

        /// Mechanisms to turn off, for tests and debugging: usage-threshold,
        /// psi, memory-events, cheap-loop, memory-high, or wakeups (all four
        /// wake-ups: --interval polling only).
        #[arg(value_name = "LIST", hide = true)]
        without: crate::settings::values::Without = values::without, default "none", under ADVANCED;
    }

    /// What only a job oomguard launches has (`run`).
    group LaunchFlags {
        /// How often sample lines in the log carry per-process detail (and on
        /// every rule or action).
        #[arg(value_name = "DURATION")]
        procs_interval: Duration = values::positive_duration, default "1m", under OUTPUT;

        /// Run the job in a memory cgroup of oomguard's own where permitted.
        #[arg(value_name = "MODE")]
        cgroup: CgroupMode = choice::<CgroupMode>(), default "auto", under ADVANCED;

        /// After SIGTERM, how long the tree may take to exit before SIGKILL.
        #[arg(value_name = "DURATION")]
        kill_after: Duration = values::positive_duration, default "10s", under STOP;

        /// What a signal oomguard receives asks of the job: SIGNAL=ACTION
        /// pairs for TERM, USR1, USR2 and INT; ACTION is checkpoint_and_exit
        /// (every rank saves its last step, then the job ends), checkpoint
        /// (save and go on) or forward (pass it on). Without a companion
        /// every signal is passed on. Unnamed signals keep their default.
        #[arg(value_name = "SIG=ACTION,...")]
        on_signal: crate::settings::values::SignalMap = values::signal_map,
            default "TERM=checkpoint_and_exit,USR1=checkpoint_and_exit,USR2=checkpoint_and_exit,INT=checkpoint_and_exit",
            under STOP;

        /// From a signal that asks for a save to the end of the whole tree:
        /// the save and the ranks' exit get this less --kill-after (a third
        /// of it at most), then SIGTERM, then SIGKILL. Fit it to the
        /// scheduler's grace (SLURM's KillWait, Kubernetes'
        /// terminationGracePeriodSeconds).
        #[arg(value_name = "DURATION")]
        signal_budget: Duration = values::positive_duration, default "30s", under STOP;

        /// The exit code of a stop (by the policy or a signal's save; not
        /// Ctrl-C's, which exits 130). 75 is EX_TEMPFAIL; a Kubeflow
        /// restartPolicy ExitCode retries only codes of 128 and above.
        #[arg(value_name = "CODE")]
        stop_code: i32 = values::stop_code, default "75", under STOP;

        /// After N stops in a row that passed no step beyond the one they
        /// resumed from, exit 78 and advise against a requeue (0: never).
        #[arg(value_name = "N")]
        requeue_limit: u32 = values::count, default "3", under STOP;

        /// Exit 76 if the job's peak PSS sum exceeded SIZE, even when the
        /// job succeeded: a memory-regression gate for CI (the PSS sum is
        /// repeatable; a cgroup's working set includes page cache).
        #[arg(value_name = "SIZE")]
        fail_above: u64 = values::positive_size, under BUDGET;

        /// How many of the job's last lines of output the dashboard leaves
        /// on the terminal when it closes (with the run's events and the
        /// summary); 0 leaves none.
        #[arg(value_name = "N")]
        output_lines: u32 = values::count, default "20", under OUTPUT;
    }

    /// What oomguard does about memory (`run`, `attach` and `replay`).
    group PolicyFlags {
        /// `default` (warn, then act before the OOM killer) or `none` (observe).
        #[arg(value_name = "NAME")]
        policy: PolicyName = choice::<PolicyName>(), default "default", under BUDGET;

        /// Warn when usage reaches this share of the nearest ceiling.
        #[arg(value_name = "PCT")]
        warn_at: f64 = values::usage_percent, default "80%", under BUDGET;

        /// Critical when usage reaches this share of the nearest ceiling.
        #[arg(value_name = "PCT")]
        critical_at: f64 = values::usage_percent, default "92%", under BUDGET;

        /// What a critical rule does.
        #[arg(value_name = "ACTION")]
        on_critical: CriticalAction = choice::<CriticalAction>(), default "stop", under BUDGET;

        /// A pause never lasts longer than this; then the critical action runs.
        #[arg(value_name = "DURATION")]
        max_pause: Duration = values::positive_duration, default "10m", under STOP;

        /// How long the trainer has to checkpoint and exit after the checkpoint signal.
        #[arg(value_name = "DURATION")]
        grace: Duration = values::positive_duration, default "1m", under STOP;

        /// The signal asking the trainer to checkpoint and exit.
        #[arg(value_name = "SIGNAL")]
        checkpoint_signal: i32 = values::checkpoint_signal, default "SIGTERM", under STOP;

        /// Run CMD (with sh -c) on every warning; OOMGUARD_* variables describe it.
        #[arg(value_name = "CMD")]
        on_warn: String = values::text, under BUDGET;
    }

    /// Restarting from a checkpoint (`--on-critical restart`).
    group RestartFlags {
        /// Where the job writes checkpoints: after the checkpoint signal oomguard
        /// waits (up to --grace) for a new, complete one before stopping the rest.
        #[arg(value_name = "DIR")]
        checkpoint_dir: PathBuf = values::path, under STOP;

        /// Which files in --checkpoint-dir are checkpoints.
        #[arg(value_name = "GLOB")]
        checkpoint_glob: String = values::text, default "*", under STOP;

        /// How many times the job may be restarted.
        #[arg(value_name = "N")]
        max_restarts: u32 = values::count, default "3", under STOP;

        /// Delay before the first restart; it doubles each time (at most 5m).
        #[arg(value_name = "DURATION")]
        restart_delay: Duration = values::positive_duration, default "5s", under STOP;

        /// An attempt that ran this long resets the restart count.
        #[arg(value_name = "DURATION")]
        restart_reset: Duration = values::positive_duration, default "30m", under STOP;
    }
}

impl From<CriticalAction> for crate::engine::policy::Action {
    fn from(c: CriticalAction) -> Self {
        match c {
            CriticalAction::Pause => Self::Pause,
            CriticalAction::Stop => Self::Stop,
            CriticalAction::Kill => Self::Kill,
            CriticalAction::Restart => Self::Restart,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_default_reads_by_its_own_rule() {
        let v = Layer::resolve(&[&Layer::default()]).unwrap();
        assert_eq!(v.interval, Duration::from_secs(1));
        assert_eq!(v.kill_after, Duration::from_secs(10));
        assert_eq!(v.grace, Duration::from_secs(60));
        assert_eq!(v.checkpoint_signal, libc::SIGTERM);
        assert_eq!(v.on_critical, CriticalAction::Stop);
        assert_eq!(v.budget, None);
        assert_eq!(
            v.pss_budget,
            crate::engine::probe::pss::SweepConfig::DEFAULT_BUDGET,
            "the sweeper's own default and the setting's disagree"
        );
        assert_eq!(DEFAULTS.len(), 23);
        assert_eq!(v.requeue_limit, 3);
        assert_eq!(v.without, crate::settings::values::Without::default());
    }

    #[test]
    fn a_key_is_set_by_its_rule_and_refused_with_its_name() {
        let mut l = Layer::default();
        assert_eq!(l.set("kill_after", "3s"), Some(Ok(())));
        assert_eq!(l.kill_after, Some(Duration::from_secs(3)));
        let e = l.set("cgroup", "sometimes").unwrap().unwrap_err();
        assert_eq!(e, "cgroup: unknown value 'sometimes' (expected auto, off)");
        assert_eq!(l.set("kil_after", "3s"), None);
        assert_eq!(Layer::KEYS.len(), 27);
    }

    #[test]
    fn the_first_layer_that_speaks_wins() {
        let mut flag = Layer::default();
        let mut file = Layer::default();
        file.set("grace", "5s").unwrap().unwrap();
        file.set("interval", "2s").unwrap().unwrap();
        flag.set("grace", "7s").unwrap().unwrap();
        let v = Layer::resolve(&[&flag, &file]).unwrap();
        assert_eq!(v.grace, Duration::from_secs(7));
        assert_eq!(v.interval, Duration::from_secs(2));
    }
}
