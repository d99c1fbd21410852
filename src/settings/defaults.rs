//! Every default of a setting that a flag or `oomguard.toml` can change,
//! written once. The resolver falls back to these, and `--help` shows them
//! (`help_defaults`), so the help text can never disagree with the code.

use std::time::Duration;

use crate::cli::CgroupMode;
use crate::policy::Action;

pub const INTERVAL: Duration = Duration::from_secs(1);
pub const PSS_INTERVAL: Duration = Duration::from_secs(5);
/// Share of one core the PSS readings may use.
pub const PSS_BUDGET: f64 = crate::probe::pss::SweepConfig::DEFAULT_BUDGET;
pub const PROCS_INTERVAL: Duration = Duration::from_secs(60);
pub const CGROUP: CgroupMode = CgroupMode::Auto;
pub const KILL_AFTER: Duration = Duration::from_secs(10);
pub const POLICY: &str = "default";
pub const WARN_AT: f64 = 80.0;
pub const CRITICAL_AT: f64 = 92.0;
pub const ON_CRITICAL: Action = Action::Stop;
pub const MAX_PAUSE: Duration = Duration::from_secs(600);
pub const GRACE: Duration = Duration::from_secs(60);
pub const CHECKPOINT_SIGNAL: i32 = libc::SIGTERM;
pub const CHECKPOINT_GLOB: &str = "*";
pub const MAX_RESTARTS: u32 = 3;
pub const RESTART_DELAY: Duration = Duration::from_secs(5);
pub const RESTART_RESET: Duration = Duration::from_secs(30 * 60);

/// `(argument id, shown default)` for every argument whose default lives
/// here; `cli::command` appends `[default: …]` to their help.
pub fn help_defaults() -> Vec<(&'static str, String)> {
    let d = |v: Duration| humantime::format_duration(v).to_string();
    vec![
        ("interval", d(INTERVAL)),
        ("pss_interval", d(PSS_INTERVAL)),
        ("pss_budget", format!("{}%", PSS_BUDGET * 100.0)),
        ("procs_interval", d(PROCS_INTERVAL)),
        ("cgroup", "auto".to_string()),
        ("kill_after", d(KILL_AFTER)),
        ("policy", POLICY.to_string()),
        ("warn_at", format!("{WARN_AT}%")),
        ("critical_at", format!("{CRITICAL_AT}%")),
        ("on_critical", ON_CRITICAL.name().to_string()),
        ("max_pause", d(MAX_PAUSE)),
        ("grace", d(GRACE)),
        (
            "checkpoint_signal",
            crate::model::signal_name(CHECKPOINT_SIGNAL),
        ),
        ("checkpoint_glob", CHECKPOINT_GLOB.to_string()),
        ("max_restarts", MAX_RESTARTS.to_string()),
        ("restart_delay", d(RESTART_DELAY)),
        ("restart_reset", d(RESTART_RESET)),
    ]
}
