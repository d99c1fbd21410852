//! `oomguard report` of several logs: one job across nodes, one oomguard
//! and one log per node. This part puts the nodes on one clock (each log's
//! `run_start` wall time), finds the node that ran short first and when,
//! the steps the nodes saved together, the steps each restart lost, and
//! each node's ranks side by side; and renders that as HTML (one lane per
//! node on the common clock), text or JSON. A node is named by its log's
//! file name (`run-%N.ndjson` gives `run-1`).

use std::collections::BTreeMap;
use std::fmt::Write;

use serde::Serialize;

use super::run_log::RunLog;
use super::svg::{esc, time_label};
use crate::sinks::log::Event as Logged;
use crate::sinks::log::{ActionEvent, CheckpointDoneEvent, FaultEvent};
use crate::vocab::units::HumanBytes;

/// The whole job, as its logs tell it.
#[derive(Debug, Serialize)]
pub struct JobReport {
    pub nodes: Vec<NodeRow>,
    /// The first node that ran short or lost a rank (not one that only
    /// followed another).
    pub cause: Option<Cause>,
    /// Each saved step, with the nodes that saved it.
    pub checkpoints: Vec<Coordinated>,
    pub restarts: Vec<RestartRow>,
    /// From the first node's start to the last node's last line.
    pub span_seconds: f64,
    /// Logs placed without a start time, and the like.
    pub warnings: Vec<String>,
}

/// One node, side by side with the others.
#[derive(Debug, Serialize)]
pub struct NodeRow {
    pub name: String,
    /// Global ranks whose companion said hello on this node.
    pub ranks: Vec<u32>,
    /// Its start on the common clock.
    pub offset_seconds: f64,
    pub outcome: Option<String>,
    pub exit_code: Option<i64>,
    pub peak_footprint_bytes: Option<u64>,
    pub ceiling_bytes: Option<u64>,
    /// The first stop, restart or kill oomguard made on this node, and
    /// why (`node N (rank R): …` when it followed another node).
    pub ended_by: Option<String>,
    pub last_step: Option<u64>,
    /// (common time, footprint as a fraction of the nearest ceiling).
    #[serde(skip)]
    series: Vec<(f64, f64)>,
    #[serde(skip)]
    marks: Vec<Mark>,
}

/// Where the trouble began.
#[derive(Debug, Clone, Serialize)]
pub struct Cause {
    pub node: String,
    pub t: f64,
    pub what: String,
}

/// A step saved on some nodes: which, and when.
#[derive(Debug, Serialize)]
pub struct Coordinated {
    pub step: u64,
    pub nodes: Vec<(String, f64)>,
}

/// One restart of one node.
#[derive(Debug, Serialize)]
pub struct RestartRow {
    pub node: String,
    pub t: f64,
    /// The attempt that ended.
    pub attempt: u32,
    pub saved_step: Option<u64>,
    pub last_step: Option<u64>,
    pub lost_steps: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum MarkKind {
    Cause,
    Followed,
    Checkpoint,
    Restart,
}

#[derive(Debug, Clone)]
struct Mark {
    t: f64,
    kind: MarkKind,
    label: String,
}

/// Seconds since the epoch of the log's own `ts` form
/// (`2026-11-26T18:56:11.942Z`).
fn epoch_seconds(ts: &str) -> Option<f64> {
    let (date, time) = ts.strip_suffix('Z')?.split_once('T')?;
    let mut d = date.splitn(3, '-').map(str::parse::<u32>);
    let (y, m, day) = (d.next()?.ok()?, d.next()?.ok()?, d.next()?.ok()?);
    let mut c = time.splitn(3, ':');
    let h: f64 = c.next()?.parse().ok()?;
    let mi: f64 = c.next()?.parse().ok()?;
    let s: f64 = c.next()?.parse().ok()?;
    let days = crate::vocab::forensics::kernel::days_from_civil(i64::from(y), m, day) as f64;
    Some(days * 86_400.0 + h * 3600.0 + mi * 60.0 + s)
}

/// "0–1", "0, 2, 5", or "?".
fn ranks_text(ranks: &[u32]) -> String {
    match ranks {
        [] => "?".into(),
        [one] => one.to_string(),
        [first, .., last] if last - first + 1 == ranks.len() as u32 => format!("{first}–{last}"),
        _ => ranks
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(", "),
    }
}

/// When several logs come from one SLURM node (one oomguard per rank), each
/// is named by its place, `<node> task <task>` (`1 task 3`), so every
/// finding says which task of which node it is about; otherwise by its
/// file's name.
pub fn name_tasks(logs: &mut [(String, RunLog)]) {
    let place = |log: &RunLog| {
        let ids = &log.start.as_ref()?.ids;
        Some((
            ids.get("slurm_node")?.clone(),
            ids.get("slurm_task")?.clone(),
        ))
    };
    let places: Vec<Option<(String, String)>> = logs.iter().map(|(_, l)| place(l)).collect();
    let shared = places
        .iter()
        .flatten()
        .enumerate()
        .any(|(i, (n, _))| places.iter().flatten().skip(i + 1).any(|(m, _)| m == n));
    if !shared {
        return;
    }
    for ((name, _), p) in logs.iter_mut().zip(places) {
        if let Some((node, task)) = p {
            *name = format!("{node} task {task}");
        }
    }
}

/// Builds the job's view from its nodes' logs (name, log).
pub fn job_report(logs: &[(String, RunLog)]) -> JobReport {
    let mut warnings = Vec::new();
    let starts: Vec<Option<f64>> = logs
        .iter()
        .map(|(_, l)| l.start.as_ref()?.ts.as_deref().and_then(epoch_seconds))
        .collect();
    let t0 = starts
        .iter()
        .flatten()
        .copied()
        .fold(f64::INFINITY, f64::min);
    let mut nodes = Vec::new();
    let mut restarts = Vec::new();
    let mut cause: Option<Cause> = None;
    for ((name, log), start) in logs.iter().zip(&starts) {
        let offset = match start {
            Some(s) if t0.is_finite() => s - t0,
            _ => {
                warnings.push(format!(
                    "{name}: no start time in its log; placed at the job's start"
                ));
                0.0
            }
        };
        let row = node_row(name, log, offset, &mut restarts);
        if let Some(first) = row.marks.iter().find(|m| m.kind == MarkKind::Cause)
            && cause.as_ref().is_none_or(|c| first.t < c.t)
        {
            cause = Some(Cause {
                node: name.clone(),
                t: first.t,
                what: first.label.clone(),
            });
        }
        nodes.push(row);
    }
    let mut saved: BTreeMap<u64, Vec<(String, f64)>> = BTreeMap::new();
    for n in &nodes {
        for m in n.marks.iter().filter(|m| m.kind == MarkKind::Checkpoint) {
            if let Some(step) = m.label.strip_prefix("step ").and_then(|s| s.parse().ok()) {
                saved.entry(step).or_default().push((n.name.clone(), m.t));
            }
        }
    }
    let span_seconds = nodes
        .iter()
        .flat_map(|n| {
            n.series
                .iter()
                .map(|p| p.0)
                .chain(n.marks.iter().map(|m| m.t))
        })
        .fold(0.0, f64::max);
    JobReport {
        nodes,
        cause,
        checkpoints: saved
            .into_iter()
            .map(|(step, nodes)| Coordinated { step, nodes })
            .collect(),
        restarts,
        span_seconds,
        warnings,
    }
}

/// The restart of one node at `t` that ended its attempt `ended`: the
/// steps it lost since the newest save.
fn restart_row(
    name: &str,
    log: &RunLog,
    t: f64,
    ended: u32,
    newest_save: Option<u64>,
) -> RestartRow {
    let last_step = log
        .progress
        .iter()
        .filter(|p| p.attempt == ended)
        .filter_map(|p| p.step)
        .max();
    RestartRow {
        node: name.to_string(),
        t,
        attempt: ended,
        saved_step: newest_save,
        last_step,
        lost_steps: last_step.map(|l| l.saturating_sub(newest_save.unwrap_or(0))),
    }
}

/// Whichever came first on a node is its cause candidate: a node that
/// followed another before its own trouble did not begin it, so its later
/// causes are marked as following too.
fn followed_first(marks: &mut [Mark]) {
    if let Some(first) = marks
        .iter()
        .filter(|m| matches!(m.kind, MarkKind::Cause | MarkKind::Followed))
        .min_by(|a, b| a.t.total_cmp(&b.t))
        .map(|m| (m.t, m.kind))
        && first.1 == MarkKind::Followed
    {
        for m in marks.iter_mut().filter(|m| m.kind == MarkKind::Cause) {
            if m.t >= first.0 {
                m.kind = MarkKind::Followed;
            }
        }
    }
}

/// One node's row, marks and series; its restarts go to `restarts`.
fn node_row(name: &str, log: &RunLog, offset: f64, restarts: &mut Vec<RestartRow>) -> NodeRow {
    let series = log
        .samples
        .iter()
        .filter_map(|s| {
            let ceiling = s.ceiling.as_ref()?.bytes;
            let used = s.footprint_bytes.unwrap_or(s.pss_bytes);
            (ceiling > 0).then(|| (offset + s.t, used as f64 / ceiling as f64))
        })
        .collect();
    let mut marks = Vec::new();
    let mut ended_by = None;
    let mut acted_in = 0;
    let mut newest_save = None;
    for e in &log.events {
        let t = offset + e.t;
        match &e.event {
            Logged::Action(ActionEvent { action, reason, .. })
                if action.ends_attempt() && acted_in != e.attempt =>
            {
                acted_in = e.attempt;
                let why = reason.clone();
                let followed = why.starts_with("node ");
                ended_by.get_or_insert_with(|| format!("{action}: {why}"));
                marks.push(Mark {
                    t,
                    kind: if followed {
                        MarkKind::Followed
                    } else {
                        MarkKind::Cause
                    },
                    label: format!("{action}: {why}"),
                });
            }
            Logged::OomKill(k) => marks.push(Mark {
                t,
                kind: MarkKind::Cause,
                label: format!(
                    "kernel OOM kill of {} (pid {})",
                    k.comm.as_deref().unwrap_or("?"),
                    k.pid.map_or("?".into(), |p| p.to_string())
                ),
            }),
            Logged::Fault(FaultEvent {
                remote: false,
                reason,
                detail,
                ..
            }) => marks.push(Mark {
                t,
                kind: MarkKind::Cause,
                label: format!(
                    "{}: {}",
                    reason.as_deref().unwrap_or("fault"),
                    detail.as_deref().unwrap_or("")
                ),
            }),
            Logged::CheckpointDone(CheckpointDoneEvent {
                step: Some(step),
                ok: true,
                ..
            }) => {
                newest_save = Some(*step);
                marks.push(Mark {
                    t,
                    kind: MarkKind::Checkpoint,
                    label: format!("step {step}"),
                });
            }
            Logged::Restart(_) => {
                let ended = e
                    .line_attempt
                    .map_or(e.attempt, |n| n.saturating_sub(1).max(1));
                marks.push(Mark {
                    t,
                    kind: MarkKind::Restart,
                    label: format!("restart after attempt {ended}"),
                });
                restarts.push(restart_row(name, log, t, ended, newest_save));
            }
            _ => {}
        }
    }
    followed_first(&mut marks);
    NodeRow {
        name: name.to_string(),
        ranks: log.ranks.clone(),
        offset_seconds: offset,
        outcome: log.end.as_ref().and_then(|e| e.outcome.clone()),
        exit_code: log.end.as_ref().and_then(|e| e.exit_code),
        peak_footprint_bytes: log
            .samples
            .iter()
            .map(|s| s.footprint_bytes.unwrap_or(s.pss_bytes))
            .max(),
        ceiling_bytes: log
            .samples
            .iter()
            .filter_map(|s| s.ceiling.as_ref().map(|c| c.bytes))
            .min(),
        ended_by,
        last_step: log.progress.iter().filter_map(|p| p.step).max(),
        series,
        marks,
    }
}

/// The summary lines both renderers give.
fn summary_lines(r: &JobReport) -> Vec<String> {
    let mut out = Vec::new();
    let ranks_of = |name: &str| {
        r.nodes
            .iter()
            .find(|n| n.name == name)
            .map_or("?".into(), |n| ranks_text(&n.ranks))
    };
    match &r.cause {
        Some(c) => out.push(format!(
            "node {} (ranks {}) ran short first, at {}: {}",
            c.node,
            ranks_of(&c.node),
            time_label(c.t),
            c.what
        )),
        None => out.push("no node ran short".into()),
    }
    for c in &r.checkpoints {
        let at: Vec<String> = c
            .nodes
            .iter()
            .map(|(n, t)| format!("{n} at {}", time_label(*t)))
            .collect();
        out.push(format!(
            "step {} saved on {} of {} nodes ({})",
            c.step,
            c.nodes.len(),
            r.nodes.len(),
            at.join(", ")
        ));
    }
    for x in &r.restarts {
        let lost = match (x.lost_steps, x.saved_step) {
            (Some(l), Some(s)) => format!("resumed from step {s}, {l} steps lost"),
            (Some(l), None) => format!("no save, {l} steps lost"),
            _ => "steps unknown".into(),
        };
        out.push(format!(
            "node {} restarted after attempt {} at {}: {lost}",
            x.node,
            x.attempt,
            time_label(x.t)
        ));
    }
    out
}

fn node_cells(n: &NodeRow) -> [String; 6] {
    let peak = match (n.peak_footprint_bytes, n.ceiling_bytes) {
        (Some(p), Some(c)) => format!("{} of {}", HumanBytes(p), HumanBytes(c)),
        (Some(p), None) => HumanBytes(p).to_string(),
        _ => "?".into(),
    };
    [
        n.name.clone(),
        ranks_text(&n.ranks),
        n.outcome.clone().unwrap_or_else(|| "?".into()),
        n.exit_code.map_or("?".into(), |c| c.to_string()),
        peak,
        n.ended_by.clone().unwrap_or_else(|| "—".into()),
    ]
}

const HEADS: [&str; 6] = [
    "node",
    "ranks",
    "outcome",
    "exit",
    "peak footprint",
    "ended by",
];

/// The job report for the terminal.
pub fn render_job_text(r: &JobReport) -> String {
    let mut s = format!(
        "oomguard job report: {} nodes over {}\n\n",
        r.nodes.len(),
        time_label(r.span_seconds)
    );
    for line in summary_lines(r) {
        let _ = writeln!(s, "  {line}");
    }
    s.push('\n');
    let rows: Vec<[String; 6]> = r.nodes.iter().map(node_cells).collect();
    let mut widths = HEADS.map(|h| h.chars().count());
    for row in &rows {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        let mut l = String::from(" ");
        for (c, w) in cells.iter().zip(widths) {
            let _ = write!(l, " {c:<w$}");
        }
        l.trim_end().to_string() + "\n"
    };
    s.push_str(&line(HEADS.iter().map(|h| h.to_string()).collect()));
    for row in rows {
        s.push_str(&line(row.to_vec()));
    }
    for w in &r.warnings {
        let _ = writeln!(s, "\nwarning: {w}");
    }
    s
}

/// The job report as data.
pub fn render_job_json(r: &JobReport) -> serde_json::Value {
    let mut v = serde_json::to_value(r).unwrap_or_default();
    v["summary"] = summary_lines(r).into();
    v
}

const LANE: f64 = 70.0;
const LEFT: f64 = 150.0;
const WIDTH: f64 = 960.0;

fn mark_colour(k: MarkKind) -> &'static str {
    match k {
        MarkKind::Cause => "#D55E00",
        MarkKind::Followed => "#0072B2",
        MarkKind::Checkpoint => "#009E73",
        MarkKind::Restart => "#8c8c8c",
    }
}

/// One lane per node on the common clock: the footprint as a share of the
/// node's nearest ceiling, and its marks.
fn lanes_svg(r: &JobReport) -> String {
    let span = r.span_seconds.max(1.0);
    let plot = WIDTH - LEFT - 20.0;
    let x = |t: f64| LEFT + plot * (t / span).clamp(0.0, 1.0);
    let height = LANE * r.nodes.len() as f64 + 30.0;
    let mut s = format!(
        r#"<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {height}" width="{WIDTH}" height="{height}" font-family="sans-serif" font-size="12">"#
    );
    for (i, n) in r.nodes.iter().enumerate() {
        let top = LANE * i as f64 + 5.0;
        let bottom = top + LANE - 15.0;
        let y = |f: f64| bottom - (bottom - top) * f.clamp(0.0, 1.05) / 1.05;
        let _ = write!(
            s,
            r##"<rect x="{LEFT}" y="{top}" width="{plot}" height="{h:.1}" fill="#f6f7f9"/><line x1="{LEFT}" x2="{right:.1}" y1="{full:.1}" y2="{full:.1}" stroke="#D55E00" stroke-dasharray="4 3"/><text x="8" y="{name_y:.1}">{name}</text><text x="8" y="{ranks_y:.1}" fill="#5b6473">ranks {ranks}</text>"##,
            h = bottom - top,
            right = LEFT + plot,
            full = y(1.0),
            name_y = top + 20.0,
            name = esc(&n.name),
            ranks_y = top + 36.0,
            ranks = esc(&ranks_text(&n.ranks)),
        );
        let points: Vec<String> = n
            .series
            .iter()
            .map(|(t, f)| format!("{:.1},{:.1}", x(*t), y(*f)))
            .collect();
        if !points.is_empty() {
            let _ = write!(
                s,
                r##"<polyline fill="none" stroke="#0072B2" stroke-width="1.5" points="{}"/>"##,
                points.join(" ")
            );
        }
        for m in &n.marks {
            let _ = write!(
                s,
                r#"<g class="mark mark-{kind:?}"><title>{label}</title><line x1="{mx:.1}" x2="{mx:.1}" y1="{top}" y2="{bottom:.1}" stroke="{c}" stroke-width="{w}"/></g>"#,
                kind = m.kind,
                label = esc(&format!("{} at {}: {}", n.name, time_label(m.t), m.label)),
                mx = x(m.t),
                c = mark_colour(m.kind),
                w = if m.kind == MarkKind::Cause { 3.0 } else { 1.5 },
            );
        }
    }
    let axis_y = LANE * r.nodes.len() as f64 + 20.0;
    for k in 0..=4 {
        let t = span * f64::from(k) / 4.0;
        let _ = write!(
            s,
            r##"<text x="{:.1}" y="{axis_y}" text-anchor="middle" fill="#5b6473">{}</text>"##,
            x(t),
            esc(&time_label(t))
        );
    }
    s.push_str("</svg>");
    s
}

/// The job report as one self-contained HTML page.
pub fn render_job_html(r: &JobReport) -> String {
    let mut h = String::from(
        r#"<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>oomguard job report</title><style>
body { font-family: sans-serif; margin: 24px; color: #1a1a1a; max-width: 1000px; }
table { border-collapse: collapse; margin-top: 12px; } td, th { padding: 4px 10px; border-bottom: 1px solid #ddd; text-align: left; }
.legend span { margin-right: 16px; } .cause { color: #D55E00; font-weight: 700; }
</style></head><body>"#,
    );
    let _ = write!(
        h,
        "<h1>oomguard job report</h1><p>{} nodes over {}, on one clock (each log's start time).</p><ul id=\"summary\">",
        r.nodes.len(),
        esc(&time_label(r.span_seconds))
    );
    for (i, line) in summary_lines(r).iter().enumerate() {
        let class = if i == 0 && r.cause.is_some() {
            " class=\"cause\""
        } else {
            ""
        };
        let _ = write!(h, "<li{class}>{}</li>", esc(line));
    }
    h.push_str("</ul><h2>Timeline</h2><p class=\"legend\"><span style=\"color:#0072B2\">— footprint, share of the node's nearest ceiling (dashed: 100 %)</span><span style=\"color:#D55E00\">| ran short</span><span style=\"color:#0072B2\">| followed another node</span><span style=\"color:#009E73\">| saved</span><span style=\"color:#8c8c8c\">| restarted</span></p>");
    h.push_str(&lanes_svg(r));
    h.push_str("<h2>Nodes</h2><table id=\"nodes\"><tr>");
    for head in HEADS {
        let _ = write!(h, "<th>{head}</th>");
    }
    h.push_str("</tr>");
    for n in &r.nodes {
        h.push_str("<tr>");
        for c in node_cells(n) {
            let _ = write!(h, "<td>{}</td>", esc(&c));
        }
        h.push_str("</tr>");
    }
    h.push_str("</table>");
    for w in &r.warnings {
        let _ = write!(h, "<p>warning: {}</p>", esc(w));
    }
    h.push_str("</body></html>\n");
    h
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tools::report::load;

    fn node(ts: &str, lines: &[&str]) -> RunLog {
        let mut text = format!(
            r#"{{"schema":"oomguard/1","event":"run_start","ts":"{ts}","t":0,"attempt":1,"argv":["torchrun"],"pid":1,"ceilings":[],"policy":{{}},"gpu":{{}},"version":"x","interval_seconds":1,"pss_interval_seconds":1}}"#
        );
        for l in lines {
            text.push('\n');
            text.push_str(&format!(r#"{{"schema":"oomguard/1","ts":"{ts}",{l}}}"#));
        }
        load::load(&text).unwrap()
    }

    #[test]
    fn iso_times_become_epoch_seconds() {
        assert_eq!(epoch_seconds("1970-01-02T00:00:01.5Z"), Some(86_401.5));
        assert_eq!(epoch_seconds("not a time"), None);
    }

    #[test]
    fn the_node_that_acted_first_on_its_own_is_the_cause_on_one_clock() {
        let a = node(
            "2026-11-26T10:00:00.000Z",
            &[
                r#""event":"companion","t":1,"attempt":1,"pid":5,"rank":0"#,
                r#""event":"companion","t":1,"attempt":1,"pid":6,"rank":1"#,
                r#""event":"action","t":12,"attempt":1,"action":"stop","reason":"critical-headroom: 3 GiB left","pids":[],"signal":null,"result":"ok""#,
                r#""event":"checkpoint_done","t":13,"attempt":1,"id":1,"rank":0,"step":245,"paths":["/c"],"ok":true"#,
            ],
        );
        // Node b started 2 s later and followed node a.
        let b = node(
            "2026-11-26T10:00:02.000Z",
            &[
                r#""event":"companion","t":1,"attempt":1,"pid":7,"rank":2"#,
                r#""event":"action","t":10.5,"attempt":1,"action":"stop","reason":"node 0 (rank 1): critical-headroom","pids":[],"signal":null,"result":"ok""#,
                r#""event":"checkpoint_done","t":11,"attempt":1,"id":1,"rank":2,"step":245,"paths":["/c"],"ok":true"#,
            ],
        );
        let r = job_report(&[("a".into(), a), ("b".into(), b)]);
        let cause = r.cause.clone().unwrap();
        assert_eq!(cause.node, "a");
        assert_eq!(cause.t, 12.0);
        assert_eq!(r.nodes[1].offset_seconds, 2.0);
        assert_eq!(r.nodes[0].ranks, vec![0, 1]);
        assert_eq!(r.checkpoints.len(), 1);
        assert_eq!(r.checkpoints[0].step, 245);
        assert_eq!(
            r.checkpoints[0].nodes,
            vec![("a".into(), 13.0), ("b".into(), 13.0)]
        );
        let text = render_job_text(&r);
        assert!(
            text.contains("node a (ranks 0–1) ran short first"),
            "{text}"
        );
        assert!(text.contains("step 245 saved on 2 of 2 nodes"), "{text}");
        let html = render_job_html(&r);
        assert!(html.contains("mark-Cause") && html.contains("mark-Followed"));
    }

    #[test]
    fn a_restart_counts_the_steps_after_the_last_save() {
        let a = node(
            "2026-11-26T10:00:00.000Z",
            &[
                r#""event":"checkpoint_done","t":5,"attempt":1,"id":1,"rank":0,"step":100,"paths":["/c"],"ok":true"#,
                r#""event":"sample","t":6,"attempt":1,"progress":{"step":130},"headroom_bytes":1,"headroom_percent":1,"tree":{"procs":1,"rss_bytes":1,"pss_bytes":1,"uss_bytes":1,"swap_bytes":0,"footprint_bytes":1,"pss_age_seconds":0},"system":{"mem_total_bytes":1,"mem_available_bytes":1,"swap_total_bytes":0,"swap_used_bytes":0,"swap_in_bytes_per_s":0,"swap_out_bytes_per_s":0,"oom_kill_total":0}"#,
                r#""event":"restart","t":7,"attempt":2,"reason":"kernel OOM kill","degraded":{}"#,
            ],
        );
        let r = job_report(&[("a".into(), a)]);
        assert_eq!(r.restarts.len(), 1);
        let x = &r.restarts[0];
        assert_eq!(
            (x.attempt, x.saved_step, x.last_step, x.lost_steps),
            (1, Some(100), Some(130), Some(30))
        );
    }
}
