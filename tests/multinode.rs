//! One job on two "nodes" of this machine: two oomguards, each running
//! `torchrun --nnodes 2 --nproc-per-node 2` (gloo on CPU, a c10d
//! rendezvous on localhost), each in its own memory cgroup, one node
//! leaking. The leaking node's stop reaches every rank through the job's
//! own process group: all four ranks save the same step, both oomguards
//! exit 75, and the healthy node's log names the node that ran short.

#![allow(clippy::unwrap_used)]

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};

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
    let venv = common::torch_venv()?;
    let (cg_a, cg_b) = (
        MemCgroup::or_skip("node-a", 4 << 30)?,
        MemCgroup::or_skip("node-b", 4 << 30)?,
    );
    let dir = tempfile::tempdir().unwrap();
    let torchrun = venv.join("bin/torchrun");
    let plain =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/jobs/companion/plain.py");
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_oomguard"));
    let endpoint = format!("localhost:{port}");
    let start = |cg: &MemCgroup, name: &str, extra: &[&str], leak: &str| -> Child {
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
            .env("DIST", "1")
            .env("LEAK_LOCAL_RANK", leak)
            .env("CKPT_DIR", dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let mut a_args = vec!["--budget", "1600M"];
    a_args.extend(extra_a);
    let a = start(&cg_a, "a", &a_args, "1");
    let b = start(&cg_b, "b", &[], "99");
    let out = [a.wait_with_output().unwrap(), b.wait_with_output().unwrap()];
    cg_a.kill_all();
    cg_b.kill_all();
    let logs = [
        common::read_log(&dir.path().join("a.ndjson")),
        common::read_log(&dir.path().join("b.ndjson")),
    ];
    Some(TwoNodes { out, logs, dir })
}

#[test]
fn serial_a_stop_on_one_node_checkpoints_every_rank_on_both() {
    let _serial = common::serial();
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
    // The healthy node says which node ran short and why.
    let reasons = stop_reasons(&r.logs[1]);
    assert!(
        reasons
            .iter()
            .any(|r| r.starts_with("node ") && r.contains("critical")),
        "{reasons:?}\n{why}"
    );
    assert!(
        stop_reasons(&r.logs[0])
            .iter()
            .all(|r| !r.starts_with("node "))
    );
}

/// `--on-critical pause` on a node of a job that spans nodes: never a
/// pause (it would stall the other node in its next all-reduce until the
/// collective's timeout): a stop with a checkpoint, on both nodes.
#[test]
fn serial_a_pause_on_one_node_of_a_multinode_job_becomes_a_stop() {
    let _serial = common::serial();
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
    let _serial = common::serial();
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
    let stdout: String = r
        .out
        .iter()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .collect();
    for rank in 0..4 {
        assert!(
            stdout.contains(&format!("rank {rank} resumed from step {step}")),
            "rank {rank} did not resume from step {step}\n{why}"
        );
        assert!(
            stdout.contains(&format!("rank {rank} finished at step 300")),
            "rank {rank} did not finish\n{why}"
        );
    }
}
