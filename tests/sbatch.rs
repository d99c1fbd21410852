//! The `sbatch` recipe of docs/multinode.md, run as written through
//! stand-ins for `srun` and `scontrol` that set SLURM's environment: two
//! "nodes" on this machine, each task in its own memory cgroup, each an
//! oomguard over `torchrun --nnodes 2 --nproc-per-node 2` (gloo, CPU), one
//! rank leaking until its node's cgroup ceiling is near. Every rank saves the
//! same step, both oomguards exit 75, each node's log lands in its own file
//! (`--log logs/%j/run-%N.ndjson`), and the script requeues the job.
//!
//! The same recipe also runs under a real SLURM (Debian's `slurm-wlm`): one
//! `slurmctld` and two `slurmd -N` on this machine, each `slurmd` (and so
//! each node's job step) in its own memory cgroup.

#![allow(clippy::unwrap_used)]

use crate::common;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::MemCgroup;
use common::schema::Event;

/// The recipe: the first `bash` block after its heading.
fn recipe() -> String {
    let doc = fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/multinode.md"))
        .unwrap();
    let from = doc
        .find("## The `sbatch` recipe")
        .expect("the recipe's heading");
    let block = &doc[from..];
    let start = block.find("```bash\n").expect("a bash block") + "```bash\n".len();
    let end = start + block[start..].find("```").unwrap();
    block[start..end].to_string()
}

const SRUN: &str = r#"#!/bin/sh
# srun's stand-in: one task per node of FAKE_SLURM_CGROUPS, each started
# inside its own memory cgroup with SLURM's per-task variables.
node=0
pids=""
for cg in $FAKE_SLURM_CGROUPS; do
  SLURM_NODEID=$node SLURM_PROCID=$node SLURM_LOCALID=0 SLURM_STEP_ID=0 \
    sh -c 'echo $$ > "$0/cgroup.procs" && exec "$@"' "$cg" "$@" > "$FAKE_SLURM_OUT/task-$node.out" 2>&1 &
  pids="$pids $!"
  node=$((node + 1))
done
rc=0
for p in $pids; do
  wait "$p" || rc=$?
done
exit $rc
"#;

const SCONTROL: &str = r#"#!/bin/sh
case "$1 $2" in
  "show hostnames") echo localhost ;;
  "requeue "*) echo "$2" >> "$FAKE_SLURM_OUT/requeued" ;;
  *) echo "scontrol stand-in: $*" >&2; exit 1 ;;
esac
"#;

fn executable(path: &Path, text: &str) {
    fs::write(path, text).unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(0o755)).unwrap();
}

/// `dir/bin` holding `oomguard` (and, with `srun`, the stand-ins for
/// `srun` and `scontrol`): the `PATH` a job script runs with, before the
/// torch environment's `bin` and the test's own.
fn search_path(dir: &Path, venv: &Path, srun: Option<&str>) -> String {
    let bin = dir.join("bin");
    fs::create_dir(&bin).unwrap();
    if let Some(srun) = srun {
        executable(&bin.join("srun"), srun);
        executable(&bin.join("scontrol"), SCONTROL);
    }
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_oomguard"), bin.join("oomguard")).unwrap();
    format!(
        "{}:{}:{}",
        bin.display(),
        venv.join("bin").display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

/// The torch environment, when a SLURM of the test's own can run here
/// (`slurm-wlm`, root; `freezer`: the hierarchy `proctrack/cgroup` needs on
/// cgroup v1); `None` (said) otherwise.
fn real_slurm(freezer: bool) -> Option<std::path::PathBuf> {
    let tools = ["slurmctld", "slurmd", "sbatch", "munge"]
        .iter()
        .all(|t| which(t).is_file());
    if !common::require(tools, "slurm-wlm not installed (apt-get install slurm-wlm)")
        || !common::require(is_root(), "a SLURM of its own needs root")
    {
        return None;
    }
    if freezer
        && !common::require(
            Path::new("/sys/fs/cgroup/freezer").is_dir(),
            "proctrack/cgroup on cgroup v1 needs the freezer hierarchy",
        )
    {
        return None;
    }
    common::torch_venv()
}

#[test]
fn serial_the_sbatch_recipe_stops_every_node_with_one_checkpoint_and_requeues() {
    let _serial =
        common::machine::beside_with(&[common::machine::Need::Slurm, common::machine::Need::Torch]);
    let Some(venv) = common::torch_venv() else {
        return;
    };
    let (Some(cg0), Some(cg1)) = (
        MemCgroup::or_skip("sbatch-0", 1600 << 20),
        MemCgroup::or_skip("sbatch-1", 1600 << 20),
    ) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let path = search_path(dir.path(), &venv, Some(SRUN));
    let plain =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/jobs/companion/plain.py");
    let script = recipe().replace("train.py", &format!("{} 4000", plain.display()));
    let script_path = dir.path().join("train.sbatch");
    executable(&script_path, &script);
    let cgroups = format!("{} {}", cg0.dir.display(), cg1.dir.display());
    common::deadline::arm();
    let out = std::process::Command::new("bash")
        .arg(&script_path)
        .current_dir(dir.path())
        .env("PATH", path)
        .env("SLURM_JOB_ID", "4242")
        .env("SLURM_NNODES", "2")
        .env("SLURM_JOB_NODELIST", "localhost")
        .env("FAKE_SLURM_CGROUPS", cgroups)
        .env("FAKE_SLURM_OUT", dir.path())
        .env("DIST", "1")
        // One rank of the job leaks (the node the rendezvous gives it runs
        // short); the environment is every task's, as under srun.
        .env("LEAK_RANK", "1")
        .env("CKPT_DIR", dir.path())
        .env_remove("OOMGUARD_CONTROL")
        .output()
        .unwrap();
    cg0.kill_all();
    cg1.kill_all();
    let task =
        |n: u32| fs::read_to_string(dir.path().join(format!("task-{n}.out"))).unwrap_or_default();
    let why = format!(
        "script exit {:?}\nstderr:\n{}\ntask 0:\n{}\ntask 1:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr),
        task(0),
        task(1)
    );
    assert_eq!(out.status.code(), Some(75), "{why}");
    assert_eq!(
        fs::read_to_string(dir.path().join("requeued"))
            .unwrap_or_default()
            .trim(),
        "4242",
        "the script did not requeue\n{why}"
    );
    // One log per node, named by the pattern.
    let logs: Vec<_> = (0..2)
        .map(|n| common::read_log(&dir.path().join(format!("logs/4242/run-{n}.ndjson"))))
        .collect();
    let done = |log: &[common::schema::Line]| {
        log.iter().rev().find_map(|l| match &l.event {
            Event::CheckpointDone(v) => v["step"].as_u64(),
            _ => None,
        })
    };
    let step = done(&logs[0]).unwrap_or_else(|| panic!("node 0: no checkpoint_done\n{why}"));
    assert_eq!(done(&logs[1]), Some(step), "{why}");
    for rank in 0..4 {
        assert!(
            dir.path()
                .join(format!("ckpt-r{rank}-{step}.json"))
                .exists(),
            "rank {rank} did not save step {step}\n{why}"
        );
    }
    // The healthy node's log names the node that ran short.
    let named = logs.iter().flatten().any(|l| {
        matches!(&l.event, Event::Action(a) if a.action == "stop" && a.reason.starts_with("node "))
    });
    assert!(named, "no node names the other as the cause\n{why}");
    // Each log says which run of which job it is.
    for (n, log) in logs.iter().enumerate() {
        let ids = log.iter().find_map(|l| match &l.event {
            Event::RunStart(s) => Some(s.ids.clone()),
            _ => None,
        });
        let ids = ids.unwrap_or_else(|| panic!("node {n}: no run_start\n{why}"));
        assert_eq!(
            ids.get("job_id").map(String::as_str),
            Some("4242"),
            "{ids:?}"
        );
        assert_eq!(ids.get("rank"), Some(&n.to_string()), "{ids:?}");
        assert_eq!(
            ids.get("slurm_step").map(String::as_str),
            Some("0"),
            "{ids:?}"
        );
    }
}

/// The recipe of "One task per rank" in docs/multinode.md.
fn per_rank_recipe() -> String {
    let doc = fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/multinode.md"))
        .unwrap();
    let from = doc
        .find("## One task per rank")
        .expect("the recipe's heading");
    let block = &doc[from..];
    let start = block.find("```bash\n").expect("a bash block") + "```bash\n".len();
    let end = start + block[start..].find("```").unwrap();
    block[start..end].to_string()
}

/// srun's stand-in for `--ntasks-per-node=2`: two tasks per node of
/// FAKE_SLURM_CGROUPS, each with SLURM's per-task variables, the tasks of a
/// node in that node's memory cgroup.
const SRUN_PER_RANK: &str = r#"#!/bin/sh
nodes=$(echo $FAKE_SLURM_CGROUPS | wc -w)
node=0
pids=""
for cg in $FAKE_SLURM_CGROUPS; do
  for local in 0 1; do
    task=$((node * 2 + local))
    SLURM_NODEID=$node SLURM_PROCID=$task SLURM_LOCALID=$local SLURM_STEP_ID=0 \
    SLURM_NNODES=$nodes SLURM_NTASKS=$((nodes * 2)) SLURM_STEP_TASKS_PER_NODE="2(x$nodes)" \
    SLURM_NTASKS_PER_NODE=2 SLURM_NODELIST=localhost \
      sh -c 'echo $$ > "$0/cgroup.procs" && exec "$@"' "$cg" "$@" > "$FAKE_SLURM_OUT/task-$task.out" 2>&1 &
    pids="$pids $!"
  done
  node=$((node + 1))
done
rc=0
for p in $pids; do
  wait "$p"
  c=$?
  [ "$c" -gt "$rc" ] && rc=$c
done
exit $rc
"#;

/// docs/multinode.md's one-task-per-rank recipe through the stand-in
/// `srun`: two nodes of two tasks, one oomguard per rank, a plain DDP loop
/// taking its rank from `SLURM_PROCID`, rank 1 leaking until its node's
/// cgroup nears its ceiling. Every rank saves the same step; every task's
/// oomguard ends as a stop (exit 75), the ones that did not ask included,
/// naming rank 1; each task has its own log and resume record; the script
/// requeues (oomguard's own stop); the next run resumes every rank from
/// that step.
#[test]
fn serial_one_task_per_rank_every_task_stops_with_one_save_and_the_requeue_resumes() {
    let _serial =
        common::machine::beside_with(&[common::machine::Need::Slurm, common::machine::Need::Torch]);
    let Some(venv) = common::torch_venv() else {
        return;
    };
    let (Some(cg0), Some(cg1)) = (
        MemCgroup::or_skip("per-rank-0", 1400 << 20),
        MemCgroup::or_skip("per-rank-1", 1400 << 20),
    ) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let path = search_path(dir.path(), &venv, Some(SRUN_PER_RANK));
    let plain =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/jobs/companion/plain.py");
    let script_path = dir.path().join("train.sbatch");
    let script = per_rank_recipe()
        .replace(
            "python train.py",
            &format!("python {} 300", plain.display()),
        )
        .replace("MASTER_PORT=29500", "MASTER_PORT=29531");
    executable(&script_path, &script);
    let cgroups = format!("{} {}", cg0.dir.display(), cg1.dir.display());
    common::deadline::arm();
    let run = |leak: &str| {
        std::process::Command::new("bash")
            .arg(&script_path)
            .current_dir(dir.path())
            .env("PATH", &path)
            .env("SLURM_JOB_ID", "4343")
            .env("SLURM_JOB_NODELIST", "localhost")
            .env("FAKE_SLURM_CGROUPS", &cgroups)
            .env("FAKE_SLURM_OUT", dir.path())
            .env("DIST", "1")
            .env("LEAK_RANK", "1")
            .env("LEAK_MB", leak)
            .env("CKPT_DIR", dir.path())
            .env_remove("OOMGUARD_CONTROL")
            .output()
            .unwrap()
    };
    let out = run("8");
    let task =
        |n: u32| fs::read_to_string(dir.path().join(format!("task-{n}.out"))).unwrap_or_default();
    let why = |out: &std::process::Output| {
        let mut w = format!(
            "script exit {:?}\nstderr:\n{}",
            out.status.code(),
            String::from_utf8_lossy(&out.stderr)
        );
        for n in 0..4 {
            w.push_str(&format!("\ntask {n}:\n{}", task(n)));
        }
        w
    };
    let first = why(&out);
    assert_eq!(out.status.code(), Some(75), "{first}");
    assert_eq!(
        fs::read_to_string(dir.path().join("requeued"))
            .unwrap_or_default()
            .trim(),
        "4343",
        "the script did not requeue oomguard's own stop\n{first}"
    );
    // One log per task (`%r`), each a stop, the same step saved.
    let logs: Vec<_> = (0..4)
        .map(|n| common::read_log(&dir.path().join(format!("logs/4343/run-{n}.ndjson"))))
        .collect();
    let done = |log: &[common::schema::Line]| {
        log.iter().rev().find_map(|l| match &l.event {
            Event::CheckpointDone(v) => v["step"].as_u64(),
            _ => None,
        })
    };
    let step = done(&logs[1]).unwrap_or_else(|| panic!("task 1: no save\n{first}"));
    for (n, log) in logs.iter().enumerate() {
        assert_eq!(done(log), Some(step), "task {n}\n{first}");
        let end = common::schema::run_end(log);
        assert_eq!(
            (end.outcome.as_str(), end.exit_code),
            ("stopped_by_policy", 75),
            "task {n} did not end as a stop\n{first}"
        );
        // Its companion said where it is, from SLURM's variables.
        let hello = log.iter().find_map(|l| match &l.event {
            Event::Companion(v) => Some(v.clone()),
            _ => None,
        });
        let hello = hello.unwrap_or_else(|| panic!("task {n}: no companion\n{first}"));
        assert_eq!(
            (
                hello["rank"].as_u64(),
                hello["local_rank"].as_u64(),
                hello["task"].as_u64()
            ),
            (Some(n as u64), Some(n as u64 % 2), Some(n as u64)),
            "task {n}: {hello}"
        );
        assert!(
            dir.path().join(format!("ckpt-r{n}-{step}.json")).exists(),
            "rank {n} did not save step {step}\n{first}"
        );
        assert!(
            dir.path()
                .join(format!(".oomguard-resume-task{n}.json"))
                .exists(),
            "task {n} kept no resume record\n{first}"
        );
    }
    // The other node's tasks, which did not ask, name the node and rank
    // that grew. (Task 0 shares rank 1's node cgroup and decides on its
    // own: the tasks of a node do not pool their measurements yet.)
    for n in [2usize, 3] {
        let named = logs[n].iter().any(|l| {
            matches!(&l.event, Event::Action(a) if a.action == "stop" && a.reason.contains("(rank 1)"))
        });
        assert!(named, "task {n} does not name rank 1\n{first}");
    }
    // One report for the job's logs names the node and task of each
    // finding.
    let report = common::oomguard()
        .args(["report", "--format", "text"])
        .arg(dir.path().join("logs/4343"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&report.stdout);
    assert!(
        text.contains("node 0 task ") && text.contains("ran short first"),
        "{text}\n{}",
        String::from_utf8_lossy(&report.stderr)
    );
    assert!(
        text.contains("saved on 4 of 4 nodes (0 task 0 at"),
        "{text}"
    );
    // The requeued run: every rank resumes from that step and finishes.
    let out = run("0");
    let second = why(&out);
    assert_eq!(out.status.code(), Some(0), "{second}");
    for n in 0..4 {
        assert!(
            task(n).contains(&format!("rank {n} resumed from step {step}")),
            "rank {n} did not resume from step {step}\n{second}"
        );
    }
    cg0.kill_all();
    cg1.kill_all();
}

/// The per-rank recipe with an unmodified Lightning DDP script (Lightning's
/// own SLURM mode: `Trainer(devices=2, num_nodes=2)`, ranks from SLURM's
/// variables), rank 1 leaking: every rank saves the same step, every task's
/// oomguard exits 75, the script requeues, and the next run resumes every
/// rank from that step (Lightning's `fit(ckpt_path=…)`, filled in).
#[test]
fn serial_one_task_per_rank_unmodified_lightning_saves_one_step_and_resumes_it() {
    let _serial =
        common::machine::beside_with(&[common::machine::Need::Slurm, common::machine::Need::Torch]);
    let Some(venv) = common::torch_venv() else {
        return;
    };
    let (Some(cg0), Some(cg1)) = (
        MemCgroup::or_skip("per-rank-lit-0", 1600 << 20),
        MemCgroup::or_skip("per-rank-lit-1", 1600 << 20),
    ) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let path = search_path(dir.path(), &venv, Some(SRUN_PER_RANK));
    let lit = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/jobs/companion/lightning_ddp.py");
    let script_path = dir.path().join("train.sbatch");
    let script = per_rank_recipe()
        .replace("python train.py", &format!("python {} 400", lit.display()))
        .replace("MASTER_PORT=29500", "MASTER_PORT=29535");
    executable(&script_path, &script);
    let cgroups = format!("{} {}", cg0.dir.display(), cg1.dir.display());
    common::deadline::arm();
    let run = || {
        std::process::Command::new("bash")
            .arg(&script_path)
            .current_dir(dir.path())
            .env("PATH", &path)
            .env("SLURM_JOB_ID", "4646")
            .env("SLURM_JOB_NODELIST", "localhost")
            .env("FAKE_SLURM_CGROUPS", &cgroups)
            .env("FAKE_SLURM_OUT", dir.path())
            .env("NODES", "2")
            .env("DEVICES", "2")
            .env("LEAK_RANK", "1")
            .env("CKPT_DIR", dir.path())
            .env_remove("OOMGUARD_CONTROL")
            .output()
            .unwrap()
    };
    let task =
        |n: u32| fs::read_to_string(dir.path().join(format!("task-{n}.out"))).unwrap_or_default();
    let why = |out: &std::process::Output| {
        let mut w = format!(
            "script exit {:?}\nstderr:\n{}",
            out.status.code(),
            String::from_utf8_lossy(&out.stderr)
        );
        for n in 0..4 {
            w.push_str(&format!("\ntask {n}:\n{}", task(n)));
        }
        w
    };
    let out = run();
    let first = why(&out);
    assert_eq!(out.status.code(), Some(75), "{first}");
    assert!(
        dir.path().join("requeued").exists(),
        "not requeued\n{first}"
    );
    let logs: Vec<_> = (0..4)
        .map(|n| common::read_log(&dir.path().join(format!("logs/4646/run-{n}.ndjson"))))
        .collect();
    let done = |log: &[common::schema::Line]| {
        log.iter().rev().find_map(|l| match &l.event {
            Event::CheckpointDone(v) if v["ok"] == true => v["step"].as_u64(),
            _ => None,
        })
    };
    let step = done(&logs[0]).unwrap_or_else(|| panic!("task 0: no save\n{first}"));
    for (n, log) in logs.iter().enumerate() {
        assert_eq!(done(log), Some(step), "task {n}\n{first}");
        let end = common::schema::run_end(log);
        assert_eq!(
            (end.outcome.as_str(), end.exit_code),
            ("stopped_by_policy", 75),
            "task {n}\n{first}"
        );
    }
    let out = run();
    let second = why(&out);
    cg0.kill_all();
    cg1.kill_all();
    assert_eq!(out.status.code(), Some(0), "{second}");
    for n in 0..4 {
        assert!(
            task(n).contains(&format!("rank {n} resumed from step {step}")),
            "rank {n} did not resume from step {step}\n{second}"
        );
    }
}

/// Two tasks of one node under `--budget`, no SLURM memory confinement
/// (`--cgroup off`, as a user who is not root runs it): rank 1 leaks up to
/// 1000 MiB, so its tree alone never reaches the critical level, but the node's two
/// together pass it. The tasks pool their footprints: one oomguard decides
/// for the node, its stop names rank 1, both ranks save the same step,
/// and both oomguards exit 75 (the memory cgroup around them, well above
/// the budget, only guards the machine).
#[test]
fn serial_one_task_per_rank_a_node_budget_is_the_tasks_together() {
    let _serial =
        common::machine::beside_with(&[common::machine::Need::Slurm, common::machine::Need::Torch]);
    let Some(venv) = common::torch_venv() else {
        return;
    };
    let Some(cg) = MemCgroup::or_skip("node-budget", 2600 << 20) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let path = search_path(dir.path(), &venv, Some(SRUN_PER_RANK));
    let plain =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/jobs/companion/plain.py");
    let script_path = dir.path().join("train.sbatch");
    let script = per_rank_recipe()
        .replace(
            "srun oomguard run",
            "srun oomguard run --cgroup off --budget 1600M",
        )
        .replace(
            "python train.py",
            &format!("python {} 2000", plain.display()),
        )
        .replace("MASTER_PORT=29500", "MASTER_PORT=29532");
    executable(&script_path, &script);
    common::deadline::arm();
    let out = std::process::Command::new("bash")
        .arg(&script_path)
        .current_dir(dir.path())
        .env("PATH", &path)
        .env("SLURM_JOB_ID", "4444")
        .env("SLURM_JOB_NODELIST", "localhost")
        .env("FAKE_SLURM_CGROUPS", cg.dir.display().to_string())
        .env("FAKE_SLURM_OUT", dir.path())
        .env("DIST", "1")
        .env("LEAK_RANK", "1")
        // 1 MiB a step (~14 MiB/s): slow enough that no ETA stops rank 1
        // before the critical level, and up to 1000 MiB, well past what
        // the two ranks (340-450 MiB each) need to reach it together; alone
        // rank 1 stays above 8 % headroom. 600 MiB at 4 a step was too
        // close: one run peaked at 16 % headroom and finished.
        .env("LEAK_MB", "1")
        .env("MAX_MB", "1000")
        .env("CKPT_DIR", dir.path())
        .env_remove("OOMGUARD_CONTROL")
        .output()
        .unwrap();
    cg.kill_all();
    let task =
        |n: u32| fs::read_to_string(dir.path().join(format!("task-{n}.out"))).unwrap_or_default();
    let why = format!(
        "script exit {:?}\nstderr:\n{}\ntask 0:\n{}\ntask 1:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stderr),
        task(0),
        task(1)
    );
    assert_eq!(out.status.code(), Some(75), "{why}");
    let logs: Vec<_> = (0..2)
        .map(|n| common::read_log(&dir.path().join(format!("logs/4444/run-{n}.ndjson"))))
        .collect();
    let stops = stop_decisions(logs.iter().flatten());
    // One decision: the leader's, naming rank 1; the other task joins it
    // as another's request ("node 0 (rank 1): …").
    let (joined, decided): (Vec<&String>, Vec<&String>) = stops
        .iter()
        .partition(|r| r.starts_with("node 0 (rank 1): "));
    assert_eq!((decided.len(), joined.len()), (1, 1), "{stops:?}\n{why}");
    assert!(
        decided[0].contains("rank 1 (task 1) grew the most on this node"),
        "{stops:?}"
    );
    let done = |log: &[common::schema::Line]| {
        log.iter().rev().find_map(|l| match &l.event {
            Event::CheckpointDone(v) => v["step"].as_u64(),
            _ => None,
        })
    };
    let step = done(&logs[0]).unwrap_or_else(|| panic!("task 0: no save\n{why}"));
    assert_eq!(done(&logs[1]), Some(step), "{why}");
    for (n, log) in logs.iter().enumerate() {
        let end = common::schema::run_end(log);
        assert_eq!(
            (end.outcome.as_str(), end.exit_code),
            ("stopped_by_policy", 75),
            "task {n}\n{why}"
        );
    }
}

/// The pid of the rank SLURM started as task `task` (its python, not its
/// oomguard: both have the task's variables).
fn task_rank_pid(task: u32, marker: &str) -> Option<u32> {
    for e in fs::read_dir("/proc").ok()?.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let (Ok(env), Ok(cmd)) = (
            fs::read(format!("/proc/{pid}/environ")),
            fs::read(format!("/proc/{pid}/cmdline")),
        ) else {
            continue;
        };
        let vars: Vec<&[u8]> = env.split(|&b| b == 0).collect();
        let is_task = vars.contains(&format!("SLURM_PROCID={task}").as_bytes());
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        if is_task && cmd.starts_with("python") && cmd.contains(marker) {
            return Some(pid);
        }
    }
    None
}

/// One task per rank, two nodes of two: a rank SIGKILLed (rank 3 on node
/// 1, then rank 0 on node 0, whose process serves the job's store) is
/// named by every other task's oomguard, each of which ends within 10 s of
/// the kill.
#[test]
fn serial_one_task_per_rank_a_killed_rank_is_named_on_every_node_within_10_s() {
    let _serial =
        common::machine::beside_with(&[common::machine::Need::Slurm, common::machine::Need::Torch]);
    let Some(venv) = common::torch_venv() else {
        return;
    };
    let (Some(cg0), Some(cg1)) = (
        MemCgroup::or_skip("rank-kill-0", 1600 << 20),
        MemCgroup::or_skip("rank-kill-1", 1600 << 20),
    ) else {
        return;
    };
    let plain =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/jobs/companion/plain.py");
    for (victim, port) in [(3u32, "29533"), (0, "29534")] {
        let dir = tempfile::tempdir().unwrap();
        let path = search_path(dir.path(), &venv, Some(SRUN_PER_RANK));
        let script_path = dir.path().join("train.sbatch");
        let marker = format!("{} 100000 {port}", plain.display());
        let script = per_rank_recipe()
            .replace("python train.py", &format!("python {marker}"))
            .replace("MASTER_PORT=29500", &format!("MASTER_PORT={port}"));
        executable(&script_path, &script);
        common::deadline::arm();
        let mut job = std::process::Command::new("bash")
            .arg(&script_path)
            .current_dir(dir.path())
            .env("PATH", &path)
            .env("SLURM_JOB_ID", format!("45{victim}"))
            .env("SLURM_JOB_NODELIST", "localhost")
            .env(
                "FAKE_SLURM_CGROUPS",
                format!("{} {}", cg0.dir.display(), cg1.dir.display()),
            )
            .env("FAKE_SLURM_OUT", dir.path())
            .env("DIST", "1")
            .env("LEAK_MB", "0")
            .env("CKPT_DIR", dir.path())
            .env_remove("OOMGUARD_CONTROL")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let task = |n: u32| {
            fs::read_to_string(dir.path().join(format!("task-{n}.out"))).unwrap_or_default()
        };
        let log = |n: u32| dir.path().join(format!("logs/45{victim}/run-{n}.ndjson"));
        let training = common::wait_for(Duration::from_secs(120), || {
            (0..4).all(|n| task(n).contains(&format!("rank {n} completed step 20\n")))
        });
        let pid = task_rank_pid(victim, &marker);
        if let (true, Some(pid)) = (training, pid) {
            common::send(pid, "KILL");
        }
        let killed = std::time::Instant::now();
        let mut ended: [Option<Duration>; 4] = [None; 4];
        common::wait_for(Duration::from_secs(60), || {
            for (n, e) in ended.iter_mut().enumerate() {
                if e.is_none()
                    && fs::read_to_string(log(n as u32)).is_ok_and(|t| t.contains("\"run_end\""))
                {
                    *e = Some(killed.elapsed());
                }
            }
            ended.iter().all(Option::is_some)
        });
        let _ = job.kill();
        let _ = job.wait();
        cg0.kill_all();
        cg1.kill_all();
        let why = (0..4)
            .map(|n| format!("task {n}:\n{}\n", task(n)))
            .collect::<String>();
        assert!(training && pid.is_some(), "never trained\n{why}");
        for n in (0..4u32).filter(|n| *n != victim) {
            let took = ended[n as usize].unwrap_or_else(|| panic!("task {n} never ended\n{why}"));
            eprintln!("rank {victim} killed: task {n} ended after {took:?}");
            assert!(took <= Duration::from_secs(10), "task {n}: {took:?}\n{why}");
            let out = task(n);
            let said: Vec<&str> = out.lines().filter(|l| l.starts_with("oomguard:")).collect();
            // `node 1 (rank 3): rank-killed: …`; for rank 0, whose
            // process served the store: `rank 0: store-lost: …`.
            let named = said.iter().any(|l| {
                l.contains(&format!("(rank {victim}): rank-killed"))
                    || l.contains(&format!("rank {victim}: store-lost"))
            });
            assert!(
                named,
                "task {n} does not name rank {victim}: {said:?}\n{why}"
            );
        }
    }
}

/// A SLURM cluster of two "nodes" on this machine, in `dir`: the first node
/// is named after this host (so the recipe's rendezvous endpoint, the first
/// node's name, resolves), the second `<host>-2`; both `slurmd` bind
/// loopback. Dropping it stops the daemons.
struct Slurm {
    conf: std::path::PathBuf,
    daemons: Vec<Child>,
}

impl Slurm {
    /// One node per cgroup, `ProctrackType=proctrack/<proctrack>`
    /// (`linuxproc` signals every process of a step; `cgroup`, the usual
    /// setting, only the step's top task, so a cgroup.conf for cgroup v1
    /// comes with it).
    fn start(dir: &Path, cgroups: &[&MemCgroup], proctrack: &str) -> Slurm {
        Slurm::start_with(dir, cgroups, proctrack, false)
    }

    /// [`Slurm::start`]; `confine`: `task/cgroup` with `ConstrainRAMSpace`,
    /// so a job's `--mem` is its memory cgroup's limit on each node.
    fn start_with(dir: &Path, cgroups: &[&MemCgroup], proctrack: &str, confine: bool) -> Slurm {
        let host = fs::read_to_string("/proc/sys/kernel/hostname")
            .unwrap()
            .trim()
            .to_string();
        for d in ["state", "spool", "log"] {
            fs::create_dir_all(dir.join(d)).unwrap();
        }
        let d = dir.display();
        let conf = dir.join("slurm.conf");
        let names: Vec<String> = (0..cgroups.len())
            .map(|i| match i {
                0 => host.clone(),
                n => format!("{host}-{}", n + 1),
            })
            .collect();
        let nodes: String = names
            .iter()
            .enumerate()
            .map(|(i, n)| {
                format!(
                    "NodeName={n} NodeHostname=localhost NodeAddr=127.0.0.1 Port={} CPUs=2 RealMemory=4000\n",
                    17818 + i
                )
            })
            .collect();
        if proctrack == "cgroup" {
            fs::write(
                dir.join("cgroup.conf"),
                format!(
                    "CgroupPlugin=cgroup/v1\nCgroupMountpoint=/sys/fs/cgroup\n\
                     ConstrainCores=no\nConstrainRAMSpace={}\nConstrainDevices=no\n",
                    if confine { "yes" } else { "no" }
                ),
            )
            .unwrap();
        }
        fs::write(
            &conf,
            format!(
                "ClusterName=oomguardtest\nSlurmctldHost=localhost\nSlurmctldPort=17817\n\
                 AuthType=auth/munge\nProctrackType=proctrack/{proctrack}\nTaskPlugin=task/{task}\n\
                 JobAcctGatherType=jobacct_gather/none\nSelectType=select/cons_tres\n\
                 SelectTypeParameters={select}\nSlurmUser=root\nSlurmdUser=root\nMpiDefault=none\n\
                 StateSaveLocation={d}/state\nSlurmdSpoolDir={d}/spool/%n\n\
                 SlurmctldPidFile={d}/slurmctld.pid\nSlurmdPidFile={d}/slurmd-%n.pid\n\
                 SlurmctldLogFile={d}/log/slurmctld.log\nSlurmdLogFile={d}/log/slurmd-%n.log\n\
                 ReturnToService=2\n{nodes}\
                 PartitionName=debug Nodes={} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES\n",
                names.join(","),
                task = if confine { "cgroup" } else { "none" },
                // `--mem` becomes a limit only where memory is allocated.
                select = if confine { "CR_Core_Memory" } else { "CR_Core" },
            ),
        )
        .unwrap();
        start_munge();
        let quiet = |mut c: Command| {
            c.stdout(Stdio::null()).stderr(Stdio::null());
            c.spawn().unwrap()
        };
        let mut ctld = Command::new("slurmctld");
        ctld.arg("-D").arg("-f").arg(&conf);
        let mut daemons = vec![quiet(ctld)];
        std::thread::sleep(Duration::from_secs(1));
        for (cg, name) in cgroups.iter().zip(names.iter().cloned()) {
            let slurmd = which("slurmd");
            let c = cg.command(&slurmd, &["-D", "-f", conf.to_str().unwrap(), "-N", &name]);
            daemons.push(quiet(c));
        }
        let slurm = Slurm { conf, daemons };
        let idle = common::wait_for(Duration::from_secs(60), || {
            let out = slurm
                .cmd("sinfo")
                .args(["-h", "-o", "%T %D"])
                .output()
                .unwrap();
            String::from_utf8_lossy(&out.stdout).trim() == format!("idle {}", names.len())
        });
        assert!(idle, "the slurmd never came up: see {d}/log");
        slurm
    }

    fn cmd(&self, program: &str) -> Command {
        let mut c = Command::new(program);
        c.env("SLURM_CONF", &self.conf);
        c
    }

    /// `sbatch` of `script` in `work` (its output in `slurm-<id>.out`
    /// there, `CKPT_DIR` pointing there), with `args`, the `PATH` `path`
    /// and `env`: the job's id.
    fn submit(
        &self,
        work: &Path,
        script: &Path,
        args: &[&str],
        path: &str,
        env: &[(&str, &str)],
    ) -> String {
        let mut c = self.cmd("sbatch");
        c.arg("--parsable")
            .args(args)
            .arg("-o")
            .arg(work.join("slurm-%j.out"))
            .arg(script)
            .current_dir(work)
            .env("PATH", path)
            .env("CKPT_DIR", work)
            .env_remove("OOMGUARD_CONTROL");
        for (k, v) in env {
            c.env(k, v);
        }
        let out = c.output().unwrap();
        let id = String::from_utf8_lossy(&out.stdout).trim().to_string();
        assert!(out.status.success() && !id.is_empty(), "sbatch: {out:?}");
        id
    }

    /// What a failed assertion shows: the newest step lines and other
    /// lines of the job's output and the newest 40 of slurmctld's log
    /// (its state is [`Slurm::state`], read before the test cancels it).
    /// Bounded, so that CI's excerpt of the failures still reaches the
    /// next test's.
    fn why(&self, id: &str, output: &str) -> String {
        let tail = |text: &str, n: usize| {
            let lines: Vec<&str> = text.lines().collect();
            lines[lines.len().saturating_sub(n)..].join("\n")
        };
        let log = self.conf.parent().map(|d| d.join("log/slurmctld.log"));
        let log = log
            .and_then(|l| fs::read_to_string(l).ok())
            .unwrap_or_default();
        // The ranks' step lines drown the rest: the newest four are enough.
        let (steps, rest): (Vec<&str>, Vec<&str>) =
            output.lines().partition(|l| l.contains("completed step"));
        format!(
            "job {id}\n… output (the newest 4 step lines):\n{}\n… output (the rest):\n{}\n… slurmctld log:\n{}",
            tail(&steps.join("\n"), 4),
            tail(&rest.join("\n"), 80),
            tail(&log, 40)
        )
    }

    /// The job's state, restarts and exit code, for a message: read before
    /// the test cancels it.
    fn state(&self, id: &str) -> String {
        format!(
            "JobState={} Restarts={} ExitCode={}",
            self.job_field(id, "JobState").unwrap_or_default(),
            self.job_field(id, "Restarts").unwrap_or_default(),
            self.job_field(id, "ExitCode").unwrap_or_default()
        )
    }

    /// Whether job `id` ended (completed, failed, cancelled, timed out…):
    /// a wait for COMPLETED stops there rather than at its limit.
    fn ended(&self, id: &str) -> bool {
        self.job_field(id, "JobState").is_some_and(|s| {
            matches!(
                s.as_str(),
                "COMPLETED" | "FAILED" | "CANCELLED" | "TIMEOUT" | "OUT_OF_MEMORY" | "NODE_FAIL"
            )
        })
    }

    /// `scontrol show job ID`'s `KEY=value`.
    fn job_field(&self, id: &str, key: &str) -> Option<String> {
        let out = self
            .cmd("scontrol")
            .args(["show", "job", id])
            .output()
            .ok()?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.split_whitespace()
            .find_map(|w| w.strip_prefix(&format!("{key}=")).map(str::to_string))
    }
}

impl Drop for Slurm {
    fn drop(&mut self) {
        for d in self.daemons.iter_mut().rev() {
            let _ = d.kill();
            let _ = d.wait();
        }
    }
}

/// The reasons of the stops decided in `lines`. A stop's SIGTERM to what
/// is left of the tree once its save is over is a stop line too (its
/// reason ends "terminating the rest of the tree"); it comes only when the
/// job is slower to exit than oomguard is to look (seen in CI, where a
/// Lightning task still ran at the tick after its save), so it is not
/// counted.
fn stop_decisions<'a>(lines: impl Iterator<Item = &'a common::schema::Line>) -> Vec<String> {
    lines
        .filter_map(|l| match &l.event {
            Event::Action(a) if a.action == "stop" => Some(a.reason.clone()),
            _ => None,
        })
        .filter(|r| !r.ends_with(": terminating the rest of the tree"))
        .collect()
}

fn is_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

fn which(program: &str) -> std::path::PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/sbin".into()])
        .map(|d| d.join(program))
        .find(|p| p.is_file())
        .unwrap_or_else(|| program.into())
}

/// munge authenticates SLURM's messages: started (as its own user, with a
/// key made on first use) unless one answers already.
fn start_munge() {
    let works = || {
        Command::new("munge")
            .arg("-n")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if works() {
        return;
    }
    if !Path::new("/etc/munge/munge.key").exists() {
        let _ = Command::new(which("mungekey")).arg("--create").status();
    }
    let _ = fs::create_dir_all("/run/munge");
    for path in ["/etc/munge/munge.key", "/run/munge"] {
        let _ = Command::new("chown").args(["munge:munge", path]).status();
    }
    let munged = which("munged");
    let _ = Command::new("su")
        .args(["-s", "/bin/sh", "munge", "-c"])
        .arg(munged)
        .status();
    assert!(
        common::wait_for(Duration::from_secs(10), works),
        "munged did not start"
    );
}

#[test]
fn serial_the_sbatch_recipe_under_a_real_slurm_stops_every_node_and_requeues() {
    let _serial =
        common::machine::beside_with(&[common::machine::Need::Slurm, common::machine::Need::Torch]);
    let Some(venv) = real_slurm(false) else {
        return;
    };
    let (Some(cg0), Some(cg1)) = (
        MemCgroup::or_skip("slurm-0", 1600 << 20),
        MemCgroup::or_skip("slurm-1", 1600 << 20),
    ) else {
        return;
    };
    common::deadline::arm();
    let dir = tempfile::tempdir().unwrap();
    let slurm = Slurm::start(dir.path(), &[&cg0, &cg1], "linuxproc");
    let path = search_path(dir.path(), &venv, None);
    let plain =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/jobs/companion/plain.py");
    let work = dir.path().join("work");
    fs::create_dir(&work).unwrap();
    let script = work.join("train.sbatch");
    executable(
        &script,
        &recipe().replace("train.py", &format!("{} 600", plain.display())),
    );
    let id = slurm.submit(
        &work,
        &script,
        &[],
        &path,
        &[("DIST", "1"), ("LEAK_RANK", "1")],
    );
    // The script requeues the job after the stop: SLURM counts a restart.
    let requeued = common::wait_for(Duration::from_secs(240), || {
        slurm.job_field(&id, "Restarts").as_deref() == Some("1")
    });
    let _ = slurm.cmd("scancel").arg(&id).status();
    let output = fs::read_to_string(work.join(format!("slurm-{id}.out"))).unwrap_or_default();
    let why = slurm.why(&id, &output);
    assert!(requeued, "the job was not requeued\n{why}");
    assert_eq!(
        output.matches("Exited with exit code 75").count(),
        2,
        "both nodes' oomguards exit 75\n{why}"
    );
    let logs: Vec<_> = (0..2)
        .map(|n| common::read_log(&work.join(format!("logs/{id}/run-{n}.ndjson"))))
        .collect();
    let stop_step = |log: &[common::schema::Line]| {
        log.iter().rev().find_map(|l| match &l.event {
            Event::CheckpointDone(v) => v["step"].as_u64(),
            _ => None,
        })
    };
    let step = stop_step(&logs[0]).unwrap_or_else(|| panic!("node 0: no save\n{why}"));
    assert_eq!(stop_step(&logs[1]), Some(step), "{why}");
    for rank in 0..4 {
        assert!(
            work.join(format!("ckpt-r{rank}-{step}.json")).exists(),
            "rank {rank} did not save step {step}\n{why}"
        );
    }
    for (n, log) in logs.iter().enumerate() {
        let ids = log.iter().find_map(|l| match &l.event {
            Event::RunStart(s) => Some(s.ids.clone()),
            _ => None,
        });
        let ids = ids.unwrap_or_else(|| panic!("node {n}: no run_start\n{why}"));
        assert_eq!(ids.get("job_id"), Some(&id), "{ids:?}");
        assert_eq!(
            ids.get("slurm_step").map(String::as_str),
            Some("0"),
            "{ids:?}"
        );
    }
    drop(slurm);
    cg0.kill_all();
    cg1.kill_all();
}

/// The preemption recipe of docs/preemption.md (its bash block), on one
/// node of a real SLURM with `proctrack/cgroup`: `scancel --signal=USR1`
/// signals the step's top task alone, which is oomguard; every rank saves
/// the step it completed, oomguard exits 75, the script requeues the job,
/// and the requeued run resumes from the saved step and finishes.
#[test]
fn serial_under_proctrack_cgroup_a_usr1_to_the_step_saves_every_rank_and_the_requeue_resumes() {
    let _serial =
        common::machine::beside_with(&[common::machine::Need::Slurm, common::machine::Need::Torch]);
    let Some(venv) = real_slurm(true) else {
        return;
    };
    let Some(cg) = MemCgroup::or_skip("slurm-pc", 3000 << 20) else {
        return;
    };
    common::deadline::arm();
    let dir = tempfile::tempdir().unwrap();
    let slurm = Slurm::start(dir.path(), &[&cg], "cgroup");
    let path = search_path(dir.path(), &venv, None);
    let plain =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/jobs/companion/plain.py");
    let work = dir.path().join("work");
    fs::create_dir(&work).unwrap();
    let script = work.join("train.sbatch");
    let recipe = preemption_recipe()
        .replace("#SBATCH --nodes=2", "#SBATCH --nodes=1")
        .replace("--nproc-per-node 8", "--nproc-per-node 2")
        .replace("train.py", &format!("{} 500", plain.display()));
    executable(&script, &recipe);
    let id = slurm.submit(
        &work,
        &script,
        &[],
        &path,
        &[("DIST", "1"), ("LEAK_MB", "0")],
    );
    let output = || fs::read_to_string(work.join(format!("slurm-{id}.out"))).unwrap_or_default();
    let training = common::wait_for(Duration::from_secs(120), || {
        output().contains("rank 1 completed step 30")
    });
    let signalled = training
        && slurm
            .cmd("scancel")
            .args(["--signal=USR1", &id])
            .status()
            .is_ok_and(|s| s.success());
    // Requeued (Restarts=1), resumed, and finished: COMPLETED.
    let finished = signalled
        && common::wait_for(Duration::from_secs(240), || {
            slurm.job_field(&id, "JobState").as_deref() == Some("COMPLETED")
        });
    let restarts = slurm.job_field(&id, "Restarts");
    let _ = slurm.cmd("scancel").arg(&id).status();
    let text = output();
    let why = slurm.why(&id, &text);
    assert!(training, "the job never trained\n{why}");
    assert!(finished, "the job did not finish after its requeue\n{why}");
    assert_eq!(restarts.as_deref(), Some("1"), "{why}");
    // The signal reached oomguard, not torchrun (which would die of
    // USR1): every rank saved and left.
    let step: u64 = text
        .split("rank 0 left after its checkpoint at step ")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no save\n{why}"));
    for rank in 0..2 {
        assert!(
            work.join(format!("ckpt-r{rank}-{step}.json")).exists(),
            "rank {rank} did not save step {step}\n{why}"
        );
        assert!(
            text.contains(&format!(
                "rank {rank} left after its checkpoint at step {step}"
            )),
            "rank {rank} did not leave after its save\n{why}"
        );
        assert!(
            text.contains(&format!("rank {rank} resumed from step {step}")),
            "rank {rank} did not resume from step {step}\n{why}"
        );
        assert!(
            text.contains(&format!("rank {rank} finished at step 500")),
            "{why}"
        );
    }
    assert!(
        text.contains("was preempted (SIGUSR1) and saved first; exit 75"),
        "{why}"
    );
    // The requeued run kept the log of the stop that requeued it: the
    // recipe's `logs/%j/run-%N.ndjson` holds both runs.
    let runs = common::read_log_runs(&work.join(format!("logs/{id}/run-0.ndjson")));
    assert_eq!(runs.len(), 2, "{why}");
    let saved = runs[0].iter().rev().find_map(|l| match &l.event {
        Event::CheckpointDone(v) => v["step"].as_u64(),
        _ => None,
    });
    assert_eq!(
        saved,
        Some(step),
        "the first run's log lost its save\n{why}"
    );
    let ends: Vec<(String, i32)> = runs
        .iter()
        .map(|r| {
            let e = common::schema::run_end(r);
            (e.outcome.clone(), e.exit_code)
        })
        .collect();
    assert_eq!(
        ends,
        [
            ("stopped_by_signal".to_string(), 75),
            ("exited".to_string(), 0)
        ],
        "{why}"
    );
    drop(slurm);
    cg.kill_all();
}

/// The first `bash` block of docs/preemption.md's `sbatch` section.
fn preemption_recipe() -> String {
    let doc = fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/preemption.md"))
        .unwrap();
    let from = doc
        .find("## SLURM: the `sbatch` recipe")
        .expect("the recipe's heading");
    let block = &doc[from..];
    let start = block.find("```bash\n").expect("a bash block") + "```bash\n".len();
    let end = start + block[start..].find("```").unwrap();
    block[start..end].to_string()
}

/// docs/multinode.md's one-task-per-rank recipe under a real SLURM (two
/// `slurmd -N` nodes, `proctrack/cgroup`, `task/cgroup` with
/// `ConstrainRAMSpace`, `sbatch --nodes 2 --ntasks-per-node 2 --mem`),
/// running an unmodified Lightning DDP script whose rank 1 leaks: its
/// node's two tasks together near `--mem`, one oomguard decides for the
/// node, all four ranks save the same step, every task's oomguard exits 75
/// (no kernel OOM kill), the script requeues (`oomguard ended`), and the
/// requeued job resumes every rank from that step and completes.
#[test]
fn serial_under_a_real_slurm_one_task_per_rank_lightning_saves_one_step_and_resumes_it() {
    let _serial =
        common::machine::beside_with(&[common::machine::Need::Slurm, common::machine::Need::Torch]);
    let Some(venv) = real_slurm(true) else {
        return;
    };
    // The daemons' own cgroups; the job's memory is SLURM's (`--mem`).
    let (Some(cg0), Some(cg1)) = (
        MemCgroup::or_skip("slurm-rank-0", 2600 << 20),
        MemCgroup::or_skip("slurm-rank-1", 2600 << 20),
    ) else {
        return;
    };
    common::deadline::arm();
    let dir = tempfile::tempdir().unwrap();
    let slurm = Slurm::start_with(dir.path(), &[&cg0, &cg1], "cgroup", true);
    let path = search_path(dir.path(), &venv, None);
    let lit = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/jobs/companion/lightning_ddp.py");
    let work = dir.path().join("work");
    fs::create_dir(&work).unwrap();
    let script = work.join("train.sbatch");
    executable(
        &script,
        &per_rank_recipe()
            .replace("python train.py", &format!("python {} 600", lit.display()))
            .replace("MASTER_PORT=29500", "MASTER_PORT=29536"),
    );
    let id = slurm.submit(
        &work,
        &script,
        &["--mem=1700M"],
        &path,
        &[("NODES", "2"), ("DEVICES", "2"), ("LEAK_RANK", "1")],
    );
    // 230 s here alone; 400 s was not enough beside other tests in CI.
    common::deadline::arm_for(Duration::from_secs(720));
    common::wait_for(Duration::from_secs(600), || slurm.ended(&id));
    let finished = slurm.job_field(&id, "JobState").as_deref() == Some("COMPLETED");
    let restarts = slurm.job_field(&id, "Restarts");
    let state = slurm.state(&id);
    let _ = slurm.cmd("scancel").arg(&id).status();
    let text = fs::read_to_string(work.join(format!("slurm-{id}.out"))).unwrap_or_default();
    let why = slurm.why(&id, &text);
    assert!(
        finished,
        "the job did not complete after its requeue ({state})\n{why}"
    );
    assert_eq!(restarts.as_deref(), Some("1"), "{why}");
    let logs: Vec<Vec<Vec<common::schema::Line>>> = (0..4)
        .map(|n| common::read_log_runs(&work.join(format!("logs/{id}/run-{n}.ndjson"))))
        .collect();
    let saved = |log: &[common::schema::Line]| {
        log.iter().rev().find_map(|l| match &l.event {
            Event::CheckpointDone(v) if v["ok"] == true => v["step"].as_u64(),
            _ => None,
        })
    };
    let step = saved(&logs[0][0]).unwrap_or_else(|| panic!("task 0: no save\n{why}"));
    for (n, runs) in logs.iter().enumerate() {
        assert_eq!(runs.len(), 2, "task {n}: its log holds both runs\n{why}");
        assert_eq!(saved(&runs[0]), Some(step), "task {n}\n{why}");
        let ends: Vec<(String, i32)> = runs
            .iter()
            .map(|r| {
                let e = common::schema::run_end(r);
                (e.outcome.clone(), e.exit_code)
            })
            .collect();
        assert_eq!(
            ends,
            [
                ("stopped_by_policy".to_string(), 75),
                ("exited".to_string(), 0)
            ],
            "task {n}\n{why}"
        );
        assert!(
            text.contains(&format!("rank {n} resumed from step {step}")),
            "rank {n} did not resume from step {step}\n{why}"
        );
    }
    assert!(
        text.contains("oomguard: requeue") && !text.contains("do not requeue"),
        "{why}"
    );
    // One decision for the node that ran short (its two tasks share the
    // job's cgroup, and one oomguard decides for both), naming rank 1; the
    // other three join it as another's request.
    let stops = stop_decisions(logs.iter().flat_map(|runs| runs[0].iter()));
    let (joined, decided): (Vec<&String>, Vec<&String>) = stops
        .iter()
        .partition(|r| r.starts_with("node 0 (rank 1): "));
    assert_eq!((decided.len(), joined.len()), (1, 3), "{stops:?}\n{why}");
    assert!(
        decided[0].contains("rank 1 (task 1) grew the most"),
        "{stops:?}"
    );
    drop(slurm);
    cg0.kill_all();
    cg1.kill_all();
}

/// The same recipe under a real SLURM with the plain-loop companion API
/// (ranks from `SLURM_PROCID`, no torchrun): the time limit's warning
/// (`scancel --signal=USR1`, as `--signal=USR1@N` sends it) makes every rank
/// save the same step, every task exit 75 and the script requeue; the
/// requeued run resumes every rank from that step, and a plain `scancel`
/// of it saves again (exit 75) but is **not** requeued.
#[test]
fn serial_under_a_real_slurm_one_task_per_rank_a_warning_is_requeued_and_a_scancel_is_not() {
    let _serial =
        common::machine::beside_with(&[common::machine::Need::Slurm, common::machine::Need::Torch]);
    let Some(venv) = real_slurm(true) else {
        return;
    };
    let (Some(cg0), Some(cg1)) = (
        MemCgroup::or_skip("slurm-warn-0", 2000 << 20),
        MemCgroup::or_skip("slurm-warn-1", 2000 << 20),
    ) else {
        return;
    };
    common::deadline::arm();
    let dir = tempfile::tempdir().unwrap();
    let slurm = Slurm::start(dir.path(), &[&cg0, &cg1], "cgroup");
    let path = search_path(dir.path(), &venv, None);
    let plain =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/jobs/companion/plain.py");
    let work = dir.path().join("work");
    fs::create_dir(&work).unwrap();
    let script = work.join("train.sbatch");
    executable(
        &script,
        &per_rank_recipe()
            .replace(
                "python train.py",
                &format!("python {} 100000", plain.display()),
            )
            .replace("MASTER_PORT=29500", "MASTER_PORT=29537"),
    );
    let id = slurm.submit(
        &work,
        &script,
        &[],
        &path,
        &[("DIST", "1"), ("LEAK_MB", "0")],
    );
    let output = || fs::read_to_string(work.join(format!("slurm-{id}.out"))).unwrap_or_default();
    let all_at =
        |step: u64| (0..4).all(|n| output().contains(&format!("rank {n} completed step {step}\n")));
    let training = common::wait_for(Duration::from_secs(120), || all_at(30));
    let warned = training
        && slurm
            .cmd("scancel")
            .args(["--signal=USR1", &id])
            .status()
            .is_ok_and(|s| s.success());
    // Requeued, and the next run resumed every rank.
    let resumed = warned
        && common::wait_for(Duration::from_secs(300), || {
            (0..4).all(|n| output().contains(&format!("rank {n} resumed from step ")))
        });
    let first_step = |text: &str| -> Option<u64> {
        text.split("rank 0 resumed from step ")
            .nth(1)?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    };
    let step = first_step(&output());
    let trained_again =
        resumed && common::wait_for(Duration::from_secs(60), || all_at(step.unwrap_or(0) + 20));
    let cancelled = trained_again
        && slurm
            .cmd("scancel")
            .arg(&id)
            .status()
            .is_ok_and(|s| s.success());
    let ended = cancelled
        && common::wait_for(Duration::from_secs(90), || {
            output().contains("oomguard: do not requeue")
        });
    // Time for a requeue that must not come.
    std::thread::sleep(Duration::from_secs(3));
    let restarts = slurm.job_field(&id, "Restarts");
    let state = slurm.job_field(&id, "JobState");
    let _ = slurm.cmd("scancel").arg(&id).status();
    let text = output();
    let why = slurm.why(&id, &text);
    assert!(training, "the job never trained\n{why}");
    assert!(
        resumed,
        "the warning's requeue did not resume every rank\n{why}"
    );
    let step = step.unwrap_or_else(|| panic!("no resume step\n{why}"));
    for n in 0..4 {
        assert!(
            work.join(format!("ckpt-r{n}-{step}.json")).exists(),
            "rank {n} did not save step {step}\n{why}"
        );
        assert!(
            text.contains(&format!("rank {n} resumed from step {step}\n")),
            "rank {n}\n{why}"
        );
    }
    assert!(
        ended,
        "the scancel's end did not say 'do not requeue'\n{why}"
    );
    assert_eq!(restarts.as_deref(), Some("1"), "{why}");
    assert_ne!(
        state.as_deref(),
        Some("PENDING"),
        "requeued after a scancel\n{why}"
    );
    assert!(text.contains("SIGTERM"), "{why}");
    for n in 0..4 {
        let runs = common::read_log_runs(&work.join(format!("logs/{id}/run-{n}.ndjson")));
        let ends: Vec<(String, i32)> = runs
            .iter()
            .map(|r| {
                let e = common::schema::run_end(r);
                (e.outcome.clone(), e.exit_code)
            })
            .collect();
        assert_eq!(
            ends,
            [
                ("stopped_by_signal".to_string(), 75),
                ("stopped_by_signal".to_string(), 75)
            ],
            "task {n}\n{why}"
        );
    }
    drop(slurm);
    cg0.kill_all();
    cg1.kill_all();
}
