//! Prometheus metrics (design.md §4.4): the registry the supervision loop
//! feeds once per tick, and its rendering in the classic text exposition
//! format 0.0.4.
//!
//! This module owns the metric names, units, labels and help texts; they are
//! a contract with users' dashboards and alert rules, so they only change
//! together with design.md. Two publishers read the same rendering:
//! [`http::serve`] (`--metrics-addr`, scraped) and [`textfile::Textfile`]
//! (`--metrics-textfile`, for node_exporter's textfile collector).
//!
//! Rules the rendering keeps, because consumers rely on them:
//! - classic text format only, no timestamps, no `# EOF`: node_exporter's
//!   textfile collector rejects both (it does not speak OpenMetrics);
//! - a metric whose value is unknown (no cgroup, no ETA yet) is left out,
//!   never written as 0: 0 bytes of headroom means "about to die";
//! - families sorted by name, series by labels, so two renderings of the
//!   same state are byte-identical (golden tests, diffable textfiles);
//! - no pid labels: pids change at every restart and worker respawn, and
//!   each one would be a new series forever. Per-process detail stays in the
//!   NDJSON log and the TUI.
//!
//! The state sits behind a `std::sync::Mutex`: it is held only to copy
//! numbers in or format them out (microseconds), never across an `.await`,
//! so the HTTP task and the tick never wait on each other in practice.

pub mod http;
pub mod textfile;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::vocab::model::{Role, Sample, View};

pub use http::{MetricsError, Serving, serve};
pub use textfile::{Textfile, TextfileError};

/// The `Content-Type` of the classic text exposition format.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Actions whose `oomguard_actions_total{action}` series exist from the
/// start (at 0), so `increase()` and alert rules see the first one happen.
pub const ACTIONS: [&str; 6] = ["warn", "pause", "resume", "stop", "kill", "restart"];

/// Constant labels added to every series, by label name. See
/// [`constant_labels_from_env`].
pub type ConstantLabels = BTreeMap<String, String>;

/// The constant labels of design.md §4.4 from an environment (`(name,
/// value)` pairs, e.g. `std::env::vars()` or a test's map) and a host name:
///
/// | label | from |
/// |---|---|
/// | `job_id` | `SLURM_JOB_ID` |
/// | `rank` | `RANK` (torchrun), else `SLURM_PROCID` |
/// | `local_rank` | `LOCAL_RANK` (torchrun), else `SLURM_LOCALID` |
/// | `node` | the host name |
///
/// Absent or empty values give no label (an empty label value is the same
/// as no label to Prometheus anyway). These are what lets one Prometheus
/// tell apart, and aggregate, every rank of a multi-node job.
pub fn constant_labels_from_env<I, K, V>(env: I, hostname: Option<&str>) -> ConstantLabels
where
    I: IntoIterator<Item = (K, V)>,
    K: AsRef<str>,
    V: AsRef<str>,
{
    let env: BTreeMap<String, String> = env
        .into_iter()
        .filter_map(|(k, v)| {
            let v = v.as_ref().trim();
            (!v.is_empty()).then(|| (k.as_ref().to_string(), v.to_string()))
        })
        .collect();
    let first = |names: &[&str]| names.iter().find_map(|n| env.get(*n).cloned());
    let mut labels = ConstantLabels::new();
    let mut put = |name: &str, value: Option<String>| {
        if let Some(v) = value {
            labels.insert(name.to_string(), v);
        }
    };
    put("job_id", first(&["SLURM_JOB_ID"]));
    put("rank", first(&["RANK", "SLURM_PROCID"]));
    put("local_rank", first(&["LOCAL_RANK", "SLURM_LOCALID"]));
    put(
        "node",
        hostname
            .map(str::trim)
            .filter(|h| !h.is_empty())
            .map(str::to_string),
    );
    labels
}

/// What `run_start.ids` records: the constant labels, plus the SLURM job
/// step (`SLURM_STEP_ID`) when there is one.
pub fn run_ids() -> BTreeMap<String, String> {
    let mut ids = constant_labels();
    let var = |name: &str| {
        std::env::var(name)
            .ok()
            .map(|s| s.trim().to_string())
            .filter(|s| !s.is_empty())
    };
    if let Some(step) = var("SLURM_STEP_ID") {
        ids.insert("slurm_step".into(), step);
    }
    // Which SLURM node and task this oomguard is (`oomguard report` names a
    // job's logs by them when several tasks share a node).
    if let Some(node) = var("SLURM_NODEID") {
        ids.insert("slurm_node".into(), node);
    }
    if let Some(task) = var("SLURM_PROCID") {
        ids.insert("slurm_task".into(), task);
    }
    ids
}

/// [`constant_labels_from_env`] for this process: its environment and the
/// kernel's host name.
pub fn constant_labels() -> ConstantLabels {
    let env = std::env::vars_os().map(|(k, v)| {
        (
            k.to_string_lossy().into_owned(),
            v.to_string_lossy().into_owned(),
        )
    });
    constant_labels_from_env(env, hostname().as_deref())
}

/// The wall clock in seconds, to the millisecond as the log writes times.
fn unix_now() -> f64 {
    (crate::vocab::clock::unix_seconds() * 1000.0).round() / 1000.0
}

/// The host name (`/proc/sys/kernel/hostname`, what `uname -n` prints), or
/// `None` when it cannot be read.
pub fn hostname() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
}

/// The metric registry: a cheaply cloneable handle (clones share state).
///
/// Fed by the supervision loop ([`Metrics::update`] once per tick, the
/// counters as things happen) and read by the publishers
/// ([`Metrics::render`]).
#[derive(Debug, Clone)]
pub struct Metrics {
    inner: Arc<Mutex<State>>,
}

#[derive(Debug)]
struct State {
    constant: ConstantLabels,
    version: String,
    tick: Option<Tick>,
    actions: BTreeMap<String, u64>,
    restarts: u64,
    paused: bool,
    /// The job's printed (step, total), when it prints progress.
    progress: (Option<u64>, Option<u64>),
    /// The newest stop, restart or kill: its labels and when (Unix s).
    stop: Option<(Vec<(&'static str, String)>, f64)>,
    /// A stop was marked in this attempt (the ladder's later steps are not
    /// new stops).
    stop_marked: bool,
    /// The newest save the companion reported: step, when (Unix s).
    saved: Option<(u64, f64)>,
}

/// What one tick contributed, already reduced to metric values.
#[derive(Debug, Clone, PartialEq)]
struct Tick {
    footprint: u64,
    tree_pss: u64,
    tree_rss: u64,
    tree_uss: u64,
    tree_swap: u64,
    role_pss: [(Role, u64); 4],
    headroom: Option<u64>,
    ceilings: Vec<(&'static str, u64)>,
    eta: Option<f64>,
    cgroup_usage: Option<u64>,
    cgroup_oom_kills: Option<u64>,
    /// (MemAvailable, swap used); `None` when /proc/meminfo was not read.
    system: Option<(u64, u64)>,
    psi: Option<(f64, f64)>,
    /// (index, uuid, used, total).
    gpus: Vec<(u32, String, u64, u64)>,
}

impl Metrics {
    /// An empty registry. `version` goes into `oomguard_build_info`;
    /// `constant` labels go on every series.
    pub fn new(constant: ConstantLabels, version: &str) -> Self {
        let actions = ACTIONS.iter().map(|a| (a.to_string(), 0)).collect();
        Self {
            inner: Arc::new(Mutex::new(State {
                constant,
                version: version.to_string(),
                tick: None,
                actions,
                restarts: 0,
                paused: false,
                progress: (None, None),
                stop: None,
                stop_marked: false,
                saved: None,
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Nothing panics while the lock is held; if something did, the
        // numbers are still the last good ones.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes one tick's sample and view. Replaces everything the previous
    /// tick set; a value this tick does not know (no cgroup, no ETA) stops
    /// being exported.
    pub fn update(&self, sample: &Sample, view: &View) {
        // The same role totals the sample line carries (absent roles are 0).
        let mut role_pss = Role::ALL.map(|r| (r, 0u64));
        for t in crate::vocab::model::role_totals(&sample.procs) {
            if let Some(slot) = role_pss.iter_mut().find(|(r, _)| *r == t.role) {
                slot.1 = t.pss_bytes;
            }
        }
        let tick = Tick {
            footprint: sample.tree.footprint_bytes,
            tree_pss: sample.tree.pss_bytes,
            tree_rss: sample.tree.rss_bytes,
            tree_uss: sample.tree.uss_bytes,
            tree_swap: sample.tree.swap_bytes,
            role_pss,
            headroom: view.headroom_bytes(),
            ceilings: sample
                .ceilings()
                .iter()
                .map(|c| (c.ceiling.source.as_str(), c.ceiling.bytes))
                .collect(),
            eta: view.eta_seconds.filter(|e| e.is_finite()),
            cgroup_usage: sample.cgroup.as_ref().map(|c| c.usage_bytes),
            cgroup_oom_kills: sample.cgroup.as_ref().and_then(|c| c.oom_kill_count),
            // SystemReader leaves zeros when /proc/meminfo is unreadable;
            // a machine with no memory is not a reading.
            system: (sample.system.mem_total_bytes > 0).then_some((
                sample.system.mem_available_bytes,
                sample.system.swap_used_bytes,
            )),
            psi: sample.psi.map(|p| (p.some_avg10, p.full_avg10)),
            gpus: sample
                .gpus
                .iter()
                .map(|g| (g.index, g.uuid.clone(), g.used_bytes, g.total_bytes))
                .collect(),
        };
        self.lock().tick = Some(tick);
    }

    /// Counts one action (`warn`, `pause`, `resume`, `stop`, `kill`,
    /// `restart`; other names get a series of their own). Counts the
    /// action only: a restart also calls [`Metrics::restart`].
    pub fn action(&self, name: &str) {
        *self.lock().actions.entry(name.to_string()).or_insert(0) += 1;
    }

    /// Counts one restart of the job (a new attempt).
    pub fn restart(&self) {
        let mut st = self.lock();
        st.restarts += 1;
        st.stop_marked = false;
    }

    /// The attempt's stop, restart or kill began now, for `reason` (its
    /// action line's): `oomguard_stop_timestamp_seconds`, labelled with
    /// the node that caused it (`self`, or the number in `node N (rank
    /// R): …`), that rank, and the rule or fault. Once per attempt.
    pub fn stopped(&self, action: &str, reason: &str) {
        let mut st = self.lock();
        if st.stop_marked {
            return;
        }
        st.stop_marked = true;
        let (cause_node, rest) = match reason.strip_prefix("node ") {
            Some(r) => {
                let (n, rest) = r.split_once(' ').unwrap_or((r, ""));
                (n.trim_end_matches(':').to_string(), rest)
            }
            None => ("self".to_string(), reason),
        };
        let (cause_rank, rest) = match rest.strip_prefix("(rank ") {
            Some(r) => {
                let (n, rest) = r.split_once(')').unwrap_or((r, ""));
                (n.to_string(), rest.trim_start_matches(':').trim_start())
            }
            None => (String::new(), rest.trim_start_matches(':').trim_start()),
        };
        let rule = rest
            .split(':')
            .next()
            .unwrap_or_default()
            .trim()
            .to_string();
        let mut labels = vec![("action", action.to_string()), ("cause_node", cause_node)];
        if !cause_rank.is_empty() {
            labels.push(("cause_rank", cause_rank));
        }
        labels.push(("reason", rule));
        st.stop = Some((labels, unix_now()));
    }

    /// The companion reported a save of `step`: the
    /// `oomguard_checkpoint_timestamp_seconds{step}` series.
    pub fn saved(&self, step: u64) {
        self.lock().saved = Some((step, unix_now()));
    }

    /// Whether oomguard holds the job paused (`oomguard_paused` 1 / 0).
    pub fn set_paused(&self, paused: bool) {
        self.lock().paused = paused;
    }

    /// The training step and total the job last printed
    /// (`oomguard_progress_step`, `oomguard_progress_total`); `None` stops
    /// exporting them.
    pub fn set_progress(&self, step: Option<u64>, total: Option<u64>) {
        self.lock().progress = (step, total);
    }

    /// The exposition in the classic text format 0.0.4 (see the module
    /// comment for the rules it keeps).
    pub fn render(&self) -> String {
        let families = self.lock().families();
        let mut out = String::with_capacity(4096);
        for f in &families {
            f.write(&mut out);
        }
        out
    }
}

/// A sample value: bytes and counts stay exact integers.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Value {
    Int(u64),
    Float(f64),
}

impl std::fmt::Display for Value {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match *self {
            Value::Int(n) => write!(f, "{n}"),
            Value::Float(x) if x.is_nan() => f.write_str("NaN"),
            Value::Float(x) if x == f64::INFINITY => f.write_str("+Inf"),
            Value::Float(x) if x == f64::NEG_INFINITY => f.write_str("-Inf"),
            // Rust's Display never uses exponent notation and round-trips,
            // both fine for Prometheus's parser.
            Value::Float(x) => write!(f, "{x}"),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Gauge,
    Counter,
}

#[derive(Debug)]
struct Family {
    name: &'static str,
    help: &'static str,
    kind: Kind,
    /// Label pairs (already merged with the constant labels and sorted by
    /// name) and value.
    series: Vec<(Vec<(String, String)>, Value)>,
}

impl Family {
    fn write(&self, out: &mut String) {
        if self.series.is_empty() {
            // No HELP/TYPE without samples: an empty family in one textfile
            // and a full one in another would still agree, but there is no
            // reason to show a metric that has nothing to say.
            return;
        }
        let kind = match self.kind {
            Kind::Gauge => "gauge",
            Kind::Counter => "counter",
        };
        let _ = writeln!(out, "# HELP {} {}", self.name, escape_help(self.help));
        let _ = writeln!(out, "# TYPE {} {kind}", self.name);
        for (labels, value) in &self.series {
            out.push_str(self.name);
            if !labels.is_empty() {
                out.push('{');
                for (i, (k, v)) in labels.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    let _ = write!(out, "{k}=\"{}\"", escape_label_value(v));
                }
                out.push('}');
            }
            let _ = writeln!(out, " {value}");
        }
    }
}

/// Escapes a label value for the text format: backslash, double quote and
/// line feed.
pub fn escape_label_value(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// Escapes HELP text: backslash and line feed (quotes are literal there).
fn escape_help(v: &str) -> String {
    v.replace('\\', "\\\\").replace('\n', "\\n")
}

/// Builds one family at a time, adding the constant labels to each series.
struct Builder<'a> {
    constant: &'a ConstantLabels,
    families: Vec<Family>,
}

impl Builder<'_> {
    fn family(&mut self, name: &'static str, kind: Kind, help: &'static str) -> &mut Family {
        self.families.push(Family {
            name,
            help,
            kind,
            series: Vec::new(),
        });
        let last = self.families.len() - 1;
        &mut self.families[last]
    }

    fn labels(&self, own: &[(&str, String)]) -> Vec<(String, String)> {
        let mut all: Vec<(String, String)> = self
            .constant
            .iter()
            .filter(|(k, _)| !own.iter().any(|(o, _)| o == k))
            .map(|(k, v)| (k.clone(), v.clone()))
            .chain(own.iter().map(|(k, v)| ((*k).to_string(), v.clone())))
            .collect();
        all.sort();
        all
    }

    fn one(&mut self, name: &'static str, kind: Kind, help: &'static str, value: Option<Value>) {
        let labels = self.labels(&[]);
        let f = self.family(name, kind, help);
        if let Some(v) = value {
            f.series.push((labels, v));
        }
    }

    fn many(
        &mut self,
        name: &'static str,
        kind: Kind,
        help: &'static str,
        series: Vec<(Vec<(&str, String)>, Value)>,
    ) {
        let series: Vec<_> = series
            .into_iter()
            .map(|(own, v)| (self.labels(&own), v))
            .collect();
        let f = self.family(name, kind, help);
        f.series = series;
        f.series.sort_by(|a, b| a.0.cmp(&b.0));
    }
}

impl State {
    fn families(&self) -> Vec<Family> {
        let mut b = Builder {
            constant: &self.constant,
            families: Vec::with_capacity(24),
        };
        let t = self.tick.as_ref();
        tree_families(&mut b, t);
        machine_families(&mut b, t);
        gpu_families(&mut b, t);
        self.run_families(&mut b);
        let mut families = b.families;
        families.sort_by_key(|f| f.name);
        families
    }

    /// What oomguard did and where the job is: actions, restarts, pause,
    /// progress, version.
    fn run_families(&self, b: &mut Builder<'_>) {
        use Kind::{Counter, Gauge};
        let int = |x: u64| Some(Value::Int(x));
        b.many(
            "oomguard_actions_total",
            Counter,
            "Actions oomguard took, by action.",
            self.actions
                .iter()
                .map(|(a, n)| (vec![("action", a.clone())], Value::Int(*n)))
                .collect(),
        );
        b.one(
            "oomguard_restarts_total",
            Counter,
            "Times oomguard restarted the job.",
            int(self.restarts),
        );
        b.one(
            "oomguard_paused",
            Gauge,
            "1 while oomguard holds the job paused, else 0.",
            int(u64::from(self.paused)),
        );
        b.one(
            "oomguard_progress_step",
            Gauge,
            "The training step the job last printed (its counter before '/').",
            self.progress.0.map(Value::Int),
        );
        b.one(
            "oomguard_progress_total",
            Gauge,
            "The total of the job's progress bar (the number after '/').",
            self.progress.1.map(Value::Int),
        );
        if let Some((labels, at)) = &self.stop {
            b.many(
                "oomguard_stop_timestamp_seconds",
                Gauge,
                "When the newest stop, restart or kill began (Unix seconds), with the node and rank that caused it and why: a Grafana annotation (useValueForTime).",
                vec![(labels.clone(), Value::Float(*at))],
            );
        }
        if let Some((step, at)) = self.saved {
            b.many(
                "oomguard_checkpoint_timestamp_seconds",
                Gauge,
                "When the companion's newest save finished (Unix seconds), with its step.",
                vec![(vec![("step", step.to_string())], Value::Float(at))],
            );
        }
        b.many(
            "oomguard_build_info",
            Gauge,
            "oomguard's version; always 1.",
            vec![(vec![("version", self.version.clone())], Value::Int(1))],
        );
    }
}

/// The job's tree: sums, roles, headroom, ceilings, ETA.
fn tree_families(b: &mut Builder<'_>, t: Option<&Tick>) {
    use Kind::Gauge;
    let int = |x: u64| Some(Value::Int(x));
    b.one(
        "oomguard_footprint_bytes",
        Gauge,
        "The job's memory footprint, the figure compared with its ceilings: the working set of the cgroup oomguard runs it in, or else the PSS sum.",
        t.and_then(|t| int(t.footprint)),
    );
    b.one(
        "oomguard_tree_pss_bytes",
        Gauge,
        "Proportional set size summed over the job's process tree (the PSS sum).",
        t.and_then(|t| int(t.tree_pss)),
    );
    b.one(
            "oomguard_tree_rss_bytes",
            Gauge,
            "Resident set size summed over the job's process tree (double-counts pages shared by forked workers).",
            t.and_then(|t| int(t.tree_rss)),
        );
    b.one(
        "oomguard_tree_uss_bytes",
        Gauge,
        "Unique (private) set size summed over the job's process tree.",
        t.and_then(|t| int(t.tree_uss)),
    );
    b.one(
        "oomguard_tree_swap_bytes",
        Gauge,
        "Swap used by the job's process tree (proportional share).",
        t.and_then(|t| int(t.tree_swap)),
    );
    b.many(
        "oomguard_role_pss_bytes",
        Gauge,
        "Proportional set size of the job's processes by role (launcher, trainer, worker, other).",
        t.map(|t| {
            t.role_pss
                .iter()
                .map(|(r, v)| (vec![("role", r.as_str().to_string())], Value::Int(*v)))
                .collect()
        })
        .unwrap_or_default(),
    );
    b.one(
        "oomguard_headroom_bytes",
        Gauge,
        "How much more the job can grow before its nearest ceiling.",
        t.and_then(|t| t.headroom).map(Value::Int),
    );
    b.many(
        "oomguard_ceiling_bytes",
        Gauge,
        "Limits the job must stay under, by source (cgroup, budget, system, shm).",
        t.map(|t| {
            t.ceilings
                .iter()
                .map(|(s, v)| (vec![("source", (*s).to_string())], Value::Int(*v)))
                .collect()
        })
        .unwrap_or_default(),
    );
    b.one(
            "oomguard_eta_seconds",
            Gauge,
            "Predicted seconds until headroom reaches zero at the current growth; absent when not growing for sure or further than an hour.",
            t.and_then(|t| t.eta)
                .map(|e| Value::Float((e * 1000.0).round() / 1000.0)),
        );
}

/// The job's cgroup, the machine's memory and pressure.
fn machine_families(b: &mut Builder<'_>, t: Option<&Tick>) {
    use Kind::{Counter, Gauge};
    b.one(
        "oomguard_cgroup_memory_usage_bytes",
        Gauge,
        "Memory usage of the job's cgroup, page cache included.",
        t.and_then(|t| t.cgroup_usage).map(Value::Int),
    );
    b.one(
        "oomguard_cgroup_oom_kills_total",
        Counter,
        "Processes the kernel OOM killer killed in the job's cgroup.",
        t.and_then(|t| t.cgroup_oom_kills).map(Value::Int),
    );
    b.one(
        "oomguard_system_memory_available_bytes",
        Gauge,
        "MemAvailable of the machine.",
        t.and_then(|t| t.system).map(|s| Value::Int(s.0)),
    );
    b.one(
        "oomguard_swap_used_bytes",
        Gauge,
        "Swap used on the machine.",
        t.and_then(|t| t.system).map(|s| Value::Int(s.1)),
    );
    b.one(
        "oomguard_pressure_memory_some_avg10",
        Gauge,
        "Memory pressure: percent of the last 10 s some tasks stalled on memory.",
        t.and_then(|t| t.psi).map(|p| Value::Float(p.0)),
    );
    b.one(
        "oomguard_pressure_memory_full_avg10",
        Gauge,
        "Memory pressure: percent of the last 10 s all tasks stalled on memory.",
        t.and_then(|t| t.psi).map(|p| Value::Float(p.1)),
    );
}

/// Each GPU's memory.
fn gpu_families(b: &mut Builder<'_>, t: Option<&Tick>) {
    use Kind::Gauge;
    let gpu = |pick: fn(&(u32, String, u64, u64)) -> u64| {
        t.map(|t| {
            t.gpus
                .iter()
                .map(|g| {
                    (
                        vec![("gpu", g.0.to_string()), ("uuid", g.1.clone())],
                        Value::Int(pick(g)),
                    )
                })
                .collect::<Vec<_>>()
        })
        .unwrap_or_default()
    };
    b.many(
        "oomguard_gpu_memory_used_bytes",
        Gauge,
        "GPU memory in use on the device (all processes).",
        gpu(|g| g.2),
    );
    b.many(
        "oomguard_gpu_memory_total_bytes",
        Gauge,
        "GPU memory of the device.",
        gpu(|g| g.3),
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vocab::model::{
        CgroupSample, GpuSample, History, ProcSample, Psi, SystemSample, TreeTotals,
    };

    fn proc(pid: u32, role: Role, pss: u64) -> ProcSample {
        ProcSample {
            pid,
            ppid: 1,
            role,
            comm: "python3".into(),
            rss_bytes: pss * 2,
            pss_bytes: pss,
            uss_bytes: pss / 2,
            swap_bytes: 0,
            rss_peak_bytes: None,
            gpu_bytes: None,
            read_age_seconds: None,
            torch: None,
            start_time: u64::from(pid),
            stopped: false,
        }
    }

    /// A full sample: cgroup, budget, PSI, one GPU, three roles.
    fn full_sample() -> Sample {
        let procs = vec![
            proc(10, Role::Launcher, 1_000),
            proc(11, Role::Trainer, 500_000),
            proc(12, Role::Worker, 100_000),
            proc(13, Role::Worker, 150_000),
        ];
        Sample {
            t: 12.0,
            tree: TreeTotals {
                procs: 4,
                rss_bytes: 1_502_000,
                pss_bytes: 751_000,
                uss_bytes: 375_500,
                swap_bytes: 4096,
                footprint_bytes: 751_000,
                pss_age_seconds: 0.5,
            },
            procs,
            system: SystemSample {
                mem_total_bytes: 16_000_000,
                mem_available_bytes: 9_000_000,
                swap_total_bytes: 1_000_000,
                swap_used_bytes: 8192,
                ..Default::default()
            },
            cgroup: Some(CgroupSample {
                version: 2,
                path: "/job".into(),
                usage_bytes: 900_000,
                limit_bytes: Some(2_000_000),
                oom_kill_count: Some(1),
                limit_path: None,
                limit_working_set_bytes: Some(800_000),
                owned: true,
            }),
            psi: Some(Psi {
                some_avg10: 1.25,
                full_avg10: 0.0,
            }),
            gpus: vec![GpuSample {
                index: 0,
                name: "Fake GPU".into(),
                uuid: "GPU-1234".into(),
                used_bytes: 3_000_000,
                total_bytes: 8_000_000,
                free_bytes: 5_000_000,
                ..Default::default()
            }],
            shm: None,
            budget_bytes: Some(1_000_000),
            others_bytes: 0,
        }
    }

    fn view_for(sample: &Sample, eta: Option<f64>) -> View {
        View {
            t: sample.t,
            nearest: sample.nearest(),
            eta_seconds: eta,
            headroom_slope: None,
            fastest: None,
        }
    }

    fn labels(pairs: &[(&str, &str)]) -> ConstantLabels {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    const GOLDEN: &str = r#"# HELP oomguard_actions_total Actions oomguard took, by action.
# TYPE oomguard_actions_total counter
oomguard_actions_total{action="kill",job_id="42",node="n1",rank="3"} 0
oomguard_actions_total{action="pause",job_id="42",node="n1",rank="3"} 0
oomguard_actions_total{action="restart",job_id="42",node="n1",rank="3"} 1
oomguard_actions_total{action="resume",job_id="42",node="n1",rank="3"} 0
oomguard_actions_total{action="stop",job_id="42",node="n1",rank="3"} 0
oomguard_actions_total{action="warn",job_id="42",node="n1",rank="3"} 2
# HELP oomguard_build_info oomguard's version; always 1.
# TYPE oomguard_build_info gauge
oomguard_build_info{job_id="42",node="n1",rank="3",version="9.9.9"} 1
# HELP oomguard_ceiling_bytes Limits the job must stay under, by source (cgroup, budget, system, shm).
# TYPE oomguard_ceiling_bytes gauge
oomguard_ceiling_bytes{job_id="42",node="n1",rank="3",source="budget"} 1000000
oomguard_ceiling_bytes{job_id="42",node="n1",rank="3",source="cgroup"} 2000000
oomguard_ceiling_bytes{job_id="42",node="n1",rank="3",source="system"} 16000000
# HELP oomguard_cgroup_memory_usage_bytes Memory usage of the job's cgroup, page cache included.
# TYPE oomguard_cgroup_memory_usage_bytes gauge
oomguard_cgroup_memory_usage_bytes{job_id="42",node="n1",rank="3"} 900000
# HELP oomguard_cgroup_oom_kills_total Processes the kernel OOM killer killed in the job's cgroup.
# TYPE oomguard_cgroup_oom_kills_total counter
oomguard_cgroup_oom_kills_total{job_id="42",node="n1",rank="3"} 1
# HELP oomguard_eta_seconds Predicted seconds until headroom reaches zero at the current growth; absent when not growing for sure or further than an hour.
# TYPE oomguard_eta_seconds gauge
oomguard_eta_seconds{job_id="42",node="n1",rank="3"} 81.5
# HELP oomguard_footprint_bytes The job's memory footprint, the figure compared with its ceilings: the working set of the cgroup oomguard runs it in, or else the PSS sum.
# TYPE oomguard_footprint_bytes gauge
oomguard_footprint_bytes{job_id="42",node="n1",rank="3"} 751000
# HELP oomguard_gpu_memory_total_bytes GPU memory of the device.
# TYPE oomguard_gpu_memory_total_bytes gauge
oomguard_gpu_memory_total_bytes{gpu="0",job_id="42",node="n1",rank="3",uuid="GPU-1234"} 8000000
# HELP oomguard_gpu_memory_used_bytes GPU memory in use on the device (all processes).
# TYPE oomguard_gpu_memory_used_bytes gauge
oomguard_gpu_memory_used_bytes{gpu="0",job_id="42",node="n1",rank="3",uuid="GPU-1234"} 3000000
# HELP oomguard_headroom_bytes How much more the job can grow before its nearest ceiling.
# TYPE oomguard_headroom_bytes gauge
oomguard_headroom_bytes{job_id="42",node="n1",rank="3"} 249000
# HELP oomguard_paused 1 while oomguard holds the job paused, else 0.
# TYPE oomguard_paused gauge
oomguard_paused{job_id="42",node="n1",rank="3"} 1
# HELP oomguard_pressure_memory_full_avg10 Memory pressure: percent of the last 10 s all tasks stalled on memory.
# TYPE oomguard_pressure_memory_full_avg10 gauge
oomguard_pressure_memory_full_avg10{job_id="42",node="n1",rank="3"} 0
# HELP oomguard_pressure_memory_some_avg10 Memory pressure: percent of the last 10 s some tasks stalled on memory.
# TYPE oomguard_pressure_memory_some_avg10 gauge
oomguard_pressure_memory_some_avg10{job_id="42",node="n1",rank="3"} 1.25
# HELP oomguard_restarts_total Times oomguard restarted the job.
# TYPE oomguard_restarts_total counter
oomguard_restarts_total{job_id="42",node="n1",rank="3"} 1
# HELP oomguard_role_pss_bytes Proportional set size of the job's processes by role (launcher, trainer, worker, other).
# TYPE oomguard_role_pss_bytes gauge
oomguard_role_pss_bytes{job_id="42",node="n1",rank="3",role="launcher"} 1000
oomguard_role_pss_bytes{job_id="42",node="n1",rank="3",role="other"} 0
oomguard_role_pss_bytes{job_id="42",node="n1",rank="3",role="trainer"} 500000
oomguard_role_pss_bytes{job_id="42",node="n1",rank="3",role="worker"} 250000
# HELP oomguard_swap_used_bytes Swap used on the machine.
# TYPE oomguard_swap_used_bytes gauge
oomguard_swap_used_bytes{job_id="42",node="n1",rank="3"} 8192
# HELP oomguard_system_memory_available_bytes MemAvailable of the machine.
# TYPE oomguard_system_memory_available_bytes gauge
oomguard_system_memory_available_bytes{job_id="42",node="n1",rank="3"} 9000000
# HELP oomguard_tree_pss_bytes Proportional set size summed over the job's process tree (the PSS sum).
# TYPE oomguard_tree_pss_bytes gauge
oomguard_tree_pss_bytes{job_id="42",node="n1",rank="3"} 751000
# HELP oomguard_tree_rss_bytes Resident set size summed over the job's process tree (double-counts pages shared by forked workers).
# TYPE oomguard_tree_rss_bytes gauge
oomguard_tree_rss_bytes{job_id="42",node="n1",rank="3"} 1502000
# HELP oomguard_tree_swap_bytes Swap used by the job's process tree (proportional share).
# TYPE oomguard_tree_swap_bytes gauge
oomguard_tree_swap_bytes{job_id="42",node="n1",rank="3"} 4096
# HELP oomguard_tree_uss_bytes Unique (private) set size summed over the job's process tree.
# TYPE oomguard_tree_uss_bytes gauge
oomguard_tree_uss_bytes{job_id="42",node="n1",rank="3"} 375500
"#;

    #[test]
    fn golden_exposition() {
        let m = Metrics::new(
            labels(&[("job_id", "42"), ("rank", "3"), ("node", "n1")]),
            "9.9.9",
        );
        let s = full_sample();
        m.update(&s, &view_for(&s, Some(81.500_04)));
        m.action("warn");
        m.action("warn");
        m.action("restart");
        m.restart();
        m.set_paused(true);
        let text = m.render();
        assert_eq!(text, GOLDEN, "got:\n{text}");
        // Stable: rendering again gives the same bytes.
        assert_eq!(m.render(), text);
    }

    #[test]
    fn before_the_first_tick_only_counters_and_info() {
        let m = Metrics::new(ConstantLabels::new(), "1.0.0");
        let text = m.render();
        let names: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("# TYPE"))
            .filter_map(|l| l.split(' ').nth(2))
            .collect();
        assert_eq!(
            names,
            [
                "oomguard_actions_total",
                "oomguard_build_info",
                "oomguard_paused",
                "oomguard_restarts_total"
            ]
        );
        for a in ACTIONS {
            assert!(
                text.contains(&format!("oomguard_actions_total{{action=\"{a}\"}} 0\n")),
                "{a}: {text}"
            );
        }
        assert!(text.contains("oomguard_build_info{version=\"1.0.0\"} 1\n"));
        assert!(text.contains("oomguard_paused 0\n"));
    }

    #[test]
    fn unknown_values_are_omitted_not_zero() {
        let m = Metrics::new(ConstantLabels::new(), "1");
        let mut s = full_sample();
        s.cgroup = None;
        s.psi = None;
        s.gpus.clear();
        s.budget_bytes = None;
        s.system = SystemSample::default();
        m.update(&s, &view_for(&s, None));
        let text = m.render();
        for gone in [
            "oomguard_eta_seconds",
            "oomguard_cgroup_",
            "oomguard_pressure_",
            "oomguard_gpu_",
            "oomguard_headroom_bytes",
            "oomguard_ceiling_bytes",
            "oomguard_system_memory_available_bytes",
            "oomguard_swap_used_bytes",
        ] {
            assert!(!text.contains(gone), "{gone} should be absent:\n{text}");
        }
        assert!(text.contains("oomguard_tree_pss_bytes 751000\n"));

        // A later tick that knows them brings them back; the next that does
        // not drops them again.
        let full = full_sample();
        m.update(&full, &view_for(&full, Some(3.0)));
        assert!(m.render().contains("oomguard_eta_seconds 3\n"));
        m.update(&full, &view_for(&full, None));
        assert!(!m.render().contains("oomguard_eta_seconds"));
    }

    #[test]
    fn view_from_history_feeds_headroom_and_eta() {
        let m = Metrics::new(ConstantLabels::new(), "1");
        let mut h = History::new(30.0);
        for i in 0..10u64 {
            let mut s = full_sample();
            s.cgroup = None;
            s.t = i as f64;
            s.budget_bytes = Some(1000 << 20);
            s.system.mem_total_bytes = 1 << 40;
            s.system.mem_available_bytes = 1 << 39;
            s.tree.footprint_bytes = (100 + 10 * i) << 20;
            m.update(&s, &h.push(&s));
        }
        let text = m.render();
        // Budget 1000 MiB − 190 MiB at 10 MiB/s: 81 s.
        assert!(
            text.contains("oomguard_headroom_bytes 849346560\n"),
            "{text}"
        );
        assert!(text.contains("oomguard_eta_seconds 81\n"), "{text}");
    }

    #[test]
    fn label_values_are_escaped() {
        let m = Metrics::new(labels(&[("job_id", "a\"b\\c\nd"), ("node", "ünï")]), "1");
        m.action("odd\"name");
        let text = m.render();
        assert!(
            text.contains(r#"oomguard_paused{job_id="a\"b\\c\nd",node="ünï"} 0"#),
            "{text}"
        );
        assert!(text.contains(r#"action="odd\"name""#), "{text}");
        // Every sample stays on one line.
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            assert!(line.starts_with("oomguard_"), "{line}");
        }
    }

    #[test]
    fn help_escaping() {
        assert_eq!(escape_help("a\\b\nc \"q\""), "a\\\\b\\nc \"q\"");
    }

    #[test]
    fn values() {
        assert_eq!(Value::Int(u64::MAX).to_string(), "18446744073709551615");
        assert_eq!(Value::Float(0.25).to_string(), "0.25");
        assert_eq!(Value::Float(3.0).to_string(), "3");
        assert_eq!(Value::Float(f64::NAN).to_string(), "NaN");
        assert_eq!(Value::Float(f64::INFINITY).to_string(), "+Inf");
        assert_eq!(Value::Float(f64::NEG_INFINITY).to_string(), "-Inf");
        assert_eq!(Value::Float(1e21).to_string(), "1000000000000000000000");
    }

    #[test]
    fn constant_labels_from_slurm_and_torchrun() {
        let slurm = [
            ("SLURM_JOB_ID", "42"),
            ("SLURM_PROCID", "7"),
            ("SLURM_LOCALID", "1"),
            ("PATH", "/bin"),
        ];
        assert_eq!(
            constant_labels_from_env(slurm, Some("node-a\n")),
            labels(&[
                ("job_id", "42"),
                ("local_rank", "1"),
                ("node", "node-a"),
                ("rank", "7")
            ])
        );
        // torchrun's RANK / LOCAL_RANK win over SLURM's ids (under srun +
        // torchrun, SLURM_PROCID numbers the launcher, not the worker).
        let both = [
            ("SLURM_JOB_ID", "42"),
            ("SLURM_PROCID", "0"),
            ("RANK", "3"),
            ("LOCAL_RANK", "3"),
            ("SLURM_LOCALID", "0"),
        ];
        let l = constant_labels_from_env(both, None);
        assert_eq!(l.get("rank").map(String::as_str), Some("3"));
        assert_eq!(l.get("local_rank").map(String::as_str), Some("3"));
        assert_eq!(l.get("node"), None);
        // Empty values are no label.
        let empty = [("SLURM_JOB_ID", " "), ("RANK", "")];
        assert!(constant_labels_from_env(empty, Some("")).is_empty());
    }

    #[test]
    fn clones_share_state() {
        let m = Metrics::new(ConstantLabels::new(), "1");
        let other = m.clone();
        other.action("kill");
        other.set_paused(true);
        let text = m.render();
        assert!(text.contains("oomguard_actions_total{action=\"kill\"} 1\n"));
        assert!(text.contains("oomguard_paused 1\n"));
    }

    #[test]
    fn a_stop_is_marked_once_per_attempt_with_its_cause_node() {
        let m = Metrics::new(ConstantLabels::new(), "1");
        m.stopped(
            "stop",
            "node 1 (rank 3): critical-eta: headroom 261 MiB (16.3%)",
        );
        // The ladder's SIGTERM later in the same stop is not a new stop.
        m.stopped("stop", "critical-eta: terminating the rest of the tree");
        m.saved(245);
        let text = m.render();
        let line = text
            .lines()
            .find(|l| l.starts_with("oomguard_stop_timestamp_seconds{"))
            .unwrap();
        assert!(
            line.starts_with(
                r#"oomguard_stop_timestamp_seconds{action="stop",cause_node="1",cause_rank="3",reason="critical-eta"} "#
            ),
            "{line}"
        );
        assert!(text.contains(r#"oomguard_checkpoint_timestamp_seconds{step="245"} "#));
        m.restart();
        m.stopped(
            "restart",
            "rank-stopped: rank 1 (pid 9) stopped by a signal for 5s",
        );
        let text = m.render();
        assert!(
            text.contains(
                r#"oomguard_stop_timestamp_seconds{action="restart",cause_node="self",reason="rank-stopped"} "#
            ),
            "{text}"
        );
    }
}
