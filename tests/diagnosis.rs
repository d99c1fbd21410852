//! The report's diagnosis on the field's canonical host-memory cases, each
//! a real PyTorch job (`tests/fixtures/jobs/diagnosis/job.py`) recorded by
//! `oomguard run --log` in a memory cgroup while an independent reader
//! (`truth.py`, a separate process reading every process's `smaps_rollup`
//! every 0.5 s) measures the truth. Then `oomguard report`:
//!
//! - the findings name the right cause, and no finding calls a start-up
//!   load, a plateau or copy-on-read growth that levelled off a leak;
//! - every per-worker or per-process figure a finding states is within
//!   15 % of the truth (the JSON findings carry them as numbers);
//! - the worker count advised never exceeds what the true peaks allow
//!   (in the terms of the footprint the policy compared with the ceiling:
//!   the cgroup's working set, which the reader reads too);
//! - text, HTML and JSON show the same findings.
//!
//! Needs root, a cgroup v1 memory hierarchy and the torch environment
//! (with pandas): skipped elsewhere, run under `CI=true`.
#![allow(clippy::unwrap_used)]

use crate::common;
use crate::support::screenshot;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;

const MIB: f64 = 1048576.0;
/// How far a stated figure may be from the truth.
const TOLERANCE: f64 = 0.15;

fn jobs() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/jobs/diagnosis")
}

/// One reading of the independent reader.
#[derive(Debug, Clone, Copy)]
struct Point {
    /// Seconds since oomguard started (the reader's clock, shifted).
    t: f64,
    rss: f64,
    uss: f64,
}

/// What the reader measured: each job process's readings, by pid.
#[derive(Debug, Default)]
struct Truth {
    procs: BTreeMap<u32, (String, Vec<Point>)>,
    /// Per round of the reader: the cgroup's working set, and the workers'
    /// USS read in that round. Rounds where a listed process was gone by
    /// its reading are left out: their working set holds memory no
    /// reading does.
    rounds: BTreeMap<u64, (Option<f64>, f64)>,
}

impl Truth {
    fn parse(text: &str, shift: f64) -> Self {
        let mut t = Truth::default();
        let mut incomplete = Vec::new();
        for line in text.lines() {
            let Ok(v) = serde_json::from_str::<Value>(line) else {
                continue;
            };
            if v["incomplete"].as_bool() == Some(true) {
                incomplete.extend(v["round"].as_u64());
                continue;
            }
            let round = t
                .rounds
                .entry(v["round"].as_u64().unwrap_or(0))
                .or_default();
            if let Some(ws) = v["cgroup_ws"].as_f64() {
                round.0 = Some(ws);
                continue;
            }
            let comm = v["comm"].as_str().unwrap_or("").to_string();
            if comm == "pt_data_worker" {
                round.1 += v["uss"].as_f64().unwrap_or(0.0);
            }
            // The job's processes only: not oomguard, its keeper, the shell
            // that put it in the cgroup.
            if comm != "python" && comm != "pt_data_worker" {
                continue;
            }
            let f = |k: &str| v[k].as_f64().unwrap_or(0.0);
            let pid = v["pid"].as_u64().unwrap() as u32;
            t.procs
                .entry(pid)
                .or_insert_with(|| (comm.clone(), Vec::new()))
                .1
                .push(Point {
                    t: f("t") - shift,
                    rss: f("rss"),
                    uss: f("uss"),
                });
        }
        for round in incomplete {
            t.rounds.remove(&round);
        }
        t
    }

    fn workers(&self) -> Vec<(u32, &Vec<Point>)> {
        self.procs
            .iter()
            .filter(|(_, (c, _))| c == "pt_data_worker")
            .map(|(pid, (_, p))| (*pid, p))
            .collect()
    }

    fn trainer(&self) -> &Vec<Point> {
        self.procs
            .values()
            .filter(|(c, _)| c == "python")
            .map(|(_, p)| p)
            .max_by_key(|p| p.len())
            .expect("the reader saw the trainer")
    }

    /// The trainer's readings up to the workers' last one. In its last
    /// moment, after its workers exited, the pages it shared with them
    /// (torch's libraries, its data) are its alone: its private figure
    /// jumps without a byte added (the numpy case: 308 → 617 MiB in its
    /// last half second, read by the reader in one run of three), which no
    /// reading of oomguard's is meant to catch.
    fn trainer_held(&self) -> &[Point] {
        let trainer = self.trainer();
        let Some(last) = (self.workers().iter())
            .filter_map(|(_, p)| p.last().map(|x| x.t))
            .reduce(f64::max)
        else {
            return trainer;
        };
        let n = trainer.iter().take_while(|p| p.t <= last).count();
        &trainer[..n.max(1)]
    }

    /// Per round while the workers ran: what does not scale with them, in
    /// the terms of the footprint the policy compares with the ceiling
    /// (the job ran in a cgroup of its own, so its working set): the
    /// cgroup's working set less the workers' USS (the trainer's own,
    /// every shared page the cgroup holds, once, and oomguard's own
    /// memory, which the ceiling also holds).
    fn fixed(&self) -> f64 {
        self.rounds
            .values()
            .filter(|&&(_, workers)| workers > 0.0)
            .filter_map(|&(ws, workers)| Some(ws? - workers))
            .fold(0.0, f64::max)
    }

    /// The cgroup's working set before the first worker was read: the
    /// trainer alone, which must fit on its own.
    fn alone(&self) -> f64 {
        self.rounds
            .values()
            .take_while(|&&(_, workers)| workers == 0.0)
            .filter_map(|&(ws, _)| ws)
            .fold(0.0, f64::max)
    }
}

fn peak(pts: &[Point], f: impl Fn(&Point) -> f64) -> f64 {
    pts.iter().map(f).fold(0.0, f64::max)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[(v.len() - 1) / 2]
}

/// The reader's two readings around `t`: what was true at `t` lies
/// between them (a worker's garbage collection copied 47 MiB within one
/// of the reader's 0.14 s steps, where interpolating was off by 30 %).
fn around(pts: &[Point], t: f64) -> (Point, Point) {
    let after = pts.iter().position(|p| p.t >= t).unwrap_or(pts.len() - 1);
    (pts[after.saturating_sub(1)], pts[after])
}

/// A recorded case: the report in three formats and the truth.
struct Case {
    json: Value,
    text: String,
    html: String,
    html_path: PathBuf,
    truth: Truth,
    ceiling: f64,
    /// The run clock (`t`) of each of oomguard's sample lines.
    sample_times: Vec<f64>,
    _dir: tempfile::TempDir,
    /// Held until the case's checks are done, its Chromium run included:
    /// another test's job must not share the machine with it.
    _serial: common::machine::Held,
}

/// The wall-clock time at which oomguard's run clock (`t`) was 0, from
/// the log's first line (its `ts`, to the millisecond, and its `t`).
fn run_clock(log: &Path) -> f64 {
    let text = std::fs::read_to_string(log).unwrap();
    let first: Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    let ts = humantime::parse_rfc3339(first["ts"].as_str().unwrap()).unwrap();
    let wall = ts
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    wall - first["t"].as_f64().unwrap()
}

/// Runs `job.py <args>` under `oomguard run --log` in a memory cgroup of
/// `limit_mib`, with the reader; None when this machine cannot (skipped).
fn record(name: &str, limit_mib: u64, args: &[&str]) -> Option<Case> {
    let venv = common::torch_venv()?;
    let serial = common::serial();
    common::deadline::arm_for(Duration::from_secs(150));
    let cg = common::MemCgroup::or_skip(name, limit_mib << 20)?;
    let python = venv.join("bin/python");
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("run.ndjson");
    let truth_path = dir.path().join("truth.ndjson");
    // The reader stays outside the cgroup: it is not part of the job.

    let mut reader = Command::new(&python)
        .arg(jobs().join("truth.py"))
        .arg(&cg.dir)
        .arg(&truth_path)
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let job = jobs().join("job.py");
    // A PSS budget of 5 % of a core, not the default 1 %: on this host's
    // kernel (6.18) `smaps_rollup` of the 700 MiB trainer costs enough that
    // 1 % left the workers' readings 5 s stale at the peak, and the copying
    // cases read as flat (the untouched tree of the sixteenth session fails
    // the same way here). These cases test the diagnosis given readings,
    // not the sweeper's budget (benches/pss.rs measures that).
    let mut argv: Vec<&str> = vec![
        "run",
        "--pss-budget",
        "5%",
        "--log",
        log.to_str().unwrap(),
        "--",
        python.to_str().unwrap(),
        job.to_str().unwrap(),
    ];
    argv.extend(args);
    let og = Path::new(env!("CARGO_BIN_EXE_oomguard"));
    let out = cg.command(og, &argv).output().unwrap();
    let _ = reader.kill();
    let _ = reader.wait();
    assert!(
        out.status.success(),
        "{name}: oomguard run failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report = |format: &str| {
        let o = common::oomguard()
            .args(["report", "--format", format, "-o", "-"])
            .arg(&log)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8(o.stdout).unwrap()
    };
    // To look at a case's log and truth afterwards.
    if let Some(keep) = std::env::var_os("OOMGUARD_DIAGNOSIS_KEEP") {
        let keep = Path::new(&keep);
        let _ = std::fs::create_dir_all(keep);
        let _ = std::fs::copy(&log, keep.join(format!("{name}.ndjson")));
        let _ = std::fs::copy(&truth_path, keep.join(format!("{name}.truth")));
    }
    let json: Value = serde_json::from_str(&report("json")).unwrap();
    let html = report("html");
    let html_path = dir.path().join("run.html");
    std::fs::write(&html_path, &html).unwrap();
    let truth = Truth::parse(
        &std::fs::read_to_string(&truth_path).unwrap_or_default(),
        run_clock(&log),
    );
    eprintln!("{name}: truth for {} processes", truth.procs.len());
    for f in findings(&json) {
        eprintln!("{name}: {} | {}", f["kind"], f["title"]);
    }
    Some(Case {
        text: report("text"),
        json,
        html,
        html_path,
        truth,
        ceiling: (limit_mib << 20) as f64,
        sample_times: common::read_log(&log)
            .iter()
            .filter(|l| matches!(l.event, common::schema::Event::Sample(_)))
            .map(|l| l.t)
            .collect(),
        _dir: dir,
        _serial: serial,
    })
}

fn findings(json: &Value) -> Vec<&Value> {
    json["findings"].as_array().unwrap().iter().collect()
}

fn kinds(c: &Case) -> Vec<String> {
    findings(&c.json)
        .iter()
        .map(|f| f["kind"].as_str().unwrap().to_string())
        .collect()
}

fn finding<'a>(c: &'a Case, kind: &str) -> &'a Value {
    findings(&c.json)
        .into_iter()
        .find(|f| f["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} finding in {:?}", kinds(c)))
}

fn number(f: &Value, name: &str) -> Option<f64> {
    f["numbers"]
        .as_array()?
        .iter()
        .find(|n| n["name"] == name)?
        .get("value")?
        .as_f64()
}

/// `stated` within [`TOLERANCE`] of a truth known to lie between `lo`
/// and `hi`.
fn close_to_range(what: &str, stated: f64, lo: f64, hi: f64) {
    let (lo, hi) = (lo.min(hi), lo.max(hi));
    let nearest = stated.clamp(lo, hi);
    eprintln!(
        "  {what}: stated {:.1} MiB, truth {:.1}-{:.1} MiB",
        stated / MIB,
        lo / MIB,
        hi / MIB
    );
    assert!(
        (stated - nearest).abs() / nearest.max(1.0) <= TOLERANCE,
        "{what}: stated {:.1} MiB, truth {:.1}-{:.1} MiB",
        stated / MIB,
        lo / MIB,
        hi / MIB
    );
}

/// `stated` within [`TOLERANCE`] of `truth`.
fn close(what: &str, stated: f64, truth: f64) {
    let err = (stated - truth).abs() / truth.max(1.0);
    eprintln!(
        "  {what}: stated {:.1} MiB, truth {:.1} MiB ({:+.0}%)",
        stated / MIB,
        truth / MIB,
        (stated - truth) / truth.max(1.0) * 100.0
    );
    assert!(
        err <= TOLERANCE,
        "{what}: stated {:.1} MiB, truth {:.1} MiB",
        stated / MIB,
        truth / MIB
    );
}

/// A worker case: its trainer imports torch and builds its data set before
/// it forks, a load and no leak (the load was missed in 17 of 160 runs while
/// it was gated on the trainer's whole-run slope).
fn loads_then_forks(c: &Case) {
    finding(c, "trainer_load");
    no_leak_claimed(c);
}

/// No finding calls growth a leak unless the case is one.
fn no_leak_claimed(c: &Case) {
    let k = kinds(c);
    for leak in ["worker_leak", "trainer_growth"] {
        assert!(!k.iter().any(|x| x == leak), "{leak} in {k:?}");
    }
}

/// Every per-worker and per-process figure a finding states, against the
/// truth; the worker count against what the true peaks allow.
fn figures(c: &Case) {
    let workers = c.truth.workers();
    let trainer = c.truth.trainer();
    let held = c.truth.trainer_held();
    // When oomguard first read each worker, from the report's processes.
    let first_read: BTreeMap<u32, f64> = c.json["processes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["pid"].as_u64().unwrap() as u32,
                p["first_read_t"].as_f64().unwrap(),
            )
        })
        .collect();
    for f in findings(&c.json) {
        let kind = f["kind"].as_str().unwrap();
        eprintln!(" {kind}");
        states_its_figures(f, kind);
        if let Some(v) = number(f, "per_worker_private_peak_bytes") {
            let t = workers
                .iter()
                .map(|(_, p)| peak(p, |x| x.uss))
                .fold(0.0, f64::max);
            close("per-worker private peak", v, t);
        }
        if let Some(v) = number(f, "per_worker_settled_bytes") {
            let t = median(
                workers
                    .iter()
                    .filter(|(_, p)| p.len() >= 2)
                    .map(|(_, p)| p[p.len() - 1].uss)
                    .collect(),
            );
            close("per-worker settled level", v, t);
        }
        if let Some(v) = number(f, "per_worker_bound_bytes") {
            let t = median(workers.iter().map(|(_, p)| peak(p, |x| x.rss)).collect());
            close("per-worker RSS (the bound of its copying)", v, t);
        }
        if let Some(v) = number(f, "per_worker_growth_bytes") {
            // Since each worker's first reading (several sets of workers
            // are first read at different times), from the truth just
            // after it and just before it: the median of values within
            // each worker's range lies within the medians of the ranges.
            let ranges: Vec<(f64, f64)> = workers
                .iter()
                .filter_map(|(pid, p)| {
                    let (before, after) = around(p, *first_read.get(pid)?);
                    let top = peak(p, |x| x.uss);
                    Some((top - after.uss, top - before.uss))
                })
                .collect();
            close_to_range(
                "per-worker growth since its first reading",
                v,
                median(ranges.iter().map(|r| r.0).collect()),
                median(ranges.iter().map(|r| r.1).collect()),
            );
        }
        if kind.starts_with("trainer_")
            && let Some(v) = number(f, "peak_private_bytes")
        {
            close("trainer private peak", v, peak(held, |x| x.uss));
        }
        if let Some(v) = number(f, "loaded_bytes") {
            close("trainer load", v, peak(held, |x| x.uss) - held[0].uss);
        }
        if let Some(v) = number(f, "released_bytes") {
            // From the peak to the lowest level after it.
            let top = trainer
                .iter()
                .enumerate()
                .max_by(|a, b| a.1.rss.total_cmp(&b.1.rss))
                .unwrap()
                .0;
            let low = trainer[top..]
                .iter()
                .map(|p| p.rss)
                .fold(f64::MAX, f64::min);
            close("trainer released", v, trainer[top].rss - low);
        }
        if let Some(v) = number(f, "growth_bytes_per_second") {
            // Like with like: the truth read at oomguard's own sample
            // times over the window the finding names, ending at its last
            // reading of the trainer (or at oomguard's first action, where
            // the finding says so), and its slope taken as the finding's
            // is (the median of the pairwise slopes), which the start-up's
            // last readings do not tilt: on a busy machine the leak case's
            // torch import ran into the window, and a least-squares slope
            // of the truth read +34.0 MiB/s for a leak of 27.5 that the
            // finding stated as 27.9. (The job ends without the
            // interpreter's teardown, seconds of plateau and a late step on
            // a loaded machine: job.py.)
            let end = number(f, "growth_window_end_seconds")
                .or_else(|| {
                    (c.json["processes"].as_array().unwrap().iter())
                        .find(|p| p["pid"].as_f64() == number(f, "pid"))
                        .and_then(|p| p["last_t"].as_f64())
                })
                .unwrap_or(trainer[trainer.len() - 1].t);
            let window = number(f, "growth_window_seconds").unwrap();
            let pts: Vec<(f64, f64)> = (c.sample_times.iter().copied())
                .filter(|t| *t <= end && end - *t <= window + 0.01)
                .map(|t| (t, at(trainer, t)))
                .collect();
            close("trainer growth per second", v, median_slope(&pts));
        }
        if let Some(fit) = number(f, "workers_fit") {
            let worker = workers
                .iter()
                .map(|(_, p)| peak(p, |x| x.uss))
                .fold(0.0, f64::max);
            let allowed = if c.truth.alone() > c.ceiling * 0.9 {
                0.0
            } else {
                ((c.ceiling * 0.9 - c.truth.fixed()) / worker).floor()
            };
            eprintln!("  workers fit: advised {fit}, the true peaks allow {allowed}");
            // At the true peaks the advised workers stay within 90 % of the
            // ceiling, up to 1 % of it or 2 % of the workers' part:
            // oomguard's reading of a worker and the reader's are a sweep
            // apart (12.06 and 12.18 MiB; a family left unread for 6 s,
            // 12.14 and 12.35), which eighty small workers multiply (81
            // advised where 79 fit, 1,397.8 MiB at the true peaks against
            // a bound of 1,397.8 at 1 %).
            let total = c.truth.fixed() + fit * worker;
            let slack = (c.ceiling * 0.01).max(fit * worker * 0.02);
            assert!(
                total <= c.ceiling * 0.9 + slack
                    && (fit == 0.0 || c.truth.alone() <= c.ceiling * 0.9),
                "{fit} workers advised ({} MiB at the true peaks), {allowed} fit",
                total / MIB
            );
        }
    }
}

/// The figures each kind of finding must state: a finding that stops
/// stating one fails here, rather than skipping the check of it below.
fn states_its_figures(f: &Value, kind: &str) {
    let required: &[&str] = match kind {
        "worker_flat" => &["per_worker_private_peak_bytes"],
        "worker_cow" => &["per_worker_growth_bytes", "per_worker_private_peak_bytes"],
        "worker_load" => &["per_worker_growth_bytes", "per_worker_settled_bytes"],
        "worker_leak" => &["per_worker_growth_bytes_per_second", "peak_private_bytes"],
        "trainer_growth" => &["growth_bytes_per_second", "peak_private_bytes"],
        "trainer_accumulation" => &["released_bytes", "peak_private_bytes"],
        "trainer_load" => &["loaded_bytes", "peak_private_bytes"],
        "num_workers" => &["per_worker_private_peak_bytes"],
        _ => &[],
    };
    for name in required {
        assert!(number(f, name).is_some(), "{kind} states no {name}: {f}");
    }
    if kind == "num_workers" {
        // A count, or none because the readings predate the peak (and
        // then how much older they are).
        assert!(
            number(f, "workers_fit").is_some() || number(f, "readings_age_seconds").is_some(),
            "num_workers states neither a count nor why it gives none: {f}"
        );
    }
    if kind == "worker_cow" {
        // Settled at a level, or still copying with its RSS as the bound.
        assert!(
            number(f, "per_worker_settled_bytes").is_some()
                || number(f, "per_worker_bound_bytes").is_some(),
            "worker_cow states neither its level nor its bound: {f}"
        );
    }
}

/// The truth's USS at `t`, between its readings on either side.
fn at(pts: &[Point], t: f64) -> f64 {
    let (before, after) = around(pts, t);
    if after.t <= before.t {
        return before.uss;
    }
    before.uss + (after.uss - before.uss) * (t - before.t) / (after.t - before.t)
}

/// The median of the slopes between every two points (Theil and Sen).
fn median_slope(pts: &[(f64, f64)]) -> f64 {
    let mut slopes = Vec::new();
    for (i, a) in pts.iter().enumerate() {
        for b in &pts[i + 1..] {
            if b.0 != a.0 {
                slopes.push((b.1 - a.1) / (b.0 - a.0));
            }
        }
    }
    assert!(!slopes.is_empty(), "no two readings to take a slope from");
    median(slopes)
}

/// Text, HTML and JSON show the same findings.
fn formats_agree(c: &Case) {
    let html = c
        .html
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"")
        .replace("&#39;", "'")
        .replace("&#x27;", "'")
        .replace("&amp;", "&");
    for f in findings(&c.json) {
        let title = f["title"].as_str().unwrap();
        assert!(c.text.contains(title), "text lacks {title:?}");
        assert!(html.contains(title), "HTML lacks {title:?}");
    }
}

fn checks(c: &Case) {
    figures(c);
    formats_agree(c);
}

#[test]
fn serial_copy_on_read_of_a_python_list_is_named_and_measured() {
    let Some(c) = record(
        "cow-list",
        2048,
        &[
            "list",
            "--items",
            "2000000",
            "--workers",
            "3",
            "--pause",
            "0.006",
            "--epoch-seconds",
            "6",
        ],
    ) else {
        return;
    };
    let cow = finding(&c, "worker_cow");
    assert!(number(cow, "cow_workers").unwrap() >= 2.0);
    loads_then_forks(&c);
    checks(&c);
    // Headless Chromium shows the finding with its numbers, without a
    // console error.
    let chrome = screenshot::chromium();
    assert!(
        chrome.is_some() || !common::in_ci(),
        "chromium not installed"
    );
    if let Some(chrome) = chrome {
        let (dom, console_errors) = screenshot::dump_dom(&chrome, &c.html_path);
        assert!(dom.contains("Copy-on-read"), "the DOM lacks the finding");
        let shown = cow["numbers"]
            .as_array()
            .unwrap()
            .iter()
            .find(|n| n["name"] == "per_worker_growth_bytes")
            .unwrap()["text"]
            .as_str()
            .unwrap()
            .to_string();
        assert!(dom.contains(&shown), "DOM lacks {shown}");
        assert!(!console_errors, "console errors");
    }
}

#[test]
fn serial_the_same_data_as_a_numpy_array_grows_nowhere() {
    let Some(c) = record(
        "cow-numpy",
        1536,
        &[
            "numpy",
            "--items",
            "2000000",
            "--workers",
            "2",
            "--pause",
            "0.003",
            "--epoch-seconds",
            "6",
        ],
    ) else {
        return;
    };
    let k = kinds(&c);
    assert!(!k.iter().any(|x| x == "worker_cow"), "{k:?}");
    assert!(k.iter().any(|x| x == "worker_flat"), "{k:?}");
    loads_then_forks(&c);
    checks(&c);
}

#[test]
fn serial_a_pandas_frame_read_by_each_worker_is_copy_on_read() {
    let Some(c) = record(
        "cow-pandas",
        2560,
        &[
            "pandas",
            "--items",
            "600000",
            "--workers",
            "2",
            "--pause",
            "0.01",
            "--epoch-seconds",
            "9",
        ],
    ) else {
        return;
    };
    finding(&c, "worker_cow");
    loads_then_forks(&c);
    checks(&c);
}

#[test]
fn serial_workers_forked_again_every_epoch_copy_again_and_do_not_leak() {
    // Epochs long enough for each set to level off before it exits, as a
    // real epoch does: with 8 s, a set still copied in its last second,
    // after oomguard's last tick that saw it (-27 % on its growth).
    let Some(c) = record(
        "cow-reforked",
        2048,
        &[
            "reforked",
            "--items",
            "1500000",
            "--workers",
            "2",
            "--epochs",
            "2",
            "--pause",
            "0.015",
            "--epoch-seconds",
            "12",
        ],
    ) else {
        return;
    };
    let cow = finding(&c, "worker_cow");
    assert!(number(cow, "worker_generations").unwrap() >= 2.0);
    loads_then_forks(&c);
    checks(&c);
}

#[test]
fn serial_evaluation_outputs_kept_to_the_end_are_an_accumulation() {
    let Some(c) = record("eval", 2048, &["eval", "--mib", "300", "--seconds", "6"]) else {
        return;
    };
    finding(&c, "trainer_accumulation");
    no_leak_claimed(&c);
    checks(&c);
}

#[test]
fn serial_losses_kept_with_their_graph_are_a_trainer_leak() {
    let Some(c) = record("leak", 3072, &["leak", "--seconds", "9"]) else {
        return;
    };
    finding(&c, "trainer_growth");
    let k = kinds(&c);
    assert!(!k.iter().any(|x| x == "trainer_load"), "{k:?}");
    checks(&c);
}

#[test]
fn serial_a_start_up_load_then_a_plateau_is_a_load() {
    let Some(c) = record("load", 1536, &["load", "--mib", "400", "--seconds", "8"]) else {
        return;
    };
    finding(&c, "trainer_load");
    no_leak_claimed(&c);
    checks(&c);
}
