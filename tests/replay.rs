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
/// the checkout), which the policy must stop (exit 75); returns its log,
/// `dir/run.ndjson`. Where the machine can make one, the run has a memory
/// cgroup of its own: the enclosing cgroup oomguard reports with `--cgroup
/// off` is then the job's alone, not the usage of every test beside it.
fn stopped_under_256_mib(dir: &Path, job: &Path, flags: &[&str]) -> std::path::PathBuf {
    let log = dir.join("run.ndjson");
    let own = MemCgroup::new("replay", 1 << 30);
    let mut cmd = match &own {
        Some(cg) => cg.command(Path::new(env!("CARGO_BIN_EXE_oomguard")), &[]),
        None => oomguard(),
    };
    let out = cmd
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
/// by the clock: a loaded machine ticks slower than 50 a second, so the job
/// holds still until its own log has 600 samples, and 5 s more.
#[test]
fn a_steady_stretch_is_thinned_and_the_run_still_replays() {
    let _machine = common::machine::beside();
    let dir = tempfile::tempdir().unwrap();
    let job = script(
        dir.path(),
        "hold_then_grow.py",
        "import time\n\
         chunks = [bytearray(60 << 20)]\n\
         def samples():\n    \
             try:\n        \
                 with open('run.ndjson') as f:\n            \
                     return sum('\"event\":\"sample\"' in l for l in f)\n    \
             except OSError:\n        \
                 return 0\n\
         give_up = time.time() + 120\n\
         while samples() < 600 and time.time() < give_up:\n    \
             time.sleep(0.5)\n\
         time.sleep(5)\n\
         for _ in range(30):\n    \
             chunks.append(bytearray(10 << 20))\n    \
             time.sleep(0.2)\n\
         time.sleep(30)\n",
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
    let samples: Vec<(f64, u64)> = lines
        .iter()
        .filter_map(|l| match &l.event {
            schema::Event::Sample(s) => Some((l.t, s.tree.footprint_bytes)),
            _ => None,
        })
        .collect();
    assert!(samples.len() > 600, "{} samples", samples.len());
    // Every tick of the first 600 is a line: their rate is the tick rate.
    let (start, warm) = (samples[1].0, samples[600].0);
    let tick_rate = 599.0 / (warm - start);
    // The stretch ends where the job begins to grow (its first 10 MiB).
    let held = samples[600].1;
    let grew = (samples.iter())
        .find(|&&(t, f)| t > warm && f > held + (8 << 20))
        .map(|&(t, _)| t)
        .unwrap_or(f64::INFINITY);
    let (from, to) = (warm + 1.0, grew - 0.5);
    assert!(
        to - from >= 3.0,
        "600 ticks by {warm:.1} s, growth at {grew:.1} s: no steady stretch"
    );
    let steady: Vec<&schema::Line> = (lines.iter())
        .filter(|l| matches!(l.event, schema::Event::Sample(_)) && from <= l.t && l.t < to)
        .collect();
    let steady_rate = steady.len() as f64 / (to - from);
    assert!(
        steady_rate <= tick_rate / 4.0 && !steady.is_empty(),
        "{steady_rate:.1} lines/s in the steady stretch {from:.1}-{to:.1} s, \
         {tick_rate:.1} ticks/s before; its first lines: {:#?}",
        &steady[..steady.len().min(4)]
    );
    let (recorded, replayed, same, acts) = replay(&log, &[]);
    assert!(
        recorded >= 2,
        "expected a warning and a stop, got {recorded}"
    );
    assert_eq!((replayed, same), (recorded, recorded), "{acts:?}");
}
