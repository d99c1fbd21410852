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

struct Node {
    child: Child,
    log: PathBuf,
}

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

#[test]
fn serial_a_stop_on_one_node_checkpoints_every_rank_on_both() {
    let _serial = common::serial();
    let Some(venv) = common::torch_venv() else {
        return;
    };
    let (Some(cg_a), Some(cg_b)) = (
        MemCgroup::or_skip("node-a", 4 << 30),
        MemCgroup::or_skip("node-b", 4 << 30),
    ) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let torchrun = venv.join("bin/torchrun");
    let plain =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/jobs/companion/plain.py");
    let bin = PathBuf::from(env!("CARGO_BIN_EXE_oomguard"));
    let start = |cg: &MemCgroup, name: &str, budget: Option<&str>, leak: &str| -> Node {
        let log = dir.path().join(format!("{name}.ndjson"));
        let mut args: Vec<String> = ["run", "--no-tui", "--log"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        args.push(log.to_string_lossy().into_owned());
        if let Some(b) = budget {
            args.extend(["--budget".to_string(), b.to_string()]);
        }
        args.push("--".into());
        args.push(torchrun.to_string_lossy().into_owned());
        for a in [
            "--nnodes",
            "2",
            "--nproc-per-node",
            "2",
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            "localhost:29687",
            "--rdzv-id",
            "multinode-test",
        ] {
            args.push(a.into());
        }
        args.push(plain.to_string_lossy().into_owned());
        args.push("2000".into());
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        let child = cg
            .command(&bin, &argv)
            .env("DIST", "1")
            .env("LEAK_LOCAL_RANK", leak)
            .env("CKPT_DIR", dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        Node { child, log }
    };
    let a = start(&cg_a, "a", Some("1600M"), "1");
    let b = start(&cg_b, "b", None, "99");
    let out_a = a.child.wait_with_output().unwrap();
    let out_b = b.child.wait_with_output().unwrap();
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
    let why = format!("node a:\n{}\n\nnode b:\n{}", text(&out_a), text(&out_b));
    assert_eq!(out_a.status.code(), Some(75), "{why}");
    assert_eq!(out_b.status.code(), Some(75), "{why}");
    let (log_a, log_b) = (common::read_log(&a.log), common::read_log(&b.log));
    let step = done_step(&log_a).unwrap_or_else(|| panic!("node a: no checkpoint_done\n{why}"));
    assert_eq!(done_step(&log_b), Some(step), "{why}");
    for rank in 0..4 {
        assert!(
            dir.path()
                .join(format!("ckpt-r{rank}-{step}.json"))
                .exists(),
            "rank {rank} did not save step {step}: {:?}\n{why}",
            fs::read_dir(dir.path())
                .unwrap()
                .filter_map(Result::ok)
                .map(|e| e.file_name())
                .collect::<Vec<_>>()
        );
    }
    // The healthy node says which node ran short and why.
    let reasons = stop_reasons(&log_b);
    assert!(
        reasons
            .iter()
            .any(|r| r.starts_with("node ") && r.contains("critical")),
        "{reasons:?}\n{why}"
    );
    assert!(stop_reasons(&log_a).iter().all(|r| !r.starts_with("node ")));
    cg_a.kill_all();
    cg_b.kill_all();
}
