//! The HTML report: one self-contained page (inline CSS and SVG, no script,
//! no fonts or images to fetch) that opens anywhere, including on a machine
//! without network access, and prints cleanly.
//!
//! The markup is well-formed XML apart from the doctype and the void
//! `<meta>` tag, so it survives strict tools and is easy to test.

use std::fmt::Write;

use super::finding::outcome_text;
use super::finding::{Finding, Severity, processes, time_text};
use super::run_log::{RunLog, Timed};
use super::svg::{esc, timeline};
use super::text::{command_text, duration, event_summary, peaks};
use crate::sinks::log::Event as Logged;
use crate::vocab::growth::Figure;
use crate::vocab::units::HumanBytes;

/// Rows shown before a table folds the rest into a `<details>`.
const ROWS_SHOWN: usize = 25;

const CSS: &str = r#"
:root { --ink:#1f2430; --muted:#5b6473; --line:#e4e7ec; --bg:#f4f5f7; --card:#ffffff;
  --crit:#C84E00; --warn:#E69F00; --info:#0072B2; --ok:#00805E; }
* { box-sizing: border-box; }
html { background: var(--bg); }
body { margin: 0; color: var(--ink); font: 15px/1.5 system-ui, -apple-system, "Segoe UI", Roboto,
  "Noto Sans", "Liberation Sans", "DejaVu Sans", Arial, sans-serif; -webkit-font-smoothing: antialiased; }
main { max-width: 1200px; margin: 0 auto; padding: 28px 32px 40px; }
code, .mono { font-family: ui-monospace, "SF Mono", Menlo, Consolas, "Liberation Mono", "DejaVu Sans Mono", monospace; font-size: 0.92em; }
header.top { display: flex; gap: 24px; align-items: flex-start; justify-content: space-between; margin-bottom: 18px; }
.eyebrow { font-size: 12px; font-weight: 700; letter-spacing: .08em; text-transform: uppercase; color: var(--muted); margin: 0 0 4px; }
h1 { font-size: 22px; line-height: 1.3; margin: 0 0 6px; font-weight: 650; word-break: break-word; }
h1 code { font-size: 20px; background: none; }
.meta { color: var(--muted); font-size: 13.5px; margin: 0; }
.meta span + span::before { content: "·"; margin: 0 8px; color: #a3a9b3; }
.outcome { flex: none; text-align: right; }
.pill { display: inline-block; padding: 6px 14px; border-radius: 999px; font-weight: 650; font-size: 15px; color: #fff; white-space: nowrap; }
.pill.critical { background: var(--crit); } .pill.warning { background: var(--warn); color: #1f1400; }
.pill.info { background: var(--info); } .pill.ok { background: var(--ok); }
.outcome .sub { display: block; margin-top: 6px; font-size: 13px; color: var(--muted); }
.cards { display: grid; grid-template-columns: repeat(4, minmax(0, 1fr)); gap: 12px; margin: 0 0 20px; }
@media (max-width: 760px) { .cards { grid-template-columns: repeat(2, minmax(0, 1fr)); } }
.card { background: var(--card); border: 1px solid var(--line); border-radius: 10px; padding: 11px 14px 12px; }
.card .k { font-size: 11.5px; font-weight: 650; letter-spacing: .05em; text-transform: uppercase; color: var(--muted); }
.card .v { font-size: 21px; font-weight: 650; font-variant-numeric: tabular-nums; margin-top: 2px; white-space: nowrap; }
.card .s { font-size: 12.5px; color: var(--muted); font-variant-numeric: tabular-nums; }
section { background: var(--card); border: 1px solid var(--line); border-radius: 12px; padding: 18px 24px 20px; margin: 0 0 20px; }
h2 { font-size: 17px; margin: 0 0 12px; font-weight: 650; }
h2 .count { color: var(--muted); font-weight: 500; font-size: 14px; margin-left: 6px; }
.chart { margin: 0 -8px; }
.chart svg { display: block; width: 100%; height: auto; }
.caption { color: var(--muted); font-size: 13px; margin: 8px 0 0; }
.finding { border: 1px solid var(--line); border-left: 5px solid var(--info); border-radius: 8px; padding: 12px 16px 12px; margin: 0 0 12px; }
.finding.critical { border-left-color: var(--crit); } .finding.warning { border-left-color: var(--warn); }
.finding.ok { border-left-color: var(--ok); }
.finding h3 { margin: 0 0 4px; font-size: 15.5px; font-weight: 650; display: flex; gap: 10px; align-items: baseline; }
.sev { flex: none; font-size: 11px; font-weight: 750; letter-spacing: .06em; text-transform: uppercase; padding: 2px 8px; border-radius: 4px; color: #fff; background: var(--info); position: relative; top: -1px; }
.sev.critical { background: var(--crit); } .sev.warning { background: var(--warn); color: #1f1400; } .sev.ok { background: var(--ok); }
.finding p { margin: 0 0 8px; max-width: 92ch; }
.nums { display: flex; flex-wrap: wrap; gap: 6px; margin: 0; padding: 0; list-style: none; }
.nums li { background: #f1f3f6; border-radius: 5px; padding: 2px 8px; font-size: 12.5px; color: var(--muted); }
.nums li b { color: var(--ink); font-weight: 600; font-variant-numeric: tabular-nums; }
table { border-collapse: collapse; width: 100%; font-size: 13.5px; font-variant-numeric: tabular-nums; }
th { text-align: left; font-weight: 650; color: var(--muted); font-size: 12px; letter-spacing: .03em; text-transform: uppercase; padding: 6px 10px; border-bottom: 2px solid var(--line); white-space: nowrap; }
td { padding: 6px 10px; border-bottom: 1px solid var(--line); vertical-align: top; }
tbody tr:last-child td { border-bottom: none; }
.num { text-align: right; white-space: nowrap; }
td.ev { white-space: nowrap; }
.role { display: inline-block; padding: 0 7px; border-radius: 4px; font-size: 12px; font-weight: 600; }
.role-trainer { background: #d6e8f5; color: #00466e; } .role-worker { background: #fbe7bf; color: #6b4800; }
.role-other { background: #f3deea; color: #7a2d5b; } .role-launcher { background: #e7e7e7; color: #444; }
.seq { display: inline-block; min-width: 26px; padding: 0 4px; text-align: center; font-weight: 700; font-size: 12px; border-radius: 4px; background: #5b6473; color: #fff; text-decoration: none; }
.seq.ev-rule { background: #E69F00; color: #1a1a1a; } .seq.ev-action { background: #0072B2; }
.seq.ev-restart { background: #009E73; } .seq.ev-oom_kill { background: #D55E00; }
.seq.ev-cuda_oom { background: #CC79A7; color: #1a1a1a; } .seq.ev-worker_died { background: #2b2b2b; }
td.nowrap { white-space: nowrap; }
.leak { color: var(--crit); font-weight: 650; }
details summary { cursor: pointer; color: var(--info); margin: 8px 0 0; font-size: 13.5px; }
footer { color: var(--muted); font-size: 12.5px; text-align: center; margin-top: 8px; }
footer ul { text-align: left; display: inline-block; margin: 6px 0; }
.empty { color: var(--muted); font-style: italic; }
@media print { html { background: #fff; } main { padding: 0; } section, .card { break-inside: avoid; } }
"#;

/// Renders the whole report page.
pub fn render_html(log: &RunLog, findings: &[Finding]) -> String {
    let mut h = String::with_capacity(64 * 1024);
    let command = command_text(log);
    let _ = write!(
        h,
        r#"<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"/><meta name="viewport" content="width=device-width, initial-scale=1"/><meta name="generator" content="oomguard"/><title>oomguard report: {}</title><style>{CSS}</style></head><body><main>"#,
        esc(&truncate(&command, 80))
    );
    header(&mut h, log, &command);
    cards(&mut h, log);
    chart(&mut h, log);
    findings_section(&mut h, findings);
    attempts_section(&mut h, log);
    events_section(&mut h, log);
    processes_section(&mut h, log);
    footer(&mut h, log);
    h.push_str("</main></body></html>\n");
    h
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(n - 1).collect();
        t.push('…');
        t
    }
}

/// The outcome as a severity, for its colour.
fn outcome_severity(log: &RunLog) -> Severity {
    let Some(end) = &log.end else {
        return Severity::Warning;
    };
    match end.outcome.as_deref() {
        Some("oom_killed" | "internal_error") => Severity::Critical,
        Some("restart_limit" | "signaled") => Severity::Warning,
        Some("stopped_by_policy" | "stopped_by_signal" | "detached") => Severity::Info,
        Some("exited") if end.exit_code == Some(0) => Severity::Ok,
        _ => Severity::Warning,
    }
}

fn header(h: &mut String, log: &RunLog, command: &str) {
    let _ = write!(
        h,
        r#"<header class="top"><div><p class="eyebrow">oomguard run report</p><h1><code>{}</code></h1><p class="meta">"#,
        esc(command)
    );
    if let Some(s) = &log.start {
        if let Some(ts) = &s.ts {
            let _ = write!(h, "<span>started {}</span>", esc(&ts.replace('T', " ")));
        }
        if let Some(pid) = s.pid {
            let _ = write!(h, "<span>pid {pid}</span>");
        }
        if let Some((v, path)) = &s.cgroup {
            let _ = write!(h, "<span>cgroup v{v} <code>{}</code></span>", esc(path));
        }
        let rules = s.rules.len();
        let _ = write!(
            h,
            "<span>{}</span>",
            if rules == 0 {
                "no policy (observe only)".to_string()
            } else {
                format!("{rules} policy rule{}", if rules == 1 { "" } else { "s" })
            }
        );
        if let Some(v) = &s.version {
            let _ = write!(h, "<span>oomguard {}</span>", esc(v));
        }
    }
    let sev = outcome_severity(log);
    let _ = write!(
        h,
        r#"</p></div><div class="outcome"><span class="pill {}" id="outcome">{}</span><span class="sub">{}</span></div></header>"#,
        sev.as_str(),
        esc(&outcome_title(log)),
        esc(&format!("after {}", time_text(duration(log))))
    );
}

fn outcome_title(log: &RunLog) -> String {
    let Some(end) = &log.end else {
        return "Outcome unknown (no run_end)".to_string();
    };
    let code = end
        .exit_code
        .map_or_else(String::new, |c| format!(" · exit code {c}"));
    let what = match end.outcome.as_deref() {
        Some("exited") => "Exited",
        Some("signaled") => "Killed by a signal",
        Some("stopped_by_policy") => "Stopped by oomguard",
        Some("stopped_by_signal") => "Saved and stopped on a signal",
        Some("oom_killed") => "OOM-killed by the kernel",
        Some("restart_limit") => "Restart limit reached",
        Some("internal_error") => "oomguard internal error",
        Some("detached") => "Stopped watching (job still running)",
        Some(other) => other,
        None => "Ended",
    };
    format!("{what}{code}")
}

fn card(h: &mut String, key: &str, value: &str, sub: &str) {
    let _ = write!(
        h,
        r#"<div class="card"><div class="k">{}</div><div class="v">{}</div><div class="s">{}</div></div>"#,
        esc(key),
        esc(value),
        esc(sub)
    );
}

/// Eight key figures, two rows of four.
fn cards(h: &mut String, log: &RunLog) {
    let p = peaks(log);
    h.push_str(r#"<div class="cards" id="peaks">"#);
    card(
        h,
        "Peak footprint",
        &HumanBytes(p.footprint).to_string(),
        &format!("{}, at {}", log.footprint_kind(), time_text(p.footprint_t)),
    );
    // The sums are breakdowns of the footprint, not what the ceiling was
    // compared with: PSS counts file pages the working set may not hold,
    // RSS counts shared pages again.
    card(
        h,
        "Peak PSS sum",
        &HumanBytes(p.pss).to_string(),
        &format!("breakdown; RSS sum {}", HumanBytes(p.rss)),
    );
    let least = log
        .samples
        .iter()
        .filter_map(|s| s.headroom_percent.map(|p| (p, s.t)))
        .min_by(|a, b| a.0.total_cmp(&b.0));
    match super::fit::nearest_ceiling(log) {
        Some((source, bytes)) => card(h, "Ceiling", &HumanBytes(bytes).to_string(), &source),
        None => card(h, "Ceiling", "—", "none known"),
    }
    card(
        h,
        "Peak swap",
        &HumanBytes(p.swap).to_string(),
        "machine-wide",
    );
    let gpus = p.gpu > 0 || log.samples.iter().any(|s| !s.gpus.is_empty());
    if gpus {
        card(h, "Peak GPU", &HumanBytes(p.gpu).to_string(), "all devices");
    } else {
        match least {
            Some((pct, t)) => card(
                h,
                "Least headroom",
                &format!("{pct:.1}%"),
                &format!("of the ceiling, at {}", time_text(t)),
            ),
            None => card(h, "Least headroom", "—", "no ceiling known"),
        }
    }
    let attempts = log.attempts.len().max(1);
    card(
        h,
        "Attempts",
        &attempts.to_string(),
        &format!(
            "{} restart{}",
            attempts - 1,
            if attempts == 2 { "" } else { "s" }
        ),
    );
    let kills = log
        .events
        .iter()
        .filter(|e| matches!(e.event, Logged::OomKill(_)))
        .count();
    card(
        h,
        "Kernel OOM kills",
        &kills.to_string(),
        if kills == 0 {
            "none"
        } else {
            "see the diagnosis"
        },
    );
    card(h, "Duration", &time_text(duration(log)), &outcome_text(log));
    h.push_str("</div>");
}

fn chart(h: &mut String, log: &RunLog) {
    h.push_str(r#"<section id="timeline-section"><h2>Timeline</h2>"#);
    let svg = timeline(log);
    if svg.is_empty() {
        h.push_str(r#"<p class="empty">The log has no samples to draw.</p></section>"#);
        return;
    }
    let _ = write!(h, r#"<div class="chart">{svg}</div>"#);
    let lists = log.snapshots.len();
    let markers = if log.events.iter().any(|e| e.has_marker()) {
        " Numbered markers match the event table below; hover a marker for details."
    } else {
        ""
    };
    let footprint = if log.footprint_is_working_set() {
        "the working set of the job's own cgroup (every page charged to it, page cache and /dev/shm included; file pages charged elsewhere, such as libraries read before the job, are not)"
    } else {
        "the PSS sum of the job's processes (shared pages counted once)"
    };
    let _ = write!(
        h,
        r#"<p class="caption">Footprint = {footprint}: what the policy compared with the ceiling and the warn and critical levels. The PSS stacked by role, the PSS sum and the RSS sum are breakdowns. The split by role comes from the {lists} per-process list{} in the log and is interpolated between them; the stack's top is the measured PSS sum of every sample.{markers}</p></section>"#,
        if lists == 1 { "" } else { "s" }
    );
}

fn findings_section(h: &mut String, findings: &[Finding]) {
    let _ = write!(
        h,
        r#"<section id="findings"><h2>Diagnosis and advice<span class="count">{}</span></h2>"#,
        findings.len()
    );
    if findings.is_empty() {
        h.push_str(r#"<p class="empty">Nothing to report: the log holds too little data.</p>"#);
    }
    for f in findings {
        let sev = f.severity.as_str();
        let _ = write!(
            h,
            r#"<article class="finding {sev}" data-kind="{}"><h3><span class="sev {sev}">{sev}</span><span>{}</span></h3><p>{}</p>"#,
            f.kind,
            esc(&f.title),
            esc(&f.advice)
        );
        if !f.numbers.is_empty() {
            h.push_str(r#"<ul class="nums">"#);
            for n in &f.numbers {
                let _ = write!(
                    h,
                    r#"<li data-name="{}">{} <b>{}</b></li>"#,
                    esc(&n.name),
                    esc(&n.label),
                    esc(&n.text)
                );
            }
            h.push_str("</ul>");
        }
        h.push_str("</article>");
    }
    h.push_str("</section>");
}

fn attempts_section(h: &mut String, log: &RunLog) {
    let _ = write!(
        h,
        r#"<section id="attempts"><h2>Attempts<span class="count">{}</span></h2><table><thead><tr><th class="num">#</th><th class="num">start</th><th class="num">end</th><th class="num">peak footprint</th><th class="num">workers</th><th>changed</th><th>exit</th><th>ended by</th></tr></thead><tbody>"#,
        log.attempts.len()
    );
    for a in &log.attempts {
        let changed: Vec<String> = a
            .degraded
            .iter()
            .map(|(k, (old, new))| format!("{k} {} → {}", plain(old), plain(new)))
            .chain(a.checkpoint.iter().map(|c| format!("from {c}")))
            .collect();
        let exit = match (&a.exit_code, &a.exit_signal) {
            (_, Some(s)) => s.clone(),
            (Some(c), None) => format!("code {c}"),
            _ => "—".to_string(),
        };
        let _ = write!(
            h,
            r#"<tr><td class="num">{}</td><td class="num">{}</td><td class="num">{}</td><td class="num">{}</td><td class="num">{}</td><td>{}</td><td class="nowrap">{}</td><td class="nowrap">{}</td></tr>"#,
            a.number,
            esc(&time_text(a.start_t)),
            esc(&time_text(a.end_t)),
            HumanBytes(a.peak_footprint_bytes),
            a.max_workers,
            if changed.is_empty() {
                "—".to_string()
            } else {
                esc(&changed.join("; "))
            },
            esc(&exit),
            esc(&a.ended_by)
        );
    }
    h.push_str("</tbody></table></section>");
}

fn plain(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Null => "unset".into(),
        v => v.to_string(),
    }
}

fn events_section(h: &mut String, log: &RunLog) {
    let rows: Vec<&Timed> = log.events.iter().collect();
    let _ = write!(
        h,
        r#"<section id="events"><h2>Events<span class="count">{}</span></h2>"#,
        rows.len()
    );
    if rows.is_empty() {
        h.push_str(r#"<p class="empty">No rule, action or failure was logged.</p></section>"#);
        return;
    }
    let head = r#"<table><thead><tr><th class="num">#</th><th class="num">time</th><th class="num">attempt</th><th>event</th><th>what happened</th></tr></thead><tbody>"#;
    let row = |h: &mut String, e: &&Timed| {
        let seq = if e.seq > 0 {
            format!(
                r##"<a class="seq ev-{1}" href="#marker-{0}">{0}</a>"##,
                e.seq,
                e.event.name()
            )
        } else {
            String::new()
        };
        let _ = write!(
            h,
            r#"<tr id="event-{}"><td class="num">{seq}</td><td class="num">{}</td><td class="num">{}</td><td class="ev">{}</td><td>{}</td></tr>"#,
            e.line,
            esc(&time_text(e.t)),
            e.attempt,
            esc(&e.event.name().replace('_', " ")),
            esc(&event_summary(e))
        );
    };
    table_with_fold(h, head, &rows, row, "events");
    h.push_str("</section>");
}

/// A table whose rows beyond [`ROWS_SHOWN`] fold into `<details>`, so the
/// page stays short without needing a script.
fn table_with_fold<T>(
    h: &mut String,
    head: &str,
    rows: &[T],
    row: impl Fn(&mut String, &T),
    what: &str,
) {
    h.push_str(head);
    for r in rows.iter().take(ROWS_SHOWN) {
        row(h, r);
    }
    h.push_str("</tbody></table>");
    if rows.len() > ROWS_SHOWN {
        let _ = write!(
            h,
            "<details><summary>{} more {what}</summary>{head}",
            rows.len() - ROWS_SHOWN
        );
        for r in &rows[ROWS_SHOWN..] {
            row(h, r);
        }
        h.push_str("</tbody></table></details>");
    }
}

fn processes_section(h: &mut String, log: &RunLog) {
    let procs = processes(log);
    let several = log.attempts.len() > 1;
    let _ = write!(
        h,
        r#"<section id="processes"><h2>Processes<span class="count">{}</span></h2>"#,
        procs.len()
    );
    if procs.is_empty() {
        h.push_str(r#"<p class="empty">The log has no per-process lists.</p></section>"#);
        return;
    }
    let head = format!(
        r#"<table><thead><tr>{}<th class="num">pid</th><th>role</th><th>command</th><th class="num">peak PSS</th><th class="num">peak USS</th><th class="num">peak RSS</th><th class="num">peak swap</th><th class="num">USS growth</th><th class="num">seen</th></tr></thead><tbody>"#,
        if several {
            r#"<th class="num">attempt</th>"#
        } else {
            ""
        }
    );
    let row = |h: &mut String, p: &super::finding::ProcSummary| {
        // The figure the readings support (`growth::figure`), as on the
        // dashboard: a rate, "flat", or "—" with too few readings.
        let growth = match p.uss_figure {
            Figure::Rate(s) if p.leaks() && s > 0.0 => format!(
                r#"<span class="leak">+{}</span>"#,
                esc(&super::finding::rate_text(s))
            ),
            Figure::Rate(s) => esc(&super::finding::rate_text(s)),
            Figure::Flat => "flat".to_string(),
            Figure::Unknown => "—".to_string(),
        };
        let _ = write!(
            h,
            r#"<tr>{}<td class="num">{}</td><td><span class="role role-{role}">{role}</span></td><td><code>{}</code></td><td class="num">{}</td><td class="num">{}</td><td class="num">{}</td><td class="num">{}</td><td class="num">{growth}</td><td class="num">{}–{}</td></tr>"#,
            if several {
                format!(r#"<td class="num">{}</td>"#, p.attempt)
            } else {
                String::new()
            },
            p.pid,
            esc(&p.comm),
            HumanBytes(p.peak_pss_bytes),
            HumanBytes(p.peak_uss_bytes),
            HumanBytes(p.peak_rss_bytes),
            HumanBytes(p.peak_swap_bytes),
            esc(&time_text(p.first_t)),
            esc(&time_text(p.last_t)),
            role = p.role.as_str(),
        );
    };
    table_with_fold(h, &head, &procs, row, "processes");
    h.push_str(
        r#"<p class="caption">PSS: proportional share (shared pages split between their users). USS: private memory, what the process alone costs. RSS counts shared pages in every process that maps them. USS growth is the least-squares slope over the per-process lists.</p></section>"#,
    );
}

fn footer(h: &mut String, log: &RunLog) {
    h.push_str("<footer>");
    if !log.warnings.is_empty() {
        let skipped = log.warnings.len() + log.unlisted_warnings;
        let _ = write!(
            h,
            r#"<div id="log-warnings"><b>{skipped} log line{} skipped:</b><ul>"#,
            if skipped == 1 { "" } else { "s" }
        );
        for w in &log.warnings {
            let _ = write!(h, "<li>{}</li>", esc(w));
        }
        if log.unlisted_warnings > 0 {
            let _ = write!(h, "<li>… {} more</li>", log.unlisted_warnings);
        }
        h.push_str("</ul></div>");
    }
    let _ = write!(
        h,
        "<p>Generated by oomguard {} from a log of schema {}.</p></footer>",
        env!("CARGO_PKG_VERSION"),
        crate::sinks::log::SCHEMA
    );
}
