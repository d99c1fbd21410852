//! `oomguard replay` on logs recorded from real runs: the recorded policy
//! reproduces the recorded actions, and a stricter policy acts differently.

#![allow(clippy::unwrap_used)]

use crate::common;

use std::path::Path;

use common::*;

fn fixture(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/logs")
        .join(name)
}

/// Runs `oomguard replay --format json` and returns (recorded, replayed,
/// same) counts and the replayed actions as `(t, action, reason)`.
fn replay(log: &Path, flags: &[&str]) -> (usize, usize, usize, Vec<(f64, String, String)>) {
    let out = oomguard()
        .arg("replay")
        .arg(log)
        .args(["--format", "json"])
        .args(flags)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    let rows: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let count = |k: &str| rows.iter().filter(|r| !r[k].is_null()).count();
    let same = rows.iter().filter(|r| r["same"] == true).count();
    let replayed = rows
        .iter()
        .filter(|r| !r["replayed"].is_null())
        .map(|r| {
            let a = &r["replayed"];
            (
                a["t"].as_f64().unwrap(),
                a["action"].as_str().unwrap().to_string(),
                a["reason"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    (count("recorded"), count("replayed"), same, replayed)
}

/// `python3 job` under `oomguard run --budget 256MiB --grace 2s` and
/// `flags`, in `dir` (the stop's end record goes beside the job, not into
/// the checkout), which the policy must stop (exit 75); returns its log.
fn stopped_under_256_mib(dir: &Path, job: &Path, flags: &[&str]) -> std::path::PathBuf {
    let log = dir.join("run.ndjson");
    let out = oomguard()
        .args([
            "run", "--no-tui", "-q", "--cgroup", "off", "--budget", "256MiB",
        ])
        .args(["--grace", "2s"])
        .args(flags)
        .arg("--log")
        .arg(&log)
        .args(["--", "python3"])
        .arg(job)
        .current_dir(dir)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(75), "{err}");
    log
}

#[test]
fn the_recorded_policy_reproduces_every_recorded_run() {
    let _machine = common::machine::beside();
    for name in ["prevented.ndjson", "restarted.ndjson"] {
        let (recorded, replayed, same, _) = replay(&fixture(name), &[]);
        assert!(recorded > 0, "{name}: nothing recorded to compare");
        assert_eq!(
            (recorded, replayed, same),
            (recorded, recorded, recorded),
            "{name}: replay under the recorded policy differs"
        );
    }
}

#[test]
fn a_stricter_critical_level_stops_earlier() {
    let _machine = common::machine::beside();
    let log = fixture("prevented.ndjson");
    let (_, _, _, base) = replay(&log, &[]);
    let (_, _, same, strict) = replay(&log, &["--critical-at", "60%", "--warn-at", "40%"]);
    let stop_at = |acts: &[(f64, String, String)]| {
        acts.iter()
            .find(|(_, a, _)| a == "stop")
            .map(|(t, _, _)| *t)
            .unwrap()
    };
    assert!(
        stop_at(&strict) < stop_at(&base) - 1.0,
        "strict stop at {} vs {}",
        stop_at(&strict),
        stop_at(&base)
    );
    assert!(
        same < strict.len(),
        "the stricter policy matched everything"
    );
}

#[test]
fn a_live_run_is_reproduced_by_its_own_replay() {
    let _machine = common::machine::beside();
    // A job that grows to about 300 MiB in 10 MiB steps and then holds,
    // under a 256 MiB budget: the default policy warns, then stops it. It
    // never grows past 300 MiB, so no memory cgroup is needed.
    let dir = tempfile::tempdir().unwrap();
    let job = script(
        dir.path(),
        "grow.py",
        "import time\nchunks = []\nfor _ in range(30):\n    chunks.append(bytearray(10 << 20))\n    time.sleep(0.2)\ntime.sleep(30)\n",
    );
    let log = stopped_under_256_mib(dir.path(), &job, &["--interval", "500ms"]);
    let (recorded, replayed, same, acts) = replay(&log, &[]);
    assert!(
        recorded >= 2,
        "expected a warning and a stop, got {recorded}"
    );
    assert_eq!((replayed, same), (recorded, recorded), "{acts:?}");
    let (_, _, _, never) = replay(&log, &["--policy", "none"]);
    assert!(never.is_empty(), "policy none acted: {never:?}");
}

/// A run that holds still past its first 600 intervals writes a tenth of
/// the lines of that stretch (`sinks::log::quiet`), then every line once
/// memory moves toward the budget; its replay still makes the live
/// decisions. Judged by the rate of lines before and after the 600th, not
/// by the clock: a loaded machine ticks slower than 50 a second.
#[test]
fn a_steady_stretch_is_thinned_and_the_run_still_replays() {
    let _machine = common::machine::beside();
    let dir = tempfile::tempdir().unwrap();
    let hold = 24.0;
    let job = script(
        dir.path(),
        "hold_then_grow.py",
        &format!(
            "import time\nchunks = [bytearray(60 << 20)]\ntime.sleep({hold})\nfor _ in range(30):\n    chunks.append(bytearray(10 << 20))\n    time.sleep(0.2)\ntime.sleep(30)\n"
        ),
    );
    // At 20 ms a tick, 600 intervals are 12 s; every cadence scaled alike.
    let log = stopped_under_256_mib(
        dir.path(),
        &job,
        &[
            "--interval",
            "20ms",
            "--procs-interval",
            "1200ms",
            "--pss-interval",
            "100ms",
        ],
    );
    let lines = read_log(&log);
    let times: Vec<f64> = lines
        .iter()
        .filter(|l| matches!(l.event, schema::Event::Sample(_)))
        .map(|l| l.t)
        .collect();
    // Every tick of the first 600 is a line: their rate is the tick rate.
    let (start, warm) = (times[1], times[600]);
    let tick_rate = 599.0 / (warm - start);
    let (from, to) = (warm + 1.0, hold - 0.5);
    assert!(
        to - from >= 3.0,
        "the first 600 ticks took until {warm:.1} s: no steady stretch left"
    );
    let steady = times.iter().filter(|&&t| from <= t && t < to).count();
    let steady_rate = steady as f64 / (to - from);
    assert!(
        steady_rate <= tick_rate / 4.0 && steady > 0,
        "{steady_rate:.1} lines/s in the steady stretch, {tick_rate:.1} ticks/s before"
    );
    let (recorded, replayed, same, acts) = replay(&log, &[]);
    assert!(
        recorded >= 2,
        "expected a warning and a stop, got {recorded}"
    );
    assert_eq!((replayed, same), (recorded, recorded), "{acts:?}");
}
