//! The node group's wire: newline-ended JSON messages on non-blocking Unix
//! stream sockets in the abstract namespace, each end checked to be this
//! user's.

use std::io::{self, Read, Write};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};

use serde::{Deserialize, Serialize};

/// A message longer than this is not one of ours: the connection is
/// dropped.
const MAX_LINE: usize = 16 * 1024;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Message {
    /// Leader to member, on joining: who leads.
    Hello { task: u32 },
    /// Member to leader, every tick.
    Report {
        task: u32,
        rank: u32,
        footprint: u64,
    },
    /// Leader to members: the node stops.
    Stop { why: String, voted: bool },
}

/// One end of a connection, with what was read of a line not yet ended.
#[derive(Debug)]
pub struct Conn {
    stream: UnixStream,
    partial: Vec<u8>,
}

/// Binds `name` (fails with `AddrInUse` when another oomguard leads).
pub fn listen(name: &str) -> io::Result<UnixListener> {
    let addr = SocketAddr::from_abstract_name(name.as_bytes())?;
    let l = UnixListener::bind_addr(&addr)?;
    l.set_nonblocking(true)?;
    Ok(l)
}

/// Connects to the leader at `name`, which must be user `uid`'s.
pub fn connect(name: &str, uid: u32) -> io::Result<Conn> {
    let addr = SocketAddr::from_abstract_name(name.as_bytes())?;
    Conn::checked(UnixStream::connect_addr(&addr)?, uid)
}

impl Conn {
    /// `stream`, if the process at its other end runs as user `uid`.
    pub fn checked(stream: UnixStream, uid: u32) -> io::Result<Conn> {
        let cred = rustix::net::sockopt::socket_peercred(&stream)?;
        if cred.uid.as_raw() != uid {
            return Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                format!(
                    "the other end (pid {}) runs as user {}, not {uid}",
                    cred.pid.as_raw_nonzero(),
                    cred.uid.as_raw()
                ),
            ));
        }
        stream.set_nonblocking(true)?;
        Ok(Conn {
            stream,
            partial: Vec::new(),
        })
    }

    /// Sends `m`; a peer too slow to take it misses it (the next tick's
    /// report replaces it).
    pub fn send(&mut self, m: &Message) {
        if let Ok(mut line) = serde_json::to_vec(m) {
            line.push(b'\n');
            let _ = self.stream.write_all(&line);
        }
    }

    /// The messages that arrived, and whether the connection is still
    /// open.
    pub fn receive(&mut self) -> (Vec<Message>, bool) {
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        let open = loop {
            match self.stream.read(&mut buf) {
                Ok(0) => break false,
                Ok(n) => self.partial.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break true,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => break false,
            }
        };
        while let Some(end) = self.partial.iter().position(|&b| b == b'\n') {
            let line: Vec<u8> = self.partial.drain(..=end).collect();
            if let Ok(m) = serde_json::from_slice(&line) {
                out.push(m);
            }
        }
        let open = open && self.partial.len() <= MAX_LINE;
        (out, open)
    }
}
