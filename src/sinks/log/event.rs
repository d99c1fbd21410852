//! The log's one event type: every line oomguard writes is an [`Event`],
//! named once here with its body type. The writer can take nothing else,
//! and both readers (`report`, `replay`) get the same typed value back
//! through [`Event::read`]; the round-trip test below writes every variant
//! and reads it back equal.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::{
    ActionEvent, CheckpointEvent, ChildExit, CudaOomEvent, OomKillEvent, PhaseMemoryEvent,
    RankFailedEvent, RestartEvent, RuleEvent, RunEnd, RunStart, SampleEvent, WorkerDiedEvent,
    lenient,
};

/// Something that takes an event's name and body, whatever the body's type
/// (the writer puts the body's fields beside the envelope's, in order).
pub(super) trait BodyVisitor {
    fn visit<T: Serialize>(self, name: &'static str, body: &T);
}

/// Declares [`Event`] from one list: the variant, its body type and the
/// name its lines carry. Everything that maps a name to a type (the serde
/// tag, [`Event::name`], [`Event::read`], [`Event::NAMES`]) comes from it.
macro_rules! events {
    ($( $(#[$doc:meta])* $variant:ident($body:ty) = $name:literal, )*) => {
        /// One line of the log (design.md §4.1). Serialized with serde's
        /// `event` tag, as the lines carry it.
        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
        #[serde(tag = "event")]
        pub enum Event {
            $( $(#[$doc])* #[serde(rename = $name)] $variant($body), )*
        }

        /// Which event a line names, typed: known even when its body
        /// does not read (a reader still counts a broken `run_end`).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
        pub enum EventName {
            $( #[serde(rename = $name)] $variant, )*
        }

        impl EventName {
            /// The name a line carries: `None` for one this version does
            /// not know.
            pub fn from_name(name: &str) -> Option<EventName> {
                match name {
                    $($name => Some(EventName::$variant),)*
                    _ => None,
                }
            }
        }

        impl Event {
            /// Every event name, in declaration order.
            pub const NAMES: &[&str] = &[$($name),*];

            /// The name its line carries (`event`).
            pub fn name(&self) -> &'static str {
                match self {
                    $(Event::$variant(_) => $name,)*
                }
            }

            /// Reads the body of a line whose `event` is `name`: `None`
            /// for a name this version does not know (events are only
            /// ever added within `oomguard/1`). `raw` is the whole line;
            /// the body's type skips the envelope's fields.
            pub fn read(name: &str, raw: &str) -> Result<Option<Event>, serde_json::Error> {
                Ok(Some(match name {
                    $($name => Event::$variant(serde_json::from_str(raw)?),)*
                    _ => return Ok(None),
                }))
            }

            pub(super) fn visit_body(&self, v: impl BodyVisitor) {
                match self {
                    $(Event::$variant(body) => v.visit($name, body),)*
                }
            }
        }
    };
}

events! {
    /// The run began: the command, its ceilings, the policy.
    RunStart(Box<RunStart>) = "run_start",
    /// One measurement of the tree.
    Sample(Box<SampleEvent>) = "sample",
    /// A rule started or stopped firing.
    Rule(RuleEvent) = "rule",
    /// oomguard acted on the job.
    Action(ActionEvent) = "action",
    /// The job's main process ended.
    ChildExit(ChildExit) = "child_exit",
    /// A new attempt starts.
    Restart(RestartEvent) = "restart",
    /// The checkpoint oomguard waited for before a restart.
    Checkpoint(CheckpointEvent) = "checkpoint",
    /// The kernel OOM killer took a process of the job (or would have).
    OomKill(Box<OomKillEvent>) = "oom_kill",
    /// The job printed a CUDA OOM.
    CudaOom(CudaOomEvent) = "cuda_oom",
    /// The job printed that a DataLoader worker died.
    WorkerDied(WorkerDiedEvent) = "worker_died",
    /// torchrun printed that a rank failed.
    RankFailed(RankFailedEvent) = "rank_failed",
    /// A training phase changed memory sharply.
    PhaseMemory(PhaseMemoryEvent) = "phase_memory",
    /// A rank's companion said hello.
    Companion(CompanionEvent) = "companion",
    /// A request went to the companion, or came from another node.
    CheckpointRequest(CheckpointRequestEvent) = "checkpoint_request",
    /// A rank took a request (at the step it will save).
    CheckpointAck(CheckpointAckEvent) = "checkpoint_ack",
    /// A rank's save finished.
    CheckpointDone(CheckpointDoneEvent) = "checkpoint_done",
    /// A job across nodes lost a rank: this node's or another's.
    Fault(FaultEvent) = "fault",
    /// This node's fault reached the job's store.
    FaultPublished(FaultPublishedEvent) = "fault_published",
    /// The job's store went away.
    StoreLost(StoreLostEvent) = "store_lost",
    /// oomguard's link to the job's store failed and is trying again.
    StoreUnsteady(StoreUnsteadyEvent) = "store_unsteady",
    /// A rank freed memory when asked to.
    Relieved(RelievedEvent) = "relieved",
    /// The run ended: how, and its peaks.
    RunEnd(Box<RunEnd>) = "run_end",
}

/// `companion`: a rank's companion connected.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct CompanionEvent {
    pub pid: u32,
    pub rank: u32,
    pub framework: String,
    #[serde(deserialize_with = "lenient")]
    pub world: Option<u32>,
    /// The companion's protocol version (`v` of its records).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub protocol: Option<u32>,
    /// Which copy ran: the companion's package version and the directory
    /// it was imported from (oomguard's embedded copy, or one installed in
    /// the job's environment, which wins: docs/install.md).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub path: Option<String>,
    /// The rank's place: its local rank, its node, and its SLURM task when
    /// SLURM started each rank as a task of its own.
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "lenient")]
    pub local_rank: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "lenient")]
    pub node: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "lenient")]
    pub task: Option<u32>,
}

/// `checkpoint_request`: what oomguard asked the ranks for (`kind`:
/// `checkpoint`, `stop`, `relieve`), or, with `remote`, what another node
/// asked for and which of its ranks caused it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct CheckpointRequestEvent {
    pub id: u64,
    pub kind: String,
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "lenient")]
    pub reason: Option<String>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub remote: bool,
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "lenient")]
    pub node: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "lenient")]
    pub cause_rank: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "lenient")]
    pub detail: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "lenient")]
    pub step: Option<u64>,
    /// `restart` when the asking node restarts the job after.
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "lenient")]
    pub then: Option<String>,
    /// The SLURM task that asked, when SLURM started each rank as a task
    /// of its own (`node` is then the node it runs on).
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "lenient")]
    pub task: Option<u32>,
}

/// `checkpoint_ack`: a rank took request `id` and will save `step`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct CheckpointAckEvent {
    pub id: u64,
    pub rank: u32,
    #[serde(deserialize_with = "lenient")]
    pub step: Option<u64>,
}

/// `checkpoint_done`: a rank's save for request `id` finished.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct CheckpointDoneEvent {
    pub id: u64,
    pub rank: u32,
    #[serde(deserialize_with = "lenient")]
    pub step: Option<u64>,
    #[serde(deserialize_with = "super::lenient_vec")]
    pub paths: Vec<PathBuf>,
    pub ok: bool,
    pub save_seconds: f64,
    /// Why a save the companion called done does not count (`ok` false):
    /// a path it named is missing, empty, or a directory with no file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_counted: Option<String>,
}

/// `fault`: a rank of this node (`remote` false) or of node `node` died or
/// was stopped, and the job ends (or restarts, `then`) for it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct FaultEvent {
    #[serde(deserialize_with = "lenient")]
    pub id: Option<u64>,
    pub remote: bool,
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "lenient")]
    pub node: Option<u32>,
    #[serde(deserialize_with = "lenient")]
    pub cause_rank: Option<u32>,
    /// Machine-readable: `rank-stopped`, `oom-kill`, `cuda-oom`.
    #[serde(deserialize_with = "lenient")]
    pub reason: Option<String>,
    #[serde(deserialize_with = "lenient")]
    pub detail: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none", deserialize_with = "lenient")]
    pub then: Option<String>,
}

/// `fault_published`: fault `id` is in the job's store.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct FaultPublishedEvent {
    pub id: u64,
}

/// `store_lost`: the job's store at `addr` stopped answering.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct StoreLostEvent {
    #[serde(deserialize_with = "lenient")]
    pub addr: Option<String>,
}

/// `store_unsteady`: oomguard's link to the job's store at `addr` failed
/// (`reason`) and is trying again, once an outage; only a store unreachable
/// for the whole lost window is `store_lost`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct StoreUnsteadyEvent {
    #[serde(deserialize_with = "lenient")]
    pub addr: Option<String>,
    pub reason: String,
}

/// `relieved`: what a rank freed for request `id`, per kind of memory.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RelievedEvent {
    pub id: u64,
    pub rank: u32,
    pub freed_bytes: BTreeMap<String, u64>,
}

/// The log line for an event read from the job's output.
/// `host_memory_critical` says whether host or cgroup memory was near its
/// ceiling when the event came (it is what tells the kernel OOM killer
/// apart from another SIGKILL). `None` for progress updates (they ride on
/// other lines as `progress`).
pub fn output_event(
    event: &crate::vocab::forensics::torch::TorchEvent,
    host_memory_critical: bool,
) -> Option<Event> {
    use crate::vocab::forensics::torch::TorchEvent;
    match event {
        TorchEvent::CudaOom(e) => Some(Event::CudaOom(CudaOomEvent::new(e))),
        TorchEvent::WorkerDied(e) => Some(Event::WorkerDied(WorkerDiedEvent::new(
            e,
            host_memory_critical,
        ))),
        TorchEvent::RankFailed(e) => {
            RankFailedEvent::new(e, host_memory_critical).map(Event::RankFailed)
        }
        TorchEvent::Progress(_) | TorchEvent::Framework(_) => None,
    }
}

/// Events that carry the job's `progress`, when it printed any. Samples
/// carry it only when it changed.
pub(super) const PROGRESS_EVENTS: &[&str] = &[
    "rule",
    "action",
    "checkpoint",
    "restart",
    "oom_kill",
    "cuda_oom",
    "worker_died",
    "rank_failed",
    "run_end",
    "phase_memory",
];

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;
    use crate::sinks::log::{LogWriter, read::Item, read::LogLines};

    /// One event of each kind, with its optional fields set, so a field the
    /// writer drops or the reader misreads shows as a difference.
    fn example(name: &str) -> Event {
        let json = |v: serde_json::Value| serde_json::to_string(&v).unwrap();
        let read = |v: serde_json::Value| Event::read(name, &json(v)).unwrap().unwrap();
        match name {
            "run_start" => read(serde_json::json!({
                "argv": ["python", "train.py"], "pid": 42, "version": "0.1.0",
                "interval_seconds": 1.0, "pss_interval_seconds": 5.0, "every_tick": true,
                "gpu": {"available": false, "reason": "no NVML"},
                "ceilings": [{"source": "cgroup", "bytes": 1073741824u64}],
                "cgroup": {"version": 2, "path": "/job", "owned": true},
                "ids": {"rank": "3", "node": "1"},
            })),
            "sample" => read(serde_json::json!({
                "headroom_percent": 12.5, "headroom_bytes": 134217728u64,
                "tree": {"pss_bytes": 900, "footprint_bytes": 1000, "procs": 3,
                         "pss_age_seconds": 0.5},
                "procs": [{"pid": 7, "ppid": 1, "role": "worker", "comm": "python",
                           "rss_bytes": 10, "pss_bytes": 8, "uss_bytes": 6, "swap_bytes": 0}],
            })),
            "rule" => Event::Rule(RuleEvent::new(
                "critical",
                "headroom_percent",
                4.0,
                5.0,
                true,
            )),
            "action" => Event::Action(ActionEvent {
                action: crate::sinks::log::ActionKind::Stop,
                reason: "critical-headroom".into(),
                pids: vec![7, 8],
                signal: Some("SIGTERM".into()),
                result: "ok".into(),
            }),
            "child_exit" => Event::ChildExit(ChildExit {
                pid: 7,
                code: Some(3),
                signal: None,
            }),
            "restart" => read(serde_json::json!({
                "reason": "oom-kill", "checkpoint": "/ckpt/step-40.pt",
                "degraded": {"NUM_WORKERS": ["4", "2"]}, "delay_seconds": 2.0,
            })),
            "checkpoint" => Event::Checkpoint(CheckpointEvent {
                confirmed: true,
                path: Some("/ckpt/step-40.pt".into()),
                waited_seconds: 1.5,
            }),
            "oom_kill" => read(serde_json::json!({
                "pid": 9, "comm": "python", "role": "worker", "anon_rss_bytes": 1048576,
                "constraint": "CONSTRAINT_MEMCG", "reason": "ours",
            })),
            "cuda_oom" => read(serde_json::json!({
                "device": "0", "tried_bytes": 2097152, "total_bytes": 8589934592u64,
                "free_bytes": 1048576, "advice": ["set expandable_segments"],
                "fragmentation": true, "message": "CUDA out of memory",
            })),
            "worker_died" => read(serde_json::json!({
                "pid": 11, "signal": "SIGKILL", "shm_hint": true, "message": "killed",
            })),
            "rank_failed" => read(serde_json::json!({
                "rank": 1, "local_rank": 1, "pid": 12, "exit_code": -9,
                "signal": "SIGKILL", "host": "node-a",
            })),
            "phase_memory" => read(serde_json::json!({
                "phase": "validation", "epoch": "2", "before_bytes": 1048576,
                "added_bytes": 2097152, "advice": "free the predictions",
            })),
            "companion" => Event::Companion(CompanionEvent {
                pid: 7,
                rank: 2,
                framework: "lightning".into(),
                world: Some(4),
                ..CompanionEvent::default()
            }),
            "checkpoint_request" => Event::CheckpointRequest(CheckpointRequestEvent {
                id: 3,
                kind: "stop".into(),
                reason: Some("critical-headroom".into()),
                remote: true,
                node: Some(1),
                cause_rank: Some(3),
                detail: Some("3.1 GiB left of 64 GiB".into()),
                step: Some(580),
                then: Some("restart".into()),
                task: None,
            }),
            "checkpoint_ack" => Event::CheckpointAck(CheckpointAckEvent {
                id: 3,
                rank: 1,
                step: Some(580),
            }),
            "checkpoint_done" => Event::CheckpointDone(CheckpointDoneEvent {
                id: 3,
                rank: 1,
                step: Some(580),
                paths: vec!["/ckpt/step-580.pt".into()],
                ok: true,
                save_seconds: 0.25,
                not_counted: None,
            }),
            "fault" => Event::Fault(FaultEvent {
                id: Some(4),
                remote: true,
                node: Some(0),
                cause_rank: Some(1),
                reason: Some("oom-kill".into()),
                detail: Some("rank 1 (pid 12) killed by the kernel OOM killer".into()),
                then: Some("restart".into()),
            }),
            "fault_published" => Event::FaultPublished(FaultPublishedEvent { id: 4 }),
            "store_lost" => Event::StoreLost(StoreLostEvent {
                addr: Some("127.0.0.1:29500".into()),
            }),
            "store_unsteady" => Event::StoreUnsteady(StoreUnsteadyEvent {
                addr: Some("127.0.0.1:29500".into()),
                reason: "cannot connect: Connection refused (os error 111)".into(),
            }),
            "relieved" => Event::Relieved(RelievedEvent {
                id: 5,
                rank: 0,
                freed_bytes: BTreeMap::from([("cuda_cache".into(), 1 << 20)]),
            }),
            "run_end" => read(serde_json::json!({
                "outcome": "stopped_by_policy", "exit_code": 75, "restarts": 1,
                "duration_seconds": 12.5,
                "peak": {"tree_pss_bytes": 1000, "t": 3.0}, "output_dropped_bytes": 8,
                "actions": {"stop": 1},
            })),
            other => panic!("no example of `{other}`: add one for the new event"),
        }
    }

    #[test]
    fn every_event_written_reads_back_equal() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run.ndjson");
        let events: Vec<Event> = Event::NAMES.iter().map(|n| example(n)).collect();
        let mut w = LogWriter::create(&path, Instant::now()).unwrap();
        for e in &events {
            assert_eq!(
                &example(e.name()),
                e,
                "the example of {} is stable",
                e.name()
            );
            w.write(e);
        }
        drop(w);
        let text = std::fs::read_to_string(&path).unwrap();
        let read: Vec<Event> = LogLines::new(text.as_bytes())
            .map(|item| match item.unwrap() {
                Item::Line(l) => l.event.unwrap().unwrap(),
                other => panic!("not a line: {other:?}"),
            })
            .collect();
        assert_eq!(read.len(), events.len());
        for (got, want) in read.iter().zip(&events) {
            assert_eq!(got, want, "{} did not survive the log", want.name());
        }
        // The same lines read through serde's tag, for other readers.
        for (line, want) in text.lines().zip(&events) {
            let got: Event = serde_json::from_str(line).unwrap();
            assert_eq!(&got, want, "{} through the serde tag", want.name());
        }
    }

    #[test]
    fn every_name_is_distinct_and_unknown_names_read_as_none() {
        let mut names = Event::NAMES.to_vec();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), Event::NAMES.len());
        assert!(Event::read("from_the_future", "{}").unwrap().is_none());
        assert!(Event::read("action", "{\"action\": 3}").is_err());
    }
}
