//! Precedence tests: for every setting that both a flag and the file can
//! set, the flag wins over the file, and the file wins over the default.

use std::path::Path;
use std::time::Duration;

use clap::Parser;

use super::*;
use crate::engine::policy::Metric;
use crate::settings::cli::{Cli, Command};

fn run_args(extra: &[&str]) -> RunArgs {
    let mut argv = vec!["oomguard", "run"];
    argv.extend_from_slice(extra);
    argv.extend_from_slice(&["--", "true"]);
    match Cli::try_parse_from(argv).map(|c| c.command) {
        Ok(Command::Run(r)) => *r,
        other => panic!("{extra:?}: {other:?}"),
    }
}

fn settings(flags: &[&str], file: Option<&str>) -> Settings {
    let a = run_args(flags);
    let layer = run_layer(&a);
    let file = file.map(|t| file::parse(Path::new("oomguard.toml"), t).unwrap());
    let cmd = CommandLine {
        no_notify: a.policy.no_notify,
        ..CommandLine::default()
    };
    Settings::merge(cmd, &layer, file.as_ref(), Preset::Run).unwrap()
}

/// One setting: a flag, a file line with another value, and how to read the
/// resolved value as text.
struct Case {
    flag: &'static [&'static str],
    file: &'static str,
    get: fn(&Settings) -> String,
    from_flag: &'static str,
    from_file: &'static str,
}

fn dur(d: Duration) -> String {
    format!("{}ms", d.as_millis())
}

fn warn_at(s: &Settings) -> String {
    format!("{:?}", s.policy.policy.thresholds().0)
}

fn crit_at(s: &Settings) -> String {
    format!("{:?}", s.policy.policy.thresholds().1)
}

fn critical_action(s: &Settings) -> String {
    let crit = s
        .policy
        .policy
        .rules
        .iter()
        .find(|r| r.name == "critical-headroom");
    format!("{:?}", crit.map(|r| r.action))
}

fn cases() -> Vec<Case> {
    let mut all = sampling_and_limit_cases();
    all.extend(action_and_restart_cases());
    all
}

/// Sampling, the cgroup, limits and thresholds.
fn sampling_and_limit_cases() -> Vec<Case> {
    vec![
        Case {
            flag: &["--interval", "2s"],
            file: "interval = \"3s\"",
            get: |s| dur(s.interval),
            from_flag: "2000ms",
            from_file: "3000ms",
        },
        Case {
            flag: &["--pss-interval", "2s"],
            file: "pss_interval = \"3s\"",
            get: |s| dur(s.pss_interval),
            from_flag: "2000ms",
            from_file: "3000ms",
        },
        Case {
            flag: &["--pss-budget", "2%"],
            file: "pss_budget = \"3%\"",
            get: |s| format!("{:.3}", s.pss_budget),
            from_flag: "0.020",
            from_file: "0.030",
        },
        Case {
            flag: &["--without", "psi"],
            file: "without = \"cheap-loop\"",
            get: |s| format!("{}{}", s.without.psi, s.without.cheap_loop),
            from_flag: "truefalse",
            from_file: "falsetrue",
        },
        Case {
            flag: &["--procs-interval", "2s"],
            file: "procs_interval = \"3s\"",
            get: |s| dur(s.procs_interval),
            from_flag: "2000ms",
            from_file: "3000ms",
        },
        Case {
            flag: &["--cgroup", "auto"],
            file: "cgroup = \"off\"",
            get: |s| format!("{:?}", s.cgroup),
            from_flag: "Auto",
            from_file: "Off",
        },
        Case {
            flag: &["--kill-after", "2s"],
            file: "kill_after = \"3s\"",
            get: |s| dur(s.kill_after),
            from_flag: "2000ms",
            from_file: "3000ms",
        },
        Case {
            flag: &["--on-signal", "USR1=forward"],
            file: "on_signal = \"USR1=checkpoint\"",
            get: |s| s.on_signal.get(libc::SIGUSR1).unwrap().name().to_string(),
            from_flag: "forward",
            from_file: "checkpoint",
        },
        Case {
            flag: &["--signal-budget", "20s"],
            file: "signal_budget = \"15s\"",
            get: |s| dur(s.signal_budget),
            from_flag: "20000ms",
            from_file: "15000ms",
        },
        Case {
            flag: &["--output-lines", "5"],
            file: "output_lines = 50",
            get: |s| s.output_lines.to_string(),
            from_flag: "5",
            from_file: "50",
        },
        Case {
            flag: &["--stop-code", "138"],
            file: "stop_code = 99",
            get: |s| s.stop_code.to_string(),
            from_flag: "138",
            from_file: "99",
        },
        Case {
            flag: &["--budget", "2GiB"],
            file: "budget = \"3GiB\"",
            get: |s| format!("{:?}", s.budget),
            from_flag: "Some(Bytes(2147483648))",
            from_file: "Some(Bytes(3221225472))",
        },
        Case {
            flag: &["--fail-above", "2GiB"],
            file: "fail_above = \"3GiB\"",
            get: |s| format!("{:?}", s.fail_above),
            from_flag: "Some(2147483648)",
            from_file: "Some(3221225472)",
        },
        Case {
            flag: &["--policy", "default"],
            file: "policy = \"none\"",
            get: |s| s.policy.policy.rules.len().to_string(),
            from_flag: "5",
            from_file: "0",
        },
        Case {
            flag: &["--warn-at", "70%"],
            file: "warn_at = \"60%\"",
            get: warn_at,
            from_flag: "Some(30.0)",
            from_file: "Some(40.0)",
        },
        Case {
            flag: &["--critical-at", "95%"],
            file: "critical_at = \"90%\"",
            get: crit_at,
            from_flag: "Some(5.0)",
            from_file: "Some(10.0)",
        },
    ]
}

/// Actions, the stop, notifications and restarts.
fn action_and_restart_cases() -> Vec<Case> {
    vec![
        Case {
            flag: &["--requeue-limit", "5"],
            file: "requeue_limit = 0",
            get: |s| s.requeue_limit.to_string(),
            from_flag: "5",
            from_file: "0",
        },
        Case {
            flag: &["--on-critical", "kill"],
            file: "on_critical = \"pause\"",
            get: critical_action,
            from_flag: "Some(Kill)",
            from_file: "Some(Pause)",
        },
        Case {
            flag: &["--max-pause", "2s"],
            file: "max_pause = \"3s\"",
            get: |s| s.policy.policy.max_pause_seconds.to_string(),
            from_flag: "2",
            from_file: "3",
        },
        Case {
            flag: &["--grace", "2s"],
            file: "grace = \"3s\"",
            get: |s| dur(s.grace),
            from_flag: "2000ms",
            from_file: "3000ms",
        },
        Case {
            flag: &["--checkpoint-signal", "USR1"],
            file: "checkpoint_signal = \"USR2\"",
            get: |s| s.checkpoint_signal.to_string(),
            from_flag: "10",
            from_file: "12",
        },
        Case {
            flag: &["--on-warn", "echo flag"],
            file: "on_warn = \"echo file\"",
            get: |s| format!("{:?}", s.on_warn),
            from_flag: "Some(\"echo flag\")",
            from_file: "Some(\"echo file\")",
        },
        Case {
            flag: &["--no-notify"],
            file: "notify = true",
            get: |s| s.notify.to_string(),
            from_flag: "false",
            from_file: "true",
        },
        Case {
            flag: &["--checkpoint-dir", "/flag"],
            file: "checkpoint_dir = \"/file\"",
            get: |s| format!("{:?}", s.checkpoint_dir),
            from_flag: "Some(\"/flag\")",
            from_file: "Some(\"/file\")",
        },
        Case {
            flag: &["--checkpoint-glob", "*.pt"],
            file: "checkpoint_glob = \"*.ckpt\"",
            get: |s| s.checkpoint_glob.clone(),
            from_flag: "*.pt",
            from_file: "*.ckpt",
        },
        Case {
            flag: &["--max-restarts", "7"],
            file: "max_restarts = 9",
            get: |s| s.max_restarts.to_string(),
            from_flag: "7",
            from_file: "9",
        },
        Case {
            flag: &["--restart-delay", "2s"],
            file: "restart_delay = \"3s\"",
            get: |s| dur(s.restart_delay),
            from_flag: "2000ms",
            from_file: "3000ms",
        },
        Case {
            flag: &["--restart-reset", "2s"],
            file: "restart_reset = \"3s\"",
            get: |s| dur(s.restart_reset),
            from_flag: "2000ms",
            from_file: "3000ms",
        },
    ]
}

#[test]
fn every_flag_beats_the_file_and_the_file_beats_the_default() {
    // `notify` is forced off under CI; compare with the same environment.
    let ci = super::in_ci();
    for c in cases() {
        let defaults = (c.get)(&settings(&[], None));
        let file_only = (c.get)(&settings(&[], Some(c.file)));
        let both = (c.get)(&settings(c.flag, Some(c.file)));
        if c.file.starts_with("notify") && ci {
            assert_eq!(both, "false");
            continue;
        }
        assert_eq!(both, c.from_flag, "{:?} did not beat `{}`", c.flag, c.file);
        assert_eq!(
            file_only, c.from_file,
            "`{}` did not beat the default",
            c.file
        );
        if !c.file.starts_with("notify") {
            assert_ne!(
                defaults, c.from_file,
                "{}: the test cannot tell file from default",
                c.file
            );
        }
        assert_ne!(
            c.from_flag, c.from_file,
            "{:?}: flag and file agree",
            c.flag
        );
    }
}

#[test]
fn every_file_key_has_a_precedence_case() {
    // A key added to the file without a case here would escape the test
    // above: list the keys the file accepts and compare.
    let covered: Vec<&str> = cases()
        .iter()
        .map(|c| c.file.split(' ').next().unwrap_or(""))
        .collect();
    for key in Layer::KEYS.iter().chain(&["notify"]) {
        assert!(covered.contains(key), "no precedence case for '{key}'");
    }
    assert_eq!(
        Layer::default(),
        file::parse(Path::new("f"), "").unwrap().layer
    );
}

#[test]
fn kill_after_from_the_command_line_beats_the_file() {
    // The bug this module was written for: clap filled in 10s, so the file
    // always won.
    let s = settings(&["--kill-after", "10s"], Some("kill_after = \"30s\""));
    assert_eq!(s.kill_after, Duration::from_secs(10));
    assert_eq!(settings(&[], None).kill_after, Duration::from_secs(10));
}

#[test]
fn presets_sit_between_the_file_and_the_defaults() {
    let demo = Settings::merge(
        CommandLine::default(),
        &Layer::default(),
        None,
        Preset::Demo { budget: 1 << 30 },
    )
    .unwrap();
    assert_eq!(demo.interval, Duration::from_millis(500));
    assert!(!demo.notify);
    assert_eq!(demo.budget, Some(SizeOrPercent::Bytes(1 << 30)));
    let file = file::parse(Path::new("f"), "interval = \"2s\"").unwrap();
    let with_file = Settings::merge(
        CommandLine::default(),
        &Layer::default(),
        Some(&file),
        Preset::Demo { budget: 1 << 30 },
    )
    .unwrap();
    assert_eq!(with_file.interval, Duration::from_secs(2));

    let attach = Settings::merge(
        CommandLine::default(),
        &Layer::default(),
        None,
        Preset::Attach {
            pid: 42,
            allow_kill: true,
        },
    )
    .unwrap();
    assert_eq!((attach.attach, attach.allow_kill), (Some(42), true));
    assert_eq!(attach.cgroup, CgroupMode::Off);
    assert_eq!(attach.max_restarts, 0);
}

#[test]
fn custom_rules_replace_defaults_unless_included() {
    let text = "[[rule]]\nname = \"swap\"\nmetric = \"swap_in_rate\"\nabove = \"50MiB/s\"\naction = \"warn\"\n";
    let s = settings(&[], Some(text));
    assert_eq!(s.policy.policy.rules.len(), 1);
    assert_eq!(s.policy.policy.rules[0].metric, Metric::SwapInRate);
    let s = settings(&[], Some(&format!("include_defaults = true\n{text}")));
    assert_eq!(s.policy.policy.rules.len(), 6);
}

#[test]
fn critical_below_warn_is_rejected_whatever_the_source() {
    let a = run_args(&["--warn-at", "90%"]);
    let file = file::parse(Path::new("f"), "critical_at = \"85%\"").unwrap();
    let e = Settings::merge(
        CommandLine::default(),
        &policy_layer(&a.policy),
        Some(&file),
        Preset::Run,
    )
    .unwrap_err();
    assert!(e.to_string().contains("must be above"), "{e}");
}

#[test]
fn bad_paths_are_refused_before_the_job_starts() {
    let cmd = CommandLine {
        run: RunOnly {
            nvml_lib: Some("/no/such/libnvidia-ml.so.1".into()),
            ..RunOnly::default()
        },
        ..CommandLine::default()
    };
    let e = Settings::merge(cmd, &Layer::default(), None, Preset::Run).unwrap_err();
    assert!(e.to_string().contains("/no/such/libnvidia-ml.so.1"), "{e}");
    let cmd = CommandLine {
        log: Some("/proc/version".into()),
        ..CommandLine::default()
    };
    let e = Settings::merge(cmd, &Layer::default(), None, Preset::Run).unwrap_err();
    assert!(e.to_string().contains("proc pseudo file system"), "{e}");
    let dir = tempfile::tempdir().unwrap();
    let cmd = CommandLine {
        log: Some(dir.path().join("run.ndjson")),
        ..CommandLine::default()
    };
    assert!(Settings::merge(cmd, &Layer::default(), None, Preset::Run).is_ok());
}

#[test]
fn help_shows_the_defaults_from_one_place() {
    let mut cmd = super::command();
    cmd.build();
    let run = cmd.find_subcommand_mut("run").unwrap();
    let help = run.render_long_help().to_string();
    assert!(help.contains("[default: 10s]"), "{help}");
    assert!(help.contains("[default: 92%]"), "{help}");
    let attach = cmd.find_subcommand_mut("attach").unwrap();
    assert!(
        attach
            .render_long_help()
            .to_string()
            .contains("[default: 1s]")
    );
}

#[test]
fn a_log_pattern_names_each_node_and_rank() {
    let slurm = |name: &str| match name {
        "SLURM_NODEID" => Some("3".to_string()),
        "SLURM_PROCID" => Some("12".to_string()),
        "SLURM_JOB_ID" => Some("4711".to_string()),
        _ => None,
    };
    let none = |_: &str| None;
    let expand = |p: &str, env: &dyn Fn(&str) -> Option<String>| {
        expand_log_pattern(Path::new(p), env, "gpu-a/7", 42)
    };
    assert_eq!(
        expand("logs/%j/run-%N-%r.ndjson", &slurm).unwrap(),
        Path::new("logs/4711/run-3-12.ndjson")
    );
    // Outside SLURM: the host name (a value never adds a directory) and
    // rank 0; %p and %% as such.
    assert_eq!(
        expand("run-%N-%r-%h-%j-%p-100%%.ndjson", &none).unwrap(),
        Path::new("run-gpu-a_7-0-gpu-a_7-local-42-100%.ndjson")
    );
    assert_eq!(
        expand("plain.ndjson", &none).unwrap(),
        Path::new("plain.ndjson")
    );
    for bad in ["run-%x.ndjson", "run-%"] {
        let err = expand(bad, &none).unwrap_err().to_string();
        assert!(err.contains("is not a pattern"), "{bad}: {err}");
    }
}

#[test]
fn a_replay_keeps_the_recorded_policy_unless_a_rule_shaping_flag_is_given() {
    let policy = |extra: &[&str]| {
        let a = run_args(extra);
        replay_policy(&a.policy).unwrap().map(|(p, _)| p)
    };
    // How a stop is carried out is no part of a replay.
    assert_eq!(policy(&[]), None);
    assert_eq!(policy(&["--grace", "5s", "--on-warn", "true"]), None);
    let p = policy(&["--warn-at", "70%"]).unwrap();
    assert_eq!(p.thresholds().0, Some(30.0));
    assert!(policy(&["--policy", "none"]).unwrap().rules.is_empty());
}

#[test]
fn a_budget_leaves_the_settings_in_bytes() {
    let total = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| crate::engine::probe::system::parse_meminfo(&t))
        .unwrap()
        .0;
    let share = settings(&["--budget", "25%"], None);
    assert_eq!(share.budget_bytes, Some((total as f64 * 0.25) as u64));
    let size = settings(&["--budget", "2GiB"], None);
    assert_eq!(size.budget_bytes, Some(2 << 30));
    assert_eq!(settings(&[], None).budget_bytes, None);
}
