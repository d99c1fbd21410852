//! Grouping the lines of a kernel log into OOM reports and reports into
//! kills. A report's lines (invoker, memcg figures, task table, summary)
//! come one at a time and some may be missing from the log, so what has been
//! seen is kept per report and attached to the kills it produced.

use super::line::{Killed, Msg, PrefixKind, Stamp, Summary, classify, split_transport};
use super::{Evidence, Invoker, OomKill, Selected, TaskRow};

/// Lines of one report are printed within milliseconds (the asynchronous
/// `oom_reaper` line up to a few seconds later). A larger jump in the
/// timestamps means the text was cut and the lines around the jump belong
/// to different reports, so report context must not leak across it.
const REPORT_GAP_SECONDS: f64 = 60.0;

/// Timestamps from different CPUs, or syslog's one-second resolution, can
/// step back a little within one report; a larger step back is a reboot or
/// a concatenation of logs.
const BACKWARD_TOLERANCE_SECONDS: f64 = 1.0;

// ---------------------------------------------------------------------------
// Task table rows.

/// Column layouts of tables whose header line is not in the log, by the
/// number of numeric columns. `None` marks a column whose meaning differs
/// between layouts with that count.
const HEADERLESS_10: [Option<&str>; 10] = [
    Some("uid"),
    Some("tgid"),
    Some("total_vm"),
    Some("rss"),
    Some("rss_anon"),
    Some("rss_file"),
    Some("rss_shmem"),
    Some("pgtables_bytes"),
    Some("swapents"),
    Some("oom_score_adj"),
];
const HEADERLESS_8: [Option<&str>; 8] = [
    Some("uid"),
    Some("tgid"),
    Some("total_vm"),
    Some("rss"),
    Some("nr_ptes"),
    Some("nr_pmds"),
    Some("swapents"),
    Some("oom_score_adj"),
];
/// 2.6.36–3.x `cpu oom_adj oom_score_adj`, told apart from the 3.x/4.x
/// `nr_ptes swapents` and `pgtables_bytes swapents` layouts (also 7
/// columns) by the `oom_adj=` of the invoker line.
const HEADERLESS_7_LEGACY: [Option<&str>; 7] = [
    Some("uid"),
    Some("tgid"),
    Some("total_vm"),
    Some("rss"),
    Some("cpu"),
    Some("oom_adj"),
    Some("oom_score_adj"),
];
const HEADERLESS_7: [Option<&str>; 7] = [
    Some("uid"),
    Some("tgid"),
    Some("total_vm"),
    Some("rss"),
    None,
    None,
    Some("oom_score_adj"),
];
/// 2.6.32 before `oom_score_adj` existed.
const HEADERLESS_6: [Option<&str>; 6] = [
    Some("uid"),
    Some("tgid"),
    Some("total_vm"),
    Some("rss"),
    Some("cpu"),
    Some("oom_adj"),
];

/// Splits a row's text after `[pid]` into whitespace-separated tokens with
/// their byte offsets, so the name (which may contain spaces) can be taken
/// verbatim from the rest of the line.
fn tokens_with_offsets(s: &str) -> Vec<(usize, &str)> {
    let mut out = Vec::new();
    let mut start = None;
    for (i, ch) in s.char_indices() {
        if ch.is_whitespace() {
            if let Some(st) = start.take() {
                out.push((st, &s[st..i]));
            }
        } else if start.is_none() {
            start = Some(i);
        }
    }
    if let Some(st) = start {
        out.push((st, &s[st..]));
    }
    out
}

pub(super) fn parse_row(
    pid: u32,
    rest: &str,
    header: Option<&[String]>,
    legacy: bool,
) -> Option<TaskRow> {
    let tokens = tokens_with_offsets(rest);
    let numeric = tokens
        .iter()
        .take_while(|(_, t)| t.parse::<i64>().is_ok())
        .count();
    let with_header: Option<Vec<Option<&str>>> = header
        .filter(|h| !h.is_empty() && numeric >= h.len() && tokens.len() > h.len())
        .map(|h| h.iter().map(|c| Some(c.as_str())).collect());
    let columns: Vec<Option<&str>> = match with_header {
        Some(c) => c,
        None => {
            // The name needs at least one token; a numeric name (rare) was
            // counted as a column, so fall back to the next known width.
            let available = numeric.min(tokens.len().saturating_sub(1));
            let width = [10, 8, 7, 6].into_iter().find(|w| *w <= available)?;
            match width {
                10 => HEADERLESS_10.to_vec(),
                8 => HEADERLESS_8.to_vec(),
                7 if legacy => HEADERLESS_7_LEGACY.to_vec(),
                7 => HEADERLESS_7.to_vec(),
                _ => HEADERLESS_6.to_vec(),
            }
        }
    };
    let name_at = tokens.get(columns.len())?.0;
    let mut row = TaskRow {
        pid,
        uid: None,
        tgid: None,
        total_vm_pages: None,
        rss_pages: None,
        rss_anon_pages: None,
        rss_file_pages: None,
        rss_shmem_pages: None,
        pgtables_bytes: None,
        nr_ptes: None,
        nr_pmds: None,
        swapents: None,
        oom_score_adj: None,
        oom_adj: None,
        cpu: None,
        name: rest[name_at..].trim_end().to_owned(),
    };
    for (col, (_, tok)) in columns.iter().zip(tokens.iter()) {
        let Some(col) = col else { continue };
        let Ok(v) = tok.parse::<i64>() else { continue };
        let unsigned = u64::try_from(v).ok();
        match *col {
            "uid" => row.uid = u32::try_from(v).ok(),
            "tgid" => row.tgid = u32::try_from(v).ok(),
            "total_vm" => row.total_vm_pages = unsigned,
            "rss" => row.rss_pages = unsigned,
            "rss_anon" => row.rss_anon_pages = unsigned,
            "rss_file" => row.rss_file_pages = unsigned,
            "rss_shmem" => row.rss_shmem_pages = unsigned,
            "pgtables_bytes" => row.pgtables_bytes = unsigned,
            "nr_ptes" => row.nr_ptes = unsigned,
            "nr_pmds" => row.nr_pmds = unsigned,
            "swapents" => row.swapents = unsigned,
            "oom_score_adj" => row.oom_score_adj = i32::try_from(v).ok(),
            "oom_adj" => row.oom_adj = i32::try_from(v).ok(),
            "cpu" => row.cpu = u32::try_from(v).ok(),
            _ => {}
        }
    }
    Some(row)
}

// ---------------------------------------------------------------------------
// Grouping lines into reports and reports into kills.

/// What has been seen of the report in progress.
#[derive(Debug, Default)]
struct Report {
    invoker: Option<Invoker>,
    /// The invoker line printed `oom_adj=` (2.6.x table layout).
    legacy: bool,
    columns: Option<Vec<String>>,
    tasks: Vec<TaskRow>,
    memcg_hint: bool,
    usage: Option<u64>,
    limit: Option<u64>,
    stats_path: Option<String>,
    task_in: Option<(String, String)>,
    summary: Option<Summary>,
    summary_stamp: Stamp,
    summary_used: bool,
    selection: Option<Killed>,
    selection_stamp: Stamp,
    selection_used: bool,
    oom_group: Option<String>,
    /// The kind named by the first kill or selection line with a prefix,
    /// for the lines of the same report that have none.
    kind: Option<PrefixKind>,
    /// A kill has come out of this report.
    killed: bool,
}

#[derive(Default)]
pub(super) struct Parser {
    pub(super) kills: Vec<OomKill>,
    report: Report,
    /// The running kernel's release: valid until the log shows a reboot.
    kernel_version: Option<String>,
    last_mono: Option<f64>,
    last_wall: Option<f64>,
}

impl Parser {
    /// One logical line of the log.
    pub(super) fn line(&mut self, line: &str) {
        let Some((stamp, msg)) = split_transport(line) else {
            return;
        };
        self.observe_time(&stamp);
        self.handle(classify(msg), &stamp);
    }

    /// Ends the report in progress when the timestamps jump, so fragments
    /// of different reports are not merged.
    fn observe_time(&mut self, stamp: &Stamp) {
        let (now, last) = match (stamp.mono, stamp.wall) {
            (Some(m), _) => (m, self.last_mono),
            (None, Some(w)) => (w, self.last_wall),
            (None, None) => return,
        };
        if let Some(prev) = last {
            if now < prev - BACKWARD_TOLERANCE_SECONDS {
                // A reboot or a concatenation of logs: also forget the kernel.
                self.finish_report();
                self.kernel_version = None;
            } else if now > prev + REPORT_GAP_SECONDS {
                self.finish_report();
            }
        }
        if stamp.mono.is_some() {
            self.last_mono = stamp.mono;
        }
        if stamp.wall.is_some() {
            self.last_wall = stamp.wall;
        }
    }

    /// A line that belongs before the kill of a report: once this report
    /// has killed, such a line starts the next report (whose invoker line
    /// may have been filtered out).
    fn section(&mut self) {
        if self.report.killed {
            self.finish_report();
        }
    }

    fn handle(&mut self, msg: Msg<'_>, stamp: &Stamp) {
        match msg {
            Msg::Other => {}
            Msg::LinuxVersion(v) => {
                self.finish_report();
                self.kernel_version = Some(v);
            }
            Msg::Invoker(inv, legacy) => {
                self.finish_report();
                self.report.invoker = Some(inv);
                self.report.legacy = legacy;
            }
            Msg::CpuHeader { pid, comm, version } => {
                if version.is_some() {
                    self.kernel_version = version;
                }
                self.section();
                if let Some(inv) = &mut self.report.invoker
                    && inv.pid.is_none()
                    && inv.comm == comm
                {
                    inv.pid = Some(pid);
                }
            }
            Msg::Section => self.section(),
            Msg::MemcgTrace => {
                self.section();
                self.report.memcg_hint = true;
            }
            Msg::MemcgUsage { usage, limit } => {
                self.section();
                self.report.memcg_hint = true;
                self.report.usage = usage;
                self.report.limit = limit;
            }
            Msg::MemcgStats(path) => {
                self.section();
                self.report.memcg_hint = true;
                // Older kernels print stats for each cgroup below the limited
                // one; the first is the limited cgroup itself.
                if self.report.stats_path.is_none() {
                    self.report.stats_path = Some(path);
                }
            }
            Msg::TaskIn { task, limit } => {
                self.section();
                self.report.memcg_hint = true;
                self.report.task_in = Some((task, limit));
            }
            Msg::TableHeader(cols) => {
                self.section();
                self.report.columns = Some(cols);
            }
            Msg::TableRow { pid, rest } => {
                self.section();
                let header = self.report.columns.as_deref();
                if let Some(row) = parse_row(pid, rest, header, self.report.legacy) {
                    self.report.tasks.push(row);
                }
            }
            Msg::Summary(summary) => {
                self.section();
                if self.report.summary.is_some() && !self.report.summary_used {
                    // Two summaries without a kill line between them (e.g.
                    // `dmesg | grep oom-kill`): the first was its own report.
                    self.finish_report();
                }
                self.report.summary = Some(summary);
                self.report.summary_stamp = stamp.clone();
                self.report.summary_used = false;
            }
            Msg::Selection(sel) => {
                if self.report.killed && self.report.oom_group.is_none() {
                    self.finish_report();
                }
                if self.report.selection.is_some() && !self.report.selection_used {
                    self.finish_report();
                }
                self.note_kind(sel.prefix);
                self.report.selection = Some(sel);
                self.report.selection_stamp = stamp.clone();
                self.report.selection_used = false;
            }
            Msg::SharedMemory(k) => {
                let kill = self.build_kill(&k, Evidence::SharedMemory, stamp);
                self.kills.push(kill);
            }
            Msg::Killed(k) => {
                if self.report.killed && self.report.oom_group.is_none() {
                    self.finish_report();
                }
                let kill = self.build_kill(&k, Evidence::KilledProcess, stamp);
                self.kills.push(kill);
                self.note_kind(k.prefix);
                self.report.killed = true;
                self.report.summary_used = true;
                self.report.selection_used = true;
            }
            Msg::Reaped { pid, comm, ok } => {
                self.flush_pending();
                let target = self.kills.iter_mut().rev().find(|k| {
                    k.pid == pid && k.reaped.is_none() && (comm.is_empty() || k.comm == comm)
                });
                match target {
                    Some(kill) => kill.reaped = Some(ok),
                    None => {
                        // The reaper only handles OOM victims, so the line
                        // proves a kill whose report is missing.
                        let mut kill = bare_kill(pid, comm, Evidence::Reaper, stamp);
                        kill.kernel_version.clone_from(&self.kernel_version);
                        kill.reaped = Some(ok);
                        self.kills.push(kill);
                    }
                }
            }
            Msg::NoKillable => self.finish_report(),
            Msg::OomGroup(path) => self.report.oom_group = Some(path),
        }
    }

    fn note_kind(&mut self, kind: PrefixKind) {
        if kind != PrefixKind::Unknown && self.report.kind.is_none() {
            self.report.kind = Some(kind);
        }
    }

    /// Turns a summary or selection that no `Killed process` line followed
    /// into a kill, so that a truncated report still names its victim.
    fn flush_pending(&mut self) {
        if !self.report.selection_used
            && let Some(sel) = self.report.selection.clone()
        {
            let stamp = self.report.selection_stamp.clone();
            let kill = self.build_kill(&sel, Evidence::Selection, &stamp);
            let summary_pid = self.report.summary.as_ref().and_then(|s| s.pid);
            if summary_pid == Some(sel.pid) {
                self.report.summary_used = true;
            }
            self.kills.push(kill);
            self.report.killed = true;
        }
        self.report.selection_used = true;
        if !self.report.summary_used
            && let Some(summary) = self.report.summary.clone()
            && let Some(pid) = summary.pid
        {
            let k = Killed {
                prefix: PrefixKind::Unknown,
                pid,
                comm: summary.task.clone().unwrap_or_default(),
                total_vm_kb: None,
                anon_rss_kb: None,
                file_rss_kb: None,
                shmem_rss_kb: None,
                uid: summary.uid,
                oom_score_adj: None,
                score: None,
            };
            let stamp = self.report.summary_stamp.clone();
            let kill = self.build_kill(&k, Evidence::Summary, &stamp);
            self.kills.push(kill);
            self.report.killed = true;
        }
        self.report.summary_used = true;
    }

    fn finish_report(&mut self) {
        self.flush_pending();
        self.report = Report::default();
    }

    pub(super) fn finish(mut self) -> Vec<OomKill> {
        self.finish_report();
        self.kills
    }

    fn build_kill(&self, k: &Killed, evidence: Evidence, stamp: &Stamp) -> OomKill {
        let r = &self.report;
        let first_of_report = !r.killed;
        // The summary names the task the kernel chose; use its per-task
        // fields only for that pid (4.19–5.0 may kill a child instead).
        let summary_for_pid = r.summary.as_ref().filter(|s| match s.pid {
            Some(p) => p == k.pid,
            None => first_of_report,
        });
        let row = r.tasks.iter().rev().find(|t| t.pid == k.pid);
        let selection = r.selection.as_ref().filter(|_| match evidence {
            Evidence::KilledProcess => !r.selection_used,
            Evidence::Selection => true,
            _ => false,
        });
        // `Task in …` also describes the selected task, not a child killed
        // in its place.
        let task_in_applies = first_of_report && selection.is_none_or(|s| s.pid == k.pid);

        let constraint = self.constraint(k.prefix, selection.map(|s| s.prefix));
        let cgroup = summary_for_pid
            .and_then(|s| s.task_memcg.clone())
            .or_else(|| {
                r.task_in
                    .as_ref()
                    .filter(|_| task_in_applies)
                    .map(|(task, _)| task.clone())
            });
        let oom_memcg = r
            .summary
            .as_ref()
            .and_then(|s| s.oom_memcg.clone())
            .or_else(|| r.task_in.as_ref().map(|(_, limit)| limit.clone()))
            .or_else(|| {
                r.stats_path
                    .clone()
                    .filter(|_| constraint.as_deref() == Some("memcg"))
            });

        let mut kill = bare_kill(k.pid, k.comm.clone(), evidence, stamp);
        kill.total_vm_bytes = k.total_vm_kb;
        kill.anon_rss_bytes = k.anon_rss_kb;
        kill.file_rss_bytes = k.file_rss_kb;
        kill.shmem_rss_bytes = k.shmem_rss_kb;
        kill.oom_score_adj = k.oom_score_adj.or(row.and_then(|t| t.oom_score_adj));
        kill.uid = k
            .uid
            .or(summary_for_pid.and_then(|s| s.uid))
            .or(row.and_then(|t| t.uid));
        kill.constraint = constraint;
        kill.cgroup = cgroup;
        kill.invoker.clone_from(&r.invoker);
        if first_of_report {
            kill.tasks.clone_from(&r.tasks);
        }
        kill.kernel_version.clone_from(&self.kernel_version);
        kill.oom_memcg = oom_memcg;
        kill.kernel_constraint = r.summary.as_ref().and_then(|s| s.constraint.clone());
        kill.memcg_usage_bytes = r.usage;
        kill.memcg_limit_bytes = r.limit;
        kill.selected = selection.map(|s| Selected {
            pid: s.pid,
            comm: s.comm.clone(),
            score: s.score,
        });
        kill.page_size_bytes = row.and_then(|t| page_size(k, t));
        kill
    }

    /// `"memcg"` or `"global"`, from the strongest evidence available. The
    /// kill line's own prefix wins; the summary's `CONSTRAINT_NONE` alone is
    /// not trusted because 4.19–5.1 print it for memcg OOMs too.
    fn constraint(&self, kill: PrefixKind, selection: Option<PrefixKind>) -> Option<String> {
        let r = &self.report;
        let memcg = Some("memcg".to_owned());
        let global = Some("global".to_owned());
        for prefix in [Some(kill), selection, r.kind].into_iter().flatten() {
            match prefix {
                PrefixKind::Memcg => return memcg,
                PrefixKind::Global => return global,
                PrefixKind::Unknown => {}
            }
        }
        if let Some(s) = &r.summary {
            if s.oom_memcg.is_some() || s.constraint.as_deref() == Some("CONSTRAINT_MEMCG") {
                return memcg;
            }
            if s.global_oom {
                return global;
            }
        }
        if r.task_in.is_some() || r.memcg_hint {
            return memcg;
        }
        if r.summary.as_ref().is_some_and(|s| s.constraint.is_some()) {
            return global;
        }
        None
    }
}

fn bare_kill(pid: u32, comm: String, evidence: Evidence, stamp: &Stamp) -> OomKill {
    OomKill {
        pid,
        comm,
        total_vm_bytes: None,
        anon_rss_bytes: None,
        file_rss_bytes: None,
        shmem_rss_bytes: None,
        oom_score_adj: None,
        uid: None,
        constraint: None,
        cgroup: None,
        ts: stamp.text.clone(),
        invoker: None,
        tasks: Vec::new(),
        uptime_seconds: stamp.mono,
        kernel_version: None,
        reaped: None,
        oom_memcg: None,
        kernel_constraint: None,
        memcg_usage_bytes: None,
        memcg_limit_bytes: None,
        selected: None,
        page_size_bytes: None,
        evidence,
    }
}

/// kB from the kill line ÷ pages from the victim's row, accepted when the
/// ratio is (within 1 %) a power of two between 4 KiB and 1 MiB: both are
/// read at slightly different moments, so exact division is not required.
fn page_size(k: &Killed, row: &TaskRow) -> Option<u64> {
    let pairs = [
        (k.total_vm_kb, row.total_vm_pages),
        (k.anon_rss_kb, row.rss_anon_pages),
    ];
    pairs.iter().find_map(|(bytes, pages)| {
        let (bytes, pages) = ((*bytes)?, (*pages)?);
        if pages < 16 {
            return None;
        }
        let ratio = bytes as f64 / pages as f64;
        (12..=20).map(|shift| 1u64 << shift).find(|p| {
            let p = *p as f64;
            (ratio - p).abs() <= p * 0.01
        })
    })
}
