//! Prometheus metrics against real tools: `promtool check metrics` on the
//! endpoint and the textfile, a real Prometheus scraping live samples of a
//! real Python job with forked workers, every PromQL expression of the
//! shipped Grafana dashboards evaluated against that Prometheus, and the
//! dashboards' JSON checked as provisioning-ready.
//!
//! `live_samples_scraped_by_prometheus` feeds `Metrics` from the real probes
//! in the test process (the library path `oomguard run` will use);
//! `real_oomguard_run_scraped_by_prometheus` runs the binary with
//! `--metrics-addr` / `--metrics-textfile`.

// The helpers below are test code too; a failed unwrap is a failed test.
#![allow(clippy::unwrap_used)]

use crate::common;
use crate::support::fake_nvml;
use crate::support::prometheus;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use oomguard::engine::probe::cgroup::{self, CgroupReader};
use oomguard::engine::probe::gpu::GpuProbe;
use oomguard::engine::probe::proc::{TreeRoot, TreeScanner, totals};
use oomguard::engine::probe::pss::{Member, PssSweeper, SweepConfig};
use oomguard::engine::probe::system::SystemReader;
use oomguard::sinks::metrics::{
    CONTENT_TYPE, ConstantLabels, Metrics, Textfile, constant_labels_from_env, hostname, serve,
};
use oomguard::vocab::model::{
    CgroupSample, GpuSample, History, ProcSample, Psi, Role, Sample, SystemSample, TreeTotals, View,
};

use common::{MemCgroup, require};
use fake_nvml::FakeNvml;
use prometheus::{Prometheus, labels, value};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------

/// A hand-built sample in which every metric has a value.
fn full_sample() -> Sample {
    let proc = |pid: u32, role: Role, pss: u64| ProcSample {
        pid,
        ppid: 1,
        role,
        comm: "python3".into(),
        rss_bytes: pss * 2,
        pss_bytes: pss,
        uss_bytes: pss / 2,
        swap_bytes: 0,
        rss_peak_bytes: None,
        gpu_bytes: None,
        read_age_seconds: None,
        torch: None,
        start_time: u64::from(pid),
        stopped: false,
    };
    let procs = vec![
        proc(10, Role::Launcher, MIB),
        proc(11, Role::Trainer, 900 * MIB),
        proc(12, Role::Worker, 300 * MIB),
    ];
    let mut tree = totals(&procs);
    tree.swap_bytes = 4096;
    Sample {
        t: 5.0,
        tree,
        procs,
        system: SystemSample {
            mem_total_bytes: 16 * GIB,
            mem_available_bytes: 9 * GIB,
            swap_total_bytes: GIB,
            swap_used_bytes: 8192,
            ..Default::default()
        },
        cgroup: Some(CgroupSample {
            version: 2,
            path: "/job".into(),
            usage_bytes: 1300 * MIB,
            limit_bytes: Some(4 * GIB),
            oom_kill_count: Some(0),
            limit_path: None,
            limit_working_set_bytes: Some(1250 * MIB),
            owned: true,
        }),
        psi: Some(Psi {
            some_avg10: 0.5,
            full_avg10: 0.25,
        }),
        gpus: vec![GpuSample {
            index: 0,
            name: "Fake".into(),
            uuid: "GPU-0000".into(),
            used_bytes: 3 * GIB,
            total_bytes: 16 * GIB,
            free_bytes: 13 * GIB,
            ..Default::default()
        }],
        shm: Some(oomguard::vocab::model::ShmSample {
            size_bytes: 64 * MIB,
            used_bytes: 24 * MIB,
        }),
        budget_bytes: Some(2 * GIB),
        others_bytes: 0,
    }
}

/// A registry fed with [`full_sample`] and a view with an ETA.
fn full_metrics(constant: ConstantLabels) -> Metrics {
    let m = Metrics::new(constant, env!("CARGO_PKG_VERSION"));
    let s = full_sample();
    let view = View {
        t: s.t,
        nearest: s.nearest(),
        eta_seconds: Some(120.0),
        headroom_slope: Some(-1000.0),
        fastest: None,
    };
    m.update(&s, &view);
    m.action("warn");
    m.stopped("stop", "node 1 (rank 3): critical-headroom: headroom 1 GiB");
    m.saved(245);
    m
}

/// The metric names an exposition has samples for.
fn metric_names(text: &str) -> Vec<String> {
    let mut names: Vec<String> = text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(str::to_string)
        .collect();
    names.dedup();
    names
}

/// `serve` on its own current-thread runtime in a thread, as oomguard runs
/// it; stopped (shutdown future completed, thread joined) on drop.
struct Endpoint {
    addr: SocketAddr,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Endpoint {
    fn start(metrics: Metrics) -> Endpoint {
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
                let serving = serve("127.0.0.1:0".parse().unwrap(), metrics, async move {
                    let _ = done_rx.await;
                })
                .await
                .unwrap();
                addr_tx.send(serving.addr).unwrap();
                let _ = stop_rx.await;
                let _ = done_tx.send(());
                let _ = serving.task.await;
            });
        });
        let addr = addr_rx.recv_timeout(Duration::from_secs(10)).unwrap();
        Endpoint {
            addr,
            stop: Some(stop_tx),
            thread: Some(thread),
        }
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A child process killed and reaped on drop, even when the test fails.
struct ChildGuard(Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A training-like job: a trainer holding 32 MiB it shares copy-on-write
/// with two forked DataLoader-style workers (8 MiB private each, then they
/// sleep), growing by `argv[2]` bytes every 100 ms so that the ETA exists,
/// for at most `argv[1]` seconds. The test ends it earlier.
const JOB: &str = r#"
import os, sys, time
duration, grow = float(sys.argv[1]), int(sys.argv[2])
shared = b"\x01" * (32 << 20)
workers = []
for _ in range(2):
    pid = os.fork()
    if pid == 0:
        private = b"\x02" * (8 << 20)
        time.sleep(duration)
        os._exit(0)
    workers.append(pid)
chunks = []
end = time.time() + duration
while time.time() < end:
    chunks.append(b"\x03" * grow)
    time.sleep(0.1)
for pid in workers:
    os.waitpid(pid, 0)
"#;

/// Job length cap; the tests stop it as soon as they have checked.
const JOB_SECONDS: &str = "45";
/// 256 KiB every 100 ms: 2.5 MiB/s, at most about 110 MiB.
const JOB_GROWTH: &str = "262144";

/// The fake GPU the samples carry (there is no GPU on these machines; the
/// real nvml-wrapper path reads it from the test suite's fake NVML).
const GPU_SCENARIO: &str = "driver_version=550.54.15\n\
    gpu=0 total=17179869184 reserved=536870912 used=2147483648 grow=1048576 util=40 uuid=GPU-fake-0000 name=Fake GPU\n";

fn python_available() -> bool {
    Command::new("python3")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Samples the job's tree with the real probes every 250 ms and feeds the
/// registry and the textfile, until dropped.
struct Feeder {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Feeder {
    fn start(job_pid: u32, metrics: Metrics, textfile: Textfile, nvml: PathBuf) -> Feeder {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let proc_root = PathBuf::from("/proc");
            let mut scanner = TreeScanner::new(&proc_root, TreeRoot::Process(job_pid));
            scanner.set_job(Some(job_pid));
            let sweeper = PssSweeper::start(
                proc_root.clone(),
                SweepConfig {
                    interval: Duration::from_millis(500),
                    budget: SweepConfig::DEFAULT_BUDGET,
                },
            );
            let mut system = SystemReader::new(&proc_root);
            let cg = cgroup::locate(&proc_root, &job_pid.to_string())
                .map(|l| CgroupReader::new(l, false));
            let mut gpu = GpuProbe::open(Some(&nvml)).expect("open the fake NVML");
            let mut history = History::new(30.0);
            let started = Instant::now();
            while !flag.load(Ordering::Relaxed) {
                let now = Instant::now();
                let mut procs: Vec<ProcSample> = scanner
                    .scan(None)
                    .into_iter()
                    .filter(|f| f.stat.state != 'Z')
                    .map(ProcSample::from)
                    .collect();
                sweeper.set_targets(procs.iter().map(Member::from).collect(), None, false);
                let age = sweeper.apply(&mut procs, now);
                let mut tree: TreeTotals = totals(&procs);
                tree.pss_age_seconds = age;
                let gpus = gpu
                    .sample()
                    .map(|r| {
                        r.devices
                            .iter()
                            .map(|d| GpuSample {
                                index: d.index,
                                name: d.name.clone(),
                                uuid: d.uuid.clone(),
                                used_bytes: d.used_bytes,
                                total_bytes: d.total_bytes,
                                free_bytes: d.free_bytes,
                                reserved_bytes: d.reserved_bytes,
                                util_percent: d.util_percent,
                                ..Default::default()
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                let sample = Sample {
                    t: now.duration_since(started).as_secs_f64(),
                    tree,
                    procs,
                    system: system.read(now),
                    cgroup: cg.as_ref().and_then(CgroupReader::read),
                    psi: system.psi(),
                    gpus,
                    shm: None,
                    budget_bytes: Some(512 * MIB),
                    others_bytes: 0,
                };
                let view = history.push(&sample);
                metrics.update(&sample, &view);
                textfile.write(&metrics.render()).unwrap();
                std::thread::sleep(Duration::from_millis(250));
            }
        });
        Feeder {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Feeder {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Values the dashboards' template variables take in these tests.
fn dashboard_vars(job: &str) -> BTreeMap<&'static str, String> {
    [
        ("datasource", "prometheus".to_string()),
        ("job", job.to_string()),
        ("job_id", "42".to_string()),
        ("node", hostname().unwrap_or_else(|| ".*".into())),
        ("rank", "3".to_string()),
    ]
    .into_iter()
    .collect()
}

/// What a scrape of the test job must show in Prometheus: the series with
/// the constant labels, plausible values, no pid labels. `gpu`: whether
/// GPU series must be there.
fn check_scraped(prom: &Prometheus, gpu: bool) {
    let sel = r#"job_id="42",rank="3""#;
    let pss = prom.wait_for(
        &format!("oomguard_tree_pss_bytes{{{sel}}}"),
        Duration::from_secs(30),
    );
    assert_eq!(pss.len(), 1, "{pss:?}\ntargets: {}", prom.targets());
    let l = labels(&pss[0]);
    assert_eq!(l.get("job").map(String::as_str), Some(prom.job.as_str()));
    assert_eq!(l.get("node"), hostname().as_ref(), "{l:?}");
    assert!(!l.keys().any(|k| k.contains("pid")), "{l:?}");
    // Let the sweeper measure the workers and the ETA window fill.
    let eta = prom.wait_for(
        &format!("oomguard_eta_seconds{{{sel}}} and on() oomguard_role_pss_bytes{{role=\"worker\",{sel}}} > 16000000"),
        Duration::from_secs(30),
    );
    assert!(
        !eta.is_empty(),
        "no ETA with measured workers; targets: {}",
        prom.targets()
    );

    let one = |q: &str| -> f64 {
        let r = prom.query(q);
        assert_eq!(r.len(), 1, "{q}: {r:?}");
        value(&r[0])
    };
    let pss = one(&format!("oomguard_tree_pss_bytes{{{sel}}}"));
    let rss = one(&format!("oomguard_tree_rss_bytes{{{sel}}}"));
    let worker = one(&format!("oomguard_role_pss_bytes{{role=\"worker\",{sel}}}"));
    let trainer = one(&format!(
        "oomguard_role_pss_bytes{{role=\"trainer\",{sel}}}"
    ));
    // 32 MiB shared + 2 × 8 MiB private + growth + interpreters.
    assert!(
        (48.0 * MIB as f64..1.0 * GIB as f64).contains(&pss),
        "tree PSS {pss}"
    );
    // The RSS sum counts the 32 MiB the workers share three times.
    assert!(rss > pss + 32.0 * MIB as f64, "RSS sum {rss} vs PSS {pss}");
    // PSS splits the shared 32 MiB three ways: each worker has 8 MiB of
    // its own plus a third, the trainer a third plus what it grew.
    assert!(worker > 16.0 * MIB as f64, "worker PSS {worker}");
    assert!(trainer > 10.0 * MIB as f64, "trainer PSS {trainer}");
    assert!(
        worker + trainer <= pss + 1.0,
        "roles {worker} + {trainer} > tree {pss}"
    );
    let roles = prom.query(&format!("oomguard_role_pss_bytes{{{sel}}}"));
    assert_eq!(roles.len(), 4, "{roles:?}");
    let eta = one(&format!("oomguard_eta_seconds{{{sel}}}"));
    assert!(eta > 0.0, "eta {eta}");
    let headroom = one(&format!("oomguard_headroom_bytes{{{sel}}}"));
    assert!(
        headroom > 0.0 && headroom < 512.0 * MIB as f64,
        "headroom {headroom}"
    );
    let budget = one(&format!(
        "oomguard_ceiling_bytes{{source=\"budget\",{sel}}}"
    ));
    assert_eq!(budget, 512.0 * MIB as f64);
    let actions = prom.query(&format!("oomguard_actions_total{{{sel}}}"));
    assert_eq!(actions.len(), 6, "{actions:?}");
    let info = prom.query(&format!("oomguard_build_info{{{sel}}}"));
    assert_eq!(
        labels(&info[0]).get("version").map(String::as_str),
        Some(env!("CARGO_PKG_VERSION"))
    );
    if gpu {
        let used = one(&format!(
            "oomguard_gpu_memory_used_bytes{{gpu=\"0\",uuid=\"GPU-fake-0000\",{sel}}}"
        ));
        assert!(used >= 2.0 * GIB as f64, "GPU used {used}");
    }
}

/// Every dashboard expression has data in `prom`; every annotation's
/// query is one Prometheus takes.
fn check_dashboards_have_data(prom: &Prometheus, gpu: bool) {
    let vars = dashboard_vars(&prom.job);
    for (_, d) in prometheus::dashboards() {
        for (_, expr) in prometheus::annotation_exprs(&d) {
            prom.query(&prometheus::substitute(&expr, &vars));
        }
    }
    let empty = prometheus::empty_dashboard_queries(prom, &vars, |expr| {
        !gpu && expr.contains("oomguard_gpu_")
    });
    assert!(
        empty.is_empty(),
        "dashboard queries without data:\n{}",
        empty.join("\n")
    );
}

// ---------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------

#[test]
fn dashboards_are_provisioning_ready() {
    let _machine = common::machine::beside();
    let known: Vec<String> = metric_names(&full_metrics(ConstantLabels::new()).render());
    let boards = prometheus::dashboards();
    let names: Vec<&str> = boards.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["oomguard-job.json", "oomguard-multinode.json"]);
    let mut uids = Vec::new();
    let metric_re = regex::Regex::new(r"oomguard_[a-z0-9_]+").unwrap();
    for (file, d) in &boards {
        let raw = serde_json::to_string(d).unwrap();
        let uid = d["uid"].as_str().unwrap_or_else(|| panic!("{file}: uid"));
        assert!((8..=40).contains(&uid.len()), "{file}: uid {uid}");
        uids.push(uid.to_string());
        assert!(
            !d["title"].as_str().unwrap_or_default().is_empty(),
            "{file}: title"
        );
        assert!(
            d["id"].is_null(),
            "{file}: id must be null for provisioning"
        );
        assert!(
            d["schemaVersion"].as_u64().unwrap_or(0) >= 39,
            "{file}: schemaVersion"
        );
        assert!(
            d["tags"]
                .as_array()
                .unwrap()
                .iter()
                .any(|t| t == "oomguard")
        );
        for import_only in ["__inputs", "__requires", "__elements"] {
            assert!(d.get(import_only).is_none(), "{file}: {import_only}");
        }
        assert!(
            !raw.contains("DS_PROMETHEUS"),
            "{file}: import-only datasource"
        );

        let vars = d["templating"]["list"].as_array().unwrap();
        assert!(
            vars.iter().any(|v| v["type"] == "datasource"
                && v["query"] == "prometheus"
                && v["name"] == "datasource"),
            "{file}: needs a prometheus datasource variable named datasource"
        );
        for v in vars.iter().filter(|v| v["type"] == "query") {
            assert_eq!(v["datasource"]["uid"], "${datasource}", "{file}: {v}");
        }
        let var_names: BTreeMap<&str, String> = vars
            .iter()
            .filter_map(|v| v["name"].as_str())
            .map(|n| (n, ".*".to_string()))
            .collect();

        let mut ids = Vec::new();
        for p in prometheus::panels(d) {
            let title = p["title"].as_str().unwrap_or_default();
            ids.push(
                p["id"]
                    .as_u64()
                    .unwrap_or_else(|| panic!("{file}: {title}: id")),
            );
            let g = &p["gridPos"];
            let (x, w) = (g["x"].as_u64().unwrap(), g["w"].as_u64().unwrap());
            assert!(x + w <= 24 && g["h"].as_u64().is_some() && g["y"].as_u64().is_some());
            if p["type"] == "row" {
                continue;
            }
            assert_eq!(
                p["datasource"],
                serde_json::json!({"type": "prometheus", "uid": "${datasource}"}),
                "{file}: {title}"
            );
            assert!(
                p["fieldConfig"]["defaults"]["unit"].is_string(),
                "{file}: {title}: unit"
            );
            let targets = p["targets"].as_array().unwrap();
            assert!(!targets.is_empty(), "{file}: {title}: no targets");
            let mut refs = Vec::new();
            for t in targets {
                refs.push(t["refId"].as_str().unwrap().to_string());
                assert_eq!(t["datasource"]["uid"], "${datasource}", "{file}: {title}");
                let expr = t["expr"].as_str().unwrap();
                // Unknown variables panic here.
                prometheus::substitute(expr, &var_names);
                for m in metric_re.find_iter(expr) {
                    assert!(
                        known.iter().any(|k| k == m.as_str()),
                        "{file}: {title}: {} is not an exported metric",
                        m.as_str()
                    );
                }
            }
            let n = refs.len();
            refs.sort();
            refs.dedup();
            assert_eq!(refs.len(), n, "{file}: {title}: duplicate refId");
        }
        let n = ids.len();
        ids.sort_unstable();
        ids.dedup();
        assert_eq!(ids.len(), n, "{file}: duplicate panel ids");
        // The stop (with its cause node) and the checkpoint as
        // annotations at the time the series holds.
        let notes = prometheus::annotation_exprs(d);
        assert_eq!(notes.len(), 2, "{file}: annotations {notes:?}");
        for (name, expr) in &notes {
            prometheus::substitute(expr, &var_names);
            for m in metric_re.find_iter(expr) {
                assert!(
                    known.iter().any(|k| k == m.as_str()),
                    "{file}: annotation {name}: {} is not an exported metric",
                    m.as_str()
                );
            }
        }
    }
    uids.sort();
    uids.dedup();
    assert_eq!(uids.len(), boards.len(), "uids must be unique");

    let (_, job) = &boards[0];
    for v in ["job_id", "node", "rank"] {
        assert!(
            job["templating"]["list"]
                .as_array()
                .unwrap()
                .iter()
                .any(|x| x["name"] == v),
            "job dashboard: variable {v}"
        );
    }
    // The multi-node board leads with the ranks sorted by headroom.
    let (_, multi) = &boards[1];
    let first = prometheus::panels(multi)
        .into_iter()
        .find(|p| p["type"] == "table")
        .unwrap();
    assert!(
        first["targets"][0]["expr"]
            .as_str()
            .unwrap()
            .starts_with("min by (node, rank) (oomguard_headroom_bytes"),
        "{first}"
    );
    assert!(
        first["transformations"]
            .as_array()
            .unwrap()
            .iter()
            .any(|t| t["id"] == "sortBy" && t["options"]["sort"][0]["desc"] == false)
    );
}

#[test]
fn promtool_accepts_the_endpoint_and_the_textfile() {
    let _machine = common::machine::beside();
    if !require(
        prometheus::tools_installed(),
        "prometheus/promtool not installed (apt-get install prometheus)",
    ) {
        return;
    }
    // Label values that need escaping travel through promtool's parser.
    let constant = constant_labels_from_env(
        [("SLURM_JOB_ID", "42"), ("RANK", "3"), ("LOCAL_RANK", "1")],
        Some("node \"a\" \\ b"),
    );
    let empty = Metrics::new(constant.clone(), "0.1.0");
    prometheus::promtool_check_metrics(&empty.render()).unwrap();

    let metrics = full_metrics(constant);
    let endpoint = Endpoint::start(metrics.clone());
    let r = prometheus::http_get(endpoint.addr, "/metrics").unwrap();
    assert_eq!(r.status, 200, "{r:?}");
    assert_eq!(r.header("content-type"), Some(CONTENT_TYPE));
    let names = metric_names(&r.body);
    assert_eq!(names.len(), 23, "every metric of design.md §4.4: {names:?}");
    // A /dev/shm smaller than half the machine is a ceiling like the others.
    assert!(
        r.body
            .lines()
            .any(|l| l.starts_with("oomguard_ceiling_bytes{")
                && l.contains("source=\"shm\"")
                && l.ends_with(" 67108864")),
        "{}",
        r.body
    );
    prometheus::promtool_check_metrics(&r.body).unwrap();
    assert_eq!(
        prometheus::http_get(endpoint.addr, "/").unwrap().status,
        404
    );

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("oomguard.prom");
    let textfile = Textfile::new(&path);
    textfile.write(&metrics.render()).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    assert_eq!(text, r.body, "the textfile and the endpoint say the same");
    prometheus::promtool_check_metrics(&text).unwrap();
    drop(textfile);
    assert!(!path.exists(), "removed at exit");
}

#[test]
fn live_samples_scraped_by_prometheus() {
    let _machine = common::machine::beside();
    if !require(
        prometheus::tools_installed(),
        "prometheus/promtool not installed (apt-get install prometheus)",
    ) || !require(python_available(), "python3 not installed")
    {
        return;
    }
    // The job grows on purpose: it runs in a memory cgroup with a limit.
    let Some(cg) = MemCgroup::or_skip("metrics-live", GIB) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let job_py = common::script(dir.path(), "job.py", JOB);
    let job = ChildGuard(
        cg.command(
            Path::new("python3"),
            &[job_py.to_str().unwrap(), JOB_SECONDS, JOB_GROWTH],
        )
        .stdout(Stdio::null())
        .spawn()
        .unwrap(),
    );
    let pid = job.0.id();
    // Wait until sh has moved itself into the cgroup and exec'd python.
    assert!(common::wait_for(Duration::from_secs(10), || {
        std::fs::read_to_string(format!("/proc/{pid}/cgroup")).is_ok_and(|c| c.contains(&cg.path))
            && std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|c| c.starts_with("python"))
    }));

    let constant = constant_labels_from_env(
        [("SLURM_JOB_ID", "42"), ("RANK", "3")],
        hostname().as_deref(),
    );
    let metrics = Metrics::new(constant, env!("CARGO_PKG_VERSION"));
    let fake = FakeNvml::new(GPU_SCENARIO);
    let textfile_path = dir.path().join("oomguard.prom");
    let feeder = Feeder::start(
        pid,
        metrics.clone(),
        Textfile::new(&textfile_path),
        fake.lib_path().to_path_buf(),
    );
    let endpoint = Endpoint::start(metrics);
    let prom = Prometheus::start("oomguard-live", &[endpoint.addr]);

    check_scraped(&prom, true);
    check_dashboards_have_data(&prom, true);

    // promtool on what Prometheus just scraped and on the textfile.
    let scraped = prometheus::http_get(endpoint.addr, "/metrics")
        .unwrap()
        .body;
    prometheus::promtool_check_metrics(&scraped).unwrap();
    let text = std::fs::read_to_string(&textfile_path).unwrap();
    prometheus::promtool_check_metrics(&text).unwrap();
    assert!(text.contains("oomguard_tree_pss_bytes{"), "{text}");
    assert!(text.contains("oomguard_footprint_bytes{"), "{text}");

    drop(feeder);
    assert!(
        !textfile_path.exists(),
        "textfile removed when its writer ends"
    );
    drop(prom);
    drop(endpoint);
    drop(job);
}

#[test]
fn real_oomguard_run_scraped_by_prometheus() {
    let _machine = common::machine::beside();
    if !require(
        prometheus::tools_installed(),
        "prometheus/promtool not installed (apt-get install prometheus)",
    ) || !require(python_available(), "python3 not installed")
    {
        return;
    }
    let Some(cg) = MemCgroup::or_skip("metrics-run", GIB) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let job_py = common::script(dir.path(), "job.py", JOB);
    let textfile = dir.path().join("oomguard.prom");
    let log = dir.path().join("run.ndjson");
    let port = prometheus::free_port();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    // NVML is loaded by soname, so the fake is found on the library path
    // (and its scenario beside it).
    let fake = FakeNvml::new(GPU_SCENARIO);

    let oomguard = Path::new(env!("CARGO_BIN_EXE_oomguard"));
    let mut cmd = cg.command(
        oomguard,
        &[
            "run",
            "-q",
            "--metrics-addr",
            &addr.to_string(),
            "--metrics-textfile",
            textfile.to_str().unwrap(),
            "--log",
            log.to_str().unwrap(),
            "--budget",
            "512MiB",
            "--interval",
            "250ms",
            "--pss-interval",
            "500ms",
            "--",
            "python3",
            job_py.to_str().unwrap(),
            JOB_SECONDS,
            JOB_GROWTH,
        ],
    );
    cmd.env_remove("GITHUB_ACTIONS")
        .env_remove("GITHUB_STEP_SUMMARY")
        .env_remove("RANK")
        .env_remove("LOCAL_RANK")
        .env_remove("SLURM_PROCID")
        .env_remove("SLURM_LOCALID")
        .env("SLURM_JOB_ID", "42")
        .env("RANK", "3")
        .env("LD_LIBRARY_PATH", fake.dir())
        .stdout(Stdio::null());
    let mut run = ChildGuard(cmd.spawn().unwrap());

    // The endpoint is up once oomguard has started.
    assert!(
        common::wait_for(Duration::from_secs(20), || {
            prometheus::http_get(addr, "/metrics").is_ok_and(|r| r.status == 200)
        }),
        "no /metrics on {addr}"
    );
    let prom = Prometheus::start("oomguard-run", &[addr]);

    // The fake NVML is on the library path: the GPU series are required (a
    // run that failed to load it must not pass by skipping them).
    let gpu = std::fs::read_to_string(&log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["event"] == "run_start")
        .is_some_and(|v| v["gpu"]["available"] == true);
    assert!(gpu, "oomguard did not load the fake NVML");
    check_scraped(&prom, gpu);
    check_dashboards_have_data(&prom, gpu);

    let r = prometheus::http_get(addr, "/metrics").unwrap();
    assert_eq!(r.header("content-type"), Some(CONTENT_TYPE));
    prometheus::promtool_check_metrics(&r.body).unwrap();
    let text = std::fs::read_to_string(&textfile).unwrap();
    prometheus::promtool_check_metrics(&text).unwrap();

    // SIGTERM to oomguard: forwarded to the job, which dies of it; then
    // oomguard removes its textfile and closes the port.
    common::send(run.0.id(), "TERM");
    let give_up = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(st) = run.0.try_wait().unwrap() {
            break st;
        }
        assert!(
            Instant::now() < give_up,
            "oomguard did not exit after SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(status.code(), Some(143), "{status:?}");
    assert!(!textfile.exists(), "textfile left behind at exit");
    assert!(
        prometheus::http_get(addr, "/metrics").is_err(),
        "endpoint still up"
    );
}

/// Sixty-four clients that connect, send half a request and wait must not
/// keep Prometheus-style scrapes of a real run from being answered.
#[test]
fn idle_sockets_do_not_starve_scrapes_of_a_real_run() {
    let _machine = common::machine::beside();
    let addr: SocketAddr = format!("127.0.0.1:{}", prometheus::free_port())
        .parse()
        .unwrap();
    let mut run = ChildGuard(
        common::oomguard()
            .args(["run", "-q", "--metrics-addr", &addr.to_string(), "--"])
            .args(["sleep", "60"])
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    assert!(
        common::wait_for(Duration::from_secs(20), || {
            prometheus::http_get(addr, "/metrics").is_ok_and(|r| r.status == 200)
        }),
        "no /metrics on {addr}"
    );
    let mut idle = Vec::new();
    for _ in 0..64 {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        std::io::Write::write_all(&mut s, b"GET /metr").unwrap();
        idle.push(s);
    }
    std::thread::sleep(Duration::from_millis(200));
    let mut served = 0;
    for _ in 0..9 {
        if let Ok(r) = prometheus::http_get(addr, "/metrics")
            && r.status == 200
            && r.body.contains("oomguard_build_info")
        {
            served += 1;
        }
    }
    assert_eq!(served, 9, "scrapes answered while 64 idle sockets are held");
    common::send(run.0.id(), "TERM");
    let _ = run.0.wait();
    drop(idle);
}

/// `--metrics-addr 0.0.0.0:…` exposes the endpoint to the network: say so.
#[test]
fn a_non_loopback_metrics_address_is_warned_about() {
    let _machine = common::machine::beside();
    let out = common::oomguard()
        .args(["run", "--metrics-addr", "0.0.0.0:0", "--", "true"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("every network interface"), "{err}");
    let out = common::oomguard()
        .args(["run", "--metrics-addr", "127.0.0.1:0", "--", "true"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("warning"), "{err}");
}
