use super::*;

fn place(task: u32, job: &str) -> Place {
    Place {
        job: job.into(),
        step: "0".into(),
        node: 0,
        task,
        node_tasks: 2,
    }
}

fn report(rank: u32, mib: u64) -> Report {
    Report {
        rank,
        footprint_bytes: mib << 20,
    }
}

/// A job id no other test (or run) uses: the names are machine-wide.
fn job(tag: &str) -> String {
    format!("test-{tag}-{}", std::process::id())
}

#[test]
fn slurms_task_list_gives_each_node_its_count() {
    assert_eq!(tasks_on("2(x3),1", 0), Some(2));
    assert_eq!(tasks_on("2(x3),1", 2), Some(2));
    assert_eq!(tasks_on("2(x3),1", 3), Some(1));
    assert_eq!(tasks_on("2(x3),1", 4), None);
    assert_eq!(tasks_on("bad", 0), None);
    let env = |pairs: &'static [(&'static str, &'static str)]| {
        move |k: &str| {
            pairs
                .iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    };
    let two = env(&[
        ("SLURM_JOB_ID", "42"),
        ("SLURM_STEP_ID", "0"),
        ("SLURM_NODEID", "1"),
        ("SLURM_PROCID", "3"),
        ("SLURM_STEP_TASKS_PER_NODE", "2(x2)"),
    ]);
    let p = Place::from_env(two).unwrap();
    assert_eq!((p.node, p.task, p.node_tasks), (1, 3, 2));
    // One task per node: nothing to pool.
    let one = env(&[
        ("SLURM_JOB_ID", "42"),
        ("SLURM_PROCID", "1"),
        ("SLURM_NODEID", "1"),
        ("SLURM_STEP_TASKS_PER_NODE", "1(x2)"),
    ]);
    assert_eq!(Place::from_env(one), None);
    assert_eq!(Place::from_env(env(&[])), None);
}

#[test]
fn the_first_leads_and_adds_the_others_footprints_and_the_member_defers() {
    let j = job("pool");
    let t0 = Instant::now();
    let mut leader = NodeGroup::new(place(0, &j));
    let mut member = NodeGroup::new(place(1, &j));
    let h = leader.exchange(report(0, 300), t0);
    assert!(leader.leads());
    assert!(
        h.said
            .iter()
            .any(|s| s.contains("decides for the 2 tasks of node 0")),
        "{:?}",
        h.said
    );
    let h = member.exchange(report(1, 400), t0);
    assert!(!member.leads());
    assert_eq!(h.defer_to, Some(0));
    // The leader admits the member and counts its report from the next.
    let _ = leader.exchange(report(0, 300), t0);
    let _ = member.exchange(report(1, 500), t0 + Duration::from_millis(500));
    std::thread::sleep(Duration::from_millis(20));
    let h = leader.exchange(report(0, 300), t0 + Duration::from_secs(1));
    assert_eq!(h.others_bytes, 500 << 20);
    let g = leader.grower().unwrap();
    assert_eq!((g.task, g.rank), (1, 1), "{g:?}");
    // The leader's stop reaches the member once.
    leader.tell_stop(&NodeStop {
        why: "node 0 (rank 1): critical-headroom".into(),
        voted: false,
    });
    std::thread::sleep(Duration::from_millis(20));
    let h = member.exchange(report(1, 500), t0 + Duration::from_secs(2));
    assert_eq!(
        h.stop.map(|s| s.why).as_deref(),
        Some("node 0 (rank 1): critical-headroom")
    );
    // A member that stopped reporting stops counting.
    std::thread::sleep(Duration::from_millis(20));
    let h = leader.exchange(report(0, 300), t0 + Duration::from_secs(3));
    assert_eq!(h.others_bytes, 500 << 20);
    let h = leader.exchange(report(0, 300), t0 + Duration::from_secs(9));
    assert_eq!(h.others_bytes, 0);
}

#[test]
fn a_member_whose_leader_is_gone_says_so_and_leads_next() {
    let j = job("gone");
    let t0 = Instant::now();
    let mut leader = NodeGroup::new(place(0, &j));
    let mut member = NodeGroup::new(place(1, &j));
    let _ = leader.exchange(report(0, 1), t0);
    let _ = member.exchange(report(1, 1), t0);
    let _ = leader.exchange(report(0, 1), t0);
    drop(leader);
    let h = member.exchange(report(1, 1), t0);
    assert!(h.said.iter().any(|s| s.contains("is gone")), "{:?}", h.said);
    assert_eq!(h.defer_to, None);
    let _ = member.exchange(report(1, 1), t0);
    assert!(member.leads());
}

#[test]
fn a_leader_no_task_joins_says_so_once() {
    let j = job("alone");
    let t0 = Instant::now();
    let mut leader = NodeGroup::new(place(0, &j));
    let _ = leader.exchange(report(0, 1), t0);
    let h = leader.exchange(report(0, 1), t0 + Duration::from_secs(10));
    assert!(h.said.is_empty(), "{:?}", h.said);
    let h = leader.exchange(report(0, 1), t0 + LONELY);
    assert!(
        h.said
            .iter()
            .any(|s| s.contains("no other task of node 0 joined")),
        "{:?}",
        h.said
    );
    let h = leader.exchange(report(0, 1), t0 + LONELY * 2);
    assert!(h.said.is_empty(), "said once: {:?}", h.said);
}
