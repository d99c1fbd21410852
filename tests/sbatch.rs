//! The `sbatch` recipe of docs/multinode.md, run as written through
//! stand-ins for `srun` and `scontrol` that set SLURM's environment: two
//! "nodes" on this machine, each task in its own memory cgroup, each an
//! oomguard over `torchrun --nnodes 2 --nproc-per-node 2` (gloo, CPU), one
//! rank leaking until its node's cgroup ceiling is near. Every rank saves the
//! same step, both oomguards exit 75, each node's log lands in its own file
//! (`--log logs/%j/run-%N.ndjson`), and the script requeues the job.

#![allow(clippy::unwrap_used)]

mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

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

#[test]
fn serial_the_sbatch_recipe_stops_every_node_with_one_checkpoint_and_requeues() {
    let _serial = common::serial();
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
    let bin = dir.path().join("bin");
    fs::create_dir(&bin).unwrap();
    executable(&bin.join("srun"), SRUN);
    executable(&bin.join("scontrol"), SCONTROL);
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_oomguard"), bin.join("oomguard")).unwrap();
    let plain =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/jobs/companion/plain.py");
    let script = recipe().replace("train.py", &format!("{} 4000", plain.display()));
    let script_path = dir.path().join("train.sbatch");
    executable(&script_path, &script);
    let path = format!(
        "{}:{}:{}",
        bin.display(),
        venv.join("bin").display(),
        std::env::var("PATH").unwrap_or_default()
    );
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
