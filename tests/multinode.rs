//! One job on two "nodes" of this machine: two oomguards, each running
//! `torchrun --nnodes 2 --nproc-per-node 2` (gloo on CPU, a c10d
//! rendezvous on localhost), each in its own memory cgroup, one node
//! leaking. The leaking node's stop reaches every rank through the job's
//! own process group: all four ranks save the same step, both oomguards
//! exit 75, and the healthy node's log names the node that ran short.

#![allow(clippy::unwrap_used)]

use crate::common;
use crate::support::screenshot;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use crate::support::store_proxy::StoreProxy;
use common::MemCgroup;
use common::schema::Event;

fn done_step(log: &[common::schema::Line]) -> Option<u64> {
    log.iter().rev().find_map(|l| match &l.event {
        Event::CheckpointDone(v) => v["step"].as_u64(),
        _ => None,
    })
}

fn stop_reasons(log: &[common::schema::Line]) -> Vec<String> {
    log.iter()
        .filter_map(|l| match &l.event {
            Event::Action(a) if a.action == "stop" => Some(a.reason.clone()),
            _ => None,
        })
        .collect()
}

/// Two nodes of one job, each an oomguard over `torchrun --nnodes 2`, each
/// in its own memory cgroup; node A leaks under a `--budget` and gets
/// `extra_a`. Returns both runs and the checkpoint directory.
struct TwoNodes {
    out: [std::process::Output; 2],
    logs: [Vec<common::schema::Line>; 2],
    dir: tempfile::TempDir,
    /// When each oomguard had exited.
    ended: [Instant; 2],
    /// What `during` returned.
    marked: Option<Instant>,
}

impl TwoNodes {
    fn why(&self) -> String {
        let text = |o: &std::process::Output| {
            format!(
                "exit {:?}\nstderr:\n{}\nstdout tail:\n{}",
                o.status.code(),
                String::from_utf8_lossy(&o.stderr),
                String::from_utf8_lossy(&o.stdout)
                    .lines()
                    .rev()
                    .take(6)
                    .collect::<Vec<_>>()
                    .join("\n")
            )
        };
        format!(
            "node a:\n{}\n\nnode b:\n{}",
            text(&self.out[0]),
            text(&self.out[1])
        )
    }
}

fn two_nodes(port: u16, extra_a: &[&str], steps: &str) -> Option<TwoNodes> {
    let mut a_args = vec!["--budget", "1600M"];
    a_args.extend(extra_a);
    let a = NodeA {
        leak: "1",
        limit: 4 << 30,
        env: &[],
        shared: &[],
        env_b: &[],
        b_after_rendezvous: false,
    };
    two_nodes_during(port, &a_args, &[], &a, steps, |_| None)
}

/// How node A differs from node B, besides its flags.
struct NodeA<'a> {
    /// The local rank that leaks (`"99"`: none).
    leak: &'a str,
    /// Its memory cgroup's limit.
    limit: u64,
    env: &'a [(&'a str, &'a str)],
    /// Given to both nodes.
    shared: &'a [(&'a str, &'a str)],
    /// Given to node B alone.
    env_b: &'a [(&'a str, &'a str)],
    /// Node B starts once node A's launcher serves the rendezvous: node A
    /// hosts the rendezvous store, and (its launcher's pid the lower, the
    /// first in torch's order) node rank 0 and the job's store too.
    b_after_rendezvous: bool,
}

/// [`two_nodes`] with each node's flags given whole, node A's differences,
/// and `during` run (with the checkpoint directory) while both jobs run.
fn two_nodes_during(
    port: u16,
    a_args: &[&str],
    b_args: &[&str],
    node_a: &NodeA<'_>,
    steps: &str,
    during: impl FnOnce(&Path) -> Option<Instant>,
) -> Option<TwoNodes> {
    let venv = common::torch_venv()?;
    let (cg_a, cg_b) = (
        MemCgroup::or_skip("node-a", node_a.limit)?,
        MemCgroup::or_skip("node-b", 4 << 30)?,
    );
    let dir = tempfile::tempdir().unwrap();
    let torchrun = venv.join("bin/torchrun");
    let plain =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/jobs/companion/plain.py");
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_oomguard"));
    let endpoint = format!("localhost:{port}");
    let start =
        |cg: &MemCgroup, name: &str, extra: &[&str], leak: &str, env: &[(&str, &str)]| -> Child {
            let log = dir.path().join(format!("{name}.ndjson"));
            let mut args = vec!["run", "--no-tui", "--log", log.to_str().unwrap()];
            args.extend(extra);
            args.extend([
                "--",
                torchrun.to_str().unwrap(),
                "--nnodes",
                "2",
                "--nproc-per-node",
                "2",
                "--rdzv-backend",
                "c10d",
                "--rdzv-endpoint",
                &endpoint,
                "--rdzv-id",
                "multinode-test",
                plain.to_str().unwrap(),
                steps,
            ]);
            cg.command(&bin, &args)
                .envs(node_a.shared.iter().copied())
                .envs(env.iter().copied())
                .env("TEST_NODE", name)
                .env("NUM_WORKERS", "4")
                .env("DIST", "1")
                .env("LEAK_LOCAL_RANK", leak)
                .env("CKPT_DIR", dir.path())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        };
    let a = start(&cg_a, "a", a_args, node_a.leak, node_a.env);
    if node_a.b_after_rendezvous {
        let serves = || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok();
        assert!(
            common::wait_for(Duration::from_secs(120), serves),
            "node a's launcher never served the rendezvous on {port}"
        );
    }
    let b = start(&cg_b, "b", b_args, "99", node_a.env_b);
    let waiter = |c: Child| {
        std::thread::spawn(move || {
            let out = c.wait_with_output().unwrap();
            (out, Instant::now())
        })
    };
    let (a, b) = (waiter(a), waiter(b));
    let marked = during(dir.path());
    let ((out_a, end_a), (out_b, end_b)) = (a.join().unwrap(), b.join().unwrap());
    let (out, ended) = ([out_a, out_b], [end_a, end_b]);
    cg_a.kill_all();
    cg_b.kill_all();
    let logs = [
        common::read_log(&dir.path().join("a.ndjson")),
        common::read_log(&dir.path().join("b.ndjson")),
    ];
    Some(TwoNodes {
        out,
        logs,
        dir,
        ended,
        marked,
    })
}

/// All four ranks resumed from `step` and finished at `last`.
fn every_rank_resumed(r: &TwoNodes, step: u64, last: u64) {
    let stdout: String = r
        .out
        .iter()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .collect();
    for rank in 0..4 {
        assert!(
            stdout.contains(&format!("rank {rank} resumed from step {step}")),
            "rank {rank} did not resume from step {step}\n{}",
            r.why()
        );
        assert!(
            stdout.contains(&format!("rank {rank} finished at step {last}")),
            "rank {rank} did not finish\n{}",
            r.why()
        );
    }
}

#[test]
fn serial_a_stop_on_one_node_checkpoints_every_rank_on_both() {
    let _serial = common::machine::beside_with(&[
        common::machine::Need::Multinode,
        common::machine::Need::Torch,
    ]);
    let Some(r) = two_nodes(29687, &[], "2000") else {
        return;
    };
    let why = r.why();
    assert_eq!(r.out[0].status.code(), Some(75), "{why}");
    assert_eq!(r.out[1].status.code(), Some(75), "{why}");
    let step = done_step(&r.logs[0]).unwrap_or_else(|| panic!("node a: no checkpoint_done\n{why}"));
    assert_eq!(done_step(&r.logs[1]), Some(step), "{why}");
    for rank in 0..4 {
        assert!(
            r.dir
                .path()
                .join(format!("ckpt-r{rank}-{step}.json"))
                .exists(),
            "rank {rank} did not save step {step}: {:?}\n{why}",
            fs::read_dir(r.dir.path())
                .unwrap()
                .filter_map(Result::ok)
                .map(|e| e.file_name())
                .collect::<Vec<_>>()
        );
    }
    // The healthy node says which node ran short, its fastest-growing
    // rank (the one that leaks), and why.
    let out_a = String::from_utf8_lossy(&r.out[0].stdout);
    let leaker = out_a
        .lines()
        .find_map(|l| l.strip_prefix("rank ")?.strip_suffix(" leaks"))
        .unwrap_or_else(|| panic!("node a's leaking rank did not say so\n{why}"));
    let reasons = stop_reasons(&r.logs[1]);
    assert!(
        reasons.iter().any(|r| r.starts_with("node ")
            && r.contains(&format!("(rank {leaker}): "))
            && r.contains("critical")),
        "{reasons:?}\n{why}"
    );
    assert!(
        stop_reasons(&r.logs[0])
            .iter()
            .all(|r| !r.starts_with("node "))
    );
    merged_report_names_the_cause(&r, step);
}

/// The pid of `node`'s oomguard, found as [`rank_pid`] finds a rank.
fn oomguard_pid(node: &str) -> Option<u32> {
    for e in fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let comm = fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        let env = fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        let node_var = format!("TEST_NODE={node}");
        if comm.trim() == "oomguard" && env.split(|&b| b == 0).any(|v| v == node_var.as_bytes()) {
            return Some(pid);
        }
    }
    None
}

/// A preemption reaches one node's oomguard only (SLURM signals a step's
/// top task): every rank of both nodes saves the same step, the step each
/// rank last completed, and both oomguards exit 75.
#[test]
fn serial_a_sigterm_to_one_nodes_oomguard_saves_every_rank_of_both_nodes() {
    let _serial = common::machine::beside_with(&[
        common::machine::Need::Multinode,
        common::machine::Need::Torch,
    ]);
    let a = NodeA {
        leak: "99",
        limit: 4 << 30,
        env: &[],
        shared: &[],
        env_b: &[],
        b_after_rendezvous: false,
    };
    let Some(r) = two_nodes_during(29697, &[], &[], &a, "100000", |dir| {
        every_rank_said_hello(dir);
        std::thread::sleep(Duration::from_secs(3));
        common::send(oomguard_pid("b").expect("node b's oomguard"), "TERM");
        Some(Instant::now())
    }) else {
        return;
    };
    let why = r.why();
    assert_eq!(r.out[0].status.code(), Some(75), "{why}");
    assert_eq!(r.out[1].status.code(), Some(75), "{why}");
    let step = done_step(&r.logs[1]).unwrap_or_else(|| panic!("node b: no checkpoint_done\n{why}"));
    assert_eq!(done_step(&r.logs[0]), Some(step), "{why}");
    let stdout: String = r
        .out
        .iter()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .collect();
    for rank in 0..4 {
        let last = stdout
            .lines()
            .filter_map(|l| {
                l.strip_prefix(&format!("rank {rank} completed step "))?
                    .parse::<u64>()
                    .ok()
            })
            .max();
        assert_eq!(
            last,
            Some(step),
            "rank {rank} went past the saved step\n{why}"
        );
        let saved = r.dir.path().join(format!("ckpt-r{rank}-{step}.json"));
        assert!(
            saved.exists(),
            "rank {rank} did not save step {step}\n{why}"
        );
    }
    assert_eq!(
        common::schema::run_end(&r.logs[1]).outcome,
        "stopped_by_signal",
        "{why}"
    );
    let took = r.ended[0].max(r.ended[1]) - r.marked.unwrap();
    eprintln!("both nodes ended {took:?} after the SIGTERM");
    assert!(took <= Duration::from_secs(30), "{took:?}\n{why}");
}

/// `oomguard report` of both logs: one report, both nodes on one clock,
/// node a as the one that ran short, the step both saved; and its HTML in
/// headless Chromium without a console error.
fn merged_report_names_the_cause(r: &TwoNodes, step: u64) {
    let logs = [r.dir.path().join("a.ndjson"), r.dir.path().join("b.ndjson")];
    let out = common::oomguard()
        .arg("report")
        .args(&logs)
        .args(["--format", "text"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    eprintln!("{text}");
    assert!(out.status.success(), "{text}");
    assert!(text.contains("oomguard job report: 2 nodes"), "{text}");
    assert!(text.contains("node a (ranks "), "{text}");
    assert!(text.contains("ran short first"), "{text}");
    assert!(
        text.contains(&format!("step {step} saved on 2 of 2 nodes")),
        "{text}"
    );
    // A directory of logs is the same job.
    let html = r.dir.path().join("job.html");
    let out = common::oomguard()
        .arg("report")
        .arg(r.dir.path())
        .arg("-o")
        .arg(&html)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    if let Some(keep) = std::env::var_os("OOMGUARD_MULTINODE_KEEP") {
        let _ = fs::copy(&html, Path::new(&keep).join("job.html"));
    }
    let Some(chrome) = screenshot::chromium() else {
        assert!(!common::in_ci(), "chromium not installed");
        return;
    };
    let (dom, console_errors) = screenshot::dump_dom(&chrome, &html);
    assert_eq!(dom.matches("<polyline").count(), 2, "one lane per node");
    assert!(dom.contains("mark-Cause"), "no cause marker");
    assert!(dom.contains("ran short first"), "{dom}");
    assert!(!console_errors, "console errors");
}

/// `--on-critical pause` on a node of a job that spans nodes: never a
/// pause (it would stall the other node in its next all-reduce until the
/// collective's timeout): a stop with a checkpoint, on both nodes.
#[test]
fn serial_a_pause_on_one_node_of_a_multinode_job_becomes_a_stop() {
    let _serial = common::machine::beside_with(&[
        common::machine::Need::Multinode,
        common::machine::Need::Torch,
    ]);
    let Some(r) = two_nodes(29688, &["--on-critical", "pause"], "2000") else {
        return;
    };
    let why = r.why();
    assert_eq!(r.out[0].status.code(), Some(75), "{why}");
    assert_eq!(r.out[1].status.code(), Some(75), "{why}");
    let err = String::from_utf8_lossy(&r.out[0].stderr);
    assert!(
        err.contains("pausing this node's would stall them all"),
        "{why}"
    );
    let paused_by_rule = r.logs[0].iter().any(|l| {
        matches!(&l.event, Event::Action(a) if a.action == "pause" && !a.reason.starts_with("throttle"))
    });
    assert!(!paused_by_rule, "{why}");
    let step = done_step(&r.logs[0]).unwrap_or_else(|| panic!("no checkpoint_done\n{why}"));
    assert_eq!(done_step(&r.logs[1]), Some(step), "{why}");
}

/// `--on-critical restart` on the node that runs short: every rank on both
/// nodes saves the same step, both oomguards restart the job (the other
/// node because the request said the job restarts: torchrun's rendezvous
/// needs every node), and all four ranks resume from that step and finish.
#[test]
fn serial_a_restart_on_one_node_restarts_every_node_from_the_same_step() {
    let _serial = common::machine::beside_with(&[
        common::machine::Need::Multinode,
        common::machine::Need::Torch,
    ]);
    let Some(r) = two_nodes(
        29689,
        &["--on-critical", "restart", "--restart-delay", "1s"],
        "300",
    ) else {
        return;
    };
    let why = r.why();
    assert_eq!(r.out[0].status.code(), Some(0), "{why}");
    assert_eq!(r.out[1].status.code(), Some(0), "{why}");
    let step = done_step(&r.logs[0]).unwrap_or_else(|| panic!("node a: no checkpoint_done\n{why}"));
    assert_eq!(done_step(&r.logs[1]), Some(step), "{why}");
    for (node, log) in r.logs.iter().enumerate() {
        // Node a asked for a 1 s delay, but a job across nodes waits for
        // every node's old launcher (and the rendezvous store one of them
        // hosts) to be gone: at least 5 s on both.
        let delay = log.iter().find_map(|l| match &l.event {
            Event::Restart(v) => v["delay_seconds"].as_f64(),
            _ => None,
        });
        assert!(
            delay.is_some_and(|d| d >= 5.0),
            "node {node}: restart delay {delay:?}\n{why}"
        );
    }
    // Node b restarted because node a's request said so, naming it.
    let err_b = String::from_utf8_lossy(&r.out[1].stderr);
    assert!(err_b.contains("restart the job with it"), "{why}");
    every_rank_resumed(&r, step, 300);
}

/// Waits until both ranks of both nodes said hello (their companions'
/// `companion` events in the nodes' logs): training runs from then on.
fn every_rank_said_hello(dir: &Path) {
    let hellos = |name: &str| {
        fs::read_to_string(dir.join(format!("{name}.ndjson")))
            .map_or(0, |t| t.matches("\"event\":\"companion\"").count())
    };
    assert!(
        common::wait_for(Duration::from_secs(180), || hellos("a") >= 2
            && hellos("b") >= 2),
        "the ranks never said hello"
    );
}

/// The pid of `node`'s rank with local rank `local` (found by its
/// environment), once it runs.
fn rank_pid(node: &str, local: u32) -> Option<u32> {
    rank(node, local).map(|(pid, _)| pid)
}

/// The value of `var` in the environment of `node`'s rank `local`.
fn rank_env(node: &str, local: u32, var: &str) -> Option<String> {
    let (_, env) = rank(node, local)?;
    let prefix = format!("{var}=");
    env.split(|&b| b == 0).find_map(|v| {
        let v = std::str::from_utf8(v).ok()?;
        v.strip_prefix(&prefix).map(str::to_string)
    })
}

/// `node`'s rank with local rank `local`: its pid and environment.
fn rank(node: &str, local: u32) -> Option<(u32, Vec<u8>)> {
    for e in fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(env) = fs::read(format!("/proc/{pid}/environ")) else {
            continue;
        };
        let vars: Vec<&[u8]> = env.split(|&b| b == 0).collect();
        let has = |v: &str| vars.contains(&v.as_bytes());
        if has(&format!("TEST_NODE={node}")) && has(&format!("LOCAL_RANK={local}")) {
            return Some((pid, env));
        }
    }
    None
}

/// A rank stopped by a signal (not by oomguard) on node A: every rank of
/// every node would wait for it in its next collective until the
/// collective's timeout. Node A's oomguard tells node B through the job's
/// rendezvous store, both end within `--grace` + 10 s of the stop, exit 75,
/// and node B names node A's rank and why.
#[test]
fn serial_a_rank_stopped_on_one_node_ends_every_node_within_the_grace() {
    let _serial = common::serial();
    let grace = ["--grace", "10s"];
    let a = NodeA {
        leak: "99",
        limit: 4 << 30,
        env: &[],
        shared: &[],
        env_b: &[],
        b_after_rendezvous: false,
    };
    let Some(r) = two_nodes_during(29690, &grace, &grace, &a, "100000", |dir| {
        every_rank_said_hello(dir);
        std::thread::sleep(Duration::from_secs(2));
        let pid = rank_pid("a", 1).expect("node a's local rank 1");
        common::send(pid, "STOP");
        Some(Instant::now())
    }) else {
        return;
    };
    let why = r.why();
    assert_eq!(r.out[0].status.code(), Some(75), "{why}");
    assert_eq!(r.out[1].status.code(), Some(75), "{why}");
    let stopped_at = r.marked.unwrap();
    for (node, ended) in r.ended.iter().enumerate() {
        let took = *ended - stopped_at;
        eprintln!("node {node} ended {took:?} after the SIGSTOP");
        assert!(
            took <= Duration::from_secs(20),
            "node {node} ended {took:?} after the SIGSTOP\n{why}"
        );
    }
    let (a, b) = (stop_reasons(&r.logs[0]), stop_reasons(&r.logs[1]));
    assert!(
        a.iter().any(|x| x.starts_with("rank-stopped: rank ")),
        "{a:?}\n{why}"
    );
    assert!(
        b.iter()
            .any(|x| x.starts_with("node ") && x.contains("rank-stopped: rank ")),
        "{b:?}\n{why}"
    );
    let published = r.logs[0]
        .iter()
        .any(|l| matches!(&l.event, Event::FaultPublished(_)));
    assert!(published, "{why}");
}

/// The kernel OOM-kills a rank on node A (`--policy none`, inside node A's
/// memory cgroup): node B's ranks fail in their next collective, and node
/// B's oomguard names node A's rank and the kill as the cause, not a crash
/// of its own, and exits 75.
#[test]
fn serial_a_kernel_oom_kill_on_one_node_is_named_on_the_other() {
    let _serial = common::serial();
    let a = NodeA {
        leak: "1",
        limit: 1536 << 20,
        env: &[("MAX_MB", "6000"), ("LEAK_MB", "4")],
        shared: &[],
        env_b: &[],
        b_after_rendezvous: false,
    };
    let Some(r) = two_nodes_during(29691, &["--policy", "none"], &[], &a, "100000", |_| None)
    else {
        return;
    };
    let why = r.why();
    let killed = r.logs[0]
        .iter()
        .any(|l| matches!(&l.event, Event::OomKill(_)));
    assert!(killed, "no kernel OOM kill on node a\n{why}");
    assert_eq!(r.out[1].status.code(), Some(75), "{why}");
    let b = stop_reasons(&r.logs[1]);
    // Named, wherever the job's store lives: node a's oomguard puts the
    // kill in the store the moment the rank is gone, before torchrun ends
    // node a's other rank (and, on node 0, the store).
    assert!(
        b.iter()
            .any(|x| x.starts_with("node ") && x.contains("oom-kill: rank ")),
        "{b:?}\n{why}"
    );
}

/// The kernel OOM-kills a rank on node A, which restarts on a kernel kill
/// (`--restart-on oom-kill`); a `checkpoint` rule had every rank save the
/// same step before. Node B restarts with node A (its
/// fault says the job restarts), both apply the same degradation step,
/// node B's included though it never ran short, and all four ranks resume
/// from that step and finish.
#[test]
fn serial_a_kernel_oom_kill_on_one_node_restarts_every_node_from_the_last_save() {
    let _serial = common::serial();
    let a = NodeA {
        leak: "1",
        limit: 1536 << 20,
        env: &[("MAX_MB", "6000"), ("LEAK_MB", "4")],
        shared: &[],
        env_b: &[],
        b_after_rendezvous: false,
    };
    // Only a checkpoint rule: the kernel, not oomguard, ends node a's ranks.
    let conf = tempfile::tempdir().unwrap();
    let save = conf.path().join("save.toml");
    fs::write(
        &save,
        "include_defaults = false\n[[rule]]\nname = \"save-early\"\n\
         metric = \"headroom_percent\"\nbelow = \"30%\"\naction = \"checkpoint\"\n",
    )
    .unwrap();
    let degrade = ["--degrade", "NUM_WORKERS=half,min=1"];
    let mut a_args = vec![
        "--config",
        save.to_str().unwrap(),
        "--restart-on",
        "oom-kill",
    ];
    a_args.extend(degrade);
    let Some(r) = two_nodes_during(29692, &a_args, &degrade, &a, "400", |_| None) else {
        return;
    };
    let why = r.why();
    assert!(
        r.logs[0]
            .iter()
            .any(|l| matches!(&l.event, Event::OomKill(_))),
        "no kernel OOM kill on node a\n{why}"
    );
    assert_eq!(r.out[0].status.code(), Some(0), "{why}");
    assert_eq!(r.out[1].status.code(), Some(0), "{why}");
    let step = done_step(&r.logs[0]).unwrap_or_else(|| panic!("node a: no checkpoint_done\n{why}"));
    assert_eq!(done_step(&r.logs[1]), Some(step), "{why}");
    for (node, log) in r.logs.iter().enumerate() {
        let restart = log.iter().find_map(|l| match &l.event {
            Event::Restart(v) => Some(v.clone()),
            _ => None,
        });
        let restart = restart.unwrap_or_else(|| panic!("node {node} did not restart\n{why}"));
        assert_eq!(
            restart["degraded"]["NUM_WORKERS"],
            serde_json::json!(["4", "2"]),
            "node {node}: {restart}\n{why}"
        );
    }
    every_rank_resumed(&r, step, 400);
}

/// A rank on node A fails with a CUDA OOM (its real message, printed by a
/// CPU-only rank: there is no GPU here): node B's oomguard names node A and
/// the CUDA OOM as the cause, not a crash of its own, and exits 75. (The
/// message comes through torchrun's shared stderr, which names no pid, so
/// no rank.)
#[test]
fn serial_a_cuda_oom_on_one_node_is_named_on_the_other() {
    let _serial = common::machine::beside_with(&[
        common::machine::Need::Multinode,
        common::machine::Need::Torch,
    ]);
    let a = NodeA {
        leak: "1",
        limit: 4 << 30,
        env: &[("LEAK_MB", "0"), ("FAKE_CUDA_OOM_STEP", "40")],
        shared: &[],
        env_b: &[],
        b_after_rendezvous: false,
    };
    let Some(r) = two_nodes_during(29693, &[], &[], &a, "100000", |_| None) else {
        return;
    };
    let why = r.why();
    let seen = r.logs[0]
        .iter()
        .any(|l| matches!(&l.event, Event::CudaOom(_)));
    assert!(seen, "node a did not see the CUDA OOM\n{why}");
    assert_eq!(r.out[1].status.code(), Some(75), "{why}");
    let b = stop_reasons(&r.logs[1]);
    assert!(
        b.iter()
            .any(|x| x.starts_with("node ") && x.contains("cuda-oom: CUDA out of memory")),
        "{b:?}\n{why}"
    );
}

/// Both nodes train until every rank has said hello, and 2 s more (3 s
/// with `idle`: every rank then waits on the store); then `end` ends node
/// A's local rank 1 (or sets it up to end itself). Node B ends within
/// 10 s, exits 75, and names node A's rank and `cause` (a fault reason).
fn a_rank_of_node_a_ends(port: u16, shared: &[(&str, &str)], kill: bool, cause: &str) {
    let _serial = common::serial();
    let a = NodeA {
        leak: "99",
        limit: 4 << 30,
        env: &[],
        shared,
        env_b: &[],
        b_after_rendezvous: false,
    };
    let Some(r) = two_nodes_during(port, &[], &[], &a, "100000", |dir| {
        every_rank_said_hello(dir);
        std::thread::sleep(Duration::from_secs(3));
        if !kill {
            return None;
        }
        let pid = rank_pid("a", 1).expect("node a's local rank 1");
        common::send(pid, "KILL");
        Some(Instant::now())
    }) else {
        return;
    };
    let why = r.why();
    let own = r.logs[0]
        .iter()
        .filter_map(|l| match &l.event {
            Event::Fault(f) if f["remote"] == false => f["reason"].as_str().map(str::to_string),
            _ => None,
        })
        .collect::<Vec<_>>();
    assert_eq!(own, [cause], "node a told its own rank's end\n{why}");
    assert_eq!(r.out[1].status.code(), Some(75), "{why}");
    let b = stop_reasons(&r.logs[1]);
    let named = format!("{cause}: rank ");
    assert!(
        b.iter()
            .any(|x| x.starts_with("node ") && x.contains(&named)),
        "{b:?}\n{why}"
    );
    // From the kill (or, for an exception, node a's word of it) to node
    // b's end.
    let from = r.marked.unwrap_or(r.ended[0]);
    let took = r.ended[1].saturating_duration_since(from);
    eprintln!("node b ended {took:?} after node a's rank");
    assert!(took <= Duration::from_secs(10), "{took:?}\n{why}");
}

/// A rank SIGKILLed on node A (no exception, no exit of its own): node B
/// names it within 10 s, though it learns no more from its own ranks than
/// a closed socket.
#[test]
fn serial_a_rank_killed_on_one_node_is_named_on_the_other_within_10_s() {
    a_rank_of_node_a_ends(29694, &[], true, "rank-killed");
}

/// A rank on node A raises an exception nothing catches: node B names the
/// rank and the exception.
#[test]
fn serial_a_rank_that_raises_on_one_node_is_named_on_the_other() {
    let shared = [
        ("RAISE_AT_STEP", "60"),
        ("RAISE_NODE", "a"),
        ("RAISE_LOCAL_RANK", "1"),
    ];
    a_rank_of_node_a_ends(29695, &shared, false, "rank-crashed");
}

/// Every rank waits on the job's store (no socket to the dead rank is
/// read) when a rank of node A is killed: only oomguard's word ends node
/// B, within 10 s.
#[test]
fn serial_a_rank_killed_while_the_others_wait_on_the_store_is_named_within_10_s() {
    a_rank_of_node_a_ends(29696, &[("IDLE_AT_STEP", "10")], true, "rank-killed");
}

/// A store link rides out a hiccup: the port oomguard's links reach the
/// job's store through (a proxy; the ranks keep their own connections)
/// cuts both nodes' waiting connections and refuses new ones for 5 s.
/// Each link says so once, connects again within its 10 s, and the
/// healthy job trains to its end on both nodes: nothing is stopped as
/// "store-lost".
#[test]
fn serial_a_store_refusing_connections_for_5_s_does_not_stop_a_healthy_job() {
    let _serial = common::machine::beside_with(&[
        common::machine::Need::Multinode,
        common::machine::Need::Torch,
    ]);
    let port = 29698;
    let ports = tempfile::tempdir().unwrap();
    let real = ports.path().join("store-port");
    let proxy = StoreProxy::start(&real, true);
    let proxy_port = proxy.port.to_string();
    let shared = [
        ("STORE_PROXY_PORT", proxy_port.as_str()),
        ("STORE_PORT_FILE", real.to_str().unwrap()),
    ];
    let a = NodeA {
        leak: "99",
        limit: 4 << 30,
        env: &[],
        shared: &shared,
        env_b: &[],
        b_after_rendezvous: false,
    };
    let mut connected = false;
    let Some(r) = two_nodes_during(port, &[], &[], &a, "600", |_| {
        // Both nodes' listeners wait in the store: cut them.
        connected = common::wait_for(Duration::from_secs(120), || proxy.accepted() >= 2);
        std::thread::sleep(Duration::from_secs(1));
        proxy.outage(Duration::from_secs(5));
        Some(Instant::now())
    }) else {
        return;
    };
    let why = r.why();
    assert!(
        connected,
        "the links never connected through the proxy\n{why}"
    );
    for (node, out) in ["a", "b"].iter().zip(&r.out) {
        assert_eq!(out.status.code(), Some(0), "node {node}\n{why}");
        let err = String::from_utf8_lossy(&out.stderr);
        let said = format!("the job's store at 127.0.0.1:{}: ", proxy.port);
        assert!(
            (1..=2).contains(&err.matches(&said).count()),
            "node {node}\n{why}"
        );
        assert!(!err.contains("store-lost"), "node {node}\n{why}");
    }
    for log in &r.logs {
        assert!(stop_reasons(log).is_empty(), "{why}");
        // Said once for the outage; the store going away with the job at
        // its end (node 0's launcher exits) may be said once more, up to
        // 8 s before this node's end (3.6 s in a CI run beside other
        // tests).
        let end = log.last().map_or(0.0, |l| l.t);
        let at: Vec<f64> = (log.iter())
            .filter(|l| {
                matches!(&l.event, Event::StoreUnsteady(u)
                if u.addr.as_deref() == Some(format!("127.0.0.1:{}", proxy.port).as_str()))
            })
            .map(|l| l.t)
            .collect();
        assert_eq!(
            at.iter().filter(|&&t| t < end - 8.0).count(),
            1,
            "store_unsteady at {at:?}, the run ended at {end:.1}\n{why}"
        );
        // The outage did not shorten the window of a later break.
        let lost: Vec<f64> = (log.iter())
            .filter(|l| matches!(l.event, Event::StoreLost(_)))
            .map(|l| l.t)
            .collect();
        assert!(
            lost.is_empty(),
            "store_lost at {lost:?} (run ended at {end:.1})\n{why}"
        );
    }
    // Both links connected again after the outage.
    assert!(
        proxy.accepted() >= 4,
        "{} connections\n{why}",
        proxy.accepted()
    );
    let stdout: String = (r.out.iter())
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .collect();
    for rank in 0..4 {
        assert!(
            stdout.contains(&format!("rank {rank} finished at step 600")),
            "rank {rank}\n{why}"
        );
    }
}

/// A fault put into the job's store before a node's listener first
/// connected is heard when it does. Each node's link reaches the store
/// through a proxy of its own that refuses connections at first. Node A
/// serves the stores (the rendezvous's and the job's: the other node's
/// launcher ends with its rank, and its stores with it) and keeps refusing
/// until node B's rank has been killed and node B has put the fault; every
/// rank waits on the store, so nothing but the store tells node A. Node A
/// then names it. (Read from the count at connection instead, it is never
/// heard: the ranks give up waiting and node A exits 1.)
#[test]
fn serial_a_fault_put_before_a_nodes_link_connected_is_named_there() {
    let _serial = common::serial();
    let ports = tempfile::tempdir().unwrap();
    let real = ports.path().join("store-port");
    let proxies = [
        StoreProxy::start(&real, false),
        StoreProxy::start(&real, false),
    ];
    let proxy_ports = proxies.each_ref().map(|p| p.port.to_string());
    // Unheard, the ranks give up waiting after a minute (and exit 1).
    let shared = [
        ("IDLE_AT_STEP", "10"),
        ("IDLE_SECONDS", "60"),
        ("STORE_PORT_FILE", real.to_str().unwrap()),
    ];
    let env_a = [("STORE_PROXY_PORT", proxy_ports[0].as_str())];
    let env_b = [("STORE_PROXY_PORT", proxy_ports[1].as_str())];
    let a = NodeA {
        leak: "99",
        limit: 4 << 30,
        env: &env_a,
        shared: &shared,
        env_b: &env_b,
        b_after_rendezvous: true,
    };
    let mut seen = None;
    let Some(r) = two_nodes_during(29699, &[], &[], &a, "100000", |dir| {
        every_rank_said_hello(dir);
        // Every rank is past step 10 and waits on the store.
        std::thread::sleep(Duration::from_secs(1));
        // Node 0's launcher serves the job's store: the node of rank 0.
        let serving = ["a", "b"]
            .into_iter()
            .position(|n| rank_env(n, 0, "RANK").as_deref() == Some("0"))
            .expect("rank 0");
        let other = 1 - serving;
        proxies[other].open();
        let names = ["a", "b"];
        let pid = rank_pid(names[other], 1).expect("the other node's local rank 1");
        common::send(pid, "KILL");
        let told = || {
            fs::read_to_string(dir.join(format!("{}.ndjson", names[other])))
                .is_ok_and(|t| t.contains("\"event\":\"fault_published\""))
        };
        let published = common::wait_for(Duration::from_secs(10), told);
        seen = Some((serving, published, proxies[serving].accepted()));
        proxies[serving].open();
        Some(Instant::now())
    }) else {
        return;
    };
    let why = r.why();
    let (serving, published, before) = seen.unwrap();
    assert_eq!(serving, 0, "rank 0 is not node a's (pids wrapped?)\n{why}");
    assert!(published, "the fault was never put in the store\n{why}");
    assert_eq!(before, 0, "the serving node's link had connected\n{why}");
    let log = &r.logs[serving];
    let unsteady = log
        .iter()
        .any(|l| matches!(l.event, Event::StoreUnsteady(_)));
    assert!(unsteady, "the serving node's link was never refused\n{why}");
    assert_eq!(r.out[serving].status.code(), Some(75), "{why}");
    let reasons = stop_reasons(log);
    assert!(
        reasons
            .iter()
            .any(|x| x.starts_with("node ") && x.contains("rank-killed: rank ")),
        "{reasons:?}\n{why}"
    );
    let took = r.ended[serving].saturating_duration_since(r.marked.unwrap_or(r.ended[serving]));
    eprintln!("the serving node ended {took:?} after its link could connect");
    assert!(took <= Duration::from_secs(10), "{took:?}\n{why}");
}
