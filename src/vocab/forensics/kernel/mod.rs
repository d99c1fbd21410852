//! Kernel OOM-killer reports: parsing every layout the kernel has printed.
//!
//! This module owns the translation of kernel log text into [`OomKill`]
//! records, and their rendering for `oomguard forensics` (JSON and a
//! human summary). It never reads files or devices: callers hand it text
//! (a saved log, stdin, or what [`crate::vocab::forensics::kmsg`] read live).
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

mod line;
mod report;

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

pub(crate) use line::days_from_civil;
use line::{KMSG_DICT, KMSG_RECORD, logical_lines};
use report::Parser;

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

#[cfg(test)]
mod tests {
    use super::line::{
        ISO_TS, days_from_civil, dmesg_t_seconds, iso_seconds, logical_lines, parse_summary,
        split_comm, split_transport, uptime_seconds,
    };
    use super::report::parse_row;
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
