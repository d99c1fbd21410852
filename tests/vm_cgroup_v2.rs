//! cgroup v2 on a real kernel: Debian's kernel booted in qemu with a busybox
//! initramfs (tests/support/vm.rs). Each test boots once and runs several
//! scenarios; their results come back as `@@ key=value` lines.

#![allow(clippy::unwrap_used)]

use crate::common;
use crate::support::vm;

use std::path::Path;

/// An image with oomguard and the static jobs (`leak`, `cow`, `asuser`) in
/// /bin.
fn image(m: &vm::Machine, dir: &Path) -> Option<vm::Initramfs> {
    let mut img = vm::Initramfs::new(m);
    img.add_binary("bin/oomguard", Path::new(env!("CARGO_BIN_EXE_oomguard")));
    for job in ["leak", "cow", "asuser"] {
        img.add_file(&format!("bin/{job}"), &vm::static_job(dir, job)?, 0o755);
    }
    Some(img)
}

/// What every test here starts with: the serial lock, the VM's kernel, a
/// directory and the image (`None`: skipped).
fn boot() -> Option<(
    common::machine::Held,
    vm::Machine,
    tempfile::TempDir,
    vm::Initramfs,
)> {
    let serial = common::serial();
    let m = vm::machine_or_skip()?;
    let dir = tempfile::tempdir().unwrap();
    let img = image(&m, dir.path())?;
    Some((serial, m, dir, img))
}

/// Shell helpers every scenario starts with. `run CG NAME CMD...` runs CMD
/// as the only process of /sys/fs/cgroup/CG (created with `memory.max` from
/// `$MAX`, default 300M) and reports its exit code, the subtree's OOM
/// kills, the peak, what is left in CG, and the log and stderr.
const PRELUDE: &str = r#"
echo "+memory +pids" > /sys/fs/cgroup/cgroup.subtree_control
run() {
  cgname=$1; cg=/sys/fs/cgroup/$1; name=$2; shift 2
  mkdir -p $cg
  echo ${MAX:-300M} > $cg/memory.max
  sh -c 'echo $$ > "$0/cgroup.procs" && exec "$@"' $cg "$@" </dev/null >/tmp/$name.out 2>/tmp/$name.err
  echo "@@ $name.exit=$?"
  report $cgname $name
}
report() {
  cg=/sys/fs/cgroup/$1; name=$2
  echo "@@ $name.oom_kill=$(grep '^oom_kill ' $cg/memory.events | cut -d' ' -f2)"
  echo "@@ $name.high_events=$(grep '^high ' $cg/memory.events | cut -d' ' -f2)"
  echo "@@ $name.peak=$(cat $cg/memory.peak)"
  echo "@@ $name.left=$(ls $cg | grep oomguard- | tr '\n' ' ')"
  echo "@@ $name.subtree=$(cat $cg/cgroup.subtree_control)"
  echo "@@begin $name.log"; cat /tmp/$name.ndjson 2>/dev/null; echo "@@end $name.log"
  echo "@@begin $name.err"; cat /tmp/$name.err; echo "@@end $name.err"
  echo "@@begin $name.out"; tail -5 /tmp/$name.out; echo "@@end $name.out"
}
"#;

/// One scenario's results.
struct Run {
    name: String,
    values: std::collections::BTreeMap<String, String>,
    log: Vec<common::schema::Line>,
    err: String,
    out: String,
}

impl Run {
    fn get(out: &vm::Output, dir: &Path, name: &str) -> Run {
        let log_path = dir.join(format!("{name}.ndjson"));
        std::fs::write(&log_path, out.section(&format!("{name}.log")).join("\n")).unwrap();
        let log = common::read_log(&log_path);
        let prefix = format!("{name}.");
        Run {
            name: name.to_string(),
            values: out
                .values()
                .into_iter()
                .filter_map(|(k, v)| Some((k.strip_prefix(&prefix)?.to_string(), v)))
                .collect(),
            log,
            err: out.section(&format!("{name}.err")).join("\n"),
            out: out.section(&format!("{name}.out")).join("\n"),
        }
    }

    fn value(&self, key: &str) -> &str {
        self.values
            .get(key)
            .map(String::as_str)
            .unwrap_or_else(|| panic!("{}: no {key}", self.name))
    }

    fn exit(&self) -> i32 {
        self.value("exit").parse().unwrap()
    }

    /// A counter the scenario read: a missing or unreadable one fails the
    /// test (a "0" nobody read would let "the kernel never killed" pass).
    fn num(&self, key: &str) -> u64 {
        self.value(key)
            .parse()
            .unwrap_or_else(|_| panic!("{}: {key} is {:?}", self.name, self.value(key)))
    }

    fn run_start(&self) -> &common::schema::RunStart {
        self.log
            .iter()
            .find_map(|l| match &l.event {
                common::schema::Event::RunStart(r) => Some(r),
                _ => None,
            })
            .unwrap_or_else(|| panic!("{}: no run_start", self.name))
    }

    fn owned(&self) -> bool {
        self.run_start().cgroup.as_ref().is_some_and(|c| c.owned)
    }

    fn not_owned_reason(&self) -> String {
        self.run_start()
            .cgroup
            .as_ref()
            .and_then(|c| c.not_owned_reason.clone())
            .unwrap_or_default()
    }

    /// Seconds from the start to the first stop (or other critical) action.
    fn first_action(&self, action: &str) -> Option<f64> {
        self.log.iter().find_map(|l| match &l.event {
            common::schema::Event::Action(a) if a.action == action => Some(l.t),
            _ => None,
        })
    }

    /// What oomguard did and how the job ended, for failure messages.
    fn actions(&self) -> Vec<String> {
        self.log
            .iter()
            .filter_map(|l| match &l.event {
                common::schema::Event::Action(a) => Some(format!(
                    "{:.2} s {} {} {:?}",
                    l.t, a.action, a.reason, a.signal
                )),
                common::schema::Event::ChildExit(c) => {
                    Some(format!("{:.2} s exit {:?} {:?}", l.t, c.code, c.signal))
                }
                _ => None,
            })
            .collect()
    }

    /// Seconds from the start to the job's main process exiting.
    fn child_exit(&self) -> Option<f64> {
        self.log.iter().find_map(|l| match &l.event {
            common::schema::Event::ChildExit(_) => Some(l.t),
            _ => None,
        })
    }

    fn run_end(&self) -> &common::schema::RunEnd {
        self.log
            .iter()
            .find_map(|l| match &l.event {
                common::schema::Event::RunEnd(r) => Some(r),
                _ => None,
            })
            .unwrap_or_else(|| panic!("{}: no run_end", self.name))
    }

    /// Nothing oomguard created is left, and the parent's controllers are
    /// as they were.
    fn assert_clean(&self) {
        assert_eq!(self.value("left"), "", "{}: cgroups left behind", self.name);
        assert_eq!(
            self.value("subtree"),
            "",
            "{}: controllers left enabled",
            self.name
        );
    }
}

#[test]
fn serial_vm_delegated_v2_owns_stops_wakeup_and_memory_high() {
    let Some((_serial, m, dir, img)) = boot() else {
        return;
    };
    let og = "oomguard run --no-tui --quiet";
    let scenario = format!(
        r#"{PRELUDE}
# A: a 200 MB/s leak inside a delegated cgroup with memory.max 300M.
run a a {og} --log /tmp/a.ndjson -- leak 200 4096
# B: 30 s polling, memory.max 200M; the leak stops at 190 MiB, past the
# critical level (184) and memory.high (~186). Only a kernel wake-up can
# act before the first poll.
MAX=200M run b b {og} --interval 30s --log /tmp/b.ndjson -- leak 200 190
# B1, B2: one kernel wake-up each, no cheap loop: memory.events alone
# (no PSI), the PSI trigger alone (no memory.events).
MAX=200M run b1 b1 {og} --interval 30s --without psi,cheap-loop --log /tmp/b1.ndjson -- leak 200 190
MAX=200M run b2 b2 {og} --interval 30s --without memory-events,cheap-loop --log /tmp/b2.ndjson -- leak 200 190
# B0: control for B, every wake-up off (memory.high still holds the leak).
MAX=200M run b0 b0 {og} --interval 30s --without wakeups --log /tmp/b0.ndjson -- leak 200 190
# C: memory.high evaluated: a 2 GB/s leak, with and without it.
run c c {og} --log /tmp/c.ndjson -- leak 2000 4096
run c0 c0 {og} --without memory-high --log /tmp/c0.ndjson -- leak 2000 4096
# C2: a trainer deaf to SIGTERM leaks on past the stop into memory.high
# (with it) or on towards the last resort (without).
LEAK_DEAF=1 run c2 c2 {og} --grace 3s --kill-after 1s --log /tmp/c2.ndjson -- leak 2000 4096
LEAK_DEAF=1 run c20 c20 {og} --without memory-high --grace 3s --kill-after 1s --log /tmp/c20.ndjson -- leak 2000 4096
# D: oomguard ends on SIGTERM mid-run and cleans up.
mkdir -p /sys/fs/cgroup/d; echo 300M > /sys/fs/cgroup/d/memory.max
sh -c 'echo $$ > /sys/fs/cgroup/d/cgroup.procs && exec {og} --log /tmp/d.ndjson -- leak 10 100' </dev/null >/tmp/d.out 2>/tmp/d.err &
sleep 3; kill -TERM $!; wait $!; echo "@@ d.exit=$?"; report d d
# E: the job is SIGKILLed; oomguard cleans up.
mkdir -p /sys/fs/cgroup/e; echo 300M > /sys/fs/cgroup/e/memory.max
sh -c 'echo $$ > /sys/fs/cgroup/e/cgroup.procs && exec {og} --log /tmp/e.ndjson -- leak 10 100' </dev/null >/tmp/e.out 2>/tmp/e.err &
sleep 3; killall -KILL leak; wait $!; echo "@@ e.exit=$?"; report e e
# F: another process shares the cgroup: not owned, and why.
mkdir -p /sys/fs/cgroup/f; sleep 60 & echo $! > /sys/fs/cgroup/f/cgroup.procs
run f f {og} --log /tmp/f.ndjson -- true
kill %1 2>/dev/null
# G: a threaded cgroup: not owned, and why.
mkdir -p /sys/fs/cgroup/g /sys/fs/cgroup/g/t; echo threaded > /sys/fs/cgroup/g/t/cgroup.type
sh -c 'echo $$ > /sys/fs/cgroup/g/t/cgroup.procs && exec {og} --log /tmp/g.ndjson -- true' </dev/null >/tmp/g.out 2>/tmp/g.err
echo "@@ g.exit=$?"; report g g
# H: a job that moves itself out of the owned cgroup is still tracked.
mkdir -p /sys/fs/cgroup/elsewhere /sys/fs/cgroup/h; echo 300M > /sys/fs/cgroup/h/memory.max
timeout 90 sh -c 'echo $$ > /sys/fs/cgroup/h/cgroup.procs && exec {og} --budget 150M --log /tmp/h.ndjson -- sh -c "echo \$\$ > /sys/fs/cgroup/elsewhere/cgroup.procs && exec leak 100 400"' </dev/null >/tmp/h.out 2>/tmp/h.err
echo "@@ h.exit=$?"; report h h
# I: no /dev/pts: the job runs without the dashboard.
mkdir -p /sys/fs/cgroup/i; echo 300M > /sys/fs/cgroup/i/memory.max
sh -c 'echo $$ > /sys/fs/cgroup/i/cgroup.procs && exec oomguard run --tui --log /tmp/i.ndjson -- sh -c "echo job-ran > /tmp/i.out"' </dev/console >/dev/console 2>/tmp/i.err
rc=$?; echo; echo "@@ i.exit=$rc"; report i i
"#
    );
    let out = vm::run_scenario(&m, img, &scenario, &vm::Boot::default());
    let get = |n: &str| Run::get(&out, dir.path(), n);

    let a = get("a");
    assert!(a.owned(), "A not owned: {}", a.not_owned_reason());
    assert_eq!(a.exit(), 75, "A: {}", a.err);
    assert_eq!(a.num("oom_kill"), 0, "A: the kernel killed");
    assert!(
        a.out.contains("checkpoint"),
        "A: the trainer did not checkpoint: {}",
        a.out
    );
    a.assert_clean();

    let (b, b0) = (get("b"), get("b0"));
    assert_eq!(b.exit(), 75, "B: {}", b.err);
    assert_eq!(b.num("oom_kill"), 0);
    let tb = b.first_action("stop").expect("B: no stop action");
    let tb0 = b0.first_action("stop").unwrap_or(f64::INFINITY);
    eprintln!("wake-up: stop at {tb:.2} s with kernel wake-ups, {tb0:.2} s without");
    // The first poll after the start is at 30 s; the leak is past the
    // critical level well before (184 MiB at the ~10-25 MB/s measured under
    // TCG on a loaded machine).
    assert!(
        tb < 28.0,
        "B: the stop waited for the 30 s poll ({tb:.2} s)"
    );
    assert!(
        tb0 >= 29.0,
        "B0 (control): stopped at {tb0:.2} s without wake-ups"
    );
    let woke = |r: &Run| {
        let w = common::schema::run_end(&r.log)
            .wakeups
            .as_ref()
            .unwrap_or_else(|| panic!("{}: no run_end.wakeups", r.name));
        (w.psi.woke, w.memory_events.woke, w.cheap_loop.armed)
    };
    let (psi, events, _) = woke(&b);
    assert!(psi + events > 0, "B: no kernel wake-up woke the loop");
    // Each kernel wake-up alone (no cheap loop) stops the leak before the
    // poll, and says it was the one; the one turned off counts nothing.
    for (r, name) in [(get("b1"), "memory.events"), (get("b2"), "PSI")] {
        assert_eq!(r.exit(), 75, "{}: {}", r.name, r.err);
        let t = r.first_action("stop").expect("no stop action");
        eprintln!("{name} alone: stop at {t:.2} s, woke {:?}", woke(&r));
        assert!(
            t < 28.0,
            "{name} alone: the stop waited for the poll ({t:.2} s)"
        );
        let (psi, events, cheap) = woke(&r);
        let (own, other) = if name == "PSI" {
            (psi, events)
        } else {
            (events, psi)
        };
        assert!(
            own > 0 && other == 0 && !cheap,
            "{name} alone: {:?}",
            woke(&r)
        );
        r.assert_clean();
    }
    b.assert_clean();
    b0.assert_clean();

    let (c, c0) = (get("c"), get("c0"));
    for r in [&c, &c0] {
        assert_eq!(r.exit(), 75, "{}: {}", r.name, r.err);
        assert_eq!(r.num("oom_kill"), 0, "{}: the kernel killed", r.name);
        assert!(
            r.out.contains("checkpoint"),
            "{}: no checkpoint; out: {:?}; err: {}; actions: {:?}",
            r.name,
            r.out,
            r.err,
            r.actions()
        );
        r.assert_clean();
        let stop = r.first_action("stop").unwrap_or(0.0);
        eprintln!(
            "memory.high {}: peak {} MiB of 300, high events {}, stop at {stop:.2} s, job exit {:.2} s after the stop",
            if r.name == "c" { "on " } else { "off" },
            r.num("peak") >> 20,
            r.num("high_events"),
            r.child_exit().unwrap_or(f64::NAN) - stop
        );
    }
    // memory.high: the value oomguard wrote, three quarters of the way from
    // the ceiling down to the critical level (94 % of 300 MiB, less what
    // else the ceiling's cgroup holds). A trainer that stops on SIGTERM
    // never reaches it (above); one deaf to it runs into it, and the kernel
    // throttles it there (high events) with it and never without it.
    let ceiling = 300u64 << 20;
    let (c2, c20) = (get("c2"), get("c20"));
    for r in [&c, &c2] {
        let high = r
            .run_start()
            .cgroup
            .as_ref()
            .and_then(|g| g.memory_high_bytes);
        assert!(
            high.is_some_and(|h| h <= ceiling * 94 / 100 && h >= ceiling * 85 / 100),
            "{}: memory.high {high:?}, not ~94 % of 300 MiB",
            r.name
        );
    }
    for r in [&c0, &c20] {
        assert_eq!(
            r.run_start()
                .cgroup
                .as_ref()
                .and_then(|g| g.memory_high_bytes),
            None
        );
    }
    eprintln!(
        "deaf trainer: high events {} with memory.high (peak {} MiB, OOM kills {}), {} without (peak {} MiB, OOM kills {})",
        c2.num("high_events"),
        c2.num("peak") >> 20,
        c2.num("oom_kill"),
        c20.num("high_events"),
        c20.num("peak") >> 20,
        c20.num("oom_kill")
    );
    assert!(
        c2.num("high_events") > 0,
        "C2: no high events with memory.high"
    );
    assert_eq!(c2.num("oom_kill"), 0, "C2: the kernel killed; {}", c2.err);
    assert_eq!(
        c20.num("high_events"),
        0,
        "C2 control: high events without memory.high"
    );
    c2.assert_clean();
    c20.assert_clean();

    let d = get("d");
    assert!(d.owned());
    assert!(d.out.contains("checkpoint"), "D: SIGTERM was not passed on");
    d.assert_clean();
    let e = get("e");
    assert!(e.owned());
    assert_eq!(e.exit(), 137, "E: {}", e.err);
    e.assert_clean();

    let f = get("f");
    assert!(!f.owned());
    assert!(
        f.not_owned_reason().contains("holds other processes"),
        "{}",
        f.not_owned_reason()
    );
    assert_eq!(f.exit(), 0);
    assert_eq!(f.value("left"), "");
    let g = get("g");
    assert!(!g.owned());
    assert!(
        g.not_owned_reason().contains("threaded"),
        "{}",
        g.not_owned_reason()
    );
    assert_eq!(g.exit(), 0);

    let h = get("h");
    assert!(h.owned());
    assert_eq!(
        h.exit(),
        75,
        "H: the job that left the cgroup was not tracked: {}",
        h.err
    );

    let i = get("i");
    assert_eq!(i.exit(), 0, "I: {}", i.err);
    assert!(i.out.contains("job-ran"), "I: {}", i.out);
    assert!(i.err.contains("pipes and no dashboard"), "I: {}", i.err);
}

/// The machine's ceiling and the global OOM killer (no cgroup limit, a
/// 1 GiB VM), then real swapping on a virtio disk.
#[test]
fn serial_vm_global_oom_and_swap() {
    let Some((_serial, m, dir, mut img)) = boot() else {
        return;
    };
    img.add_modules(&["virtio_pci", "virtio_blk"]);
    img.add_bytes(
        "etc/swap-storm.toml",
        "include_defaults = false\n\n[[rule]]\nname = \"swap-storm\"\nmetric = \"swap_in_rate\"\n\
         above = \"1MiB\"\nfor = \"1s\"\naction = \"stop\"\n",
        0o644,
    );
    let disk = dir.path().join("swap.img");
    std::fs::File::create(&disk)
        .unwrap()
        .set_len(256 << 20)
        .unwrap();
    let og = "oomguard run --no-tui --quiet";
    let scenario = format!(
        r#"{PRELUDE}
vm_kills() {{ grep '^oom_kill ' /proc/vmstat | cut -d' ' -f2; }}
global() {{
  name=$1; shift
  before=$(vm_kills)
  "$@" </dev/null >/tmp/$name.out 2>/tmp/$name.err
  echo "@@ $name.exit=$?"
  echo "@@ $name.vm_oom_kills=$(( $(vm_kills) - before ))"
  echo "@@ $name.left=$(ls /sys/fs/cgroup | grep oomguard- | tr '\n' ' ')"
  echo "@@ $name.subtree=$(cat /sys/fs/cgroup/cgroup.subtree_control | grep -v 'memory pids' )"
  echo "@@begin $name.log"; cat /tmp/$name.ndjson; echo "@@end $name.log"
  echo "@@begin $name.err"; cat /tmp/$name.err; echo "@@end $name.err"
  echo "@@begin $name.out"; tail -5 /tmp/$name.out; echo "@@end $name.out"
}}
# G1/G2: no cgroup limit; only MemAvailable stands between the leak and the
# global OOM killer. With an owned cgroup (under the root), and without.
global g1 {og} --log /tmp/g1.ndjson -- leak 300 4096
global g2 {og} --cgroup off --log /tmp/g2.ndjson -- leak 300 4096
# G3: observe only: the kernel kills, oomguard explains.
global g3 {og} --policy none --log /tmp/g3.ndjson -- leak 300 4096
echo "@@begin forensics"; oomguard forensics 2>&1; echo "@@end forensics"
# C: no cgroup to read (the root's has no memory files): 2 workers copy the
# 120 MiB they share with their parent 8 s in, and no RSS moves. (Readings
# are slow under emulation: the budget is raised so that it is not what
# decides when the copies are seen.)
global c {og} --cgroup off --pss-budget 10% --log /tmp/c.ndjson -- cow 120 2 8000 24000
# S: swap on a disk; a job holding 200 MiB in a 120 MiB cgroup and writing
# to all of it swaps for real; a swap_in_rate rule stops it.
mkswap /dev/vda >/dev/null && swapon /dev/vda
echo "@@ swap_total=$(grep SwapTotal /proc/meminfo | tr -s ' ' | cut -d' ' -f2)"
MAX=120M run s s {og} --config /etc/swap-storm.toml --log /tmp/s.ndjson -- leak 100 200 0 1
"#
    );
    let b = vm::Boot {
        disks: vec![disk],
        ..vm::Boot::default()
    };
    let out = vm::run_scenario(&m, img, &scenario, &b);
    let get = |n: &str| Run::get(&out, dir.path(), n);
    let clean = |r: &Run| {
        assert_eq!(r.value("left"), "", "{}: cgroups left behind", r.name);
        assert_eq!(
            r.value("subtree"),
            "",
            "{}: root controllers changed",
            r.name
        );
    };

    for (name, owned) in [("g1", true), ("g2", false)] {
        let r = get(name);
        assert_eq!(r.owned(), owned, "{name}: {}", r.not_owned_reason());
        assert_eq!(r.exit(), 75, "{name}: {}", r.err);
        assert_eq!(
            r.num("vm_oom_kills"),
            0,
            "{name}: the global OOM killer fired"
        );
        let stop = r.first_action("stop").expect("no stop");
        eprintln!("{name}: stopped at {stop:.2} s by the system ceiling");
        clean(&r);
    }

    let g3 = get("g3");
    assert!(g3.num("vm_oom_kills") >= 1, "G3: the kernel did not kill");
    assert_eq!(g3.exit(), 137, "G3: {}", g3.err);
    assert_eq!(g3.run_end().outcome, "oom_killed");
    let kill = g3
        .log
        .iter()
        .find_map(|l| match &l.event {
            common::schema::Event::OomKill(v) => Some(v.clone()),
            _ => None,
        })
        .expect("G3: no oom_kill event");
    assert_eq!(kill["comm"], "leak", "G3: {kill}");
    assert!(kill["pid"].is_u64(), "G3: the victim is not named: {kill}");
    common::assert_from_the_kernels_report(&kill);
    let forensics = out.section("forensics").join("\n");
    assert!(forensics.contains("leak"), "forensics: {forensics}");
    clean(&g3);

    // Copy-on-write growth seen without a cgroup: the machine's used memory
    // moved, so the family is read again long before the 60 s renewal.
    let c = get("c");
    assert_eq!(c.exit(), 0, "C: {}", c.err);
    assert!(!c.owned());
    let copied_at = c
        .out
        .lines()
        .filter_map(|l| {
            l.rsplit_once(" at ")?
                .1
                .strip_suffix(" ms")?
                .parse::<f64>()
                .ok()
        })
        .fold(0.0, f64::max)
        / 1000.0;
    assert!(copied_at > 7.0, "C: the workers did not copy: {}", c.out);
    let pss = |l: &common::schema::Line| match &l.event {
        common::schema::Event::Sample(x) => Some((l.t, x.tree.pss_bytes)),
        _ => None,
    };
    let before = c
        .log
        .iter()
        .filter_map(pss)
        .filter(|&(t, _)| t < copied_at - 1.0);
    let shared = before.map(|(_, p)| p).max().unwrap_or(0);
    assert!(
        shared < 200 << 20,
        "C: {} MiB before the copy",
        shared >> 20
    );
    // The family was read while it shared its pages (little is private):
    // what follows is a reading renewed, not a first one.
    let read_shared = c.log.iter().any(|l| match &l.event {
        common::schema::Event::Sample(x) => l.t < copied_at && x.tree.uss_bytes < 60 << 20,
        _ => false,
    });
    assert!(read_shared, "C: the workers were first read after the copy");
    let seen = c.log.iter().filter_map(pss).find(|&(_, p)| p > 300 << 20);
    let (t, p) = seen.unwrap_or_else(|| {
        let series: Vec<String> = c
            .log
            .iter()
            .filter_map(|l| match &l.event {
                common::schema::Event::Sample(x) => Some(format!(
                    "{:.1}s pss {} uss {} rss {} avail {} cg {}",
                    l.t,
                    x.tree.pss_bytes >> 20,
                    x.tree.uss_bytes >> 20,
                    x.tree.rss_bytes >> 20,
                    x.system.mem_available_bytes >> 20,
                    x.cgroup.is_some()
                )),
                _ => None,
            })
            .collect();
        panic!("C: the copies were never counted: {series:#?}")
    });
    eprintln!(
        "C: {} MiB counted {:.1} s after the copy",
        p >> 20,
        t - copied_at
    );
    assert!(
        t - copied_at < 12.0,
        "C: counted {:.1} s late",
        t - copied_at
    );
    clean(&c);

    assert!(
        out.value("swap_total").unwrap().parse::<u64>().unwrap() > 0,
        "no swap"
    );
    let s = get("s");
    assert_eq!(s.exit(), 75, "S: {}", s.err);
    let (mut swap_used, mut swap_in) = (0u64, 0f64);
    for l in &s.log {
        if let common::schema::Event::Sample(x) = &l.event {
            swap_used = swap_used.max(x.system.swap_used_bytes);
            swap_in = swap_in.max(x.system.swap_in_bytes_per_s);
        }
    }
    eprintln!(
        "S: swap used up to {} MiB, swap-in up to {:.1} MiB/s",
        swap_used >> 20,
        swap_in / 1048576.0
    );
    assert!(swap_used > 0 && swap_in > 0.0);
    assert!(s.run_end().peak.swap_used_bytes > 0);
    let fired = s
        .log
        .iter()
        .any(|l| matches!(&l.event, common::schema::Event::Rule(r) if r.rule == "swap-storm"));
    assert!(fired, "S: the swap_in_rate rule did not fire");
    assert_eq!(s.num("oom_kill"), 0);
    s.assert_clean();
    // `RECORD_FIXTURES=DIR`: keep this real swapping run's log as
    // DIR/swap.ndjson (how tests/fixtures/logs/swap.ndjson was recorded).
    if let Some(keep) = std::env::var_os("RECORD_FIXTURES") {
        std::fs::copy(
            dir.path().join("s.ndjson"),
            Path::new(&keep).join("swap.ndjson"),
        )
        .unwrap();
    }
    // The report's swap part, from real swapping.
    let report = common::oomguard()
        .arg("report")
        .arg(dir.path().join("s.ndjson"))
        .args(["--format", "json"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&report.stdout);
    assert!(
        report.status.success(),
        "report: {}",
        String::from_utf8_lossy(&report.stderr)
    );
    assert!(
        text.contains("swap_growth"),
        "the report has no swap finding: {text}"
    );
}

/// Most users are not root: a user's job in a cgroup of root's (a login
/// session's scope, a SLURM job's step), and in one delegated to the user.
#[test]
fn serial_vm_unprivileged_v2() {
    let Some((_serial, m, dir, img)) = boot() else {
        return;
    };
    let og = "asuser 1000 oomguard run --no-tui --quiet";
    let scenario = format!(
        r#"{PRELUDE}
chmod 1777 /tmp
# U1: the job's cgroup is root's, with memory.max 300M: nothing can be
# created, the limit still holds.
run u1 u1 {og} --log /tmp/u1.ndjson -- leak 200 4096
# U2: SLURM's layout: the limit on the job's cgroup, the user's processes
# in a step below it, all root's.
mkdir -p /sys/fs/cgroup/u2/step; echo 300M > /sys/fs/cgroup/u2/memory.max
echo +memory > /sys/fs/cgroup/u2/cgroup.subtree_control
sh -c 'echo $$ > /sys/fs/cgroup/u2/step/cgroup.procs && exec {og} --log /tmp/u2.ndjson -- leak 200 4096' </dev/null >/tmp/u2.out 2>/tmp/u2.err
echo "@@ u2.exit=$?"; report u2 u2
# U3: delegated to the user, as systemd's Delegate=yes does it.
mkdir -p /sys/fs/cgroup/u3
chown 1000:1000 /sys/fs/cgroup/u3 /sys/fs/cgroup/u3/cgroup.procs /sys/fs/cgroup/u3/cgroup.subtree_control /sys/fs/cgroup/u3/cgroup.threads
run u3 u3 {og} --log /tmp/u3.ndjson -- leak 200 4096
"#
    );
    let out = vm::run_scenario(&m, img, &scenario, &vm::Boot::default());
    let get = |n: &str| Run::get(&out, dir.path(), n);
    for (name, owned) in [("u1", false), ("u2", false), ("u3", true)] {
        let r = get(name);
        assert_eq!(r.owned(), owned, "{name}: {}", r.not_owned_reason());
        if !owned {
            let why = r.not_owned_reason();
            assert!(why.contains("ermission"), "{name}: not owned because {why}");
        }
        let ceiling = r
            .run_start()
            .ceilings
            .iter()
            .map(|c| c.bytes)
            .min()
            .unwrap_or(0);
        assert_eq!(ceiling, 300 << 20, "{name}: the limit was not read");
        assert_eq!(r.exit(), 75, "{name}: {}", r.err);
        assert_eq!(r.num("oom_kill"), 0, "{name}: the kernel killed");
        assert!(r.out.contains("checkpoint"), "{name}: no checkpoint");
        let stop = r.first_action("stop").unwrap_or(0.0);
        eprintln!(
            "{name}: stopped at {stop:.2} s, peak {} MiB of 300",
            r.num("peak") >> 20
        );
        if name == "u2" {
            // The scenario itself enabled memory below u2.
            assert_eq!(r.value("left"), "", "u2: cgroups left behind");
        } else {
            r.assert_clean();
        }
    }
}
