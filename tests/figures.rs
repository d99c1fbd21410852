//! Figures a user acts on (issue 52): the growth per training step that
//! the run summary, the report and the log give, and the step at which the
//! ceiling would be reached, for a plain loop leaking exactly N MiB a step
//! (N = 1 and 4), run fresh and run again after resuming from the
//! checkpoint its stop saved. Each is held against the test's own reading
//! of the trainer (`/proc/PID/smaps_rollup` beside the step the job
//! printed), which also checks that the job leaks N.
//!
//! The loop leaks, so each run is under a memory cgroup of its own (root;
//! skipped outside CI) and a `--budget` that stops it.

#![allow(clippy::unwrap_used)]

use crate::common;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::MemCgroup;
use common::schema::Line;

const MIB: f64 = 1048576.0;

/// What one `oomguard run` of the loop gave, and what the test read.
struct Leg {
    stderr: String,
    report: String,
    log: Vec<Line>,
    /// The step the run started after (0 fresh, the saved step resumed).
    start: u64,
    /// The test's reading: private bytes per step over the run.
    truth_per_step: f64,
    /// The step at which the trainer's PSS would reach the budget at that
    /// growth, from the test's last reading before the peak.
    truth_ceiling_step: f64,
    /// The test's readings of the trainer's private bytes, `(seconds
    /// since the run began, bytes)`, up to its peak.
    sampled: Vec<(f64, f64)>,
    why: String,
}

/// The trainer (the `python3 plain.py` process in `cg`), once it runs.
fn trainer(cg: &MemCgroup) -> Option<u32> {
    cg.read("cgroup.procs").lines().find_map(|l| {
        let pid: u32 = l.trim().parse().ok()?;
        let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        let cmd = String::from_utf8_lossy(&cmd);
        let mut args = cmd.split('\0');
        let python = args.next()?.ends_with("python3");
        (python && args.next()?.ends_with("plain.py")).then_some(pid)
    })
}

/// `Private_Clean + Private_Dirty` and `Pss` of `pid`, bytes.
fn private_and_pss(pid: u32) -> Option<(f64, f64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    let kib = |name: &str| -> Option<f64> {
        let line = text.lines().find(|l| l.starts_with(name))?;
        let v: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
        Some(v * 1024.0)
    };
    Some((
        kib("Private_Clean:")? + kib("Private_Dirty:")?,
        kib("Pss:")?,
    ))
}

/// One run of the loop leaking `n` MiB a step under `budget` (MiB), its
/// checkpoints in `ckpt`.
fn leg(n: u64, budget: u64, ckpt: &Path) -> Option<Leg> {
    let cg = MemCgroup::or_skip("figures", 3 << 30)?;
    let log = ckpt.join(format!("run-{}.ndjson", std::process::id()));
    let _ = std::fs::remove_file(&log);
    let plain =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/jobs/companion/plain.py");
    let budget_arg = format!("{budget}M");
    let leak = n.to_string();
    let bin = Path::new(env!("CARGO_BIN_EXE_oomguard"));
    let args = [
        "run",
        "--no-tui",
        "--cgroup",
        "off",
        "--budget",
        &budget_arg,
        "--log",
        log.to_str().unwrap(),
        "--",
        "python3",
        plain.to_str().unwrap(),
        "1000000",
    ];
    let mut child = cg
        .command(bin, &args)
        .current_dir(ckpt)
        .env("CKPT_DIR", ckpt)
        .env("LEAK_MB", &leak)
        .env("MAX_MB", "100000")
        .env_remove("OOMGUARD_CONTROL")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let began = Instant::now();
    // The steps as the job printed them, and the trainer's memory, each
    // with when it was read.
    let steps: Arc<Mutex<Vec<(Instant, u64)>>> = Arc::default();
    let start = Arc::new(Mutex::new(0u64));
    let stdout = child.stdout.take().unwrap();
    let reader = {
        let (steps, start) = (steps.clone(), start.clone());
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if let Some(s) = line.strip_prefix("rank 0 resumed from step ") {
                    *start.lock().unwrap() = s.trim().parse().unwrap_or(0);
                }
                if let Some(s) = line.strip_prefix("rank 0 completed step ") {
                    let step = s.trim().parse().unwrap_or(0);
                    steps.lock().unwrap().push((Instant::now(), step));
                }
            }
        })
    };
    let mut readings: Vec<(Instant, f64, f64)> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(120);
    while child.try_wait().unwrap().is_none() && Instant::now() < deadline {
        if let Some((private, pss)) = trainer(&cg).and_then(private_and_pss) {
            readings.push((Instant::now(), private, pss));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    if Instant::now() >= deadline {
        cg.kill_all();
    }
    let out = child.wait_with_output().unwrap();
    reader.join().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let raw = std::fs::read_to_string(&log).unwrap_or_default();
    let why = format!("exit {:?}\n{stderr}", out.status.code());
    assert_eq!(out.status.code(), Some(75), "{why}");
    let start = *start.lock().unwrap();
    let steps = steps.lock().unwrap().clone();
    let step_at = |t: Instant| {
        steps
            .iter()
            .take_while(|(at, _)| *at <= t)
            .last()
            .map(|&(_, s)| s)
    };
    // From 20 steps in (past the start-up) to the peak of the private
    // memory (the stop's save and the teardown come after it).
    let read: Vec<(u64, f64, f64)> = readings
        .iter()
        .filter_map(|&(t, private, pss)| Some((step_at(t)?, private, pss)))
        .filter(|&(s, _, _)| s >= start + 20)
        .collect();
    let first = read.first().copied().unwrap_or_else(|| {
        panic!(
            "no reading 20 steps in: {} readings, {} steps (from {start})\n{why}",
            readings.len(),
            steps.len()
        )
    });
    let peak = read
        .iter()
        .copied()
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .unwrap();
    assert!(
        peak.0 >= first.0 + 30,
        "too few steps read: {read:?}\n{why}"
    );
    let truth_per_step = (peak.1 - first.1) / (peak.0 - first.0) as f64;
    let peak_at = readings
        .iter()
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .map(|r| r.0)
        .unwrap();
    let sampled = readings
        .iter()
        .filter(|r| r.0 <= peak_at)
        .map(|r| ((r.0 - began).as_secs_f64(), r.1))
        .collect();
    let truth_ceiling_step = peak.0 as f64 + (budget as f64 * MIB - peak.2) / truth_per_step;
    let report = text_report(&log);
    Some(Leg {
        stderr,
        report,
        log: common::read_log(&log),
        start,
        truth_per_step,
        truth_ceiling_step,
        sampled,
        why: format!("{why}\nlog:\n{raw}"),
    })
}

/// `oomguard report --format text LOG`.
fn text_report(log: &Path) -> String {
    let out = common::oomguard()
        .args(["report", "--format", "text"])
        .arg(log)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// "852 KiB" → bytes.
fn size(text: &str) -> Option<f64> {
    let (num, unit) = text.trim().split_once(' ')?;
    let x: f64 = num.parse().ok()?;
    let scale = match unit.trim_end_matches(|c: char| !c.is_ascii_alphabetic()) {
        "B" => 1.0,
        "KiB" => 1024.0,
        "MiB" => MIB,
        "GiB" => MIB * 1024.0,
        _ => return None,
    };
    Some(x * scale)
}

/// The figure after `before` in `text`, up to `until`.
fn figure<'a>(text: &'a str, before: &str, until: &str) -> Option<&'a str> {
    let rest = &text[text.find(before)? + before.len()..];
    Some(&rest[..rest.find(until)?])
}

fn within(got: f64, want: f64, share: f64) -> bool {
    (got - want).abs() <= want.abs() * share
}

/// Every figure of `leg` for a leak of `n` MiB a step.
fn assert_figures(leg: &Leg, n: u64, what: &str) {
    let want = n as f64 * MIB;
    let why = format!("{what}\n{}", leg.why);
    assert!(
        within(leg.truth_per_step, want, 0.15),
        "the job leaked {:.0} KiB a step by the test's reading\n{why}",
        leg.truth_per_step / 1024.0
    );
    let said = figure(&leg.stderr, "memory grew ", "/step").and_then(size);
    assert!(
        said.is_some_and(|s| within(s, want, 0.15)),
        "summary: {said:?}\n{why}"
    );
    let reported = figure(&leg.report, "memory grows ", " per training step").and_then(size);
    assert!(
        reported.is_some_and(|s| within(s, want, 0.15)),
        "report: {reported:?}\n{}\n{why}",
        leg.report
    );
    let logged: Vec<(u64, i64)> = (leg.log.iter())
        .filter_map(|l| {
            let p = l.progress.as_ref()?;
            Some((p.step?, p.bytes_per_step?))
        })
        .filter(|&(s, _)| s > leg.start + 50)
        .collect();
    assert!(!logged.is_empty(), "no progress logged\n{why}");
    for (step, per) in &logged {
        assert!(
            within(*per as f64, want, 0.15),
            "step {step}: {per} B/step logged\n{why}"
        );
    }
    // The report's rate for the trainer, against the test's own readings
    // over the window it names (its newest seconds up to the peak, or up
    // to oomguard's first action).
    let title = figure(&leg.report, "The trainer (", " and was still growing")
        .unwrap_or_else(|| panic!("report: no growing trainer\n{}\n{why}", leg.report));
    let rate = figure(title, "grew +", "/s over").and_then(size);
    let (Some(rate), Some((window, end))) = (rate, named_window(title)) else {
        panic!("report: {title}\n{why}");
    };
    let end = end.unwrap_or_else(|| leg.sampled.last().map_or(0.0, |r| r.0));
    let sampled: Vec<(f64, f64)> = (leg.sampled.iter())
        .filter(|r| r.0 >= end - window && r.0 <= end)
        .copied()
        .collect();
    let slope = slope(&sampled);
    assert!(
        within(rate, slope, 0.15),
        "report: +{:.1} MiB/s over {window} s, the test's readings {:.1} MiB/s over \
         the same seconds ({} readings)\n{}\n{why}",
        rate / MIB,
        slope / MIB,
        sampled.len(),
        leg.report
    );
    let near = figure(&leg.stderr, "the ceiling would be reached near step ", "\n")
        .and_then(|s| s.trim().parse::<f64>().ok());
    assert!(
        near.is_some_and(|s| within(s, leg.truth_ceiling_step, 0.15)),
        "ceiling step {near:?}, truth {:.0}\n{why}",
        leg.truth_ceiling_step
    );
}

/// The window a `trainer_growth` title names: its seconds, and its end
/// where that is oomguard's first action, not the trainer's end ("over its
/// last 9.0s"; "over the 9.1s before oomguard's checkpoint at 12.2s").
fn named_window(title: &str) -> Option<(f64, Option<f64>)> {
    if let Some(rest) = title.split("over its last ").nth(1) {
        return Some((seconds(rest)?, None));
    }
    let (window, action) = title
        .split(" over the ")
        .nth(1)?
        .split_once(" before oomguard's ")?;
    let at = action.split(" at ").nth(1)?;
    Some((seconds(window)?, Some(seconds(at)?)))
}

/// "48.2s" or "1m 05s" → seconds.
fn seconds(text: &str) -> Option<f64> {
    let (m, s) = match text.trim().split_once("m ") {
        Some((m, s)) => (m.parse::<f64>().ok()?, s),
        None => (0.0, text.trim()),
    };
    Some(m * 60.0 + s.strip_suffix('s')?.parse::<f64>().ok()?)
}

/// The slope of `(t, y)`: the median of the slopes between every two
/// readings (Theil–Sen), written here, not taken from oomguard. Robust as
/// the figures it is held against are: beside other tests the loop's pace
/// changes within a minute, and a least-squares line then leans on the
/// stretch it ran fastest in.
fn slope(pts: &[(f64, f64)]) -> f64 {
    let mut slopes: Vec<f64> = Vec::new();
    for (i, a) in pts.iter().enumerate() {
        for b in &pts[i + 1..] {
            if b.0 > a.0 {
                slopes.push((b.1 - a.1) / (b.0 - a.0));
            }
        }
    }
    slopes.sort_by(f64::total_cmp);
    slopes.get(slopes.len() / 2).copied().unwrap_or(0.0)
}

/// A leak of `n` MiB a step, fresh and resumed: each run's figures.
fn fresh_and_resumed(n: u64, budget: u64) {
    let _machine = common::machine::beside();
    let ckpt = tempfile::tempdir().unwrap();
    let Some(fresh) = leg(n, budget, ckpt.path()) else {
        return;
    };
    assert_figures(&fresh, n, "fresh");
    let resumed = leg(n, budget, ckpt.path()).expect("a cgroup, as before");
    assert!(resumed.start > 0, "not resumed\n{}", resumed.why);
    assert_figures(&resumed, n, "resumed");
}

#[test]
fn serial_a_leak_of_1_mib_a_step_reads_1_mib_a_step_fresh_and_resumed() {
    fresh_and_resumed(1, 450);
}

#[test]
fn serial_a_leak_of_4_mib_a_step_reads_4_mib_a_step_fresh_and_resumed() {
    fresh_and_resumed(4, 800);
}

/// Item 3's check: a plain loop leaking 1 MiB a step (about 20 MiB/s,
/// stopped at a 1200 MiB budget after about a minute) on the dashboard.
/// The trainer's rate on the last screen that gave one, the report's rate
/// for it, and the test's own readings of its private memory
/// (`smaps_rollup`, every 0.5 s) over each one's window (the minute before
/// that screen; the window the report names) agree within 15 %.
#[test]
fn serial_a_leaking_trainer_reads_one_rate_on_the_dashboard_in_the_report_and_by_the_test() {
    let _machine = common::machine::beside();
    let Some(cg) = MemCgroup::or_skip("figures-tui", 3 << 30) else {
        return;
    };
    common::deadline::arm();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("run.ndjson");
    let plain =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/jobs/companion/plain.py");
    let pane = Pane::start(
        &cg,
        dir.path(),
        &format!(
            "--budget 1200M --log {} -- env CKPT_DIR={} LEAK_MB=1 MAX_MB=100000 python3 {} 1000000",
            log.display(),
            dir.path().display(),
            plain.display()
        ),
    );
    let start = Instant::now();
    let mut sampled: Vec<(f64, f64)> = Vec::new();
    // (seconds, the trainer row's rate in bytes/s)
    let mut shown: Vec<(f64, f64)> = Vec::new();
    let ended = loop {
        std::thread::sleep(Duration::from_millis(500));
        let at = start.elapsed().as_secs_f64();
        if let Some((private, _)) = trainer(&cg).and_then(private_and_pss) {
            sampled.push((at, private));
        }
        let screen = pane.screen();
        if let Some(exit) = screen.lines().find(|l| l.starts_with("EXIT=")) {
            break exit.to_string();
        }
        assert!(at < 150.0, "no end in 150 s:\n{screen}");
        // The table's row for the trainer (the only process).
        let row = (screen.lines())
            .filter(|l| l.contains("python3"))
            .find_map(|l| screen_rates(l).first().copied());
        if let Some(r) = row {
            shown.push((at, r / 60.0));
        }
    };
    let report = text_report(&log);
    let why = format!("{ended}\n{report}\nshown: {shown:?}");
    assert_eq!(ended, "EXIT=75", "{why}");
    // The test's slope over `[from, to]`, from 3 s in (the start-up).
    let truth = |from: f64, to: f64| {
        let pts: Vec<(f64, f64)> = (sampled.iter())
            .filter(|r| r.0 >= from.max(3.0) && r.0 <= to)
            .copied()
            .collect();
        assert!(
            pts.len() >= 10,
            "{} readings in [{from}, {to}]\n{why}",
            pts.len()
        );
        slope(&pts)
    };
    let &(at, dash) = shown
        .last()
        .unwrap_or_else(|| panic!("no rate shown\n{why}"));
    assert!(at >= 30.0, "the last rate shown was at {at:.1} s\n{why}");
    let want = truth(at - 60.0, at);
    assert!(
        within(dash, want, 0.15),
        "dashboard at {at:.1} s: {:.1} MiB/s, the test's readings {:.1} MiB/s\n{why}",
        dash / MIB,
        want / MIB
    );
    let title = figure(&report, "The trainer (", " and was still growing")
        .unwrap_or_else(|| panic!("report: no growing trainer\n{why}"));
    let said = figure(title, "grew +", "/s over").and_then(size);
    let (Some(said), Some((window, end))) = (said, named_window(title)) else {
        panic!("report: {title}\n{why}");
    };
    // The report's window ends at the trainer's peak, as the test's does,
    // or where it says (oomguard's first action).
    let peak_at = (sampled.iter())
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .map_or(0.0, |r| r.0);
    let end = end.unwrap_or(peak_at);
    let want = truth(end - window, end);
    assert!(
        within(said, want, 0.15),
        "report: {:.1} MiB/s over {window} s, the test's readings {:.1} MiB/s\n{why}",
        said / MIB,
        want / MIB
    );
    assert!(
        within(said, dash, 0.15),
        "report {:.1} MiB/s, dashboard {:.1} MiB/s\n{why}",
        said / MIB,
        dash / MIB
    );
}

/// A growth rate read on the dashboard, in bytes a minute: a table row's
/// growth cell (`Σ+135 MiB`, `▲-2.0 KiB`, `flat`, `…`) or the summary's
/// `fastest … +X/min`; `None` for "flat" and "…".
fn per_minute(figure: &str) -> Option<f64> {
    let figure = figure.trim().trim_start_matches(['Σ', '▲']);
    let figure = figure.trim_end_matches("/min");
    let (sign, rest) = match figure.strip_prefix('-') {
        Some(r) => (-1.0, r),
        None => (1.0, figure.trim_start_matches('+')),
    };
    size(rest).map(|b| sign * b)
}

/// The growth rates on a dashboard screen: each table row's and the
/// summary line's "fastest".
fn screen_rates(screen: &str) -> Vec<f64> {
    let mut out = Vec::new();
    for line in screen.lines() {
        if let Some(cell) = line.split('┃').nth(1)
            && cell
                .split_whitespace()
                .next()
                .is_some_and(|p| p.parse::<u32>().is_ok())
        {
            let words: Vec<&str> = cell.split_whitespace().collect();
            if let [.., num, unit] = words[..]
                && let Some(r) = per_minute(&format!("{num} {unit}"))
            {
                out.push(r);
            }
        }
        if let Some(rest) = line.split("fastest ").nth(1) {
            let words: Vec<&str> = rest.split_whitespace().collect();
            if let [_, _, num, unit, ..] = words[..]
                && let Some(r) = per_minute(&format!("{num} {unit}"))
            {
                out.push(r);
            }
        }
    }
    out
}

/// Every rate in `text` ("0 B/s", "+54.9 MiB/s", "+110 MiB/min"), in
/// bytes a minute.
fn text_rates(text: &str) -> Vec<f64> {
    let words: Vec<&str> = text.split_whitespace().collect();
    let mut out = Vec::new();
    for pair in words.windows(2) {
        let unit = pair[1].trim_end_matches([',', ';', ')', '.']);
        let (unit, scale) = if let Some(u) = unit.strip_suffix("/s") {
            (u, 60.0)
        } else if let Some(u) = unit.strip_suffix("/min") {
            (u, 1.0)
        } else {
            continue;
        };
        if let Some(r) = per_minute(&format!("{} {unit}", pair[0].trim_start_matches('('))) {
            out.push(r * scale);
        }
    }
    out
}

/// `oomguard run --tui --cgroup off ARGS` in a tmux session of its own
/// (160 × 45), inside `cg`, from `dir`; killed on drop. Its pane ends with
/// `EXIT=<code>` once oomguard exits.
struct Pane {
    name: String,
}

impl Pane {
    fn start(cg: &MemCgroup, dir: &Path, args: &str) -> Pane {
        // The cgroup's name is the test's own (pid and a counter).
        let name = format!("oomguard-{}", cg.dir.file_name().unwrap().to_string_lossy());
        let inner = format!(
            "echo $$ > {cg}/cgroup.procs && cd {dir} && env -u TMPDIR {bin} run --tui --cgroup off {args}; \
             echo EXIT=$?; sleep 600",
            cg = cg.dir.display(),
            dir = dir.display(),
            bin = env!("CARGO_BIN_EXE_oomguard"),
        );
        let pane = Pane { name };
        pane.tmux(&[
            "new-session",
            "-d",
            "-s",
            &pane.name,
            "-x",
            "160",
            "-y",
            "45",
            &inner,
        ]);
        pane
    }

    fn tmux(&self, args: &[&str]) -> String {
        let out = std::process::Command::new("tmux")
            .args(args)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn screen(&self) -> String {
        self.tmux(&["capture-pane", "-t", &self.name, "-p"])
    }
}

impl Drop for Pane {
    fn drop(&mut self) {
        let _ = std::process::Command::new("tmux")
            .args(["kill-session", "-t", &self.name])
            .status();
    }
}

/// One run of `job` on the dashboard (see [`flat_on_every_surface`]):
/// its pane (ended with `EXIT=0`), its screens with their times, and the
/// test's own readings, every 2 s, of the private memory of each process
/// in the cgroup whose program is python, `(seconds, pid, bytes)`.
struct FlatRun {
    pane: Pane,
    seen: Vec<(f64, String)>,
    read: Vec<(f64, u32, f64)>,
}

impl FlatRun {
    /// Which process grew by more than 8 MiB from `from` seconds on, if
    /// any, while the job's processes stay the ones read first then. When
    /// DataLoader workers exit (the loop's end), the library pages they
    /// shared with the trainer become its alone: its private memory rises
    /// by some 300 MiB in the second before it exits, no growth of the
    /// loop (a reading in that second had failed 3 of 3 runs in CI).
    fn grew(&self, from: f64) -> Option<String> {
        use std::collections::{BTreeMap, BTreeSet};
        let read: Vec<_> = self.read.iter().filter(|r| r.0 >= from).collect();
        let pids_at =
            |t: f64| -> BTreeSet<u32> { read.iter().filter(|r| r.0 == t).map(|r| r.1).collect() };
        let steady = pids_at(read.first()?.0);
        let until = (read.iter().map(|r| r.0))
            .find(|&t| pids_at(t) != steady)
            .unwrap_or(f64::INFINITY);
        let mut first: BTreeMap<u32, (f64, f64)> = BTreeMap::new();
        read.iter()
            .filter(|r| r.0 < until)
            .find_map(|&&(at, pid, private)| {
                let (t0, p0) = *first.entry(pid).or_insert((at, private));
                (private - p0 > 8.0 * MIB).then(|| {
                    format!(
                        "pid {pid} {:.1} → {:.1} MiB from {t0:.0} s to {at:.0} s",
                        p0 / MIB,
                        private / MIB
                    )
                })
            })
    }
}

fn watch_flat(cg: &MemCgroup, dir: &Path, log: &Path, job: &str) -> FlatRun {
    let pane = Pane::start(cg, dir, &format!("--log {} -- {job}", log.display()));
    let start = Instant::now();
    let deadline = start + Duration::from_secs(180);
    let mut seen: Vec<(f64, String)> = Vec::new();
    let mut read: Vec<(f64, u32, f64)> = Vec::new();
    let ended = loop {
        std::thread::sleep(Duration::from_secs(2));
        let at = start.elapsed().as_secs_f64();
        for pid in cg
            .read("cgroup.procs")
            .lines()
            .filter_map(|l| l.trim().parse().ok())
        {
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            // The job's own processes (oomguard's arguments name python too).
            let program = cmd.split(|&b| b == 0).next().unwrap_or_default();
            if String::from_utf8_lossy(program).contains("python")
                && let Some((private, _)) = private_and_pss(pid)
            {
                read.push((at, pid, private));
            }
        }
        let screen = pane.screen();
        if let Some(exit) = screen.lines().find(|l| l.starts_with("EXIT=")) {
            break exit.to_string();
        }
        assert!(Instant::now() < deadline, "no end in 180 s:\n{screen}");
        if screen.contains("Processes") {
            seen.push((at, screen));
        }
    };
    assert_eq!(ended, "EXIT=0", "{}", pane.screen());
    FlatRun { pane, seen, read }
}

/// When a flat job's start-up is over, by its log: 20 s in, and for a job
/// that reports steps, not before its step 50 (10 s of a 5-step/s loop).
/// A machine slower than this one starts torch and the workers later: a
/// footprint still growing before the loop runs is a start-up, and a rate
/// for it is right.
fn settled(log: &str) -> f64 {
    let stepping = log.lines().find_map(|line| {
        let v: serde_json::Value = serde_json::from_str(line).ok()?;
        (v["progress"]["step"].as_u64()? >= 50).then(|| v["t"].as_f64())?
    });
    stepping.map_or(20.0, |t| t.max(20.0))
}

/// `job` (a shell command line, run from `dir`) under `oomguard run` on
/// the dashboard in a tmux session of its own, inside `cg`, for as long
/// as it runs: the screens after its start-up ([`settled`]), the terminal
/// when it ended (the summary), the report and the log. Every screen, the
/// summary, the report and every log line after its start-up must give no growth
/// rate above 10 MiB a minute, no ETA and no step at which the ceiling
/// would be reached.
fn flat_on_every_surface(cg: &MemCgroup, dir: &Path, job: &str, tries: u32) {
    const LIMIT: f64 = 10.0 * MIB;
    common::deadline::arm_for(Duration::from_secs(660));
    // The job must be flat for the test to say anything: with `tries`
    // above 1, a run in which the test's own readings saw one of its
    // processes grow is run again (up to `tries` times). A DataLoader
    // worker's heap that grew a batch a batch (glibc's sliding mmap
    // threshold, see the flat loop's test) was real growth, which the
    // dashboard rightly showed as "+150 MiB/min".
    let mut attempt = 0;
    let (FlatRun { pane, seen, .. }, log, raw) = loop {
        attempt += 1;
        let log = dir.join(format!("run-{attempt}.ndjson"));
        let run = watch_flat(cg, dir, &log, job);
        let raw = std::fs::read_to_string(&log).unwrap();
        match run.grew(settled(&raw)).filter(|_| tries > 1) {
            Some(why) if attempt < tries => eprintln!("attempt {attempt}: the job grew: {why}"),
            Some(why) => panic!("the job itself grew in each of {tries} runs: {why}"),
            None => break (run, log, raw),
        }
    };
    let tmux = |args: &[&str]| pane.tmux(args);
    let settled = settled(&raw);
    let mut screens = 0;
    for (at, screen) in seen.iter().filter(|(at, _)| *at >= settled) {
        screens += 1;
        let at = at.round();
        assert!(!screen.contains("ETA"), "an ETA at {at} s:\n{screen}");
        assert!(
            !screen.contains("ceiling ≈ step"),
            "a ceiling step at {at} s:\n{screen}"
        );
        for r in screen_rates(screen) {
            assert!(
                r.abs() <= LIMIT,
                "{:.1} MiB/min at {at} s:\n{screen}",
                r / MIB
            );
        }
    }
    assert!(screens >= 10, "{screens} screens read after {settled:.1} s");
    let terminal = tmux(&["capture-pane", "-t", &pane.name, "-p", "-S", "-200"]);
    assert!(terminal.contains("exited with 0"), "{terminal}");
    for word in ["memory grew", "ceiling would be reached", "ETA"] {
        assert!(!terminal.contains(word), "summary: {word}\n{terminal}");
    }
    let report = text_report(&log);
    for word in ["per training step", "ceiling is reached", "ETA"] {
        assert!(!report.contains(word), "report: {word}\n{report}");
    }
    for r in text_rates(&report) {
        assert!(r.abs() <= LIMIT, "report: {:.1} MiB/min\n{report}", r / MIB);
    }
    let mut after = 0;
    for line in raw.lines() {
        let v: serde_json::Value = serde_json::from_str(line).unwrap();
        if v["t"].as_f64().unwrap_or(0.0) < settled {
            continue;
        }
        after += 1;
        assert!(v["eta_seconds"].is_null(), "an ETA logged: {line}");
        let p = &v["progress"];
        assert!(p["ceiling_step"].is_null(), "a ceiling step logged: {line}");
        if let (Some(per), Some(rate)) =
            (p["bytes_per_step"].as_f64(), p["steps_per_second"].as_f64())
        {
            assert!((per * rate * 60.0).abs() <= LIMIT, "{line}");
        }
    }
    assert!(after >= 30, "{after} lines after {settled:.1} s:\n{raw}");
}

/// A load at start-up and then a plateau with allocator noise, 60 s
/// (`benches/shapes.py load_plateau`): no rate, ETA or ceiling step after
/// 20 s on any surface (the start-up load read "+2.3 GiB/min" at 14 s and
/// the noise "ETA 2h 17m" at 25 s before every figure had a basis).
///
/// Alone on the machine: its 20 s assume a start-up at the machine's pace.
/// Beside other tests in CI the load itself ran past 20 s (an ETA of 17.9 s
/// at 20.1 s was right: the job was still loading).
#[test]
fn serial_a_load_then_a_plateau_shows_no_rate_no_eta_and_no_ceiling_step() {
    let _machine = common::machine::alone();
    let limit: u64 = 2 << 30;
    let Some(cg) = MemCgroup::or_skip("flat", limit) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let shapes = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/shapes.py");
    let job = format!(
        "python3 {} load_plateau --usage-file {}/memory.usage_in_bytes --limit {limit} --seconds 60",
        shapes.display(),
        cg.dir.display()
    );
    flat_on_every_surface(&cg, dir.path(), &job, 1);
}

/// A flat plain training loop with 2 DataLoader workers, 60 s: the same,
/// alone for the same reason (beside other tests in CI, torch's start-up
/// and the workers' first full readings still grew the footprint at 20 s).
#[test]
fn serial_a_flat_training_loop_shows_no_rate_no_eta_and_no_ceiling_step() {
    let _machine = common::machine::alone();
    let Some(venv) = common::torch_venv() else {
        return;
    };
    let Some(cg) = MemCgroup::or_skip("flat", 3 << 30) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let batches = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/jobs/shm/batches.py");
    // glibc's default mmap threshold follows the largest block freed: once
    // a worker frees its first 1 MiB batch, later batches come from its heap,
    // and in about half the runs the heap then grows by about a batch a
    // batch for good (USS 19 → 141 MiB per worker in 60 s, the same with
    // and without oomguard). Real growth, rightly shown; a fixed threshold
    // (glibc's own default value) keeps this job flat (11.5 MiB per worker
    // in 5 of 5 runs).
    let job = format!(
        "env CKPT_DIR={} STEPS=300 BATCH_MB=1 MALLOC_MMAP_THRESHOLD_=131072 {} {}",
        dir.path().display(),
        venv.join("bin/python").display(),
        batches.display()
    );
    flat_on_every_surface(&cg, dir.path(), &job, 3);
}
