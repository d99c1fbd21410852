//! Kernel OOM-report parsing and live kernel-log reading.
//!
//! Expected values in the fixture tests were read off the fixture text by
//! hand (sizes in the log are kB, so `kb(n)` is `n * 1024` bytes).

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use oomguard::vocab::forensics::kernel::{
    Evidence, Invoker, OomKill, TaskRow, find_pid, parse, render_json, render_text,
};
use oomguard::vocab::forensics::kmsg::{LogSource, read_kernel_log};
use proptest::prelude::*;

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/kernel-logs");

fn fixture(name: &str) -> String {
    let path = Path::new(FIXTURES).join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn kb(n: u64) -> Option<u64> {
    Some(n * 1024)
}

/// Compares the fields every fixture test checks.
#[track_caller]
fn assert_kill(
    k: &OomKill,
    pid: u32,
    comm: &str,
    sizes: [Option<u64>; 4],
    constraint: Option<&str>,
    cgroup: Option<&str>,
) {
    assert_eq!(k.pid, pid, "pid of {k:#?}");
    assert_eq!(k.comm, comm, "comm of pid {pid}");
    assert_eq!(
        [
            k.total_vm_bytes,
            k.anon_rss_bytes,
            k.file_rss_bytes,
            k.shmem_rss_bytes
        ],
        sizes,
        "total-vm, anon-rss, file-rss, shmem-rss of pid {pid}"
    );
    assert_eq!(
        k.constraint.as_deref(),
        constraint,
        "constraint of pid {pid}"
    );
    assert_eq!(k.cgroup.as_deref(), cgroup, "cgroup of pid {pid}");
}

fn row(k: &OomKill, pid: u32) -> &TaskRow {
    k.tasks
        .iter()
        .find(|t| t.pid == pid)
        .unwrap_or_else(|| panic!("no task row {pid} in {:?}", k.tasks))
}

// ---------------------------------------------------------------------------
// The shared fixtures.

#[test]
fn fixture_00_local_memcg_v1_two_kills() {
    let _machine = common::machine::beside();
    let kills = parse(&fixture("00-local-6.18-memcg-v1-two-kills.txt"));
    assert_eq!(kills.len(), 2);

    let k = &kills[0];
    let cg = "/process_api/df4e53474e114f8a6a9b8f1548078aff/ceotest";
    assert_kill(
        k,
        2045,
        "python3",
        [kb(272_664), kb(261_376), kb(1760), kb(0)],
        Some("memcg"),
        Some(cg),
    );
    assert_eq!((k.uid, k.oom_score_adj), (Some(0), Some(0)));
    assert_eq!(k.oom_memcg.as_deref(), Some(cg));
    assert_eq!(k.kernel_constraint.as_deref(), Some("CONSTRAINT_MEMCG"));
    assert_eq!(k.ts.as_deref(), Some("163.793217"));
    assert_eq!(k.uptime_seconds, Some(163.793_217));
    assert_eq!(k.kernel_version.as_deref(), Some("6.18.44-fc-v669"));
    assert_eq!(
        (k.memcg_usage_bytes, k.memcg_limit_bytes),
        (kb(262_144), kb(262_144))
    );
    assert_eq!(
        k.invoker,
        Some(Invoker {
            comm: "python3".into(),
            pid: Some(2045),
            gfp_mask: Some("0xcc0".into()),
            gfp_flags: Some("GFP_KERNEL".into()),
            order: Some(0),
            oom_score_adj: Some(0),
        })
    );
    assert_eq!(
        k.tasks,
        vec![TaskRow {
            pid: 2045,
            uid: Some(0),
            tgid: Some(2045),
            total_vm_pages: Some(68_166),
            rss_pages: Some(65_784),
            rss_anon_pages: Some(65_344),
            rss_file_pages: Some(440),
            rss_shmem_pages: Some(0),
            pgtables_bytes: Some(593_920),
            nr_ptes: None,
            nr_pmds: None,
            swapents: Some(0),
            oom_score_adj: Some(0),
            oom_adj: None,
            cpu: None,
            name: "python3".into(),
        }]
    );
    assert_eq!(k.page_size_bytes, Some(4096));
    assert_eq!(
        (k.reaped, k.selected.as_ref(), k.evidence),
        (None, None, Evidence::KilledProcess)
    );

    // The invoker (9015) is not the victim (9016): a DataLoader-style worker
    // hit the limit and the kernel chose its biggest sibling.
    let k = &kills[1];
    let cg = "/process_api/df4e53474e114f8a6a9b8f1548078aff/acc1";
    assert_kill(
        k,
        9016,
        "pt_data_worker",
        [kb(4_001_580), kb(809_456), kb(20_408), kb(0)],
        Some("memcg"),
        Some(cg),
    );
    assert_eq!(k.ts.as_deref(), Some("433.732038"));
    let inv = k.invoker.as_ref().expect("invoker");
    assert_eq!((inv.comm.as_str(), inv.pid), ("pt_data_worker", Some(9015)));
    assert_eq!(inv.gfp_mask.as_deref(), Some("0x100cca"));
    assert_eq!(inv.gfp_flags.as_deref(), Some("GFP_HIGHUSER_MOVABLE"));
    let pids: Vec<u32> = k.tasks.iter().map(|t| t.pid).collect();
    assert_eq!(pids, [8936, 9015, 9016, 9017, 9018]);
    assert_eq!(row(k, 9016).rss_pages, Some(207_466));
    assert_eq!(row(k, 8936).rss_file_pages, Some(56_632));
    assert_eq!(
        (k.memcg_usage_bytes, k.memcg_limit_bytes),
        (kb(2_097_152), kb(2_097_152))
    );
}

#[test]
fn fixture_01_raw_kmsg_records_with_wrapped_lines() {
    let _machine = common::machine::beside();
    let kills = parse(&fixture("01-kmsg-raw-records-mixed-nohang.txt"));
    // Four unrelated records from different kernels: a selection whose
    // kill line is not included, two kills, and an oom_reaper line whose
    // kill is not included.
    assert_eq!(kills.len(), 4, "{kills:#?}");

    let k = &kills[0];
    assert_kill(k, 1061, "tail", [None; 4], Some("global"), None);
    assert_eq!(k.evidence, Evidence::Selection);
    let sel = k.selected.as_ref().expect("selection");
    assert_eq!((sel.pid, sel.score), (1061, Some(917)));
    assert_eq!(k.ts.as_deref(), Some("248.095206"));

    let k = &kills[1];
    assert_kill(
        k,
        9277,
        "tail",
        [kb(783_724), kb(566_796), kb(1508), kb(0)],
        Some("global"),
        None,
    );
    assert_eq!(k.uid, Some(1000));
    assert_eq!(k.ts.as_deref(), Some("7208.057400"));

    let k = &kills[2];
    assert_kill(
        k,
        2497,
        "tail",
        [kb(6_468_944), kb(3_013_188), kb(1676), kb(0)],
        Some("memcg"),
        None,
    );
    // `UID\n : 1000` was split by the person who wrapped the record.
    assert_eq!((k.uid, k.oom_score_adj), (Some(1000), Some(0)));
    // The invoker record (seq 2928853) is 15 hours later: not this report.
    assert_eq!(k.invoker, None);

    let k = &kills[3];
    assert_kill(k, 15512, "tail", [None; 4], None, None);
    assert_eq!((k.evidence, k.reaped), (Evidence::Reaper, Some(true)));
}

#[test]
fn fixture_03_old_selection_then_kill_without_shmem() {
    let _machine = common::machine::beside();
    let kills = parse(&fixture(
        "03-dmesg-old-python2-sacrifice-child-no-shmem.txt",
    ));
    assert_eq!(kills.len(), 1);
    let k = &kills[0];
    assert_kill(
        k,
        21518,
        "python2",
        [kb(13_345_928), kb(12_721_928), kb(4), None],
        Some("global"),
        None,
    );
    assert_eq!((k.uid, k.oom_score_adj), (None, None));
    assert_eq!(k.evidence, Evidence::KilledProcess);
    let sel = k.selected.as_ref().expect("selection");
    assert_eq!(
        (sel.pid, sel.comm.as_str(), sel.score),
        (21518, "python2", Some(752))
    );
    assert_eq!(k.ts.as_deref(), Some("35881895.792304"));
}

#[test]
fn fixture_05_syslog_several_kills_and_comm_with_parentheses() {
    let _machine = common::machine::beside();
    let kills = parse(&fixture("05-syslog-multikill-python3-oom_reaper.txt"));
    let python = [kb(11_964), kb(4288), kb(3028), kb(0)];
    let resolved = [kb(168_424), kb(4064), kb(3584), kb(0)];
    let expected = [
        (15784, "python3", python, 518.050_606),
        (15925, "(resolved)", resolved, 518.061_172),
        (15783, "python3", python, 518.070_786),
        (15934, "(resolved)", resolved, 518.078_584),
    ];
    assert_eq!(kills.len(), expected.len());
    for (k, (pid, comm, sizes, uptime)) in kills.iter().zip(expected) {
        assert_kill(k, pid, comm, sizes, Some("global"), None);
        assert_eq!(k.reaped, Some(true), "reaped {pid}");
        assert_eq!(k.ts.as_deref(), Some("May 15 23:09:30"));
        assert_eq!(k.uptime_seconds, Some(uptime));
        assert_eq!((k.uid, &k.invoker), (None, &None));
    }
}

#[test]
fn fixture_07_iso_timestamps_grep_filtered() {
    let _machine = common::machine::beside();
    let kills = parse(&fixture("07-dmesg-iso8601-global-perl-oom_reaper.txt"));
    assert_eq!(kills.len(), 1);
    let k = &kills[0];
    assert_kill(
        k,
        1_440_763,
        "perl",
        [kb(87_033_376), kb(60_356_340), kb(0), kb(0)],
        Some("global"),
        Some("/user.slice/user-21417.slice/user@21417.service"),
    );
    assert_eq!((k.uid, k.oom_score_adj), (Some(21417), Some(0)));
    assert_eq!(k.ts.as_deref(), Some("2024-04-29T14:55:41,679700+02:00"));
    assert_eq!(k.kernel_constraint.as_deref(), Some("CONSTRAINT_NONE"));
    assert_eq!(k.oom_memcg, None);
    // The reaper came 5 s later.
    assert_eq!(k.reaped, Some(true));
    let inv = k.invoker.as_ref().expect("invoker");
    assert_eq!((inv.comm.as_str(), inv.pid), ("pool", None));
    assert_eq!(inv.gfp_mask.as_deref(), Some("0x6200ca"));
    assert_eq!((inv.order, inv.oom_score_adj), (Some(0), Some(0)));
    // The table header survived the grep, its rows did not.
    assert!(k.tasks.is_empty());
}

#[test]
fn fixture_09_memcg_fragments_do_not_mix() {
    let _machine = common::machine::beside();
    let kills = parse(&fixture(
        "09-dmesg-memcg-v1-k8s-5.4-azure-triton-fragments.txt",
    ));
    assert_eq!(kills.len(), 1);
    let k = &kills[0];
    let pod = "/kubepods/burstable/podcb040dc7-7546-49e2-ae77-320dc45ed2ce";
    let container =
        format!("{pod}/a82e417e149bceb2f24a3c73f90fd97b033185a234846eff07c07c4e32ca59a0");
    assert_kill(
        k,
        59249,
        "tritonserver",
        [kb(38_974_820), kb(98_544), kb(319_140), kb(6144)],
        Some("memcg"),
        Some(&container),
    );
    assert_eq!(k.oom_memcg.as_deref(), Some(pod));
    // uid from the summary; oom_score_adj from the victim's row (the kill
    // line was cut before it).
    assert_eq!((k.uid, k.oom_score_adj), (Some(0), Some(999)));
    // The invoker (python3, at 36507 s) and the memcg counters (44517 s)
    // belong to earlier reports than this kill (44930 s).
    assert_eq!(k.invoker, None);
    assert_eq!((k.memcg_usage_bytes, k.memcg_limit_bytes), (None, None));
    // Same boot, so the kernel release printed earlier still applies.
    assert_eq!(k.kernel_version.as_deref(), Some("5.4.0-1072-azure"));
    assert_eq!(k.tasks.len(), 6);
    let victim = row(k, 59249);
    assert_eq!(
        (
            victim.total_vm_pages,
            victim.rss_pages,
            victim.pgtables_bytes
        ),
        (Some(9_743_705), Some(105_957), Some(1_683_456))
    );
    assert_eq!(row(k, 7857).oom_score_adj, Some(-998));
    assert_eq!(row(k, 7857).uid, Some(65535));
    assert_eq!(k.page_size_bytes, Some(4096));
}

#[test]
fn fixture_12_global_rss_anon_table_without_header() {
    let _machine = common::machine::beside();
    let kills = parse(&fixture("12-dmesg-debian-6.11-global-python-rss_anon.txt"));
    // `OOM killer disabled.` / `enabled.` and `Purging GPU memory` are not kills.
    assert_eq!(kills.len(), 1);
    let k = &kills[0];
    assert_kill(
        k,
        18024,
        "python",
        [kb(27_928_488), kb(27_910_400), kb(0), kb(0)],
        Some("global"),
        Some(
            "/user.slice/user-1000.slice/user@1000.service/app.slice/app-graphical.slice/app-Hyprland-qterminal@02f77be1.service",
        ),
    );
    assert_eq!((k.uid, k.oom_score_adj), (Some(1000), Some(200)));
    assert_eq!(k.ts.as_deref(), Some("1929.272050"));
    assert_eq!(k.tasks.len(), 18);
    let victim = row(k, 18024);
    assert_eq!(
        (
            victim.rss_pages,
            victim.rss_anon_pages,
            victim.rss_file_pages,
            victim.rss_shmem_pages,
            victim.pgtables_bytes
        ),
        (
            Some(6_977_600),
            Some(6_977_600),
            Some(0),
            Some(0),
            Some(56_004_608)
        )
    );
    let web = row(k, 16507);
    assert_eq!(
        (web.name.as_str(), web.rss_shmem_pages, web.oom_score_adj),
        ("Web Content", Some(165), Some(233))
    );
    assert_eq!(row(k, 15833).oom_score_adj, Some(-1000));
    assert_eq!(k.page_size_bytes, Some(4096));
}

#[test]
fn fixture_15_memcg_nested_cgroup_and_cut_kill_line() {
    let _machine = common::machine::beside();
    let kills = parse(&fixture(
        "15-dmesgT-memcg-nested-kubelet-in-rootless-podman-rss_anon.txt",
    ));
    assert_eq!(kills.len(), 1);
    let k = &kills[0];
    let pod = "/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-11017d9ed95ddc35b24735fce395331554737a0676defb9930e07b0ee6d802e5.scope/container/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/kubelet-kubepods-burstable-pod17d1d0b1_bbeb_4252_a45c_c9f426d1cb34.slice";
    let task = format!(
        "{pod}/cri-containerd-799855c3e9e23ea07677c581b96f444dffb0932d7a907973bb08a8391803c559.scope"
    );
    // The kill line ends at `total-`: no sizes.
    assert_kill(k, 32550, "uvicorn", [None; 4], Some("memcg"), Some(&task));
    assert_eq!(k.oom_memcg.as_deref(), Some(pod));
    assert_eq!((k.uid, k.oom_score_adj), (Some(525_287), Some(992)));
    assert_eq!(k.ts.as_deref(), Some("Fri Aug 21 22:26:52 2026"));
    assert_eq!(k.tasks.len(), 2);
    assert_eq!(row(k, 32550).total_vm_pages, Some(67_713_442));
}

#[test]
fn fixtures_without_a_kill_line_report_no_kill() {
    let _machine = common::machine::beside();
    for name in [
        "13-mail-6.12-rc2-rss_anon-many-dd-workers.txt",
        "14-dmesgT-2025-rss_anon-table-python-workers.txt",
        "17-syslog-rhel6-2.6.32-oom_adj-legacy-table.txt",
        "18-dmesg-5.12-early-boot-no-killable-processes-panic.txt",
        "22-dmesg-6.14-memcg-header-UID-TASK-markers.txt",
        "23-dmesg-4.4-python-invoker-nr_ptes-nr_pmds-table.txt",
        "24-dmesg-4.x-table-header-nr_ptes-nr_pmds.txt",
        "90-userspace-side-oom-messages.txt",
    ] {
        assert_eq!(parse(&fixture(name)), Vec::new(), "{name}");
    }
}

/// The fixtures whose kill line was not captured, completed with a kill
/// line in that kernel's format, show that their headers and tables are
/// read and attached.
#[test]
fn fixture_13_completed_64k_pages_and_6x_header() {
    let _machine = common::machine::beside();
    let text = fixture("13-mail-6.12-rc2-rss_anon-many-dd-workers.txt")
        + " Out of memory: Killed process 185707 (dd) total-vm:556032kB, anon-rss:114688kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:512kB oom_score_adj:250\n";
    let kills = parse(&text);
    assert_eq!(kills.len(), 1);
    let k = &kills[0];
    assert_kill(
        k,
        185_707,
        "dd",
        [kb(556_032), kb(114_688), kb(0), kb(0)],
        Some("global"),
        None,
    );
    let inv = k.invoker.as_ref().expect("invoker");
    assert_eq!((inv.comm.as_str(), inv.pid), ("dd", Some(185_764)));
    assert_eq!(
        inv.gfp_flags.as_deref(),
        Some("GFP_HIGHUSER_MOVABLE|__GFP_COMP|__GFP_ZERO")
    );
    assert_eq!(inv.oom_score_adj, Some(250));
    assert_eq!(k.kernel_version.as_deref(), Some("6.12.0-rc2-custom+"));
    assert_eq!(k.tasks.len(), 30);
    assert!(
        k.tasks
            .iter()
            .all(|t| t.name == "dd" && t.oom_score_adj == Some(250))
    );
    assert_eq!(row(k, 185_665).swapents, Some(4832));
    // 8688 pages printed as 556032 kB: this aarch64 kernel has 64 KiB pages.
    assert_eq!(k.page_size_bytes, Some(65_536));
    assert_eq!(k.ts, None);
}

#[test]
fn fixture_14_completed_dmesg_t_gap_splits_reports() {
    let _machine = common::machine::beside();
    let text = fixture("14-dmesgT-2025-rss_anon-table-python-workers.txt")
        + "[Mon Dec  8 17:51:31 2025] Out of memory: Killed process 737 (docker-swarm) total-vm:2174508kB, anon-rss:11004kB, file-rss:7760kB, shmem-rss:0kB, UID:112 pgtables:368kB oom_score_adj:0\n";
    let kills = parse(&text);
    assert_eq!(kills.len(), 1);
    let k = &kills[0];
    assert_kill(
        k,
        737,
        "docker-swarm",
        [kb(2_174_508), kb(11_004), kb(7760), kb(0)],
        Some("global"),
        None,
    );
    // Only the Dec 8 rows: the Nov 21 fragment is another report.
    let pids: Vec<u32> = k.tasks.iter().map(|t| t.pid).collect();
    assert_eq!(pids, [375, 409, 717, 718, 730, 733, 737, 742]);
    assert_eq!(row(k, 733).oom_score_adj, Some(-900));
    assert_eq!(row(k, 375).swapents, Some(256));
    assert_eq!(k.ts.as_deref(), Some("Mon Dec  8 17:51:31 2025"));
}

#[test]
fn fixture_17_completed_rhel6_legacy_table() {
    let _machine = common::machine::beside();
    let text = fixture("17-syslog-rhel6-2.6.32-oom_adj-legacy-table.txt")
        + "Nov 22 06:26:05 hostname kernel: Out of memory: Kill process 1808 (crond) score 1 or sacrifice child\n\
           Nov 22 06:26:05 hostname kernel: Killed process 1808, UID 0, (crond) total-vm:117452kB, anon-rss:396kB, file-rss:4kB\n";
    let kills = parse(&text);
    assert_eq!(kills.len(), 1);
    let k = &kills[0];
    assert_kill(
        k,
        1808,
        "crond",
        [kb(117_452), kb(396), kb(4), None],
        Some("global"),
        None,
    );
    assert_eq!(k.uid, Some(0));
    let inv = k.invoker.as_ref().expect("invoker");
    assert_eq!(
        (inv.comm.as_str(), inv.pid, inv.oom_score_adj),
        ("sshd", Some(1743), Some(-1000))
    );
    assert_eq!(inv.gfp_mask.as_deref(), Some("0x201da"));
    assert_eq!(inv.gfp_flags, None);
    assert_eq!(
        k.kernel_version.as_deref(),
        Some("2.6.32-279.9.1.el6.x86_64")
    );
    assert_eq!(k.tasks.len(), 10);
    let sshd = row(k, 1743);
    assert_eq!(
        (
            sshd.total_vm_pages,
            sshd.rss_pages,
            sshd.cpu,
            sshd.oom_adj,
            sshd.oom_score_adj
        ),
        (Some(16_018), Some(60), Some(0), Some(-17), Some(-1000))
    );
    assert_eq!((sshd.pgtables_bytes, sshd.swapents), (None, None));
    assert_eq!(row(k, 1711).name, "hald-addon-inpu");
    assert_eq!(k.ts.as_deref(), Some("Nov 22 06:26:05"));
    assert_eq!(k.uptime_seconds, None);
}

#[test]
fn fixture_18_no_killable_processes_ends_the_report() {
    let _machine = common::machine::beside();
    let text = fixture("18-dmesg-5.12-early-boot-no-killable-processes-panic.txt")
        + "[   21.000000] Out of memory: Killed process 5 (y) total-vm:4kB, anon-rss:4kB, file-rss:0kB, shmem-rss:0kB\n";
    let kills = parse(&text);
    assert_eq!(kills.len(), 1);
    // The kworker invoker belonged to the report that killed nothing.
    assert_eq!((kills[0].pid, &kills[0].invoker), (5, &None));
    assert_eq!(
        kills[0].kernel_version.as_deref(),
        Some("5.12.0-11533-ge7cb072eb988")
    );
}

#[test]
fn fixture_22_completed_modern_memcg_header() {
    let _machine = common::machine::beside();
    let text = fixture("22-dmesg-6.14-memcg-header-UID-TASK-markers.txt")
        + "[13357.168700] memory: usage 524288kB, limit 524288kB, failcnt 77\n\
           [13357.168800] oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=cri-x,mems_allowed=0,oom_memcg=/kubepods/burstable/podA,task_memcg=/kubepods/burstable/podA/cri-x,task=squid,pid=527543,uid=31\n\
           [13357.168900] Memory cgroup out of memory: Killed process 527543 (squid) total-vm:600000kB, anon-rss:500000kB, file-rss:1000kB, shmem-rss:8kB, UID:31 pgtables:1100kB oom_score_adj:993\n";
    let kills = parse(&text);
    assert_eq!(kills.len(), 1);
    let k = &kills[0];
    assert_kill(
        k,
        527_543,
        "squid",
        [kb(600_000), kb(500_000), kb(1000), kb(8)],
        Some("memcg"),
        Some("/kubepods/burstable/podA/cri-x"),
    );
    assert_eq!((k.uid, k.oom_score_adj), (Some(31), Some(993)));
    let inv = k.invoker.as_ref().expect("invoker");
    assert_eq!(
        (inv.comm.as_str(), inv.pid, inv.oom_score_adj),
        ("squid", Some(527_543), Some(993))
    );
    assert_eq!(k.kernel_version.as_deref(), Some("6.14.0-23-generic"));
    assert_eq!(k.memcg_limit_bytes, kb(524_288));
}

#[test]
fn fixture_23_completed_headerless_nr_ptes_after_time_goes_back() {
    let _machine = common::machine::beside();
    let text = fixture("23-dmesg-4.4-python-invoker-nr_ptes-nr_pmds-table.txt")
        + "[  687.294300] Out of memory: Kill process 2030 (compiz) score 40 or sacrifice child\n\
           [  687.294310] Killed process 2030 (compiz) total-vm:1245896kB, anon-rss:38468kB, file-rss:0kB\n";
    let kills = parse(&text);
    assert_eq!(kills.len(), 1);
    let k = &kills[0];
    assert_kill(
        k,
        2030,
        "compiz",
        [kb(1_245_896), kb(38_468), kb(0), None],
        Some("global"),
        None,
    );
    // Fragment (b) is at 687 s, before fragment (a) at 1525 s: the python
    // invoker of (a) is another report.
    assert_eq!(k.invoker, None);
    assert_eq!(k.tasks.len(), 12);
    let compiz = row(k, 2030);
    assert_eq!(
        (
            compiz.rss_pages,
            compiz.nr_ptes,
            compiz.nr_pmds,
            compiz.swapents,
            compiz.oom_score_adj
        ),
        (Some(9617), Some(284), Some(5), Some(12_818), Some(0))
    );
    assert_eq!(row(k, 2055).name, "evolution-calen");
    assert_eq!(k.page_size_bytes, Some(4096));
}

#[test]
fn fixture_24_completed_header_with_nr_ptes_nr_pmds() {
    let _machine = common::machine::beside();
    let text = fixture("24-dmesg-4.x-table-header-nr_ptes-nr_pmds.txt")
        + "[1044908.759400] Out of memory: Kill process 848 (clamd) score 300 or sacrifice child\n\
           [1044908.759401] Killed process 848 (clamd) total-vm:1011908kB, anon-rss:448328kB, file-rss:0kB, shmem-rss:0kB\n";
    let kills = parse(&text);
    assert_eq!(kills.len(), 1);
    let k = &kills[0];
    assert_kill(
        k,
        848,
        "clamd",
        [kb(1_011_908), kb(448_328), kb(0), kb(0)],
        Some("global"),
        None,
    );
    assert_eq!(k.tasks.len(), 12);
    let clamd = row(k, 848);
    assert_eq!(
        (
            clamd.uid,
            clamd.total_vm_pages,
            clamd.rss_pages,
            clamd.nr_ptes,
            clamd.nr_pmds,
            clamd.swapents
        ),
        (
            Some(110),
            Some(252_977),
            Some(112_082),
            Some(288),
            Some(4),
            Some(615)
        )
    );
    assert_eq!(row(k, 364).oom_score_adj, Some(-1000));
    assert_eq!(k.selected.as_ref().map(|s| s.score), Some(Some(300)));
    assert_eq!(k.uid, Some(110));
}

// ---------------------------------------------------------------------------
// Layouts and transports not covered by the fixtures.

#[test]
fn older_memcg_task_in_form() {
    let _machine = common::machine::beside();
    let text = "\
[ 5000.000001] java invoked oom-killer: gfp_mask=0x24000c0, order=0, oom_score_adj=0
[ 5000.000002] java cpuset=/ mems_allowed=0
[ 5000.000003] CPU: 1 PID: 4242 Comm: java Not tainted 4.4.0-21-generic #37-Ubuntu
[ 5000.000004] Task in /docker/abc killed as a result of limit of /docker
[ 5000.000005] memory: usage 524288kB, limit 524288kB, failcnt 12
[ 5000.000006] memory+swap: usage 0kB, limit 9007199254740988kB, failcnt 0
[ 5000.000007] Memory cgroup stats for /docker: cache:0KB rss:524288KB
[ 5000.000008] [ pid ]   uid  tgid total_vm      rss nr_ptes nr_pmds swapents oom_score_adj name
[ 5000.000009] [ 4242]     0  4242   700000   131000     300       5        0             0 java
[ 5000.000010] Memory cgroup out of memory: Kill process 4242 (java) score 1000 or sacrifice child
[ 5000.000011] Killed process 4242 (java) total-vm:2800000kB, anon-rss:524000kB, file-rss:0kB, shmem-rss:0kB
";
    let kills = parse(text);
    assert_eq!(kills.len(), 1);
    let k = &kills[0];
    assert_kill(
        k,
        4242,
        "java",
        [kb(2_800_000), kb(524_000), kb(0), kb(0)],
        Some("memcg"),
        Some("/docker/abc"),
    );
    assert_eq!(k.oom_memcg.as_deref(), Some("/docker"));
    assert_eq!(k.memcg_limit_bytes, kb(524_288));
    assert_eq!(k.kernel_version.as_deref(), Some("4.4.0-21-generic"));
    let inv = k.invoker.as_ref().expect("invoker");
    assert_eq!(
        (inv.pid, inv.gfp_mask.as_deref(), inv.gfp_flags.as_deref()),
        (Some(4242), Some("0x24000c0"), None)
    );
    assert_eq!(k.uid, Some(0));
}

#[test]
fn constraint_none_in_a_memcg_oom_and_a_sacrificed_child() {
    let _machine = common::machine::beside();
    // 4.19–5.0: the summary names the selected parent with CONSTRAINT_NONE
    // (a kernel bug for memcg OOMs), then a child is killed.
    let text = "\
[  300.100000] stress invoked oom-killer: gfp_mask=0x6000c0(GFP_KERNEL), nodemask=(null), order=0, oom_score_adj=0
[  300.100100] CPU: 0 PID: 777 Comm: stress Not tainted 4.19.0-6-amd64 #1 Debian 4.19.67-2+deb10u2
[  300.100300] memory: usage 102400kB, limit 102400kB, failcnt 40
[  300.100500] Tasks state (memory values in pages):
[  300.100501] [  pid  ]   uid  tgid total_vm      rss pgtables_bytes swapents oom_score_adj name
[  300.100502] [    770]  1000   770     2000      100    53248        0             0 stress
[  300.100503] [    777]  1000   777    27000    25000   245760        0             0 stress
[  300.100600] oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0,oom_memcg=/user.slice/test,task_memcg=/user.slice/test,task=stress,pid=770,uid=1000
[  300.100700] Memory cgroup out of memory: Kill process 770 (stress) score 10 or sacrifice child
[  300.100800] Killed process 777 (stress) total-vm:108000kB, anon-rss:99800kB, file-rss:200kB, shmem-rss:0kB
[  300.120000] oom_reaper: reaped process 777 (stress), now anon-rss:0kB, file-rss:0kB, shmem-rss:0kB
";
    let kills = parse(text);
    assert_eq!(kills.len(), 1);
    let k = &kills[0];
    // The summary's task_memcg is the parent's: not claimed for the child.
    assert_kill(
        k,
        777,
        "stress",
        [kb(108_000), kb(99_800), kb(200), kb(0)],
        Some("memcg"),
        None,
    );
    assert_eq!(k.kernel_constraint.as_deref(), Some("CONSTRAINT_NONE"));
    assert_eq!(k.oom_memcg.as_deref(), Some("/user.slice/test"));
    assert_eq!(k.uid, Some(1000));
    let sel = k.selected.as_ref().expect("selection");
    assert_eq!((sel.pid, sel.score), (770, Some(10)));
    assert_eq!(k.reaped, Some(true));
    assert_eq!(k.invoker.as_ref().and_then(|i| i.pid), Some(777));

    // Only the summary line (grep): still memcg, thanks to oom_memcg=.
    let kills = parse(
        "[ 1.0] oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0,oom_memcg=/a,task_memcg=/a/b,task=x,pid=9,uid=0\n",
    );
    assert_eq!(kills.len(), 1);
    assert_kill(&kills[0], 9, "x", [None; 4], Some("memcg"), Some("/a/b"));
    assert_eq!(kills[0].evidence, Evidence::Summary);
}

#[test]
fn summary_lines_alone_are_kills() {
    let _machine = common::machine::beside();
    let text = "\
[ 10.000000] oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0,global_oom,task_memcg=/,task=a,pid=1,uid=0
[ 20.000000] oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0-1,3,oom_memcg=/x,task_memcg=/x/y,task=b c,pid=2,uid=5
";
    let kills = parse(text);
    assert_eq!(kills.len(), 2);
    assert_kill(&kills[0], 1, "a", [None; 4], Some("global"), Some("/"));
    assert_kill(&kills[1], 2, "b c", [None; 4], Some("memcg"), Some("/x/y"));
    assert_eq!(
        (kills[1].uid, kills[1].oom_memcg.as_deref()),
        (Some(5), Some("/x"))
    );
    assert_eq!(kills[1].ts.as_deref(), Some("20.000000"));
    assert!(kills.iter().all(|k| k.evidence == Evidence::Summary));
}

#[test]
fn memory_oom_group_kills_share_the_report() {
    let _machine = common::machine::beside();
    let text = "\
[  800.000001] python3 invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=0
[  800.000002] memory: usage 1048576kB, limit 1048576kB, failcnt 9
[  800.000002] Tasks state (memory values in pages):
[  800.000002] [  pid  ]   uid  tgid total_vm      rss rss_anon rss_file rss_shmem pgtables_bytes swapents oom_score_adj name
[  800.000002] [    500]     0   500    75000    50250    50000      250         0   614400        0             0 python3
[  800.000002] [    501]     0   501   225000   200250   200000      250         0  1843200        0             0 python3
[  800.000002] [    502]     0   502    75000    25250    25000      250         0   614400        0             0 pt_data_worker
[  800.000003] oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=/,mems_allowed=0,oom_memcg=/job,task_memcg=/job/worker,task=python3,pid=501,uid=0
[  800.000004] Memory cgroup out of memory: Killed process 501 (python3) total-vm:900000kB, anon-rss:800000kB, file-rss:1000kB, shmem-rss:0kB, UID:0 pgtables:1800kB oom_score_adj:0
[  800.000005] Tasks in /job are going to be killed due to memory.oom.group set
[  800.000006] Memory cgroup out of memory: Killed process 500 (python3) total-vm:300000kB, anon-rss:200000kB, file-rss:1000kB, shmem-rss:0kB, UID:0 pgtables:600kB oom_score_adj:0
[  800.000007] Memory cgroup out of memory: Killed process 502 (pt_data_worker) total-vm:300000kB, anon-rss:100000kB, file-rss:1000kB, shmem-rss:0kB, UID:0 pgtables:600kB oom_score_adj:0
[  800.010000] oom_reaper: reaped process 501 (python3), now anon-rss:0kB, file-rss:0kB, shmem-rss:0kB
";
    let kills = parse(text);
    let pids: Vec<u32> = kills.iter().map(|k| k.pid).collect();
    assert_eq!(pids, [501, 500, 502]);
    for k in &kills {
        assert_eq!(k.constraint.as_deref(), Some("memcg"));
        assert_eq!(k.oom_memcg.as_deref(), Some("/job"));
        assert_eq!(k.invoker.as_ref().map(|i| i.comm.as_str()), Some("python3"));
        assert_eq!(k.memcg_limit_bytes, kb(1_048_576));
    }
    assert_eq!(kills[0].cgroup.as_deref(), Some("/job/worker"));
    // The table is attached once per report, to its first kill.
    assert_eq!(kills[0].tasks.len(), 3);
    assert!(kills[1].tasks.is_empty() && kills[2].tasks.is_empty());
    // Group members still get their own row's values and the page size.
    assert_eq!(kills[2].page_size_bytes, Some(4096));
    assert_eq!(
        (kills[1].cgroup.as_deref(), kills[2].cgroup.as_deref()),
        (None, None)
    );
    assert_eq!(
        kills.iter().map(|k| k.reaped).collect::<Vec<_>>(),
        [Some(true), None, None]
    );
}

#[test]
fn processes_sharing_memory_are_killed_too() {
    let _machine = common::machine::beside();
    let text = "\
[   50.000000] Out of memory: Kill process 10 (a) score 900 or sacrifice child
[   50.000100] Killed process 10 (a) total-vm:1000kB, anon-rss:800kB, file-rss:4kB
[   50.000200] Kill process 11 (b c) sharing same memory
";
    let kills = parse(text);
    assert_eq!(kills.len(), 2);
    assert_eq!(kills[0].evidence, Evidence::KilledProcess);
    assert_kill(&kills[1], 11, "b c", [None; 4], Some("global"), None);
    assert_eq!(kills[1].evidence, Evidence::SharedMemory);
}

#[test]
fn kill_line_variants() {
    let _machine = common::machine::beside();
    let text = "\
[    1.000000] Killed process 2592 (java), UID 500, total-vm:2298160kB, anon-rss:1031316kB, file-rss:12kB, shmem-rss:0kB
[    2.000000] Killed process 10366, UID 48, (httpd) total-vm:2298160kB, anon-rss:1031316kB, file-rss:12kB
[    3.000000] Out of Memory: Kill process 1234 (java) score 5123 and children.
[    3.000100] Out of memory: Killed process 1234 (java).
[    4.000000] Out of memory (oom_kill_allocating_task): Killed process 77 (tmux: server) total-vm:10kB, anon-rss:9kB, file-rss:1kB, shmem-rss:0kB, UID:1000 pgtables:40kB oom_score_adj:-500
[    5.000000] Out of memory: Killed process 99 (GC Thread#9) total-vm:10kB, anon-rss:9kB, file-rss:1kB, shmem-rss:0kB, UID:1000 pgtables:40kB oom_score_adj:0
[    6.000000] Out of memory: Killed process 5 (Web Content), UID 1000, total-vm:10kB, anon-rss:9kB, file-rss:1kB, shmem-rss:0kB
[    7.000000] oom_reaper: unable to reap pid:5 (Web Content)
[    8.000000] oom_reaper: reaped process 77 (tmux: server), now anon-rss:0kB, file-rss:0kB, shmem-rss:0kB
[    9.000000] sh: Killed process 12 (not the kernel) was mentioned in prose
";
    let kills = parse(text);
    let summary: Vec<(u32, &str, Option<u32>)> = kills
        .iter()
        .map(|k| (k.pid, k.comm.as_str(), k.uid))
        .collect();
    assert_eq!(
        summary,
        [
            (2592, "java", Some(500)),
            (10366, "httpd", Some(48)),
            (1234, "java", None),
            (77, "tmux: server", Some(1000)),
            (99, "GC Thread#9", Some(1000)),
            (5, "Web Content", Some(1000)),
        ]
    );
    assert_eq!(kills[0].constraint, None);
    assert_eq!(kills[0].anon_rss_bytes, kb(1_031_316));
    assert_eq!(kills[1].file_rss_bytes, kb(12));
    assert_eq!(kills[2].constraint.as_deref(), Some("global"));
    assert_eq!(kills[2].selected.as_ref().and_then(|s| s.score), Some(5123));
    assert_eq!(kills[3].oom_score_adj, Some(-500));
    assert_eq!(kills[3].reaped, Some(true));
    assert_eq!(kills[5].reaped, Some(false));
}

#[test]
fn every_transport_gives_the_same_kill() {
    let _machine = common::machine::beside();
    let line = "Out of memory: Killed process 4321 (python3) total-vm:2048kB, anon-rss:1024kB, file-rss:512kB, shmem-rss:0kB, UID:1000 pgtables:40kB oom_score_adj:0";
    let cases = [
        (format!("[  123.456789] {line}"), Some("123.456789")),
        (
            format!("[Sun Nov 22 06:26:05 2020] {line}"),
            Some("Sun Nov 22 06:26:05 2020"),
        ),
        (
            format!("2020-11-22T06:26:05,123456+01:00 {line}"),
            Some("2020-11-22T06:26:05,123456+01:00"),
        ),
        (format!("3,1234,123456789,-;{line}"), Some("123.456789")),
        (
            format!("Nov 22 06:26:05 myhost kernel: [  123.456789] {line}"),
            Some("Nov 22 06:26:05"),
        ),
        (
            format!("Nov 22 06:26:05 myhost kernel: {line}"),
            Some("Nov 22 06:26:05"),
        ),
        (
            format!("Nov 22 06:26:05.123456 myhost kernel: {line}"),
            Some("Nov 22 06:26:05.123456"),
        ),
        (
            format!("[  123.456789] myhost kernel: {line}"),
            Some("123.456789"),
        ),
        (
            format!("2020-11-22T06:26:05.123456+01:00 myhost kernel: {line}"),
            Some("2020-11-22T06:26:05.123456+01:00"),
        ),
        (
            format!("Sun 2020-11-22 06:26:05 CET myhost kernel: {line}"),
            Some("Sun 2020-11-22 06:26:05 CET"),
        ),
        (format!("> [  123.456789] {line}"), Some("123.456789")),
        (format!(">> > [  123.456789] {line}"), Some("123.456789")),
        (format!("<3>[  123.456789] {line}"), Some("123.456789")),
        (
            format!("kern  :err   : [  123.456789] {line}"),
            Some("123.456789"),
        ),
        (format!("[  123.456789][ T4321] {line}"), Some("123.456789")),
        (format!("  {line}"), None),
        (format!("kernel: {line}\r"), None),
        (format!("[  +0.000123] {line}"), Some("+0.000123")),
    ];
    for (text, ts) in &cases {
        let kills = parse(text);
        assert_eq!(kills.len(), 1, "{text}");
        let k = &kills[0];
        assert_kill(
            k,
            4321,
            "python3",
            [kb(2048), kb(1024), kb(512), kb(0)],
            Some("global"),
            None,
        );
        assert_eq!(k.uid, Some(1000), "{text}");
        assert_eq!(k.ts.as_deref(), *ts, "{text}");
    }
    // Another program's syslog line is not the kernel's.
    assert!(parse(&format!("Nov 22 06:26:05 myhost earlyoom[1233]: {line}")).is_empty());
}

#[test]
fn kmsg_continuation_and_dictionary_lines() {
    let _machine = common::machine::beside();
    let text = "\
6,100,5000000,-;tail invoked oom-killer: gfp_mask=0x100cca(GFP_HIGHUSER_MOVABLE), order=0, oom_score_adj=0
 SUBSYSTEM=mem
3,101,5000100,-;Out of memory: Killed process 77 (tail) total-vm:100kB, anon-rss:50kB, file-rss:0kB, shmem-rss:0kB, UID:0 pgtables:40kB oom_score_adj:0
 DEVICE=+mem:x
";
    let kills = parse(text);
    assert_eq!(kills.len(), 1);
    assert_kill(
        &kills[0],
        77,
        "tail",
        [kb(100), kb(50), kb(0), kb(0)],
        Some("global"),
        None,
    );
    assert_eq!(
        kills[0].invoker.as_ref().map(|i| i.comm.as_str()),
        Some("tail")
    );
    assert_eq!(kills[0].uptime_seconds, Some(5.0001));
}

#[test]
fn a_long_pause_separates_reports() {
    let _machine = common::machine::beside();
    let text = "\
[  100.000000] python invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=0
[  400.000000] Out of memory: Killed process 1 (x) total-vm:4kB, anon-rss:4kB, file-rss:0kB, shmem-rss:0kB
";
    let kills = parse(text);
    assert_eq!(kills.len(), 1);
    assert_eq!(kills[0].invoker, None);
}

#[test]
fn find_pid_takes_the_latest_kill() {
    let _machine = common::machine::beside();
    let text = "\
[  1.0] Out of memory: Killed process 7 (a) total-vm:4kB, anon-rss:4kB, file-rss:0kB
[  2.0] Out of memory: Killed process 8 (b) total-vm:4kB, anon-rss:4kB, file-rss:0kB
[  3.0] Out of memory: Killed process 7 (c) total-vm:4kB, anon-rss:4kB, file-rss:0kB
";
    let kills = parse(text);
    assert_eq!(find_pid(&kills, 7).map(|k| k.comm.as_str()), Some("c"));
    assert_eq!(find_pid(&kills, 8).map(|k| k.comm.as_str()), Some("b"));
    assert_eq!(find_pid(&kills, 9), None);
}

// ---------------------------------------------------------------------------
// Rendering.

#[test]
fn json_has_every_field_named_by_the_contract() {
    let _machine = common::machine::beside();
    let kills = parse(&fixture("00-local-6.18-memcg-v1-two-kills.txt"));
    let json = render_json(&kills);
    let list = json["kills"].as_array().expect("kills array");
    assert_eq!(list.len(), 2);
    let first = list[0].as_object().expect("object");
    for key in [
        "pid",
        "comm",
        "total_vm_bytes",
        "anon_rss_bytes",
        "file_rss_bytes",
        "shmem_rss_bytes",
        "oom_score_adj",
        "uid",
        "constraint",
        "cgroup",
        "ts",
        "invoker",
        "tasks",
        "kernel_version",
        "reaped",
    ] {
        assert!(first.contains_key(key), "missing {key}");
    }
    assert_eq!(list[1]["pid"], 9016);
    assert_eq!(list[1]["anon_rss_bytes"], 809_456u64 * 1024);
    assert_eq!(list[1]["constraint"], "memcg");
    assert_eq!(list[1]["invoker"]["pid"], 9015);
    assert_eq!(list[1]["invoker"]["gfp_mask"], "0x100cca");
    assert_eq!(list[1]["invoker"]["order"], 0);
    assert_eq!(list[1]["tasks"][2]["rss_pages"], 207_466);
    // Missing values are null, not absent.
    assert!(list[0]["reaped"].is_null());

    // And it reads back.
    let back: Vec<OomKill> = serde_json::from_value(json["kills"].clone()).expect("deserialize");
    assert_eq!(back, kills);
    assert_eq!(render_json(&[]), serde_json::json!({ "kills": [] }));
}

#[test]
fn text_summary_names_victim_cause_invoker_and_top_tasks() {
    let _machine = common::machine::beside();
    let kills = parse(&fixture("00-local-6.18-memcg-v1-two-kills.txt"));
    let text = render_text(&kills);
    for needle in [
        "2 kernel OOM kills found.",
        "[433.732038] memory cgroup OOM: killed pt_data_worker (pid 9016, uid 0)",
        "anon-rss 790.5 MiB",
        "cgroup /process_api/df4e53474e114f8a6a9b8f1548078aff/acc1 reached its memory limit (usage 2.0 GiB of limit 2.0 GiB)",
        "invoked by: pt_data_worker (pid 9015): gfp_mask=0x100cca(GFP_HIGHUSER_MOVABLE), order=0",
        "invoked by: python3 (pid 2045, the victim itself)",
        "kernel 6.18.44-fc-v669",
        "largest tasks by rss (5 of 5 listed, 4 KiB pages)",
    ] {
        assert!(text.contains(needle), "{needle:?} missing in:\n{text}");
    }
    // Largest first, victim marked.
    let top = text
        .lines()
        .skip_while(|l| !l.contains("5 of 5 listed"))
        .nth(1)
        .expect("first task line");
    assert!(
        top.contains("9016") && top.contains("810.4 MiB") && top.ends_with("<- killed"),
        "{top}"
    );

    let global = render_text(&parse(&fixture(
        "12-dmesg-debian-6.11-global-python-rss_anon.txt",
    )));
    assert!(
        global.contains("system-wide OOM: killed python (pid 18024, uid 1000)"),
        "{global}"
    );
    assert!(global.contains("the machine ran out of memory"), "{global}");

    assert_eq!(render_text(&[]), "No kernel OOM kill found in the log.\n");
    let none = render_text(&parse(&fixture("90-userspace-side-oom-messages.txt")));
    assert!(none.contains("No kernel OOM kill found"));
}

// ---------------------------------------------------------------------------
// Robustness.

fn all_fixture_lines() -> Vec<String> {
    let mut names: Vec<PathBuf> = std::fs::read_dir(FIXTURES)
        .expect("fixture dir")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .collect();
    names.sort();
    let mut lines: Vec<String> = names
        .iter()
        .filter_map(|p| std::fs::read_to_string(p).ok())
        .flat_map(|t| t.lines().map(str::to_owned).collect::<Vec<_>>())
        .collect();
    // Shapes the fixtures lack, so the mixtures exercise them too.
    lines.extend(
        [
            "Killed process 10366, UID 48, (httpd) total-vm:2298160kB, anon-rss:1031316kB, file-rss:12kB",
            "Task in /docker/abc killed as a result of limit of /docker",
            "Tasks in /job are going to be killed due to memory.oom.group set",
            "Kill process 11 (b c) sharing same memory",
            "oom_reaper: unable to reap pid:5 (Web Content)",
            "Memory cgroup stats for /docker: cache:0KB rss:524288KB",
            "Linux version 6.1.0 (x@y) #1",
            "Pid: 1743, comm: sshd Tainted: G H 2.6.32-279.9.1.el6.x86_64 #1",
            "3,1,1,-;",
            "oom-kill:",
            "oom-kill:pid=,uid=",
            "Killed process 4294967296 (x) total-vm:18446744073709551615kB",
            "Killed process 1 (",
            "[",
            "[]",
            "[ 1.",
            "> > >",
            "\u{fffd}\u{200b} invoked oom-killer: gfp_mask=0x(",
        ]
        .map(str::to_owned),
    );
    lines
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_text_never_panics(text in any::<String>()) {
        let _machine = crate::common::machine::beside();
        let kills = parse(&text);
        let _ = render_text(&kills);
        let _ = render_json(&kills);
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..4096)) {
        let _machine = crate::common::machine::beside();
        let _ = parse(&String::from_utf8_lossy(&bytes));
    }

    #[test]
    fn shuffled_truncated_report_lines_never_panic(
        picks in proptest::collection::vec((any::<proptest::sample::Index>(), any::<proptest::sample::Index>(), 0u8..4), 0..200),
    ) {
        let _machine = crate::common::machine::beside();
        let lines = all_fixture_lines();
        let mut text = String::new();
        for (line, cut, style) in picks {
            let line = line.get(&lines);
            // Cut at a char boundary at or before a random point.
            let mut at = cut.index(line.len() + 1);
            while !line.is_char_boundary(at) {
                at -= 1;
            }
            let piece = &line[..at];
            match style {
                0 => text.push_str(piece),
                1 => text.push_str(line),
                2 => { text.push(' '); text.push_str(piece); }
                _ => { text.push_str("> "); text.push_str(line); }
            }
            text.push('\n');
        }
        let kills = parse(&text);
        for k in &kills {
            prop_assert!(text.contains(&k.pid.to_string()));
        }
        let _ = render_text(&kills);
    }
}

// ---------------------------------------------------------------------------
// The live kernel log.

/// Skips a host-dependent test with a reason, except in CI where it must run.
fn skip(reason: &str) {
    assert!(
        !matches!(std::env::var("CI").as_deref(), Ok("true" | "1")),
        "required in CI but cannot run: {reason}"
    );
    eprintln!("skipped: {reason}");
}

#[test]
fn live_kmsg_reads_back_a_line_written_to_it() {
    let _machine = common::machine::beside();
    use std::io::Write as _;
    let marker = format!(
        "oomguard-kmsg-test pid={} t={:?}",
        std::process::id(),
        std::time::SystemTime::now()
    );
    let written = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/kmsg")
        .and_then(|mut f| f.write_all(format!("{marker}\n").as_bytes()));
    if let Err(e) = written {
        skip(&format!("cannot write /dev/kmsg (needs root): {e}"));
        return;
    }
    let log = read_kernel_log(None).expect("read the kernel log");
    assert_eq!(log.source, LogSource::Kmsg, "skipped: {:?}", log.skipped);
    let line = log
        .text
        .lines()
        .find(|l| l.contains(&marker))
        .expect("marker in the log");
    // dmesg-style timestamps, so the parser's transports apply.
    assert!(line.starts_with('[') && line.contains("] "), "{line}");
    // The log is complete from boot: it starts at 0 seconds (unless the
    // ring buffer wrapped), and parsing it never fails.
    let _ = parse(&log.text);

    let recent = read_kernel_log(Some(Duration::from_secs(120))).expect("recent log");
    assert!(recent.text.contains(&marker));
    assert!(recent.text.lines().count() <= log.text.lines().count());
}

/// Our memory cgroup v1 directory, from `/proc/self/cgroup`.
fn memcg_v1_dir() -> Option<PathBuf> {
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    cgroups.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        controllers
            .split(',')
            .any(|c| c == "memory")
            .then(|| Path::new("/sys/fs/cgroup/memory").join(path.trim_start_matches('/')))
    })
}

/// Removes the test cgroup, killing what is left in it first.
struct CgroupGuard(PathBuf);

impl Drop for CgroupGuard {
    fn drop(&mut self) {
        if let Ok(procs) = std::fs::read_to_string(self.0.join("cgroup.procs")) {
            for pid in procs.lines() {
                let _ = Command::new("kill").args(["-9", pid]).status();
            }
        }
        for _ in 0..50 {
            if std::fs::remove_dir(&self.0).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

#[test]
fn live_oom_kill_in_a_memory_cgroup_is_found_by_pid() {
    use std::os::unix::process::ExitStatusExt as _;

    let Some(parent) = memcg_v1_dir().filter(|p| p.join("memory.limit_in_bytes").exists()) else {
        skip("no cgroup v1 memory controller for this process");
        return;
    };
    // The kernel kills here: alone, so no other test sees the machine's
    // OOM-kill count rise or this report (common::machine).
    let _alone = common::machine::alone();
    let name = format!("oomguard-kernel-test-{}", std::process::id());
    let dir = parent.join(&name);
    if let Err(e) = std::fs::create_dir(&dir) {
        skip(&format!(
            "cannot create {} (needs root): {e}",
            dir.display()
        ));
        return;
    }
    let guard = CgroupGuard(dir.clone());
    let limit: u64 = 64 << 20;
    std::fs::write(dir.join("memory.limit_in_bytes"), limit.to_string()).expect("set limit");
    // Without swap accounting limits the job could swap instead of dying.
    let _ = std::fs::write(dir.join("memory.memsw.limit_in_bytes"), limit.to_string());

    let procs = dir.join("cgroup.procs");
    let script = format!(
        "echo $$ > {} && exec python3 -c 'chunks = []\nwhile True: chunks.append(b\"x\" * (4 << 20))'",
        procs.display()
    );
    let mut child = Command::new("sh")
        .args(["-c", &script])
        .stdin(Stdio::null())
        .spawn()
        .expect("spawn python3");
    let pid = child.id();
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("python3 was not OOM-killed within 60 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.signal(), Some(9), "{status:?}");

    // The kill line is logged as the signal is sent; allow a moment anyway.
    let mut found = None;
    for _ in 0..50 {
        let log = read_kernel_log(Some(Duration::from_secs(300))).expect("read the kernel log");
        if let Some(kill) = find_pid(&parse(&log.text), pid) {
            found = Some(kill.clone());
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let kill = found.unwrap_or_else(|| panic!("no kill of pid {pid} in the kernel log"));
    assert_eq!(kill.comm, "python3");
    assert_eq!(kill.evidence, Evidence::KilledProcess);
    assert_eq!(kill.constraint.as_deref(), Some("memcg"));
    let cgroup = kill.cgroup.as_deref().expect("task cgroup");
    assert!(cgroup.ends_with(&name), "{cgroup}");
    assert_eq!(kill.oom_memcg.as_deref(), Some(cgroup));
    assert_eq!(kill.memcg_limit_bytes, Some(limit));
    assert!(
        kill.anon_rss_bytes.is_some_and(|b| b > 0 && b <= limit),
        "{kill:?}"
    );
    assert!(kill.tasks.iter().any(|t| t.pid == pid), "{:?}", kill.tasks);
    assert!(kill.kernel_version.is_some());
    drop(guard);
}

// ---------------------------------------------------------------------------
// The `forensics` command's input and output, through the binary.

#[allow(clippy::unwrap_used)]
fn oomguard_forensics(args: &[&str], stdin: Stdio) -> std::process::Output {
    common::deadline::arm();
    Command::new(env!("CARGO_BIN_EXE_oomguard"))
        .arg("forensics")
        .args(args)
        .stdin(stdin)
        .output()
        .unwrap()
}

const TWO_KILLS: &str = "00-local-6.18-memcg-v1-two-kills.txt";

#[test]
fn stdin_with_a_bad_byte_is_read_lossily_and_the_bytes_counted() {
    let _machine = common::machine::beside();
    let dir = tempfile::tempdir().unwrap();
    let mut bytes = b"\xff\xfe garbage\n".to_vec();
    bytes.extend_from_slice(fixture(TWO_KILLS).as_bytes());
    let path = dir.path().join("log");
    std::fs::write(&path, &bytes).unwrap();
    let by_path = oomguard_forensics(&[path.to_str().unwrap()], Stdio::null());
    let by_stdin = oomguard_forensics(&["-"], std::fs::File::open(&path).unwrap().into());
    assert!(by_stdin.status.success(), "{by_stdin:?}");
    assert_eq!(by_stdin.stdout, by_path.stdout);
    assert!(String::from_utf8_lossy(&by_stdin.stdout).contains("2 kernel OOM kills found"));
    let err = String::from_utf8_lossy(&by_stdin.stderr);
    assert!(err.contains("2 bytes of stdin were not UTF-8"), "{err}");
}

#[test]
fn a_pipe_on_stdin_is_read_instead_of_the_live_kernel_log() {
    let _machine = common::machine::beside();
    let path = Path::new(FIXTURES).join(TWO_KILLS);
    let mut cat = Command::new("cat")
        .arg(&path)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let piped = oomguard_forensics(&["--format", "json"], cat.stdout.take().unwrap().into());
    cat.wait().unwrap();
    let by_path = oomguard_forensics(&["--format", "json", path.to_str().unwrap()], Stdio::null());
    assert!(piped.status.success(), "{piped:?}");
    assert_eq!(piped.stdout, by_path.stdout);
    let v: serde_json::Value = serde_json::from_slice(&piped.stdout).unwrap();
    assert_eq!(v["kills"].as_array().unwrap().len(), 2);
}

#[test]
fn json_output_streams_in_bounded_memory() {
    let _machine = common::machine::beside();
    // Every fixture, many times over: about 40 MB of kernel log with
    // thousands of kills.
    let mut one = String::new();
    for entry in std::fs::read_dir(FIXTURES).unwrap() {
        one.push_str(&std::fs::read_to_string(entry.unwrap().path()).unwrap());
        one.push('\n');
    }
    let copies = (40 << 20) / one.len() + 1;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("big.log");
    std::fs::write(&path, one.repeat(copies)).unwrap();
    let input = std::fs::metadata(&path).unwrap().len();
    let out = Command::new("/usr/bin/time")
        .args(["-f", "maxrss_kb=%M", env!("CARGO_BIN_EXE_oomguard")])
        .args(["forensics", "--format", "json", path.to_str().unwrap()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .output();
    let Ok(out) = out else {
        skip("/usr/bin/time not installed");
        return;
    };
    assert!(out.status.success(), "{:?}", out.status);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["kills"].as_array().unwrap().len() > 1000);
    let err = String::from_utf8_lossy(&out.stderr);
    let rss_kb: u64 = err
        .lines()
        .find_map(|l| l.strip_prefix("maxrss_kb="))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("{err}"));
    // Reading it whole took several times the input; streaming keeps the
    // binary's own size and a few reports.
    assert!(
        rss_kb * 1024 < input / 2,
        "peak RSS {rss_kb} KiB for {input} bytes of input"
    );
}

/// One enormous line (a binary file, `/dev/zero`, a log with no line
/// end) costs a bounded amount of memory: 400 MB with no line end under a
/// 256 MiB address-space limit.
#[test]
fn a_line_with_no_end_costs_bounded_memory() {
    let _machine = common::machine::beside();
    let chunk = vec![b'x'; 1 << 20];
    let out = common::run_capped(&["forensics", "-"], move |w| {
        for _ in 0..400 {
            if w.write_all(&chunk).is_err() {
                return;
            }
        }
    });
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}: {err}", out.status);
    assert!(
        err.contains("1 line of stdin longer than 1 MiB was cut"),
        "{err}"
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("No kernel OOM kill"));
}

/// A report whose task table has 100,000 rows (a big machine): `--format
/// json` writes it a row at a time, so its memory follows the table's
/// rows, not a JSON tree of them (which took some 30 times the text).
#[test]
fn json_of_a_huge_task_table_costs_bounded_memory() {
    let _machine = common::machine::beside();
    const ROWS: usize = 100_000;
    let out = common::run_capped(&["forensics", "--format", "json", "-"], |w| {
        let mut text = String::from(
            "[  100.000000] python3 invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=0\n\
             [  100.000100] Tasks state (memory values in pages):\n\
             [  100.000200] [  pid  ]   uid  tgid total_vm      rss rss_anon rss_file rss_shmem pgtables_bytes swapents oom_score_adj name\n",
        );
        for i in 0..ROWS {
            let pid = 10_000 + i;
            text.push_str(&format!(
                "[  100.000300] [{pid:>7}]     0 {pid:>5}    68166    65784    65344      440         0   593920        0             0 worker{i}\n"
            ));
            if text.len() > 1 << 20 {
                if w.write_all(text.as_bytes()).is_err() {
                    return;
                }
                text.clear();
            }
        }
        text.push_str(
            "[  100.000400] oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0,global_oom,task_memcg=/,task=worker7,pid=10007,uid=0\n\
             [  100.000500] Out of memory: Killed process 10007 (worker7) total-vm:272664kB, anon-rss:261376kB, file-rss:1760kB, shmem-rss:0kB, UID:0 pgtables:580kB oom_score_adj:0\n",
        );
        let _ = w.write_all(text.as_bytes());
    });
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}: {err}", out.status);
    let json = String::from_utf8_lossy(&out.stdout);
    assert!(json.contains("\"pid\": 10007"), "no kill found");
    let rows = json.matches("\"name\": \"worker").count();
    assert_eq!(rows, ROWS, "rows written");
}
