//! A TCP proxy in front of the job's rendezvous store that can refuse
//! connections for a while: the store "hiccup" of a flaky network or a
//! restarting peer, for oomguard's store link alone (the ranks keep their
//! own connections to the real store).

#![allow(clippy::unwrap_used)]

use std::io;
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub struct StoreProxy {
    pub port: u16,
    shared: Arc<Shared>,
}

#[derive(Default)]
struct Shared {
    /// Taking connections (false: the port refuses them).
    open: AtomicBool,
    /// The accept loop has let its listener go.
    closed: AtomicBool,
    stop: AtomicBool,
    accepted: AtomicUsize,
    /// Both ends of every forwarded connection, to cut them.
    conns: Mutex<Vec<TcpStream>>,
}

impl StoreProxy {
    /// Forwards `127.0.0.1:<port>` to `127.0.0.1:<the port written in
    /// target>` (read at each connection: the job's store port is the
    /// job's to choose, and `plain.py` writes it down); `open`: takes
    /// connections from the start (else only after [`Self::open`]).
    pub fn start(target: &Path, open: bool) -> Self {
        let first = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = first.local_addr().unwrap().port();
        let shared = Arc::new(Shared::default());
        shared.open.store(open, Ordering::SeqCst);
        let s = shared.clone();
        let target = target.to_path_buf();
        std::thread::spawn(move || accept_loop(first, port, &target, &s));
        StoreProxy { port, shared }
    }

    /// Connections taken so far.
    pub fn accepted(&self) -> usize {
        self.shared.accepted.load(Ordering::SeqCst)
    }

    /// Cuts every forwarded connection and refuses new ones for `d`.
    pub fn outage(&self, d: Duration) {
        self.shared.open.store(false, Ordering::SeqCst);
        while !self.shared.closed.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(10));
        }
        for c in self.shared.conns.lock().unwrap().drain(..) {
            let _ = c.shutdown(Shutdown::Both);
        }
        std::thread::sleep(d);
        self.open();
    }

    /// Starts taking connections.
    pub fn open(&self) {
        self.shared.open.store(true, Ordering::SeqCst);
    }
}

impl Drop for StoreProxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        for c in self.shared.conns.lock().unwrap().drain(..) {
            let _ = c.shutdown(Shutdown::Both);
        }
    }
}

fn accept_loop(first: TcpListener, port: u16, target: &PathBuf, s: &Shared) {
    let mut listener = Some(first);
    while !s.stop.load(Ordering::SeqCst) {
        if !s.open.load(Ordering::SeqCst) {
            // Nothing listens: a connection is refused.
            listener = None;
            s.closed.store(true, Ordering::SeqCst);
            std::thread::sleep(Duration::from_millis(10));
            continue;
        }
        s.closed.store(false, Ordering::SeqCst);
        let l = match listener.as_ref() {
            Some(l) => l,
            // std sets SO_REUSEADDR: the port binds again at once.
            None => match TcpListener::bind(("127.0.0.1", port)) {
                Ok(l) => listener.insert(l),
                Err(_) => {
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
            },
        };
        let _ = l.set_nonblocking(true);
        match l.accept() {
            Ok((client, _)) => {
                let _ = client.set_nonblocking(false);
                let target = std::fs::read_to_string(target)
                    .ok()
                    .and_then(|t| t.trim().parse::<u16>().ok());
                if let Some(Ok(store)) = target.map(|t| TcpStream::connect(("127.0.0.1", t))) {
                    s.accepted.fetch_add(1, Ordering::SeqCst);
                    forward(client, store, s);
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

fn forward(client: TcpStream, store: TcpStream, s: &Shared) {
    let mut conns = s.conns.lock().unwrap();
    for (from, to) in [(&client, &store), (&store, &client)] {
        let (mut from, mut to) = (from.try_clone().unwrap(), to.try_clone().unwrap());
        std::thread::spawn(move || {
            let _ = io::copy(&mut from, &mut to);
            let _ = to.shutdown(Shutdown::Write);
        });
    }
    conns.push(client);
    conns.push(store);
}
