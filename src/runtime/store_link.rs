//! This node's line to the job's rendezvous store (torch's `TCPStore`,
//! hosted by node 0's launcher under torchrun), spoken by oomguard itself.
//!
//! A fault of this node (a rank killed, crashed, stopped) must reach the
//! other nodes even when no rank of this node is left to carry it, and
//! before this node's launcher tears the store down (torchrun notices a dead
//! rank within 0.1 s and ends the rest). So oomguard writes the fault into
//! the store the moment it learns of it, and a thread waits in the store for
//! the other nodes' faults, so they are heard even when this node's ranks
//! have already died of the broken collective. The keys are the ones the
//! companion used before oomguard carried faults itself:
//! `oomguard/faults` counts the faults put, `oomguard/fault/<n>` is the n-th
//! (JSON: id, node, cause_rank, reason, detail, then, t).
//!
//! The client speaks the store's wire protocol (one query byte, then
//! length-prefixed keys and values in the host's byte order, after a
//! `VALIDATE` with the store's magic number) over std's blocking sockets,
//! on two threads of its own: nothing here ever blocks the loop.

use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use crate::vocab::companion::{Fault, Record};

const VALIDATE: u8 = 0;
const SET: u8 = 1;
const GET: u8 = 3;
const ADD: u8 = 4;
const WAIT: u8 = 6;
const MAGIC: u32 = 0x3C85_F7CE;
/// `WaitResponseType::STOP_WAITING`: every key waited for is set.
const STOP_WAITING: u8 = 0;

const COUNT_KEY: &str = "oomguard/faults";
/// A store that does not take a connection within this is gone.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// A wait for the next fault is renewed (on a new connection) this often,
/// so a store that vanished without closing its socket is noticed.
const WAIT_RENEW: Duration = Duration::from_secs(30);
/// A query's answer takes at most this long from a live store.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);
/// A store that cannot be reached is tried again after this, then after
/// twice as long each time, up to [`RETRY_MAX`]: a refused connection, a
/// name that does not resolve yet, a store that restarts.
const RETRY_FIRST: Duration = Duration::from_millis(250);
const RETRY_MAX: Duration = Duration::from_secs(2);
/// Only a store unreachable this long is lost (said once, and the loop
/// decides: `peers::STORE_LOST_WAIT`).
const LOST_AFTER: Duration = Duration::from_secs(10);
/// A fault put before this attempt began (less this much, for the
/// nodes' clocks) is an earlier attempt's, in a store that outlived it.
const CLOCK_SLACK_SECONDS: f64 = 2.0;

/// One connection to a `TCPStore`.
pub struct StoreClient {
    stream: TcpStream,
}

impl StoreClient {
    /// Connects to `addr` (`host:port`) and introduces itself.
    pub fn connect(addr: &str) -> io::Result<Self> {
        let mut last = io::Error::new(io::ErrorKind::NotFound, format!("{addr}: no address"));
        for sa in addr.to_socket_addrs()? {
            match TcpStream::connect_timeout(&sa, CONNECT_TIMEOUT) {
                Ok(stream) => {
                    stream.set_nodelay(true)?;
                    stream.set_read_timeout(Some(ANSWER_TIMEOUT))?;
                    stream.set_write_timeout(Some(ANSWER_TIMEOUT))?;
                    let mut c = StoreClient { stream };
                    let mut q = vec![VALIDATE];
                    q.extend_from_slice(&MAGIC.to_ne_bytes());
                    c.stream.write_all(&q)?;
                    return Ok(c);
                }
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    fn query(kind: u8, key: &str) -> Vec<u8> {
        let mut q = vec![kind];
        push_bytes(&mut q, key.as_bytes());
        q
    }

    /// Adds `n` to the counter `key` (0 reads it); the new value.
    pub fn add(&mut self, key: &str, n: i64) -> io::Result<i64> {
        let mut q = Self::query(ADD, key);
        q.extend_from_slice(&n.to_ne_bytes());
        self.stream.write_all(&q)?;
        let mut v = [0u8; 8];
        self.stream.read_exact(&mut v)?;
        Ok(i64::from_ne_bytes(v))
    }

    pub fn set(&mut self, key: &str, value: &[u8]) -> io::Result<()> {
        let mut q = Self::query(SET, key);
        push_bytes(&mut q, value);
        self.stream.write_all(&q)
    }

    /// The value of `key`, which must be set (the store holds a `GET` of a
    /// missing key until it is).
    pub fn get(&mut self, key: &str) -> io::Result<Vec<u8>> {
        self.stream.write_all(&Self::query(GET, key))?;
        let mut len = [0u8; 8];
        self.stream.read_exact(&mut len)?;
        let len = u64::from_ne_bytes(len);
        if len > 1 << 20 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{key}: a value of {len} bytes"),
            ));
        }
        let mut v = vec![0u8; len as usize];
        self.stream.read_exact(&mut v)?;
        Ok(v)
    }

    /// Waits until `key` is set, at most `within` (then `TimedOut` or
    /// `WouldBlock`, and the connection must be dropped: its answer may
    /// still come).
    pub fn wait(&mut self, key: &str, within: Duration) -> io::Result<()> {
        let mut q = vec![WAIT];
        q.extend_from_slice(&1u64.to_ne_bytes());
        push_bytes(&mut q, key.as_bytes());
        self.stream.write_all(&q)?;
        self.stream.set_read_timeout(Some(within))?;
        let mut r = [0u8; 1];
        self.stream.read_exact(&mut r)?;
        self.stream.set_read_timeout(Some(ANSWER_TIMEOUT))?;
        if r[0] == STOP_WAITING {
            Ok(())
        } else {
            Err(io::Error::other(format!("{key}: the wait was cancelled")))
        }
    }

    fn shutdown_handle(&self) -> Option<TcpStream> {
        self.stream.try_clone().ok()
    }
}

fn push_bytes(q: &mut Vec<u8>, b: &[u8]) {
    q.extend_from_slice(&(b.len() as u64).to_ne_bytes());
    q.extend_from_slice(b);
}

/// What the link heard, for the loop (as the companion's records said it
/// before oomguard carried faults itself).
#[derive(Debug)]
pub enum News {
    Heard(Record),
    /// A fault could not be put in the store: why.
    CannotTell(String),
    /// The store at the address did not answer, or answered something
    /// unusable (why), and is being tried again for up to the seconds
    /// given: said once per outage.
    Unsteady(String, String, u64),
}

/// The link of one attempt: its threads stop (and say nothing more) when it
/// is dropped.
pub struct StoreLink {
    addr: String,
    out: mpsc::Sender<(u64, Fault)>,
    news: mpsc::Receiver<News>,
    stopped: Arc<AtomicBool>,
    /// The waiting thread's connection, shut down on drop to end its wait.
    waiting: Arc<std::sync::Mutex<Option<TcpStream>>>,
}

impl std::fmt::Debug for StoreLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StoreLink")
            .field("addr", &self.addr)
            .finish()
    }
}

/// Which oomguard of the job this link speaks for: its node, and its
/// SLURM task when SLURM started each rank as a task of its own (then
/// several oomguards share a node, and the task tells them apart).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Place {
    pub node: u32,
    pub task: Option<u32>,
}

impl Place {
    /// The number that tells this oomguard's faults from the others'.
    pub fn origin(self) -> u32 {
        self.task.unwrap_or(self.node)
    }
}

impl StoreLink {
    /// Starts the link to the store at `addr` for the oomguard at `place`,
    /// for an attempt that began at `since` (Unix seconds): faults put
    /// before it are an earlier attempt's.
    pub fn start(addr: String, place: Place, since: f64) -> io::Result<Self> {
        Self::start_with(addr, place, since, LOST_AFTER)
    }

    /// [`StoreLink::start`], the store lost after `lost_after` unreachable.
    pub fn start_with(
        addr: String,
        place: Place,
        since: f64,
        lost_after: Duration,
    ) -> io::Result<Self> {
        let (out, out_rx) = mpsc::channel::<(u64, Fault)>();
        let (news_tx, news) = mpsc::channel();
        let stopped = Arc::new(AtomicBool::new(false));
        let waiting = Arc::new(std::sync::Mutex::new(None));
        {
            let (addr, tx, stopped) = (addr.clone(), news_tx.clone(), stopped.clone());
            std::thread::Builder::new()
                .name("oomguard-store-out".into())
                .spawn(move || tell(&addr, place, &out_rx, &tx, &stopped))?;
        }
        {
            let (addr, stopped, waiting) = (addr.clone(), stopped.clone(), waiting.clone());
            std::thread::Builder::new()
                .name("oomguard-store-in".into())
                .spawn(move || {
                    let mut l = Listener {
                        addr: &addr,
                        origin: place.origin(),
                        since,
                        lost_after,
                        news: &news_tx,
                        stopped: &stopped,
                        steady: false,
                    };
                    l.run(&waiting);
                })?;
        }
        Ok(StoreLink {
            addr,
            out,
            news,
            stopped,
            waiting,
        })
    }

    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Puts this node's fault `id` in the store (at once, on the link's
    /// thread); [`Record::FaultPublished`] follows once it is there.
    pub fn publish(&self, id: u64, fault: &Fault) {
        let _ = self.out.send((id, fault.clone()));
    }

    /// What was heard since the last call.
    pub fn take(&self) -> Vec<News> {
        self.news.try_iter().collect()
    }
}

impl Drop for StoreLink {
    fn drop(&mut self) {
        self.stopped.store(true, Ordering::SeqCst);
        if let Ok(mut w) = self.waiting.lock()
            && let Some(s) = w.take()
        {
            let _ = s.shutdown(std::net::Shutdown::Both);
        }
    }
}

/// The outgoing thread: each fault goes into the store on a connection
/// made for it (a fault is rare; a connection kept open could be stale).
fn tell(
    addr: &str,
    place: Place,
    faults: &mpsc::Receiver<(u64, Fault)>,
    news: &mpsc::Sender<News>,
    stopped: &AtomicBool,
) {
    for (id, fault) in faults {
        if stopped.load(Ordering::SeqCst) {
            return;
        }
        let mut body = serde_json::to_value(&fault).unwrap_or_default();
        body["id"] = id.into();
        body["node"] = place.node.into();
        body["origin"] = place.origin().into();
        body["t"] = crate::vocab::clock::unix_seconds().into();
        let put = connect_soon(addr, stopped).and_then(|mut c| {
            let n = c.add(COUNT_KEY, 1)?;
            c.set(&format!("oomguard/fault/{n}"), body.to_string().as_bytes())?;
            // The set has no answer: a read of the counter makes sure the
            // store has taken it before the fault counts as told.
            c.add(COUNT_KEY, 0).map(|_| ())
        });
        let said = match put {
            Ok(()) => News::Heard(Record::FaultPublished { id }),
            Err(e) => News::CannotTell(format!("the job's store at {addr}: {e}")),
        };
        if news.send(said).is_err() {
            return;
        }
    }
}

/// A connection to the store, tried again with backoff for about a second
/// and a half when it is refused or does not resolve (a fault is urgent:
/// the other nodes must read it before the store's host tears it down).
/// Only the connection is tried again: once a fault's number is taken, a
/// second try would leave that number unset and the listeners waiting on
/// it.
fn connect_soon(addr: &str, stopped: &AtomicBool) -> io::Result<StoreClient> {
    let mut backoff = RETRY_FIRST;
    for _ in 0..3 {
        match StoreClient::connect(addr) {
            Ok(c) => return Ok(c),
            Err(_) if !stopped.load(Ordering::SeqCst) => std::thread::sleep(backoff),
            Err(e) => return Err(e),
        }
        backoff *= 2;
    }
    StoreClient::connect(addr)
}

/// The listening thread: waits in the store for each next fault, and says
/// the other nodes' ones. A store that does not answer is tried again with
/// backoff, said once; one unreachable for [`LOST_AFTER`] is lost, said
/// once, and the thread ends.
struct Listener<'a> {
    addr: &'a str,
    origin: u32,
    since: f64,
    lost_after: Duration,
    news: &'a mpsc::Sender<News>,
    stopped: &'a AtomicBool,
    /// The store answered on this connection: an outage before it is over
    /// (the next break starts a new one, said again, with its own window).
    steady: bool,
}

/// Why a connection's wait for faults ended.
enum Ended {
    /// The link was dropped, or its loop is gone.
    Stopped,
    /// The wait ran out (renewed on a new connection at once), after the
    /// connection served: the store is steady.
    Renew,
    /// The connection broke, or the store sent something unusable.
    Broken(String),
}

impl Listener<'_> {
    fn run(&mut self, waiting: &std::sync::Mutex<Option<TcpStream>>) {
        let mut next: Option<i64> = None;
        let mut down_since: Option<std::time::Instant> = None;
        let mut backoff = RETRY_FIRST;
        let mut said = false;
        loop {
            if self.stopped.load(Ordering::SeqCst) {
                return;
            }
            let broke = match StoreClient::connect(self.addr) {
                Ok(mut c) => {
                    if let Ok(mut w) = waiting.lock() {
                        *w = c.shutdown_handle();
                    }
                    match self.serve(&mut c, &mut next) {
                        Ended::Stopped => return,
                        Ended::Renew => {
                            (down_since, backoff, said) = (None, RETRY_FIRST, false);
                            continue;
                        }
                        Ended::Broken(why) => {
                            if std::mem::take(&mut self.steady) {
                                (down_since, backoff, said) = (None, RETRY_FIRST, false);
                            }
                            why
                        }
                    }
                }
                Err(e) => format!("cannot connect: {e}"),
            };
            let since = *down_since.get_or_insert_with(std::time::Instant::now);
            if since.elapsed() >= self.lost_after {
                if !self.stopped.load(Ordering::SeqCst) {
                    let _ = self.news.send(News::Heard(Record::StoreLost {
                        addr: Some(self.addr.to_string()),
                    }));
                }
                return;
            }
            if !said {
                said = true;
                let _ = self.news.send(News::Unsteady(
                    self.addr.to_string(),
                    broke,
                    self.lost_after.as_secs(),
                ));
            }
            self.pause(backoff);
            backoff = (backoff * 2).min(RETRY_MAX);
        }
    }

    /// Sleeps `d`, waking early when the link is dropped.
    fn pause(&self, d: Duration) {
        let end = std::time::Instant::now() + d;
        while std::time::Instant::now() < end && !self.stopped.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(50).min(d));
        }
    }

    /// Waits on one connection for each next fault, from `next` (on the
    /// first connection: the first fault of the store, so that one put
    /// before this node connected is heard).
    fn serve(&mut self, c: &mut StoreClient, next: &mut Option<i64>) -> Ended {
        // One round trip on every connection: the store answers, so an
        // outage before this one is over.
        if let Err(e) = c.add(COUNT_KEY, 0) {
            return Ended::Broken(e.to_string());
        }
        self.steady = true;
        loop {
            let n = *next.get_or_insert(1);
            let key = format!("oomguard/fault/{n}");
            match c.wait(&key, WAIT_RENEW) {
                Ok(()) => {}
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock
                    ) =>
                {
                    return Ended::Renew;
                }
                Err(e) => return Ended::Broken(e.to_string()),
            }
            let body = match c.get(&key) {
                Ok(b) => b,
                Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                    // Unusable, and the rest of it is still on the wire:
                    // skipped, on a new connection.
                    *next = n.checked_add(1);
                    return Ended::Broken(format!("{e}: skipped"));
                }
                Err(e) => return Ended::Broken(e.to_string()),
            };
            // The store's count is anyone's to write: one at i64::MAX has
            // no next fault.
            let Some(after) = n.checked_add(1) else {
                return Ended::Stopped;
            };
            *next = Some(after);
            if let Some(r) = remote_fault(&body, self.origin, self.since)
                && !self.stopped.load(Ordering::SeqCst)
                && self.news.send(News::Heard(r)).is_err()
            {
                return Ended::Stopped;
            }
            if self.stopped.load(Ordering::SeqCst) {
                return Ended::Stopped;
            }
        }
    }
}

/// Another oomguard's fault as the loop takes it (`None`: this one's own
/// (origin `own`), one put before this attempt began at `since`, or not a
/// fault). An older oomguard's fault names its node alone.
fn remote_fault(body: &[u8], own: u32, since: f64) -> Option<Record> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    let node = u32::try_from(v["node"].as_u64()?).ok()?;
    let origin = v["origin"]
        .as_u64()
        .and_then(|o| u32::try_from(o).ok())
        .unwrap_or(node);
    if origin == own {
        return None;
    }
    if v["t"]
        .as_f64()
        .is_some_and(|t| t < since - CLOCK_SLACK_SECONDS)
    {
        return None;
    }
    let text = |k: &str| v[k].as_str().map(str::to_string);
    Some(Record::Fault {
        id: v["id"].as_u64().unwrap_or(0),
        node,
        cause_rank: v["cause_rank"].as_u64().and_then(|r| u32::try_from(r).ok()),
        reason: text("reason"),
        detail: text("detail"),
        then: text("then"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::net::TcpListener;
    use std::sync::Mutex;

    type Data = Arc<Mutex<HashMap<String, Vec<u8>>>>;

    /// A store that answers as torch's does, for the queries the link uses.
    fn fake_store() -> (String, Data) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        drop(l);
        let data = fake_store_at(&addr);
        (addr, data)
    }

    fn serve(mut s: TcpStream, data: &Mutex<HashMap<String, Vec<u8>>>) {
        let mut u8b = [0u8; 1];
        let read_bytes = |s: &mut TcpStream| -> Option<Vec<u8>> {
            let mut n = [0u8; 8];
            s.read_exact(&mut n).ok()?;
            let mut b = vec![0u8; u64::from_ne_bytes(n) as usize];
            s.read_exact(&mut b).ok()?;
            Some(b)
        };
        s.read_exact(&mut u8b).unwrap();
        assert_eq!(u8b[0], VALIDATE);
        let mut m = [0u8; 4];
        s.read_exact(&mut m).unwrap();
        assert_eq!(u32::from_ne_bytes(m), MAGIC);
        while s.read_exact(&mut u8b).is_ok() {
            match u8b[0] {
                ADD => {
                    let k = String::from_utf8(read_bytes(&mut s).unwrap()).unwrap();
                    let mut n = [0u8; 8];
                    s.read_exact(&mut n).unwrap();
                    let mut d = data.lock().unwrap();
                    let old = d
                        .get(&k)
                        .map_or(0, |v| String::from_utf8_lossy(v).parse::<i64>().unwrap());
                    let new = old + i64::from_ne_bytes(n);
                    d.insert(k, new.to_string().into_bytes());
                    s.write_all(&new.to_ne_bytes()).unwrap();
                }
                SET => {
                    let k = String::from_utf8(read_bytes(&mut s).unwrap()).unwrap();
                    let v = read_bytes(&mut s).unwrap();
                    data.lock().unwrap().insert(k, v);
                }
                GET => {
                    let k = String::from_utf8(read_bytes(&mut s).unwrap()).unwrap();
                    let v = data.lock().unwrap().get(&k).cloned().unwrap();
                    let mut a = (v.len() as u64).to_ne_bytes().to_vec();
                    a.extend(v);
                    s.write_all(&a).unwrap();
                }
                WAIT => {
                    let mut n = [0u8; 8];
                    s.read_exact(&mut n).unwrap();
                    let k = String::from_utf8(read_bytes(&mut s).unwrap()).unwrap();
                    while !data.lock().unwrap().contains_key(&k) {
                        std::thread::sleep(Duration::from_millis(10));
                    }
                    s.write_all(&[STOP_WAITING]).unwrap();
                }
                q => panic!("query {q}"),
            }
        }
    }

    fn fault(reason: &str) -> Fault {
        Fault {
            cause_rank: Some(3),
            reason: reason.into(),
            detail: "rank 3 (pid 9) killed by SIGKILL".into(),
            then: None,
        }
    }

    /// What `link` heard, once `enough` holds of it (5 s at most).
    fn heard(link: &StoreLink, enough: impl Fn(&[News]) -> bool) -> Vec<News> {
        let mut all = Vec::new();
        for _ in 0..500 {
            all.extend(link.take());
            if enough(&all) {
                return all;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        panic!("never heard it: {all:?}");
    }

    #[test]
    fn a_fault_one_node_puts_is_heard_by_the_other_and_not_by_itself() {
        let (addr, data) = fake_store();
        let (a, b) = (
            StoreLink::start(addr.clone(), node(0), 0.0).unwrap(),
            StoreLink::start(addr, node(1), 0.0).unwrap(),
        );
        std::thread::sleep(Duration::from_millis(100));
        a.publish(42, &fault("rank-killed"));
        let on_a = heard(&a, |all| {
            all.iter()
                .any(|n| matches!(n, News::Heard(Record::FaultPublished { id: 42 })))
        });
        let on_b = heard(&b, |all| {
            all.iter()
                .any(|n| matches!(n, News::Heard(Record::Fault { .. })))
        });
        let Some(News::Heard(Record::Fault {
            id,
            node,
            cause_rank,
            reason,
            ..
        })) = on_b
            .into_iter()
            .find(|n| matches!(n, News::Heard(Record::Fault { .. })))
        else {
            unreachable!()
        };
        assert_eq!(
            (id, node, cause_rank, reason.as_deref()),
            (42, 0, Some(3), Some("rank-killed"))
        );
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            !a.take()
                .iter()
                .chain(&on_a)
                .any(|n| matches!(n, News::Heard(Record::Fault { .. }))),
            "a node hears its own fault"
        );
        let stored = data
            .lock()
            .unwrap()
            .get("oomguard/fault/1")
            .cloned()
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&stored).unwrap();
        assert_eq!(
            (v["node"].as_u64(), v["origin"].as_u64()),
            (Some(0), Some(0))
        );
        assert!(v["t"].as_f64().unwrap() > 1.0e9);
    }

    #[test]
    fn a_store_that_is_gone_is_said_once_and_a_fault_that_cannot_go_says_why() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        drop(l);
        let link =
            StoreLink::start_with(addr.clone(), node(1), 0.0, Duration::from_secs(1)).unwrap();
        link.publish(7, &fault("rank-crashed"));
        let all = heard(&link, |all| {
            all.iter().any(|n| matches!(n, News::CannotTell(_)))
                && all
                    .iter()
                    .any(|n| matches!(n, News::Heard(Record::StoreLost { .. })))
        });
        std::thread::sleep(Duration::from_millis(100));
        let all: Vec<News> = all.into_iter().chain(link.take()).collect();
        let lost = all
            .iter()
            .filter(|n| matches!(n, News::Heard(Record::StoreLost { .. })))
            .count();
        assert!(lost <= 1, "{all:?}");
        assert!(
            all.iter()
                .any(|n| matches!(n, News::CannotTell(w) if w.contains(&addr))),
            "{all:?}"
        );
    }

    fn node(node: u32) -> Place {
        Place { node, task: None }
    }

    #[test]
    fn what_is_not_another_nodes_fault_is_not_news() {
        assert_eq!(remote_fault(br#"{"node":2,"id":1}"#, 2, 0.0), None);
        // Two SLURM tasks of one node: the other task's fault is news, this
        // task's own is not.
        let task1 = Place {
            node: 0,
            task: Some(1),
        };
        assert_eq!(task1.origin(), 1);
        assert!(matches!(
            remote_fault(br#"{"node":0,"origin":0,"id":3}"#, task1.origin(), 0.0),
            Some(Record::Fault { node: 0, id: 3, .. })
        ));
        assert_eq!(
            remote_fault(br#"{"node":0,"origin":1,"id":3}"#, task1.origin(), 0.0),
            None
        );
        assert_eq!(remote_fault(b"not json", 2, 0.0), None);
        assert!(matches!(
            remote_fault(br#"{"node":0,"id":5,"reason":"rank-crashed"}"#, 2, 0.0),
            Some(Record::Fault { node: 0, id: 5, .. })
        ));
        // Put before this attempt began (beyond the clocks' slack): an
        // earlier attempt's, in a store that outlived it.
        let old = br#"{"node":0,"id":5,"t":1000.0}"#;
        assert_eq!(remote_fault(old, 2, 1003.0), None);
        assert!(remote_fault(old, 2, 1001.5).is_some());
    }

    /// A fault put in the store as another node's oomguard puts it.
    fn put(data: &Data, n: i64, body: &serde_json::Value) {
        let mut d = data.lock().unwrap();
        d.insert(COUNT_KEY.into(), n.to_string().into_bytes());
        d.insert(format!("oomguard/fault/{n}"), body.to_string().into_bytes());
    }

    fn other_nodes_fault(id: u64) -> serde_json::Value {
        serde_json::json!({"id": id, "node": 0, "reason": "rank-killed", "t": crate::vocab::clock::unix_seconds()})
    }

    /// The fake store, on the port of `addr`, once that is free.
    fn fake_store_at(addr: &str) -> Data {
        let l = TcpListener::bind(addr).unwrap();
        let data: Data = Arc::default();
        let d = data.clone();
        std::thread::spawn(move || {
            for s in l.incoming().flatten() {
                let d = d.clone();
                std::thread::spawn(move || serve(s, &d));
            }
        });
        data
    }

    #[test]
    fn a_refused_store_is_tried_again_and_a_fault_put_before_the_connection_is_heard() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        drop(l);
        let link =
            StoreLink::start_with(addr.clone(), node(1), 0.0, Duration::from_secs(5)).unwrap();
        std::thread::sleep(Duration::from_millis(700));
        // The store comes up, with another node's fault already in it.
        let data = fake_store_at(&addr);
        put(&data, 1, &other_nodes_fault(11));
        let all = heard(&link, |all| {
            all.iter()
                .any(|n| matches!(n, News::Heard(Record::Fault { id: 11, .. })))
        });
        let unsteady = all
            .iter()
            .filter(|n| matches!(n, News::Unsteady(..)))
            .count();
        assert_eq!(unsteady, 1, "said once: {all:?}");
        assert!(
            !all.iter()
                .any(|n| matches!(n, News::Heard(Record::StoreLost { .. }))),
            "{all:?}"
        );
    }

    #[test]
    fn a_fault_too_large_is_skipped_and_the_next_is_heard_without_spinning() {
        let (addr, data) = fake_store();
        data.lock()
            .unwrap()
            .insert("oomguard/fault/1".into(), vec![b' '; (1 << 20) + 1]);
        put(&data, 2, &other_nodes_fault(22));
        let link = StoreLink::start(addr, node(1), 0.0).unwrap();
        let all = heard(&link, |all| {
            all.iter()
                .any(|n| matches!(n, News::Heard(Record::Fault { id: 22, .. })))
        });
        assert!(
            all.iter()
                .any(|n| matches!(n, News::Unsteady(_, w, _) if w.contains("skipped"))),
            "{all:?}"
        );
    }

    #[test]
    fn a_store_that_drops_every_connection_is_tried_with_backoff_not_in_a_loop() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let a = accepted.clone();
        std::thread::spawn(move || {
            for s in l.incoming().flatten() {
                a.fetch_add(1, Ordering::SeqCst);
                drop(s);
            }
        });
        let link = StoreLink::start_with(addr, node(1), 0.0, Duration::from_secs(60)).unwrap();
        std::thread::sleep(Duration::from_secs(2));
        let n = accepted.load(Ordering::SeqCst);
        // 250 ms, then 500, 1000: four or five tries in 2 s.
        assert!((2..=6).contains(&n), "{n} connections in 2 s");
        drop(link);
    }

    #[test]
    fn a_count_at_the_top_of_i64_is_no_overflow_and_faults_are_read_from_the_first() {
        let (addr, data) = fake_store();
        put(&data, 1, &other_nodes_fault(33));
        data.lock()
            .unwrap()
            .insert(COUNT_KEY.into(), i64::MAX.to_string().into_bytes());
        let link = StoreLink::start(addr, node(1), 0.0).unwrap();
        heard(&link, |all| {
            all.iter()
                .any(|n| matches!(n, News::Heard(Record::Fault { id: 33, .. })))
        });
    }
}
