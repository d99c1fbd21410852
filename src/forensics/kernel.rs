//! Kernel OOM-killer reports: parsing every layout the kernel has printed.
//!
//! This module owns the translation of kernel log text into [`OomKill`]
//! records, and their rendering for `oomguard forensics` (JSON and a
//! human summary). It never reads files or devices: callers hand it text
//! (a saved log, stdin, or what [`crate::forensics::kmsg`] read live).
//!
//! # Transports
//!
//! One parser handles every way the kernel log reaches a user: plain `dmesg`
//! (`[  sec.usec] msg`), `dmesg -T`, `dmesg --time-format iso`, `dmesg -r` /
//! `-x` prefixes, raw `/dev/kmsg` records (`level,seq,usec,flags;msg`, with
//! continuation lines), classic syslog and journalctl prefixes
//! (`Mon DD HH:MM:SS host kernel: …`, `[uptime] host kernel: …`), text
//! quoted by mail (`> `), and lines with the prefix already stripped.
//! Lines starting with `# ` are annotations (our fixtures carry provenance
//! that way) and are skipped. Syslog lines tagged with another program
//! (`systemd-oomd[885]: …`) are not kernel output and are skipped too.
//!
//! # Layouts
//!
//! A kill is anchored on the one line that every kernel since 2.6 prints,
//! `Killed process <pid> (<comm>) …`, in all its prefixes and field orders.
//! The rest of the report (the invoker line, the `CPU: … <uname -r>` header,
//! the memcg counters, the task table, the `oom-kill:` summary, the older
//! `Kill process … or sacrifice child` selection and `Task in … killed as a
//! result of limit of …` lines) is collected per report and attached to the
//! kills it produced. When the `Killed process` line itself is missing (a
//! truncated or grep-filtered log) a kill is still reported from the best
//! remaining evidence (summary, selection or `oom_reaper` line); its
//! [`OomKill::evidence`] says which.
//!
//! Anything not understood is skipped. The parser never panics, whatever
//! the input (a property test feeds it arbitrary text).

use std::borrow::Cow;
use std::fmt::Write as _;
use std::sync::LazyLock;

use regex::Regex;
use serde::{Deserialize, Serialize};

/// Lines of one report are printed within milliseconds (the asynchronous
/// `oom_reaper` line up to a few seconds later). A larger jump in the
/// timestamps means the text was cut and the lines around the jump belong
/// to different reports, so report context must not leak across it.
const REPORT_GAP_SECONDS: f64 = 60.0;

/// Timestamps from different CPUs, or syslog's one-second resolution, can
/// step back a little within one report; a larger step back is a reboot or
/// a concatenation of logs.
const BACKWARD_TOLERANCE_SECONDS: f64 = 1.0;

/// One process killed by the kernel OOM killer, with the report that led to
/// the kill.
///
/// Sizes are converted to bytes (the kernel prints kB); values of the task
/// table stay in the units the kernel printed (see [`TaskRow`]). Every field
/// the given kernel did not print, or that was lost from the log, is `None`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OomKill {
    /// Pid of the killed process.
    pub pid: u32,
    /// Its command name (`comm`, at most 15 bytes; may contain spaces,
    /// parentheses and colons).
    pub comm: String,
    /// `total-vm` of the victim, in bytes.
    pub total_vm_bytes: Option<u64>,
    /// `anon-rss` of the victim, in bytes.
    pub anon_rss_bytes: Option<u64>,
    /// `file-rss` of the victim, in bytes.
    pub file_rss_bytes: Option<u64>,
    /// `shmem-rss` of the victim, in bytes (absent before about 4.5).
    pub shmem_rss_bytes: Option<u64>,
    /// The victim's `oom_score_adj`, from the kill line or its task-table row.
    pub oom_score_adj: Option<i32>,
    /// The victim's uid, from the kill line, the summary or its task-table row.
    pub uid: Option<u32>,
    /// `"global"` (the machine ran out of memory, possibly restricted by a
    /// cpuset or memory policy) or `"memcg"` (a memory cgroup hit its
    /// limit). `None` when the log does not say.
    pub constraint: Option<String>,
    /// The victim's memory cgroup (`task_memcg=`, or the older `Task in …`).
    pub cgroup: Option<String>,
    /// The timestamp of the kill line as printed: the `[ sec.usec]` content,
    /// the `dmesg -T`, ISO or syslog timestamp. For raw `/dev/kmsg` records,
    /// the microsecond field written as seconds.
    pub ts: Option<String>,
    /// The task whose allocation invoked the OOM killer (often not the victim).
    pub invoker: Option<Invoker>,
    /// The task table of the report that led to this kill. Empty when the
    /// table was not printed or not captured, and for the further kills of
    /// a report that killed several processes (`memory.oom.group`, shared
    /// memory): the table is attached once, to the report's first kill,
    /// because a cgroup-wide group kill would otherwise repeat a table with
    /// a row per member for every member.
    #[serde(default)]
    pub tasks: Vec<TaskRow>,
    /// Seconds since boot on the kernel's printk clock, when the line
    /// carried a monotonic timestamp (dmesg, `/dev/kmsg`, syslog with uptime).
    pub uptime_seconds: Option<f64>,
    /// Kernel release from the `CPU: … <uname -r>` or `Linux version` line.
    pub kernel_version: Option<String>,
    /// `Some(true)` when an `oom_reaper: reaped process` line followed,
    /// `Some(false)` for `oom_reaper: unable to reap`.
    pub reaped: Option<bool>,
    /// The memory cgroup whose limit was hit (`oom_memcg=`, or the older
    /// `… as a result of limit of …`), for memcg OOMs.
    pub oom_memcg: Option<String>,
    /// The constraint exactly as the summary line printed it (e.g.
    /// `CONSTRAINT_MEMCG`). Kernels 4.19–5.1 print `CONSTRAINT_NONE` for
    /// memcg OOMs, so [`OomKill::constraint`] does not rely on it alone.
    pub kernel_constraint: Option<String>,
    /// Usage of the limited memory cgroup at the OOM, in bytes
    /// (`memory: usage NkB, …`).
    pub memcg_usage_bytes: Option<u64>,
    /// Limit of that memory cgroup, in bytes (`…, limit NkB, …`).
    pub memcg_limit_bytes: Option<u64>,
    /// The process chosen by kernels before 5.1 (`Kill process N (comm)
    /// score N or sacrifice child`); a child of it may be the one killed.
    pub selected: Option<Selected>,
    /// Page size in bytes, inferred from the victim's task-table row and its
    /// kill line (kB ÷ pages), when both are present and agree.
    pub page_size_bytes: Option<u64>,
    /// Which line proves this kill.
    #[serde(default)]
    pub evidence: Evidence,
}

/// The line a kill was read from, strongest first.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Evidence {
    /// The kernel's `Killed process N (comm) …` line.
    #[default]
    KilledProcess,
    /// Only the `oom-kill:constraint=…,task=…,pid=…` summary line.
    Summary,
    /// Only the pre-5.1 `Kill process N (comm) score N or sacrifice child`
    /// selection: the kernel may have killed a child of this pid instead.
    Selection,
    /// `Kill process N (comm) sharing same memory` (kernels before 4.x kill
    /// the other users of the victim's memory with this line).
    SharedMemory,
    /// Only an `oom_reaper:` line, which the kernel prints for OOM victims.
    Reaper,
}

/// The task that invoked the OOM killer: `<comm> invoked oom-killer:
/// gfp_mask=0x…(FLAGS), order=N, oom_score_adj=N`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Invoker {
    /// Command name of the invoking task.
    pub comm: String,
    /// Its pid, from the `CPU: N PID: N Comm: …` (or 2.6.32 `Pid: N, comm:`)
    /// header that follows.
    pub pid: Option<u32>,
    /// Allocation flags in hex, e.g. `0xcc0`.
    pub gfp_mask: Option<String>,
    /// Symbolic flags printed next to the mask, e.g. `GFP_KERNEL`.
    pub gfp_flags: Option<String>,
    /// Allocation order; `-1` for an OOM forced by sysrq or a memcg without
    /// an allocation.
    pub order: Option<i32>,
    /// The invoker's `oom_score_adj`.
    pub oom_score_adj: Option<i32>,
}

/// The process the pre-5.1 kernels selected (`Kill process … or sacrifice
/// child`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Selected {
    /// Pid of the selected process.
    pub pid: u32,
    /// Its command name.
    pub comm: String,
    /// Its OOM badness score as printed.
    pub score: Option<u64>,
}

/// One row of the report's task table (`Tasks state (memory values in
/// pages):`), in the units the kernel printed.
///
/// Column names follow the table header: `total_vm`, `rss`, `rss_anon`,
/// `rss_file`, `rss_shmem` (6.11+) and `swapents` are in pages;
/// `pgtables_bytes` (4.15+) is in bytes; `nr_ptes` and `nr_pmds` (older
/// kernels) count page-table pages; `cpu` and `oom_adj` appear on 2.6.x.
/// Columns a layout lacks are `None`. The page size is not printed (64 KiB
/// pages exist); see [`OomKill::page_size_bytes`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskRow {
    /// `pid` column.
    pub pid: u32,
    /// `uid` column.
    pub uid: Option<u32>,
    /// `tgid` column (the process id of the thread group).
    pub tgid: Option<u32>,
    /// `total_vm`, pages.
    pub total_vm_pages: Option<u64>,
    /// `rss`, pages.
    pub rss_pages: Option<u64>,
    /// `rss_anon`, pages (6.11+).
    pub rss_anon_pages: Option<u64>,
    /// `rss_file`, pages (6.11+).
    pub rss_file_pages: Option<u64>,
    /// `rss_shmem`, pages (6.11+).
    pub rss_shmem_pages: Option<u64>,
    /// `pgtables_bytes`, bytes (4.15+).
    pub pgtables_bytes: Option<u64>,
    /// `nr_ptes`, page-table pages (before 4.15).
    pub nr_ptes: Option<u64>,
    /// `nr_pmds`, PMD pages (4.x before 4.15).
    pub nr_pmds: Option<u64>,
    /// `swapents`, swapped-out pages.
    pub swapents: Option<u64>,
    /// `oom_score_adj` column.
    pub oom_score_adj: Option<i32>,
    /// `oom_adj` column (2.6.x).
    pub oom_adj: Option<i32>,
    /// `cpu` column (2.6.x).
    pub cpu: Option<u32>,
    /// `name` column (the command name).
    pub name: String,
}

/// Parses every OOM kill in `text`, in log order.
///
/// `text` may be any of the transports described in the module docs, with
/// other messages interleaved and several reports in a row. Reports that
/// killed nothing (`Out of memory and no killable processes...`) produce no
/// entry.
pub fn parse(text: &str) -> Vec<OomKill> {
    let mut parser = Parser::default();
    for line in logical_lines(text) {
        parser.line(&line);
    }
    parser.finish()
}

/// Kills a [`StreamParser`] keeps after [`StreamParser::take_settled`]: a
/// late `oom_reaper` line can still amend one of these.
const UNSETTLED_KILLS: usize = 64;

/// [`parse`] for a log read a line at a time, so that a large log costs
/// memory for the kills found, not for its text: feed every line, take the
/// kills that can no longer change now and then, and the rest at the end.
#[derive(Default)]
pub struct StreamParser {
    parser: Parser,
    /// The logical line being assembled (`/dev/kmsg` continuation lines
    /// start with a space and belong to the record before them).
    pending: Option<String>,
    in_record: bool,
}

impl std::fmt::Debug for StreamParser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamParser")
            .field("kills", &self.parser.kills.len())
            .finish_non_exhaustive()
    }
}

impl StreamParser {
    pub fn new() -> Self {
        Self::default()
    }

    /// One physical line of the log, with or without its line ending.
    pub fn feed(&mut self, raw: &str) {
        let raw = raw.strip_suffix('\n').unwrap_or(raw);
        let line = raw.strip_suffix('\r').unwrap_or(raw);
        if self.in_record
            && let Some(cont) = line.strip_prefix(' ')
        {
            if !KMSG_DICT.is_match(cont)
                && let Some(last) = self.pending.as_mut()
                && last.len() < super::MAX_LINE_BYTES
            {
                last.push_str(cont);
            }
            return;
        }
        self.in_record = KMSG_RECORD.is_match(line);
        if let Some(done) = self.pending.replace(line.to_owned()) {
            self.parser.line(&done);
        }
    }

    /// Kills old enough that nothing later in the log changes them, in log
    /// order; the newest few are kept for a late reaper line.
    pub fn take_settled(&mut self) -> Vec<OomKill> {
        let kills = &mut self.parser.kills;
        let settled = kills.len().saturating_sub(UNSETTLED_KILLS);
        kills.drain(..settled).collect()
    }

    /// The end of the log: every kill not yet taken.
    pub fn finish(mut self) -> Vec<OomKill> {
        if let Some(done) = self.pending.take() {
            self.parser.line(&done);
        }
        self.parser.finish()
    }
}

/// The latest kill of `pid` (pids are reused; the last report is the one
/// that matters for a process that just died).
pub fn find_pid(kills: &[OomKill], pid: u32) -> Option<&OomKill> {
    kills.iter().rev().find(|k| k.pid == pid)
}

/// `{"kills": [...]}` for `oomguard forensics --format json`.
pub fn render_json(kills: &[OomKill]) -> serde_json::Value {
    serde_json::json!({ "kills": kills })
}

/// Writes the same text as `{:#}` of [`render_json`], one kill at a time,
/// so kills can be written as they are found: `begin`, then `kill` for
/// each, then `end`.
#[derive(Debug, Default)]
pub struct JsonWriter {
    written: usize,
}

impl JsonWriter {
    pub fn begin(&mut self, out: &mut impl std::io::Write) -> std::io::Result<()> {
        out.write_all(b"{\n  \"kills\": [")
    }

    pub fn kill(
        &mut self,
        out: &mut impl std::io::Write,
        mut kill: OomKill,
    ) -> std::io::Result<()> {
        // Through a Value, so keys come in the same (sorted) order as in
        // `render_json`; but the task table (tens of thousands of rows on
        // a big machine) is written a row at a time: a Value of a whole
        // table costs some 30 times its text.
        let tasks = std::mem::take(&mut kill.tasks);
        let mut value = serde_json::to_value(&kill).map_err(std::io::Error::other)?;
        const MARK: &str = "\u{1}tasks\u{1}";
        if let Some(map) = value.as_object_mut() {
            map.insert("tasks".into(), serde_json::Value::String(MARK.into()));
        }
        let text = serde_json::to_string_pretty(&value).map_err(std::io::Error::other)?;
        let mark = format!(
            "\"tasks\": {}",
            serde_json::to_string(MARK).map_err(std::io::Error::other)?
        );
        out.write_all(if self.written == 0 { b"\n" } else { b",\n" })?;
        // Pretty JSON escapes newlines inside strings, so every line of the
        // text is a line of the structure: indent it as the array's item.
        let mut first = true;
        let mut line_out = |out: &mut dyn std::io::Write, line: &str| {
            if !std::mem::take(&mut first) {
                out.write_all(b"\n")?;
            }
            out.write_all(b"    ")?;
            out.write_all(line.as_bytes())
        };
        for line in text.lines() {
            let Some(at) = line.find(&mark) else {
                line_out(out, line)?;
                continue;
            };
            let (indent, rest) = (&line[..at], &line[at + mark.len()..]);
            if tasks.is_empty() {
                line_out(out, &format!("{indent}\"tasks\": []{rest}"))?;
                continue;
            }
            line_out(out, &format!("{indent}\"tasks\": ["))?;
            for (i, row) in tasks.iter().enumerate() {
                let row = serde_json::to_value(row)
                    .and_then(|v| serde_json::to_string_pretty(&v))
                    .map_err(std::io::Error::other)?;
                // Ends the previous row's last line (a line's end is
                // written before the next line).
                if i > 0 {
                    out.write_all(b",")?;
                }
                for l in row.lines() {
                    line_out(out, &format!("{indent}  {l}"))?;
                }
            }
            line_out(out, &format!("{indent}]{rest}"))?;
        }
        self.written += 1;
        Ok(())
    }

    pub fn end(&mut self, out: &mut impl std::io::Write) -> std::io::Result<()> {
        if self.written > 0 {
            out.write_all(b"\n  ]\n}\n")
        } else {
            out.write_all(b"]\n}\n")
        }
    }
}

/// A summary for a person: who was killed, how big it was, which limit was
/// hit, who invoked the OOM killer and the largest tasks of the report.
pub fn render_text(kills: &[OomKill]) -> String {
    let mut out = String::new();
    if kills.is_empty() {
        out.push_str("No kernel OOM kill found in the log.\n");
        return out;
    }
    let _ = writeln!(
        out,
        "{} kernel OOM kill{} found.",
        kills.len(),
        if kills.len() == 1 { "" } else { "s" }
    );
    for kill in kills {
        out.push('\n');
        render_kill(&mut out, kill);
    }
    out
}

/// How many rows of the task table the text summary shows.
const TOP_TASKS: usize = 5;

fn render_kill(out: &mut String, k: &OomKill) {
    let when =
        k.ts.as_deref()
            .map(|t| format!("[{t}] "))
            .unwrap_or_default();
    let kind = match k.constraint.as_deref() {
        Some("memcg") => "memory cgroup OOM",
        Some("global") => "system-wide OOM",
        _ => "OOM",
    };
    let uid = k.uid.map(|u| format!(", uid {u}")).unwrap_or_default();
    let _ = writeln!(out, "{when}{kind}: killed {} (pid {}{uid})", k.comm, k.pid);
    match k.evidence {
        Evidence::KilledProcess => {}
        Evidence::Summary => out.push_str(
            "  (only the oom-kill summary line was found; the kill line is missing from the log)\n",
        ),
        Evidence::Selection => out.push_str(
            "  (only the selection line was found: the kernel may have killed a child of this process instead)\n",
        ),
        Evidence::SharedMemory => out.push_str("  (killed because it shared memory with the victim)\n"),
        Evidence::Reaper => out.push_str(
            "  (only the oom_reaper line was found; the rest of the report is missing from the log)\n",
        ),
    }
    if let Some(sel) = &k.selected
        && sel.pid != k.pid
    {
        let _ = writeln!(
            out,
            "  selected {} (pid {}), killed its child instead",
            sel.comm, sel.pid
        );
    }
    let sizes: Vec<String> = [
        ("anon-rss", k.anon_rss_bytes),
        ("file-rss", k.file_rss_bytes),
        ("shmem-rss", k.shmem_rss_bytes),
        ("total-vm", k.total_vm_bytes),
    ]
    .iter()
    .filter_map(|(name, v)| v.map(|b| format!("{name} {}", human_bytes(b))))
    .collect();
    if !sizes.is_empty() {
        let _ = writeln!(out, "  size: {}", sizes.join(", "));
    }
    match k.constraint.as_deref() {
        Some("memcg") => {
            let limited = match k.oom_memcg.as_deref().or(k.cgroup.as_deref()) {
                Some(path) => format!("cgroup {path}"),
                None => "a memory cgroup (path not in the log)".to_owned(),
            };
            let usage = match (k.memcg_usage_bytes, k.memcg_limit_bytes) {
                (Some(u), Some(l)) => {
                    format!(" (usage {} of limit {})", human_bytes(u), human_bytes(l))
                }
                (None, Some(l)) => format!(" (limit {})", human_bytes(l)),
                _ => String::new(),
            };
            let _ = writeln!(out, "  cause: {limited} reached its memory limit{usage}");
        }
        Some("global") => {
            let _ = writeln!(out, "  cause: the machine ran out of memory");
        }
        _ => {}
    }
    if let Some(cg) = &k.cgroup
        && k.oom_memcg.as_deref() != Some(cg.as_str())
    {
        let _ = writeln!(out, "  victim's cgroup: {cg}");
    }
    if let Some(inv) = &k.invoker {
        let mut detail = Vec::new();
        if let Some(mask) = &inv.gfp_mask {
            match &inv.gfp_flags {
                Some(flags) => detail.push(format!("gfp_mask={mask}({flags})")),
                None => detail.push(format!("gfp_mask={mask}")),
            }
        }
        if let Some(order) = inv.order {
            detail.push(format!("order={order}"));
        }
        let pid = match inv.pid {
            Some(p) if p == k.pid => format!(" (pid {p}, the victim itself)"),
            Some(p) => format!(" (pid {p})"),
            None => String::new(),
        };
        let detail = if detail.is_empty() {
            String::new()
        } else {
            format!(": {}", detail.join(", "))
        };
        let _ = writeln!(out, "  invoked by: {}{pid}{detail}", inv.comm);
    }
    let mut facts = Vec::new();
    if let Some(adj) = k.oom_score_adj {
        facts.push(format!("oom_score_adj {adj}"));
    }
    match k.reaped {
        Some(true) => facts.push("memory reaped by oom_reaper".to_owned()),
        Some(false) => facts.push("oom_reaper could not reap it".to_owned()),
        None => {}
    }
    if let Some(v) = &k.kernel_version {
        facts.push(format!("kernel {v}"));
    }
    if !facts.is_empty() {
        let _ = writeln!(out, "  {}", facts.join("; "));
    }
    render_top_tasks(out, k);
}

fn render_top_tasks(out: &mut String, k: &OomKill) {
    let mut rows: Vec<&TaskRow> = k.tasks.iter().filter(|t| t.rss_pages.is_some()).collect();
    if rows.is_empty() {
        return;
    }
    rows.sort_by_key(|t| std::cmp::Reverse(t.rss_pages.unwrap_or(0)));
    let unit = match k.page_size_bytes {
        Some(p) => format!("{} KiB pages", p / 1024),
        None => "rss in pages; page size not known".to_owned(),
    };
    let _ = writeln!(
        out,
        "  largest tasks by rss ({} of {} listed, {unit}):",
        rows.len().min(TOP_TASKS),
        k.tasks.len()
    );
    for t in rows.iter().take(TOP_TASKS) {
        let pages = t.rss_pages.unwrap_or(0);
        let rss = match k.page_size_bytes {
            Some(p) => human_bytes(pages.saturating_mul(p)),
            None => format!("{pages} pages"),
        };
        let marker = if t.pid == k.pid { "  <- killed" } else { "" };
        let _ = writeln!(out, "    {:>8} {:>12}  {}{marker}", t.pid, rss, t.name);
    }
}

/// Binary units with one decimal, as people read memory sizes.
fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

// ---------------------------------------------------------------------------
// Transport: from raw lines to (timestamp, kernel message).

/// Where a line's time came from, kept for grouping lines into reports.
#[derive(Debug, Clone, Default)]
struct Stamp {
    /// The timestamp as printed (see [`OomKill::ts`]).
    text: Option<String>,
    /// Seconds since boot (printk clock).
    mono: Option<f64>,
    /// Wall-clock seconds on an arbitrary but consistent scale, only used
    /// to detect gaps between lines.
    wall: Option<f64>,
}

static KMSG_RECORD: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^(\d{1,5}),(\d{1,20}),(\d{1,20}),[^;]*;").expect("static regex"));
static ISO_TS: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"^(?:[A-Z][a-z]{2} )?((\d{4})-(\d{2})-(\d{2})[T ](\d{2}):(\d{2}):(\d{2})(?:[.,](\d{1,9}))?(Z|[+-]\d{2}:?\d{2})?)(?: [A-Z]{2,5})?(?:\s|$)",
    )
    .expect("static regex")
});
static SYSLOG_TS: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^(([A-Z][a-z]{2}) +(\d{1,2}) (\d{2}):(\d{2}):(\d{2})(?:\.\d+)?)(?:\s|$)")
        .expect("static regex")
});
static UPTIME: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^\s*\d{1,12}\.\d{1,9}\s*$").expect("static regex"));
static DMESG_T: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^[A-Z][a-z]{2} ([A-Z][a-z]{2}) +(\d{1,2}) (\d{2}):(\d{2}):(\d{2}) (\d{4})$")
        .expect("static regex")
});
/// `dmesg --time-format delta|reltime` stamps: `+0.000123`, `Nov21 14:22`,
/// `Nov21 14:22 <    0.000123>`.
static DMESG_OTHER_TS: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"^\s*(?:\+?\d+\.\d+|[A-Z][a-z]{2}\d{1,2} \d{2}:\d{2}(?::\d{2})?(?: <\s*[\d.]+>)?)\s*$",
    )
    .expect("static regex")
});
static SYSLOG_PROG: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^[\w.@/-]+\[\d+\]$").expect("static regex"));
static DMESG_X: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^(?:kern|user|mail|daemon|auth|syslog|lpr|news|uucp|cron|authpriv|ftp|res0|res1|res2|res3|local[0-7])\s*:\s*(?:emerg|alert|crit|err|warn|notice|info|debug)\s*: ")
        .expect("static regex")
});
static LEVEL_PREFIX: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^<\d{1,3}>").expect("static regex"));
static CALLER_ID: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^\[\s*[TC]\d+\]\s?").expect("static regex"));
static KMSG_DICT: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^[A-Z][A-Z0-9_]*=").expect("static regex"));

/// Splits `text` into lines and glues `/dev/kmsg` continuation lines back
/// onto their record: dictionary lines (` SUBSYSTEM=…`) are dropped, any
/// other line starting with a space continues the record's message (records
/// hard-wrapped by a person, as in some bug reports).
fn logical_lines(text: &str) -> Vec<Cow<'_, str>> {
    let mut out: Vec<Cow<'_, str>> = Vec::new();
    let mut in_record = false;
    for raw in text.lines() {
        let line = raw.strip_suffix('\r').unwrap_or(raw);
        if in_record && let Some(cont) = line.strip_prefix(' ') {
            if !KMSG_DICT.is_match(cont)
                && let Some(last) = out.last_mut()
            {
                last.to_mut().push_str(cont);
            }
            continue;
        }
        in_record = KMSG_RECORD.is_match(line);
        out.push(Cow::Borrowed(line));
    }
    out
}

/// Strips the transport from one line. Returns `None` for lines that are
/// not kernel output (annotations, other programs' syslog lines).
fn split_transport(line: &str) -> Option<(Stamp, &str)> {
    let mut s = line.trim_start();
    if s == "#" || s.starts_with("# ") {
        return None;
    }
    while let Some(rest) = s.strip_prefix('>') {
        s = rest.trim_start();
    }
    let mut stamp = Stamp::default();
    s = strip_regex(&LEVEL_PREFIX, s);
    s = strip_regex(&DMESG_X, s);

    if let Some(c) = KMSG_RECORD.captures(s) {
        let usec: u64 = c.get(3).and_then(|m| m.as_str().parse().ok()).unwrap_or(0);
        stamp.mono = Some(usec as f64 / 1e6);
        stamp.text = Some(format!("{}.{:06}", usec / 1_000_000, usec % 1_000_000));
        let end = c.get(0).map_or(0, |m| m.end());
        let msg = strip_regex(&CALLER_ID, &s[end..]);
        return Some((stamp, msg.trim_start()));
    }

    if let Some(c) = ISO_TS.captures(s) {
        // Keep the weekday and zone name of journalctl's short-full too.
        stamp.text = c.get(0).map(|m| m.as_str().trim().to_owned());
        stamp.wall = iso_seconds(&c);
        s = &s[c.get(0).map_or(0, |m| m.end())..];
    } else if let Some(c) = SYSLOG_TS.captures(s) {
        stamp.text = c.get(1).map(|m| m.as_str().to_owned());
        stamp.wall = syslog_seconds(&c);
        s = &s[c.get(0).map_or(0, |m| m.end())..];
    } else if let Some((content, rest)) = leading_bracket(s) {
        if let Some(mono) = uptime_seconds(content) {
            stamp.text = Some(content.trim().to_owned());
            stamp.mono = Some(mono);
            s = rest;
        } else if let Some(wall) = dmesg_t_seconds(content) {
            stamp.text = Some(content.trim().to_owned());
            stamp.wall = Some(wall);
            s = rest;
        } else if DMESG_OTHER_TS.is_match(content) {
            stamp.text = Some(content.trim().to_owned());
            s = rest;
        }
    }

    s = s.trim_start();
    match syslog_tag(s) {
        Tag::Kernel(rest) => s = rest,
        Tag::Other => return None,
        Tag::None => {}
    }
    s = strip_regex(&LEVEL_PREFIX, s);
    // Syslog and journalctl put the kernel's own uptime after the tag.
    if let Some((content, rest)) = leading_bracket(s)
        && let Some(mono) = uptime_seconds(content)
    {
        stamp.mono = Some(mono);
        if stamp.text.is_none() {
            stamp.text = Some(content.trim().to_owned());
        }
        s = rest;
    }
    s = strip_regex(&CALLER_ID, s);
    Some((stamp, s.trim_start()))
}

fn strip_regex<'a>(re: &Regex, s: &'a str) -> &'a str {
    match re.find(s) {
        Some(m) => &s[m.end()..],
        None => s,
    }
}

/// `[content] rest` → `(content, rest)` with one space after `]` removed.
fn leading_bracket(s: &str) -> Option<(&str, &str)> {
    let inner = s.strip_prefix('[')?;
    let close = inner.find(']')?;
    let rest = &inner[close + 1..];
    Some((&inner[..close], rest.strip_prefix(' ').unwrap_or(rest)))
}

fn uptime_seconds(content: &str) -> Option<f64> {
    if !UPTIME.is_match(content) {
        return None;
    }
    // Parsing the decimal as a whole rounds once, so equal text gives
    // equal values whatever the transport.
    content.trim().parse().ok()
}

fn month_number(name: &str) -> Option<u32> {
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    MONTHS
        .iter()
        .position(|m| *m == name)
        .and_then(|i| u32::try_from(i + 1).ok())
}

/// Days since 1970-01-01 of a proleptic Gregorian date.
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = i64::from(m);
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn cap_num<T: std::str::FromStr>(c: &regex::Captures<'_>, i: usize) -> Option<T> {
    c.get(i)?.as_str().parse().ok()
}

fn clock_seconds(days: i64, h: u32, mi: u32, s: u32) -> f64 {
    (days * 86_400 + i64::from(h) * 3600 + i64::from(mi) * 60 + i64::from(s)) as f64
}

fn iso_seconds(c: &regex::Captures<'_>) -> Option<f64> {
    let days = days_from_civil(cap_num(c, 2)?, cap_num(c, 3)?, cap_num(c, 4)?);
    let mut secs = clock_seconds(days, cap_num(c, 5)?, cap_num(c, 6)?, cap_num(c, 7)?);
    if let Some(frac) = c.get(8) {
        let digits = frac.as_str();
        secs += digits.parse::<f64>().ok()? / 10f64.powi(digits.len() as i32);
    }
    if let Some(zone) = c.get(9).map(|m| m.as_str())
        && zone != "Z"
    {
        let sign = if zone.starts_with('-') { -1.0 } else { 1.0 };
        let digits: String = zone.chars().filter(char::is_ascii_digit).collect();
        let h: f64 = digits.get(..2)?.parse().ok()?;
        let m: f64 = digits.get(2..)?.parse().ok()?;
        secs -= sign * (h * 3600.0 + m * 60.0);
    }
    Some(secs)
}

fn syslog_seconds(c: &regex::Captures<'_>) -> Option<f64> {
    // Classic syslog has no year; a fixed leap year keeps Feb 29 valid and
    // the scale consistent within one file, which is all gap detection needs.
    let days = days_from_civil(2000, month_number(c.get(2)?.as_str())?, cap_num(c, 3)?);
    Some(clock_seconds(
        days,
        cap_num(c, 4)?,
        cap_num(c, 5)?,
        cap_num(c, 6)?,
    ))
}

fn dmesg_t_seconds(content: &str) -> Option<f64> {
    let c = DMESG_T.captures(content.trim())?;
    let days = days_from_civil(
        cap_num(&c, 6)?,
        month_number(c.get(1)?.as_str())?,
        cap_num(&c, 2)?,
    );
    Some(clock_seconds(
        days,
        cap_num(&c, 3)?,
        cap_num(&c, 4)?,
        cap_num(&c, 5)?,
    ))
}

enum Tag<'a> {
    /// `kernel:` or `host kernel:`: the message follows.
    Kernel(&'a str),
    /// Another program's syslog line (`prog[pid]:`, `host prog[pid]:`).
    Other,
    None,
}

fn syslog_tag(s: &str) -> Tag<'_> {
    let (first, rest1) = s.split_once(' ').unwrap_or((s, ""));
    if let Some(prog) = first.strip_suffix(':') {
        return classify_prog(prog, rest1);
    }
    let (second, rest2) = rest1.split_once(' ').unwrap_or((rest1, ""));
    if let Some(prog) = second.strip_suffix(':') {
        return classify_prog(prog, rest2);
    }
    Tag::None
}

fn classify_prog<'a>(prog: &str, rest: &'a str) -> Tag<'a> {
    if prog == "kernel" {
        Tag::Kernel(rest)
    } else if SYSLOG_PROG.is_match(prog) {
        Tag::Other
    } else {
        // `oom_reaper:`, `CPU:`, `memory:` … are kernel messages.
        Tag::None
    }
}

// ---------------------------------------------------------------------------
// Messages: what one kernel line says.

#[derive(Debug)]
enum Msg<'a> {
    LinuxVersion(String),
    Invoker(Invoker, bool),
    CpuHeader {
        pid: u32,
        comm: &'a str,
        version: Option<String>,
    },
    Section,
    MemcgTrace,
    MemcgUsage {
        usage: Option<u64>,
        limit: Option<u64>,
    },
    MemcgStats(String),
    TaskIn {
        task: String,
        limit: String,
    },
    TableHeader(Vec<String>),
    TableRow {
        pid: u32,
        rest: &'a str,
    },
    Summary(Summary),
    Selection(Killed),
    SharedMemory(Killed),
    Killed(Killed),
    Reaped {
        pid: u32,
        comm: String,
        ok: bool,
    },
    NoKillable,
    OomGroup(String),
    Other,
}

/// The `oom-kill:` summary line (4.19+), parsed as a key=value bag.
#[derive(Debug, Clone, Default)]
struct Summary {
    constraint: Option<String>,
    global_oom: bool,
    oom_memcg: Option<String>,
    task_memcg: Option<String>,
    task: Option<String>,
    pid: Option<u32>,
    uid: Option<u32>,
}

/// Which kind of OOM a line's prefix names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PrefixKind {
    Memcg,
    Global,
    Unknown,
}

/// A `Killed process` / `Kill process` line.
#[derive(Debug, Clone)]
struct Killed {
    prefix: PrefixKind,
    pid: u32,
    comm: String,
    total_vm_kb: Option<u64>,
    anon_rss_kb: Option<u64>,
    file_rss_kb: Option<u64>,
    shmem_rss_kb: Option<u64>,
    uid: Option<u32>,
    oom_score_adj: Option<i32>,
    score: Option<u64>,
}

static CPU_HEADER: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^CPU: \d+ (?:UID: \d+ )?PID: (\d+) Comm: (.*)$").expect("static regex")
});
static PID_HEADER_2632: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^Pid: (\d+), comm: (.*)$").expect("static regex"));
static LINUX_VERSION: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^Linux version (\S+)").expect("static regex"));
static MEMCG_USAGE: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^memory: usage (\d+)kB, limit (\d+)kB").expect("static regex"));
static TABLE_HEADER: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^\[\s*pid\s*\]\s+(.*)$").expect("static regex"));
static TABLE_ROW: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^\[\s*(\d+)\]\s+(.*)$").expect("static regex"));
static VERSION_TOKEN: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^\d+\.\d+[\w.+~-]*$").expect("static regex"));

fn classify(msg: &str) -> Msg<'_> {
    let msg = msg.trim_end();
    if msg.is_empty() {
        return Msg::Other;
    }
    if let Some(k) = parse_kill_line(msg, "Killed process ") {
        return Msg::Killed(k);
    }
    if let Some(k) = parse_kill_line(msg, "Kill process ") {
        return if msg.ends_with("sharing same memory") {
            Msg::SharedMemory(k)
        } else {
            Msg::Selection(k)
        };
    }
    if let Some(rest) = msg.strip_prefix("oom-kill:") {
        return Msg::Summary(parse_summary(rest));
    }
    if let Some(i) = msg.find(" invoked oom-killer:") {
        let (inv, legacy) = parse_invoker(&msg[..i], &msg[i + " invoked oom-killer:".len()..]);
        return Msg::Invoker(inv, legacy);
    }
    if let Some(rest) = msg.strip_prefix("oom_reaper: ") {
        return parse_reaper(rest).unwrap_or(Msg::Other);
    }
    if msg.starts_with('[') {
        if let Some(c) = TABLE_HEADER.captures(msg) {
            let cols = c.get(1).map_or("", |m| m.as_str());
            let mut cols: Vec<String> = cols.split_whitespace().map(str::to_owned).collect();
            if cols.last().is_some_and(|c| c == "name") {
                cols.pop();
            }
            return Msg::TableHeader(cols);
        }
        if let Some(c) = TABLE_ROW.captures(msg)
            && let (Some(pid), Some(rest)) = (c.get(1), c.get(2))
            && let Ok(pid) = pid.as_str().parse()
        {
            return Msg::TableRow {
                pid,
                rest: rest.as_str(),
            };
        }
        return Msg::Other;
    }
    if let Some(c) = CPU_HEADER
        .captures(msg)
        .or_else(|| PID_HEADER_2632.captures(msg))
        && let (Some(pid), Some(rest)) = (c.get(1), c.get(2))
        && let Ok(pid) = pid.as_str().parse()
    {
        let (comm, version) = split_comm_version(rest.as_str());
        return Msg::CpuHeader { pid, comm, version };
    }
    if let Some(c) = MEMCG_USAGE.captures(msg) {
        return Msg::MemcgUsage {
            usage: cap_num::<u64>(&c, 1).map(kib),
            limit: cap_num::<u64>(&c, 2).map(kib),
        };
    }
    if let Some(rest) = msg.strip_prefix("Memory cgroup stats for ") {
        // 5.x ends the line with the path; 4.x continues `: cache:0KB …`.
        let path = match rest.split_once(": ") {
            Some((path, _)) => path,
            None => rest.strip_suffix(':').unwrap_or(rest),
        };
        return Msg::MemcgStats(path.to_owned());
    }
    if let Some(rest) = msg.strip_prefix("Task in ")
        && let Some((task, limit)) = rest.split_once(" killed as a result of limit of ")
    {
        return Msg::TaskIn {
            task: task.to_owned(),
            limit: limit.to_owned(),
        };
    }
    if let Some(rest) = msg.strip_prefix("Tasks in ")
        && let Some((cg, _)) = rest.split_once(" are going to be killed")
    {
        return Msg::OomGroup(cg.to_owned());
    }
    if msg.starts_with("Out of memory and no killable processes") {
        return Msg::NoKillable;
    }
    if msg.starts_with("Mem-Info:") || msg.starts_with("Tasks state (memory values in pages)") {
        return Msg::Section;
    }
    if msg.contains("mem_cgroup_out_of_memory") {
        return Msg::MemcgTrace;
    }
    if let Some(c) = LINUX_VERSION.captures(msg)
        && let Some(v) = c.get(1)
    {
        return Msg::LinuxVersion(v.as_str().to_owned());
    }
    Msg::Other
}

fn kib(kb: u64) -> u64 {
    kb.saturating_mul(1024)
}

/// `<prefix>: Killed process N (comm) fields…` (or `Kill process`). Every
/// prefix the kernel has used says "out of memory" (`Out of memory`,
/// `Memory cgroup out of memory`, `Out of memory (oom_kill_allocating_task)`),
/// so any other text before the anchor is prose, not a kernel line.
fn parse_kill_line(msg: &str, anchor: &str) -> Option<Killed> {
    let at = msg.find(anchor)?;
    let prefix = msg[..at].trim_end();
    let lower = prefix.to_ascii_lowercase();
    if !(prefix.is_empty() || (prefix.ends_with(':') && lower.contains("out of memory"))) {
        return None;
    }
    let rest = &msg[at + anchor.len()..];
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    let pid: u32 = rest[..digits].parse().ok()?;
    let mut rest = &rest[digits..];
    // RHEL6 prints the uid before the comm: `Killed process N, UID N, (comm) …`.
    let mut uid_first = None;
    if let Some(r) = rest.strip_prefix(", UID ") {
        let d = r.bytes().take_while(u8::is_ascii_digit).count();
        uid_first = r[..d].parse::<u32>().ok();
        rest = r[d..].strip_prefix(',').unwrap_or(&r[d..]);
    }
    let rest = rest.strip_prefix(" (")?;
    let (comm, tail) = split_comm(rest);
    let prefix_kind = if lower.contains("memory cgroup") {
        PrefixKind::Memcg
    } else if lower.starts_with("out of memory") {
        PrefixKind::Global
    } else {
        PrefixKind::Unknown
    };
    Some(Killed {
        prefix: prefix_kind,
        pid,
        comm: comm.to_owned(),
        total_vm_kb: kb_field(tail, "total-vm:"),
        anon_rss_kb: kb_field(tail, "anon-rss:"),
        file_rss_kb: kb_field(tail, "file-rss:"),
        shmem_rss_kb: kb_field(tail, "shmem-rss:"),
        uid: uid_first.or_else(|| number_after(tail, "UID").and_then(|v| u32::try_from(v).ok())),
        oom_score_adj: number_after(tail, "oom_score_adj:").and_then(|v| i32::try_from(v).ok()),
        score: number_after(tail, ") score ")
            .or_else(|| number_after(tail, "score "))
            .and_then(|v| u64::try_from(v).ok()),
    })
}

/// Splits `comm) rest` at the delimiter the kernel prints after the comm,
/// so that comms with spaces, colons or parentheses survive. Returns the
/// comm and the text from the closing parenthesis on.
fn split_comm(rest: &str) -> (&str, &str) {
    const DELIMITERS: [&str; 6] = [
        ") total-vm",
        "), UID",
        "), now",
        ") score ",
        ") sharing same memory",
        ") total-",
    ];
    let found = DELIMITERS.iter().filter_map(|d| rest.find(d)).min();
    if let Some(i) = found {
        return (&rest[..i], &rest[i..]);
    }
    if let Some(i) = rest.rfind(") ") {
        return (&rest[..i], &rest[i..]);
    }
    // 2.6.18 ends the line with `(comm).`
    if let Some(stripped) = rest.trim_end().trim_end_matches('.').strip_suffix(')') {
        return (stripped, ")");
    }
    // A line cut inside the comm: keep what is there.
    (rest, "")
}

/// `key:NkB` anywhere in `s`.
fn kb_field(s: &str, key: &str) -> Option<u64> {
    let at = s.find(key)?;
    let rest = &s[at + key.len()..];
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    if !rest[digits..].starts_with("kB") {
        return None;
    }
    rest[..digits].parse::<u64>().ok().map(kib)
}

/// The signed number after `key` (skipping `:`, `=` and spaces, so that
/// `UID:1000`, `UID: 1000` and RHEL7's `UID 1000` all work).
fn number_after(s: &str, key: &str) -> Option<i64> {
    let at = s.find(key)?;
    let rest = s[at + key.len()..].trim_start_matches([':', '=', ' ']);
    let sign = usize::from(rest.starts_with('-'));
    let digits = rest[sign..].bytes().take_while(u8::is_ascii_digit).count();
    if digits == 0 {
        return None;
    }
    rest[..sign + digits].parse().ok()
}

fn parse_invoker(comm: &str, rest: &str) -> (Invoker, bool) {
    let (gfp_mask, gfp_flags) = match rest.find("gfp_mask=") {
        Some(at) => {
            let v = &rest[at + "gfp_mask=".len()..];
            let hex_len = v
                .bytes()
                .take_while(|b| b.is_ascii_hexdigit() || *b == b'x')
                .count();
            let mask = (hex_len > 0).then(|| v[..hex_len].to_owned());
            let flags = v[hex_len..]
                .strip_prefix('(')
                .and_then(|f| f.split_once(')'))
                .map(|(f, _)| f.to_owned())
                .filter(|f| !f.is_empty());
            (mask, flags)
        }
        None => (None, None),
    };
    let invoker = Invoker {
        comm: comm.trim().to_owned(),
        pid: None,
        gfp_mask,
        gfp_flags,
        order: number_after(rest, "order=").and_then(|v| i32::try_from(v).ok()),
        oom_score_adj: number_after(rest, "oom_score_adj=").and_then(|v| i32::try_from(v).ok()),
    };
    // 2.6.x prints `oom_adj=` too; those kernels have the `cpu oom_adj` table.
    (invoker, rest.contains(" oom_adj="))
}

/// `python3 Not tainted 6.1.0 #1` → (`python3`, `6.1.0`).
fn split_comm_version(rest: &str) -> (&str, Option<String>) {
    for marker in [" Not tainted", " Tainted:"] {
        if let Some(at) = rest.find(marker) {
            let version = rest[at + marker.len()..]
                .split_whitespace()
                .find(|t| VERSION_TOKEN.is_match(t))
                .map(str::to_owned);
            return (rest[..at].trim(), version);
        }
    }
    (rest.trim(), None)
}

fn parse_reaper(rest: &str) -> Option<Msg<'static>> {
    if let Some(r) = rest.strip_prefix("reaped process ") {
        let digits = r.bytes().take_while(u8::is_ascii_digit).count();
        let pid = r[..digits].parse().ok()?;
        let comm = r[digits..]
            .strip_prefix(" (")
            .map(|c| split_comm(c).0.to_owned())
            .unwrap_or_default();
        return Some(Msg::Reaped {
            pid,
            comm,
            ok: true,
        });
    }
    if let Some(r) = rest.strip_prefix("unable to reap pid:") {
        let digits = r.bytes().take_while(u8::is_ascii_digit).count();
        let pid = r[..digits].parse().ok()?;
        let comm = r[digits..]
            .strip_prefix(" (")
            .map(|c| split_comm(c).0.to_owned())
            .unwrap_or_default();
        return Some(Msg::Reaped {
            pid,
            comm,
            ok: false,
        });
    }
    None
}

/// Parses `constraint=…,nodemask=…,cpuset=…,mems_allowed=…,global_oom|
/// oom_memcg=…,task_memcg=…,task=…,pid=…,uid=…`. Values may contain commas
/// (`mems_allowed=0,2`), so each value runs to the start of the next known
/// key rather than to the next comma. A value that runs to the end of the
/// line where the kernel always prints more keys was cut off, and is
/// dropped.
fn parse_summary(rest: &str) -> Summary {
    const KEYS: [&str; 9] = [
        "constraint",
        "nodemask",
        "cpuset",
        "mems_allowed",
        "oom_memcg",
        "task_memcg",
        "task",
        "pid",
        "uid",
    ];
    // (start of the `key=` text, key, start of the value)
    let mut found: Vec<(usize, &str, usize)> = Vec::new();
    for key in KEYS {
        let at_start = rest.starts_with(key) && rest[key.len()..].starts_with('=');
        let pos = if at_start {
            Some(0)
        } else {
            rest.find(&format!(",{key}=")).map(|p| p + 1)
        };
        if let Some(p) = pos {
            found.push((p, key, p + key.len() + 1));
        }
    }
    let global_pos = rest.find(",global_oom").filter(|p| {
        let after = &rest[p + ",global_oom".len()..];
        after.is_empty() || after.starts_with(',')
    });
    let mut boundaries: Vec<usize> = found
        .iter()
        .map(|(p, _, _)| p - usize::from(*p > 0))
        .collect();
    if let Some(g) = global_pos {
        boundaries.push(g);
    }
    let mut summary = Summary {
        global_oom: global_pos.is_some(),
        ..Summary::default()
    };
    for &(_, key, value_start) in &found {
        let end = boundaries
            .iter()
            .copied()
            .filter(|b| *b >= value_start)
            .min();
        let value = match end {
            Some(e) => &rest[value_start..e],
            // Runs to the end of the line: complete only for the last key
            // the kernel prints; anything else was cut off.
            None if key == "uid" => rest[value_start..].trim_end(),
            None => continue,
        };
        match key {
            "constraint" => summary.constraint = Some(value.to_owned()),
            "oom_memcg" => summary.oom_memcg = Some(value.to_owned()),
            "task_memcg" => summary.task_memcg = Some(value.to_owned()),
            "task" => summary.task = Some(value.to_owned()),
            "pid" => summary.pid = value.parse().ok(),
            "uid" => summary.uid = value.parse().ok(),
            _ => {}
        }
    }
    summary
}

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

fn parse_row(pid: u32, rest: &str, header: Option<&[String]>, legacy: bool) -> Option<TaskRow> {
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
struct Parser {
    kills: Vec<OomKill>,
    report: Report,
    /// The running kernel's release: valid until the log shows a reboot.
    kernel_version: Option<String>,
    last_mono: Option<f64>,
    last_wall: Option<f64>,
}

impl Parser {
    /// One logical line of the log.
    fn line(&mut self, line: &str) {
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

    fn finish(mut self) -> Vec<OomKill> {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn transport(line: &str) -> Option<(Option<String>, Option<f64>, String)> {
        split_transport(line).map(|(st, msg)| (st.text, st.mono, msg.to_owned()))
    }

    #[test]
    fn comm_is_taken_up_to_the_kernel_delimiter() {
        let cases = [
            ("tmux: server) total-vm:1kB", "tmux: server"),
            ("(resolved)) total-vm:1kB", "(resolved)"),
            ("GC Thread#9) total-vm:1kB", "GC Thread#9"),
            ("Web Content), UID 1000, total-vm:1kB", "Web Content"),
            ("a (b) c), now anon-rss:0kB", "a (b) c"),
            ("python3) score 5 or sacrifice child", "python3"),
            ("x) sharing same memory", "x"),
            ("uvicorn) total-", "uvicorn"),
            ("java).", "java"),
            ("init)", "init"),
            ("cut-off comm", "cut-off comm"),
        ];
        for (input, comm) in cases {
            assert_eq!(split_comm(input).0, comm, "{input}");
        }
    }

    #[test]
    fn summary_values_may_contain_commas_and_be_cut_off() {
        let s = parse_summary(
            "constraint=CONSTRAINT_MEMCG,nodemask=0-1,cpuset=a,b,mems_allowed=0,2-3,oom_memcg=/x,task_memcg=/x/y,task=tmux: server,pid=42,uid=7",
        );
        assert_eq!(s.constraint.as_deref(), Some("CONSTRAINT_MEMCG"));
        assert!(!s.global_oom);
        assert_eq!(s.oom_memcg.as_deref(), Some("/x"));
        assert_eq!(s.task_memcg.as_deref(), Some("/x/y"));
        assert_eq!(s.task.as_deref(), Some("tmux: server"));
        assert_eq!((s.pid, s.uid), (Some(42), Some(7)));

        let global = parse_summary(
            "constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0,global_oom,task_memcg=/,task=a,pid=1,uid=0",
        );
        assert!(global.global_oom);
        assert_eq!(global.oom_memcg, None);
        assert_eq!(global.task_memcg.as_deref(), Some("/"));

        // Cut inside task_memcg: the path is incomplete, and pid unknown.
        let cut = parse_summary("constraint=CONSTRAINT_MEMCG,oom_memcg=/a,task_memcg=/a/b/c");
        assert_eq!(cut.oom_memcg.as_deref(), Some("/a"));
        assert_eq!(cut.task_memcg, None);
        assert_eq!(cut.pid, None);

        let empty = parse_summary("");
        assert_eq!(empty.constraint, None);
    }

    #[test]
    fn rows_follow_the_header_or_their_width() {
        let header: Vec<String> = "uid tgid total_vm rss pgtables_bytes swapents oom_score_adj"
            .split(' ')
            .map(str::to_owned)
            .collect();
        let row = parse_row(
            5,
            "1000  5   609228     3511   540672        0           233 Web Content",
            Some(&header),
            false,
        )
        .expect("row");
        assert_eq!(row.name, "Web Content");
        assert_eq!(row.pgtables_bytes, Some(540_672));
        assert_eq!(row.oom_score_adj, Some(233));

        // Without a header, 7 columns are ambiguous in the middle…
        let row = parse_row(5, "0  5  100  10  1  2  -17 x", None, false).expect("row");
        assert_eq!((row.total_vm_pages, row.rss_pages), (Some(100), Some(10)));
        assert_eq!(
            (row.pgtables_bytes, row.nr_ptes, row.cpu),
            (None, None, None)
        );
        assert_eq!(row.oom_score_adj, Some(-17));
        // …unless the invoker line said this is a 2.6.x kernel.
        let row = parse_row(5, "0  5  100  10  1  -17  -1000 x", None, true).expect("row");
        assert_eq!(
            (row.cpu, row.oom_adj, row.oom_score_adj),
            (Some(1), Some(-17), Some(-1000))
        );

        // A numeric name is not swallowed as a column.
        let row = parse_row(5, "0 5 1 1 1 1 0 0 1 0 2024", None, false).expect("row");
        assert_eq!(row.name, "2024");
        assert_eq!(row.rss_anon_pages, Some(1));

        assert_eq!(parse_row(5, "1 2 3", None, false), None);
        assert_eq!(parse_row(5, "", Some(&header), false), None);
    }

    #[test]
    fn transports_are_stripped() {
        let msg = "Out of memory: Killed process 1 (x)";
        let cases: [(&str, Option<&str>, Option<f64>); 14] = [
            ("[  123.456789] {M}", Some("123.456789"), Some(123.456_789)),
            (
                "[Fri Nov 21 14:22:56 2025] {M}",
                Some("Fri Nov 21 14:22:56 2025"),
                None,
            ),
            (
                "2024-04-29T14:55:41,679700+02:00 {M}",
                Some("2024-04-29T14:55:41,679700+02:00"),
                None,
            ),
            (
                "3,1699,7208057400,-;{M}",
                Some("7208.057400"),
                Some(7208.0574),
            ),
            (
                "3,1699,7208057400,-,caller=T12;{M}",
                Some("7208.057400"),
                Some(7208.0574),
            ),
            (
                "May 15 23:09:30 host kernel: [  518.050606] {M}",
                Some("May 15 23:09:30"),
                Some(518.050_606),
            ),
            (
                "Nov 22 06:26:05 hostname kernel: {M}",
                Some("Nov 22 06:26:05"),
                None,
            ),
            (
                "[ 1929.272003] hostname kernel: {M}",
                Some("1929.272003"),
                Some(1_929.272_003),
            ),
            (
                "Mon 2024-04-29 14:55:41 CEST myhost kernel: {M}",
                Some("Mon 2024-04-29 14:55:41 CEST"),
                None,
            ),
            ("> > [    1.000000] {M}", Some("1.000000"), Some(1.0)),
            ("<3>[    1.000000] {M}", Some("1.000000"), Some(1.0)),
            (
                "kern  :err   : [    1.000000] {M}",
                Some("1.000000"),
                Some(1.0),
            ),
            ("[    1.000000][  T4321] {M}", Some("1.000000"), Some(1.0)),
            ("kernel: {M}", None, None),
        ];
        for (line, ts, mono) in cases {
            let line = line.replace("{M}", msg);
            let (got_ts, got_mono, got_msg) = transport(&line).expect(&line);
            assert_eq!(got_msg, msg, "{line}");
            assert_eq!(got_ts.as_deref(), ts, "{line}");
            match (got_mono, mono) {
                (Some(a), Some(b)) => assert!((a - b).abs() < 1e-6, "{line}"),
                (a, b) => assert_eq!(a, b, "{line}"),
            }
        }
        assert!(transport("# source: somewhere").is_none());
        assert!(transport("Sep 02 13:07:24 systemd-oomd[885]: Killed /x").is_none());
        assert!(transport("Dec 18 19:34:56 host systemd-oomd[840]: Killed /x").is_none());
        // Table rows and headers are not timestamps.
        assert_eq!(
            transport("[  15758]     0 x").map(|t| t.2),
            Some("[  15758]     0 x".to_owned())
        );
        assert_eq!(
            transport("[  pid  ]   uid").map(|t| t.2),
            Some("[  pid  ]   uid".to_owned())
        );
    }

    #[test]
    fn streaming_parses_as_the_whole_text_and_writes_the_same_json() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/kernel-logs");
        let mut all = String::new();
        for entry in std::fs::read_dir(dir).unwrap() {
            let text = std::fs::read_to_string(entry.unwrap().path()).unwrap();
            all.push_str(&text);
            all.push('\n');
        }
        // Many copies, so that kills are settled and taken mid-stream.
        let text = all.repeat(8);
        let whole = parse(&text);
        assert!(whole.len() > UNSETTLED_KILLS, "{}", whole.len());
        let mut stream = StreamParser::new();
        let mut w = JsonWriter::default();
        let mut json = Vec::new();
        w.begin(&mut json).unwrap();
        let mut got = Vec::new();
        for line in text.split_inclusive('\n') {
            stream.feed(line);
            for k in stream.take_settled() {
                w.kill(&mut json, k.clone()).unwrap();
                got.push(k);
            }
        }
        for k in stream.finish() {
            w.kill(&mut json, k.clone()).unwrap();
            got.push(k);
        }
        w.end(&mut json).unwrap();
        assert_eq!(got, whole);
        let want = format!("{:#}\n", render_json(&whole));
        assert!(String::from_utf8(json).unwrap() == want, "JSON differs");

        let mut empty = Vec::new();
        let mut w = JsonWriter::default();
        w.begin(&mut empty).unwrap();
        w.end(&mut empty).unwrap();
        assert_eq!(
            String::from_utf8(empty).unwrap(),
            format!("{:#}\n", render_json(&[]))
        );
    }

    #[test]
    fn kmsg_records_are_rejoined() {
        let text = "3,1,100,-;Out of memory: Kill process 1 (a) score 9 or sacr\n ifice child\n SUBSYSTEM=mem\n\nplain line\n continued?";
        let lines = logical_lines(text);
        assert_eq!(
            lines,
            vec![
                "3,1,100,-;Out of memory: Kill process 1 (a) score 9 or sacrifice child",
                "",
                "plain line",
                " continued?",
            ]
        );
    }

    #[test]
    fn clock_helpers() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
        let c = ISO_TS
            .captures("1970-01-02T00:00:01.5+01:00 x")
            .expect("iso");
        assert_eq!(iso_seconds(&c), Some(86_401.5 - 3600.0));
        assert_eq!(dmesg_t_seconds("Thu Jan  1 00:01:00 1970"), Some(60.0));
        assert_eq!(uptime_seconds(" 12.000500"), Some(12.0005));
    }

    #[test]
    fn sizes_are_readable() {
        assert_eq!(human_bytes(0), "0 B");
        assert_eq!(human_bytes(1023), "1023 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(28_598_771_712), "26.6 GiB");
        assert_eq!(human_bytes(u64::MAX), "16384.0 PiB");
    }
}
