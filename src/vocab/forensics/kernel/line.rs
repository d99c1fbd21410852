//! One line of a kernel log: the transport stripped off (dmesg, syslog,
//! journalctl, `/dev/kmsg` records) and what the kernel message says. Kept
//! apart from the grouping into reports because every line is read alone here,
//! with no memory of the lines before it.

use std::borrow::Cow;
use std::sync::LazyLock;

use regex::Regex;

use super::Invoker;

// ---------------------------------------------------------------------------
// Transport: from raw lines to (timestamp, kernel message).

/// Where a line's time came from, kept for grouping lines into reports.
#[derive(Debug, Clone, Default)]
pub(super) struct Stamp {
    /// The timestamp as printed (see [`OomKill::ts`]).
    pub(super) text: Option<String>,
    /// Seconds since boot (printk clock).
    pub(super) mono: Option<f64>,
    /// Wall-clock seconds on an arbitrary but consistent scale, only used
    /// to detect gaps between lines.
    pub(super) wall: Option<f64>,
}

pub(super) static KMSG_RECORD: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^(\d{1,5}),(\d{1,20}),(\d{1,20}),[^;]*;").expect("static regex"));
pub(super) static ISO_TS: LazyLock<Regex> = LazyLock::new(|| {
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
pub(super) static KMSG_DICT: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^[A-Z][A-Z0-9_]*=").expect("static regex"));

/// Splits `text` into lines and glues `/dev/kmsg` continuation lines back
/// onto their record: dictionary lines (` SUBSYSTEM=…`) are dropped, any
/// other line starting with a space continues the record's message (records
/// hard-wrapped by a person, as in some bug reports).
pub(super) fn logical_lines(text: &str) -> Vec<Cow<'_, str>> {
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
pub(super) fn split_transport(line: &str) -> Option<(Stamp, &str)> {
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

pub(super) fn uptime_seconds(content: &str) -> Option<f64> {
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
pub(crate) fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
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

pub(super) fn iso_seconds(c: &regex::Captures<'_>) -> Option<f64> {
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

pub(super) fn dmesg_t_seconds(content: &str) -> Option<f64> {
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
pub(super) enum Msg<'a> {
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
pub(super) struct Summary {
    pub(super) constraint: Option<String>,
    pub(super) global_oom: bool,
    pub(super) oom_memcg: Option<String>,
    pub(super) task_memcg: Option<String>,
    pub(super) task: Option<String>,
    pub(super) pid: Option<u32>,
    pub(super) uid: Option<u32>,
}

/// Which kind of OOM a line's prefix names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum PrefixKind {
    Memcg,
    Global,
    Unknown,
}

/// A `Killed process` / `Kill process` line.
#[derive(Debug, Clone)]
pub(super) struct Killed {
    pub(super) prefix: PrefixKind,
    pub(super) pid: u32,
    pub(super) comm: String,
    pub(super) total_vm_kb: Option<u64>,
    pub(super) anon_rss_kb: Option<u64>,
    pub(super) file_rss_kb: Option<u64>,
    pub(super) shmem_rss_kb: Option<u64>,
    pub(super) uid: Option<u32>,
    pub(super) oom_score_adj: Option<i32>,
    pub(super) score: Option<u64>,
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

pub(super) fn classify(msg: &str) -> Msg<'_> {
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
pub(super) fn split_comm(rest: &str) -> (&str, &str) {
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
pub(super) fn parse_summary(rest: &str) -> Summary {
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
