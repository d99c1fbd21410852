//! `oomguard doctor`: within about a second, what oomguard can do on this
//! machine, what it cannot, why, and the remedy for each gap.
//!
//! Two checks are required for prevention and decide the exit code: a
//! ceiling is readable (a cgroup limit or the machine's memory), and a way
//! to act in time exists (a kernel wake-up, a cgroup of its own, or fast
//! polling). The rest are advisory: reported, never failing the command.
//! Every check reuses the probe the run itself uses (`probe::cgroup`,
//! `probe::system`, `probe::gpu`, `forensics::kmsg`, the companion), so
//! what the doctor says is what a run would find. The slow ones (NVML,
//! the Python interpreter, the kernel log) run on threads of their own
//! with a deadline, so the answer stays under two seconds.
//!
//! `doctor -- CMD` also starts a command under the supervisor and says
//! whether a stop would lose its work (`probe.rs`).

mod checks;
pub mod interpreter;
pub mod probe;

pub use interpreter::Interpreter;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde::Serialize;

/// The JSON report's schema name.
pub const SCHEMA: &str = "oomguard-doctor/1";

/// Exit code when a required check failed.
pub const EXIT_REQUIRED: i32 = 1;

/// How long the slow checks (NVML, python3, the kernel log) may take.
pub const SLOW_CHECK_DEADLINE: Duration = Duration::from_millis(1500);

/// How a check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    /// Works.
    Ok,
    /// A gap: oomguard does less here (with a remedy).
    Warn,
    /// A required check failed: oomguard cannot prevent OOM kills here.
    Fail,
}

impl State {
    fn label(self) -> &'static str {
        match self {
            State::Ok => "ok",
            State::Warn => "warn",
            State::Fail => "FAIL",
        }
    }
}

/// One finding.
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    /// Stable name (`ceiling`, `act_in_time`, `own_cgroup`, `psi`, `swap`,
    /// `nvml`, `shm`, `python`, `kernel_log`, `notifications`,
    /// `stop_saves`).
    pub name: &'static str,
    /// Whether this check decides the exit code.
    pub required: bool,
    pub state: State,
    /// What oomguard can do here, in one line.
    pub summary: String,
    /// Why a gap exists.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
    /// What the user can do about it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remedy: Option<String>,
    /// Figures behind the summary, for scripts.
    #[serde(skip_serializing_if = "serde_json::Value::is_null")]
    pub details: serde_json::Value,
}

impl Check {
    fn new(name: &'static str, state: State, summary: impl Into<String>) -> Self {
        Self {
            name,
            required: false,
            state,
            summary: summary.into(),
            why: None,
            remedy: None,
            details: serde_json::Value::Null,
        }
    }

    fn required(mut self) -> Self {
        self.required = true;
        self
    }

    fn why(mut self, why: impl Into<String>) -> Self {
        self.why = Some(why.into());
        self
    }

    fn remedy(mut self, remedy: impl Into<String>) -> Self {
        self.remedy = Some(remedy.into());
        self
    }

    fn details(mut self, details: serde_json::Value) -> Self {
        self.details = details;
        self
    }
}

/// The whole report.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub schema: &'static str,
    /// Every required check passed.
    pub ok: bool,
    /// How long the checks took (without `-- CMD`'s run).
    pub elapsed_seconds: f64,
    pub checks: Vec<Check>,
    /// `doctor -- CMD`: the command, and what was found.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub probe: Option<probe::Probed>,
}

impl Report {
    /// 0 when every required check passed, [`EXIT_REQUIRED`] otherwise.
    pub fn exit_code(&self) -> i32 {
        if self.ok { 0 } else { EXIT_REQUIRED }
    }

    pub fn render_json(&self) -> String {
        let mut s = serde_json::to_string_pretty(self)
            .unwrap_or_else(|e| format!("{{\"schema\":\"{SCHEMA}\",\"error\":\"{e}\"}}"));
        s.push('\n');
        s
    }

    pub fn render_text(&self) -> String {
        let mut out = String::from("oomguard doctor: what oomguard can do here\n\n");
        for (title, required) in [("Required for prevention", true), ("Advisory", false)] {
            out.push_str(title);
            out.push_str(":\n");
            for c in self.checks.iter().filter(|c| c.required == required) {
                out.push_str(&format!(
                    "  {:<5} {:<14} {}\n",
                    c.state.label(),
                    c.name,
                    c.summary
                ));
                if let Some(w) = &c.why {
                    out.push_str(&format!("{:23}why: {w}\n", ""));
                }
                if let Some(r) = &c.remedy {
                    out.push_str(&format!("{:23}remedy: {r}\n", ""));
                }
            }
            out.push('\n');
        }
        out.push_str(if self.ok {
            "oomguard can stop a job here before the kernel OOM killer does.\n"
        } else {
            "oomguard cannot prevent OOM kills here until the failed checks above are fixed.\n"
        });
        out
    }
}

/// Where the checks look (tests point `proc_root` at a fixture).
#[derive(Debug, Clone)]
pub struct Env {
    pub proc_root: PathBuf,
    pub nvml_lib: Option<PathBuf>,
    pub shm: PathBuf,
    /// The Python the `python` check asks (`doctor -- CMD`: the command's).
    pub python: Interpreter,
}

impl Default for Env {
    fn default() -> Self {
        Self {
            proc_root: PathBuf::from("/proc"),
            nvml_lib: None,
            shm: PathBuf::from("/dev/shm"),
            python: Interpreter::OnPath,
        }
    }
}

/// Runs every check (the slow ones in parallel, each with its deadline).
pub fn diagnose(env: &Env) -> Report {
    let started = Instant::now();
    let facts = checks::Facts::gather(env);
    // Before any child process starts: on cgroup v2 the job's cgroup can
    // only be made where oomguard is its cgroup's only process, and a
    // `python3` of the doctor's own would make it look taken.
    let own = checks::own_cgroup(&facts);
    let nvml = checks::spawn_slow("nvml", {
        let lib = env.nvml_lib.clone();
        move || checks::nvml(lib.as_deref())
    });
    let python = checks::spawn_slow("python", {
        let interpreter = env.python.clone();
        move || checks::python(&interpreter)
    });
    let kernel_log = checks::spawn_slow("kernel_log", checks::kernel_log);
    let deadline = started + SLOW_CHECK_DEADLINE + Duration::from_millis(100);
    // Required first, then in the order the issue lists them.
    let list = vec![
        checks::ceiling(&facts),
        checks::act_in_time(&facts, own.state == State::Ok),
        own,
        checks::psi(&facts),
        checks::swap(&facts),
        nvml.join(deadline),
        checks::shm(&env.shm),
        python.join(deadline),
        kernel_log.join(deadline),
        checks::notifications(),
    ];
    let ok = list.iter().all(|c| !c.required || c.state != State::Fail);
    Report {
        schema: SCHEMA,
        ok,
        elapsed_seconds: (started.elapsed().as_secs_f64() * 1000.0).round() / 1000.0,
        checks: list,
        probe: None,
    }
}

/// Adds `doctor -- CMD`'s finding to the report, as the advisory check
/// `stop_saves`.
pub fn add_probe(report: &mut Report, probed: probe::Probed) {
    report.checks.push(checks::stop_saves(&probed));
    report.probe = Some(probed);
}
