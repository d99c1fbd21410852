//! `oomguard attach` on a real cgroup v2 kernel (the VM harness of
//! tests/support/vm.rs): a job started without oomguard, alone in its
//! memory cgroup, attached by pid, by `--cgroup` and by a SLURM-style path
//! (`system.slice/slurmstepd.scope/job_ID/step_0/user/task_0`). One boot
//! runs every scenario; results come back as `@@ key=value` lines.

#![allow(clippy::unwrap_used)]

use crate::common;
use crate::support::vm;

use std::collections::BTreeMap;
use std::path::Path;

use common::schema::{self, Event};

/// `job CG NAME ARGS...` starts `leak ARGS` alone in /sys/fs/cgroup/CG, in
/// the background (not under oomguard), its pid in `$job`. `report NAME CG
/// PID` prints what a scenario left: oomguard's exit code is printed by the
/// caller; here the job's state, the cgroup's OOM kills, the log, stderr
/// and the job's output.
const PRELUDE: &str = r#"
echo "+memory +pids" > /sys/fs/cgroup/cgroup.subtree_control
job() {
  cg=/sys/fs/cgroup/$1; name=$2; shift 2
  sh -c 'echo $$ > "$0/cgroup.procs" && exec leak "$@"' $cg "$@" </dev/null >/tmp/$name.job 2>&1 &
  job=$!
}
state() { cut -d' ' -f3 /proc/$1/stat 2>/dev/null || echo gone; }
report() {
  name=$1; cg=/sys/fs/cgroup/$2
  echo "@@ $name.job_state=$(state $3)"
  echo "@@ $name.oom_kill=$(grep '^oom_kill ' $cg/memory.events | cut -d' ' -f2)"
  echo "@@begin $name.log"; cat /tmp/$name.ndjson 2>/dev/null; echo "@@end $name.log"
  echo "@@begin $name.err"; cat /tmp/$name.err; echo "@@end $name.err"
  echo "@@begin $name.job"; tail -5 /tmp/$name.job; echo "@@end $name.job"
}
# Waits until the job holds $2 MiB (so every sample has something to count).
holds() { i=0; while [ $(( $(cat /sys/fs/cgroup/$1/memory.current) >> 20 )) -lt $2 ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done; }
"#;

/// One scenario's results.
struct Run {
    name: String,
    values: BTreeMap<String, String>,
    log: Vec<schema::Line>,
    err: String,
    job: String,
}

impl Run {
    fn get(out: &vm::Output, dir: &Path, name: &str) -> Run {
        let log_path = dir.join(format!("{name}.ndjson"));
        std::fs::write(&log_path, out.section(&format!("{name}.log")).join("\n")).unwrap();
        let prefix = format!("{name}.");
        Run {
            name: name.to_string(),
            values: out
                .values()
                .into_iter()
                .filter_map(|(k, v)| Some((k.strip_prefix(&prefix)?.to_string(), v)))
                .collect(),
            log: common::read_log(&log_path),
            err: out.section(&format!("{name}.err")).join("\n"),
            job: out.section(&format!("{name}.job")).join("\n"),
        }
    }

    fn value(&self, key: &str) -> &str {
        self.values
            .get(key)
            .map(String::as_str)
            .unwrap_or_else(|| panic!("{}: no {key}", self.name))
    }

    fn num(&self, key: &str) -> i64 {
        self.value(key)
            .parse()
            .unwrap_or_else(|_| panic!("{}: {key} is {}", self.name, self.value(key)))
    }

    /// The job was still running (sleeping or running) when the watch
    /// ended.
    fn job_alive(&self) -> bool {
        matches!(self.value("job_state"), "S" | "R" | "D")
    }

    fn run_start(&self) -> &schema::RunStart {
        self.log
            .iter()
            .find_map(|l| match &l.event {
                Event::RunStart(r) => Some(r),
                _ => None,
            })
            .unwrap_or_else(|| panic!("{}: no run_start: {}", self.name, self.err))
    }

    fn first_action(&self, action: &str) -> Option<f64> {
        self.log.iter().find_map(|l| match &l.event {
            Event::Action(a) if a.action == action => Some(l.t),
            _ => None,
        })
    }

    /// The first stop's signal and the pids it went to.
    fn stop(&self) -> Option<(Option<String>, Vec<u32>)> {
        self.log.iter().find_map(|l| match &l.event {
            Event::Action(a) if a.action == "stop" => Some((a.signal.clone(), a.pids.clone())),
            _ => None,
        })
    }

    /// The job's main process (the leak), as the scenario saw it.
    fn pid(&self) -> u32 {
        self.num("pid") as u32
    }

    /// Attached to `path`, a cgroup that holds only the job and is not
    /// oomguard's, and every sample's footprint is that cgroup's working
    /// set: within 5 % of the cgroup's own usage and working set read in
    /// the same pass.
    fn assert_exclusive(&self, path: &str, at_least_mib: u64) {
        let info = self
            .run_start()
            .cgroup
            .as_ref()
            .unwrap_or_else(|| panic!("{}: no cgroup in run_start", self.name));
        assert_eq!(info.path, path, "{}", self.name);
        assert!(!info.owned && info.exclusive, "{}: {info:?}", self.name);
        let samples: Vec<(f64, &schema::Sample)> = self
            .log
            .iter()
            .filter_map(|l| Some((l.t, l.sample()?)))
            .collect();
        // The job holds its memory until it is stopped.
        let holding = self.first_action("stop").unwrap_or(f64::INFINITY);
        assert!(
            samples.len() >= 3,
            "{}: only {} samples",
            self.name,
            samples.len()
        );
        // The path is fixed for the run: written on the lines with the
        // process list only.
        assert!(
            samples
                .iter()
                .filter_map(|(_, s)| s.cgroup.as_ref())
                .any(|c| !c.path.is_empty()),
            "{}: no sample names the cgroup",
            self.name
        );
        for (t, s) in samples {
            let cg = s.cgroup.as_ref().expect("a cgroup on every sample");
            assert_eq!(cg.version, 2, "{}", self.name);
            if !cg.path.is_empty() {
                assert_eq!(cg.path, path, "{}", self.name);
            }
            assert!(!cg.owned, "{}", self.name);
            let fp = s.tree.footprint_bytes as f64;
            let usage = cg.usage_bytes as f64;
            let ws = cg.limit_working_set_bytes.unwrap() as f64;
            assert!(
                (fp - usage).abs() <= 0.05 * usage && (fp - ws).abs() <= 0.05 * ws,
                "{}: footprint {fp} vs cgroup usage {usage} / working set {ws}",
                self.name
            );
            assert!(
                t >= holding || s.tree.footprint_bytes >= at_least_mib << 20,
                "{}: footprint {} below {at_least_mib} MiB",
                self.name,
                s.tree.footprint_bytes
            );
        }
    }

    /// The watch ended with the job still running, and the log says so.
    fn assert_detached(&self, reason: &str) {
        assert_eq!(self.num("exit"), 0, "{}: {}", self.name, self.err);
        assert!(self.job_alive(), "{}: the job must still run", self.name);
        assert!(
            !self.job.contains("checkpoint"),
            "{}: the job was signalled: {}",
            self.name,
            self.job
        );
        let end = schema::run_end(&self.log);
        assert_eq!(end.outcome, "detached", "{}", self.name);
        assert_eq!(end.exit_code_known, Some(false), "{}", self.name);
        assert_eq!(
            end.detached_reason.as_deref(),
            Some(reason),
            "{}",
            self.name
        );
        assert_eq!(
            end.still_running_pids,
            Some(vec![self.pid()]),
            "{}",
            self.name
        );
        assert_eq!(self.run_start().pid, self.pid(), "{}", self.name);
        assert!(
            self.err.contains("still running"),
            "{}: {}",
            self.name,
            self.err
        );
        assert!(self.first_action("stop").is_none(), "{}", self.name);
    }

    /// The policy stopped the leak with the checkpoint signal (SIGTERM),
    /// the trainer checkpointed and left by itself, the kernel killed
    /// nothing, and oomguard could not know the job's code.
    fn assert_stopped(&self) {
        assert_eq!(self.num("exit"), 75, "{}: {}", self.name, self.err);
        assert_eq!(self.num("oom_kill"), 0, "{}: the kernel killed", self.name);
        // The trainer alone gets the checkpoint signal.
        let (signal, pids) = self
            .stop()
            .unwrap_or_else(|| panic!("{}: no stop action", self.name));
        assert_eq!(signal.as_deref(), Some("SIGTERM"), "{}", self.name);
        assert_eq!(pids, vec![self.pid()], "{}", self.name);
        assert!(
            self.job.contains("checkpoint"),
            "{}: the trainer did not checkpoint: {}",
            self.name,
            self.job
        );
        assert_eq!(self.num("job_exit"), 0, "{}: {}", self.name, self.job);
        assert!(
            self.first_action("kill").is_none(),
            "{}: killed without --allow-kill",
            self.name
        );
        let end = schema::run_end(&self.log);
        assert_eq!(end.outcome, "stopped_by_policy", "{}", self.name);
        assert_eq!(end.exit_code_known, Some(false), "{}", self.name);
    }
}

#[test]
fn serial_vm_attach_v2() {
    let _serial = common::serial();
    let Some(m) = vm::machine_or_skip() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let Some(leak) = vm::static_job(dir.path(), "leak") else {
        return;
    };
    let mut img = vm::Initramfs::new(&m);
    img.add_binary("bin/oomguard", Path::new(env!("CARGO_BIN_EXE_oomguard")));
    img.add_file("bin/leak", &leak, 0o755);
    let og = "oomguard attach --no-tui --no-notify --interval 500ms";
    let slurm = "system.slice/slurmstepd.scope/job_42";
    let scenario = format!(
        r#"{PRELUDE}
# P: by pid; the watch ends by SIGTERM to oomguard, the job runs on.
mkdir -p /sys/fs/cgroup/p; echo 300M > /sys/fs/cgroup/p/memory.max
job p p 40 80; jp=$job; holds p 40
{og} --log /tmp/p.ndjson $jp >/dev/null 2>/tmp/p.err &
o=$!; sleep 6; kill -TERM $o; wait $o; echo "@@ p.exit=$?"
echo "@@ p.pid=$jp"; report p p $jp; kill $jp; wait $jp

# S1/S2: SLURM's v2 layout, the limit on the job, the processes in a task
# leaf. By --slurm-job, then by --cgroup with the path inside the
# hierarchy; both watches end by --watch-for.
mkdir -p /sys/fs/cgroup/{slurm}/step_0/user/task_0
echo +memory > /sys/fs/cgroup/system.slice/cgroup.subtree_control
echo +memory > /sys/fs/cgroup/system.slice/slurmstepd.scope/cgroup.subtree_control
echo +memory > /sys/fs/cgroup/{slurm}/cgroup.subtree_control
echo +memory > /sys/fs/cgroup/{slurm}/step_0/cgroup.subtree_control
echo +memory > /sys/fs/cgroup/{slurm}/step_0/user/cgroup.subtree_control
echo 300M > /sys/fs/cgroup/{slurm}/memory.max
job {slurm}/step_0/user/task_0 s1 40 80; js=$job; holds {slurm} 40
{og} --slurm-job 42 --watch-for 4s --log /tmp/s1.ndjson >/dev/null 2>/tmp/s1.err
echo "@@ s1.exit=$?"; echo "@@ s1.pid=$js"; report s1 {slurm} $js
{og} --cgroup /{slurm} --watch-for 4s --log /tmp/s2.ndjson >/dev/null 2>/tmp/s2.err
echo "@@ s2.exit=$?"; echo "@@ s2.pid=$js"; cp /tmp/s1.job /tmp/s2.job; report s2 {slurm} $js
kill $js; wait $js

# C: by --cgroup (the directory); a leak in a 200M cgroup is stopped by
# the policy with the checkpoint signal.
mkdir -p /sys/fs/cgroup/c; echo 200M > /sys/fs/cgroup/c/memory.max
job c c 20 400; jc=$job; holds c 30
timeout 120 {og} --cgroup /sys/fs/cgroup/c --log /tmp/c.ndjson >/dev/null 2>/tmp/c.err
echo "@@ c.exit=$?"; echo "@@ c.pid=$jc"; wait $jc; echo "@@ c.job_exit=$?"; report c c $jc

# W/W0: 30 s polling; the admin's memory.high (186M, past the critical
# level of a 200M limit) holds the leak. Only a kernel wake-up from the
# attached cgroup (memory.events `high`, or its PSI) can act before the
# next poll. W0: the control, kernel wake-ups off.
for w in w w0; do
  mkdir -p /sys/fs/cgroup/$w; echo 200M > /sys/fs/cgroup/$w/memory.max; echo 186M > /sys/fs/cgroup/$w/memory.high
  job $w $w 200 190 1000; jw=$job
  without=none; if [ $w = w0 ]; then without=wakeups; fi
  timeout 120 oomguard attach --no-tui --no-notify --interval 30s --without $without --cgroup /$w --log /tmp/$w.ndjson >/dev/null 2>/tmp/$w.err
  echo "@@ $w.exit=$?"; echo "@@ $w.pid=$jw"; wait $jw; echo "@@ $w.job_exit=$?"; report $w $w $jw
done
"#
    );
    let out = vm::run_scenario(&m, img, &scenario, &vm::Boot::default());
    let get = |n: &str| Run::get(&out, dir.path(), n);

    let p = get("p");
    p.assert_detached("SIGTERM received");
    p.assert_exclusive("/p", 30);

    let slurm_path = format!("/{slurm}");
    for name in ["s1", "s2"] {
        let s = get(name);
        s.assert_detached("--watch-for 4.0s elapsed");
        s.assert_exclusive(&slurm_path, 30);
    }

    let c = get("c");
    c.assert_stopped();
    c.assert_exclusive("/c", 25);

    let (w, w0) = (get("w"), get("w0"));
    w.assert_stopped();
    w0.assert_stopped();
    let tw = w.first_action("stop").unwrap();
    let tw0 = w0.first_action("stop").unwrap();
    eprintln!("attached v2 wake-up: stop at {tw:.2} s with kernel wake-ups, {tw0:.2} s without");
    // The first poll after the start is at 30 s; the leak starts 1 s after
    // oomguard and is at memory.high well before 28 s even at the
    // ~10-25 MB/s measured under TCG on a loaded machine.
    assert!(
        tw < 28.0,
        "W: the stop waited for the 30 s poll ({tw:.2} s)"
    );
    assert!(
        tw0 >= 29.0,
        "W0 (control): stopped at {tw0:.2} s without wake-ups"
    );
}
