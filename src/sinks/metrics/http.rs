//! `--metrics-addr`: serves `GET /metrics` over HTTP/1.1 for Prometheus to
//! scrape.
//!
//! A deliberately small hand-written responder, not hyper: there is one
//! endpoint, one method, no request body, no keep-alive, no TLS, and the
//! response is a few kilobytes. What matters here is that it can never hurt
//! the job's supervision, which runs on the same current-thread runtime:
//!
//! - each connection is its own task, so a slow client holds only its task;
//! - the request head must arrive within [`REQUEST_TIMEOUT`] and fit in
//!   [`MAX_REQUEST`] bytes, and the response must be taken within
//!   [`WRITE_TIMEOUT`]; a client that dawdles is dropped;
//! - at most [`MAX_CONNECTIONS`] are open at once. When a new client comes
//!   and every slot is taken, the oldest connection that has not yet sent a
//!   whole request head is closed to make room: idle sockets (a port
//!   scanner, a client that connects and never speaks) can delay a scrape
//!   by nothing, however many there are. Only when every slot is busy
//!   answering is the newcomer closed;
//! - rendering copies numbers under a mutex for microseconds and never
//!   awaits while holding it.
//!
//! Every response closes the connection (`Connection: close`): Prometheus
//! reconnects for each scrape at most once per scrape interval, which costs
//! nothing, and it spares the server the keep-alive state machine.

use std::collections::VecDeque;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::{AbortHandle, JoinHandle};

use super::{CONTENT_TYPE, Metrics};

/// How long a client may take to send its request head.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a client may take to accept the response.
pub const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// The largest request head accepted (Prometheus sends about 300 bytes).
pub const MAX_REQUEST: usize = 8 * 1024;
/// Connections open at the same time (each costs a task and a descriptor).
pub const MAX_CONNECTIONS: usize = 128;

/// The limits a connection lives under; [`serve`] uses the constants above.
#[derive(Debug, Clone, Copy)]
struct Limits {
    request_timeout: Duration,
    write_timeout: Duration,
    max_connections: usize,
}

const LIMITS: Limits = Limits {
    request_timeout: REQUEST_TIMEOUT,
    write_timeout: WRITE_TIMEOUT,
    max_connections: MAX_CONNECTIONS,
};

/// Why the metrics endpoint could not start.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    /// The address could not be bound (in use, not local, no permission).
    #[error("cannot serve metrics on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// The warning to print when `addr` can be reached from other machines:
/// `/metrics` has no authentication, and its labels and series name the
/// job, its processes and the host. `None` for loopback addresses.
pub fn exposure_warning(addr: SocketAddr) -> Option<String> {
    let ip = match addr.ip() {
        // `::ffff:127.0.0.1` is loopback too.
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    };
    if ip.is_loopback() {
        return None;
    }
    let reach = if ip.is_unspecified() {
        "every network interface"
    } else {
        "the network"
    };
    Some(format!(
        "--metrics-addr {addr} serves /metrics, unauthenticated, to {reach}; \
         use 127.0.0.1:{} unless other machines are meant to scrape it",
        addr.port()
    ))
}

/// A running endpoint.
#[derive(Debug)]
pub struct Serving {
    /// The address actually bound (the real port when 0 was asked for).
    pub addr: SocketAddr,
    /// The accept loop; it ends when the shutdown future completes.
    pub task: JoinHandle<()>,
}

/// Binds `addr` and serves `metrics` on it from a spawned task until
/// `shutdown` completes. Must be called inside a tokio runtime with I/O and
/// time enabled. Returns once the socket is bound, so a bind error can be
/// reported (as a usage error) before the job starts.
pub async fn serve<F>(
    addr: SocketAddr,
    metrics: Metrics,
    shutdown: F,
) -> Result<Serving, MetricsError>
where
    F: Future<Output = ()> + Send + 'static,
{
    serve_with(addr, metrics, shutdown, LIMITS).await
}

async fn serve_with<F>(
    addr: SocketAddr,
    metrics: Metrics,
    shutdown: F,
    limits: Limits,
) -> Result<Serving, MetricsError>
where
    F: Future<Output = ()> + Send + 'static,
{
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|source| MetricsError::Bind { addr, source })?;
    let bound = listener
        .local_addr()
        .map_err(|source| MetricsError::Bind { addr, source })?;
    let task = tokio::spawn(accept_loop(listener, metrics, shutdown, limits));
    Ok(Serving { addr: bound, task })
}

/// One open connection, as the accept loop sees it.
#[derive(Debug)]
struct Conn {
    task: AbortHandle,
    /// Set once the whole request head has arrived: from then on the
    /// connection is being answered and is not evicted.
    answering: Arc<AtomicBool>,
}

async fn accept_loop<F>(listener: TcpListener, metrics: Metrics, shutdown: F, limits: Limits)
where
    F: Future<Output = ()> + Send + 'static,
{
    // Oldest first, so eviction takes the connection idle the longest.
    let mut open: VecDeque<Conn> = VecDeque::new();
    tokio::pin!(shutdown);
    loop {
        let accepted = tokio::select! {
            () = &mut shutdown => return,
            a = listener.accept() => a,
        };
        match accepted {
            Ok((stream, _peer)) => {
                open.retain(|c| !c.task.is_finished());
                if open.len() >= limits.max_connections.max(1) {
                    match open
                        .iter()
                        .position(|c| !c.answering.load(Ordering::Relaxed))
                    {
                        Some(i) => {
                            if let Some(idle) = open.remove(i) {
                                idle.task.abort();
                            }
                        }
                        // Every slot is answering a request: those end
                        // within the write timeout; drop the newcomer.
                        None => continue,
                    }
                }
                let metrics = metrics.clone();
                let answering = Arc::new(AtomicBool::new(false));
                let flag = Arc::clone(&answering);
                let task = tokio::spawn(async move {
                    handle(stream, &metrics, limits, &flag).await;
                });
                open.push_back(Conn {
                    task: task.abort_handle(),
                    answering,
                });
            }
            // Out of descriptors or the like: back off instead of spinning
            // on an error that persists.
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

async fn handle(mut stream: TcpStream, metrics: &Metrics, limits: Limits, answering: &AtomicBool) {
    let head = tokio::time::timeout(limits.request_timeout, read_head(&mut stream)).await;
    answering.store(true, Ordering::Relaxed);
    let response = match head {
        Ok(Ok(head)) => respond(&head, metrics),
        Ok(Err(HeadError::TooLarge)) => Response::plain(431, "request header too large\n"),
        Ok(Err(HeadError::Closed)) => return,
        Err(_elapsed) => Response::plain(408, "request timeout\n"),
    };
    let bytes = response.into_bytes();
    let write = async {
        stream.write_all(&bytes).await?;
        stream.shutdown().await
    };
    if !matches!(
        tokio::time::timeout(limits.write_timeout, write).await,
        Ok(Ok(()))
    ) {
        return;
    }
    // Closing a socket with unread input makes the kernel send a reset,
    // which can destroy the response before the client has read it (a POST
    // body we never read, a pipelined request). Drain briefly first.
    let mut sink = [0u8; 1024];
    let drain = async {
        let mut total = 0usize;
        while total < 64 * 1024 {
            match stream.read(&mut sink).await {
                Ok(0) | Err(_) => break,
                Ok(n) => total += n,
            }
        }
    };
    let _ = tokio::time::timeout(Duration::from_millis(500), drain).await;
}

#[derive(Debug, PartialEq, Eq)]
enum HeadError {
    TooLarge,
    /// The client closed before sending a whole head (a port probe, a
    /// health check that only connects).
    Closed,
}

/// Reads until the blank line that ends the request head.
async fn read_head(stream: &mut TcpStream) -> Result<Vec<u8>, HeadError> {
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    loop {
        let n = stream.read(&mut buf).await.map_err(|_| HeadError::Closed)?;
        if n == 0 {
            return Err(HeadError::Closed);
        }
        head.extend_from_slice(&buf[..n]);
        if let Some(end) = head_end(&head) {
            head.truncate(end);
            return Ok(head);
        }
        if head.len() > MAX_REQUEST {
            return Err(HeadError::TooLarge);
        }
    }
}

/// Where the head ends (`\r\n\r\n`, or a bare `\n\n` from hand-typed
/// requests), if it has.
fn head_end(buf: &[u8]) -> Option<usize> {
    let crlf = buf.windows(4).position(|w| w == b"\r\n\r\n");
    let lf = buf.windows(2).position(|w| w == b"\n\n");
    match (crlf, lf) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

/// One response, always closing the connection.
#[derive(Debug, PartialEq, Eq)]
struct Response {
    status: u16,
    content_type: &'static str,
    extra: Option<&'static str>,
    body: String,
    /// HEAD: headers as for GET, no body.
    head_only: bool,
}

impl Response {
    fn plain(status: u16, body: &str) -> Self {
        Self {
            status,
            content_type: "text/plain; charset=utf-8",
            extra: None,
            body: body.to_string(),
            head_only: false,
        }
    }

    fn into_bytes(self) -> Vec<u8> {
        let reason = match self.status {
            200 => "OK",
            400 => "Bad Request",
            404 => "Not Found",
            405 => "Method Not Allowed",
            408 => "Request Timeout",
            431 => "Request Header Fields Too Large",
            _ => "Error",
        };
        let mut out = format!(
            "HTTP/1.1 {} {reason}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n",
            self.status,
            self.content_type,
            self.body.len()
        );
        if let Some(extra) = self.extra {
            out.push_str(extra);
            out.push_str("\r\n");
        }
        out.push_str("\r\n");
        if !self.head_only {
            out.push_str(&self.body);
        }
        out.into_bytes()
    }
}

/// The answer to one request head.
fn respond(head: &[u8], metrics: &Metrics) -> Response {
    let text = String::from_utf8_lossy(head);
    let line = text.lines().next().unwrap_or_default();
    let mut parts = line.split_ascii_whitespace();
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Response::plain(400, "bad request\n");
    };
    if !version.starts_with("HTTP/1.") {
        return Response::plain(400, "bad request\n");
    }
    // Prometheus may add query parameters; the path alone decides.
    let path = target.split(['?', '#']).next().unwrap_or_default();
    if path != "/metrics" {
        return Response::plain(404, "not found: oomguard serves /metrics only\n");
    }
    match method {
        "GET" | "HEAD" => Response {
            status: 200,
            content_type: CONTENT_TYPE,
            extra: None,
            body: metrics.render(),
            head_only: method == "HEAD",
        },
        _ => Response {
            extra: Some("Allow: GET, HEAD"),
            ..Response::plain(405, "method not allowed\n")
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sinks::metrics::ConstantLabels;

    fn metrics() -> Metrics {
        Metrics::new(ConstantLabels::new(), "0.0.0-test")
    }

    #[test]
    fn routing() {
        let m = metrics();
        let r = respond(b"GET /metrics HTTP/1.1\r\nHost: x", &m);
        assert_eq!((r.status, r.content_type), (200, CONTENT_TYPE));
        assert!(r.body.contains("oomguard_build_info"));
        assert_eq!(respond(b"GET /metrics?x=1 HTTP/1.0", &m).status, 200);
        assert_eq!(respond(b"GET / HTTP/1.1", &m).status, 404);
        assert_eq!(respond(b"GET /metricsx HTTP/1.1", &m).status, 404);
        let post = respond(b"POST /metrics HTTP/1.1", &m);
        assert_eq!((post.status, post.extra), (405, Some("Allow: GET, HEAD")));
        assert_eq!(respond(b"GET /metrics", &m).status, 400);
        assert_eq!(respond(b"GET /metrics SPDY/3", &m).status, 400);
        assert_eq!(respond(b"\xff\xfe", &m).status, 400);
        let head = respond(b"HEAD /metrics HTTP/1.1", &m);
        let bytes = String::from_utf8(head.into_bytes()).unwrap();
        assert!(bytes.ends_with("\r\n\r\n"), "{bytes}");
        assert!(!bytes.contains("Content-Length: 0\r\n"), "{bytes}");
    }

    #[test]
    fn head_ends() {
        assert_eq!(head_end(b"GET / HTTP/1.1\r\n\r\nrest"), Some(14));
        assert_eq!(head_end(b"GET / HTTP/1.1\n\n"), Some(14));
        assert_eq!(head_end(b"GET / HTTP/1.1\r\n"), None);
    }

    async fn try_request(addr: SocketAddr, raw: &[u8]) -> std::io::Result<String> {
        let mut s = TcpStream::connect(addr).await?;
        s.write_all(raw).await?;
        let mut out = String::new();
        s.read_to_string(&mut out).await?;
        Ok(out)
    }

    async fn request(addr: SocketAddr, raw: &[u8]) -> String {
        try_request(addr, raw).await.unwrap()
    }

    #[tokio::test]
    async fn serves_over_tcp_and_shuts_down() {
        let m = metrics();
        m.action("warn");
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let serving = serve("127.0.0.1:0".parse().unwrap(), m, async {
            let _ = rx.await;
        })
        .await
        .unwrap();
        assert_ne!(serving.addr.port(), 0);

        let ok = request(serving.addr, b"GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n").await;
        let (head, body) = ok.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
        assert!(
            head.contains(&format!("Content-Type: {CONTENT_TYPE}")),
            "{head}"
        );
        assert!(
            head.contains(&format!("Content-Length: {}", body.len())),
            "{head}"
        );
        assert!(
            body.contains("oomguard_actions_total{action=\"warn\"} 1\n"),
            "{body}"
        );

        let nf = request(serving.addr, b"GET /other HTTP/1.1\r\n\r\n").await;
        assert!(nf.starts_with("HTTP/1.1 404 "), "{nf}");
        // A body we never read must not reset the connection before the
        // client has the answer.
        let mut post = b"POST /metrics HTTP/1.1\r\nContent-Length: 20000\r\n\r\n".to_vec();
        post.extend(std::iter::repeat_n(b'x', 20000));
        let na = request(serving.addr, &post).await;
        assert!(na.starts_with("HTTP/1.1 405 "), "{na}");
        let big = vec![b'a'; MAX_REQUEST + 2048];
        let tl = request(serving.addr, &big).await;
        assert!(tl.starts_with("HTTP/1.1 431 "), "{tl}");

        tx.send(()).unwrap();
        tokio::time::timeout(Duration::from_secs(5), serving.task)
            .await
            .unwrap()
            .unwrap();
        assert!(TcpStream::connect(serving.addr).await.is_err());
    }

    #[tokio::test]
    async fn a_silent_client_does_not_block_others() {
        let serving = serve(
            "127.0.0.1:0".parse().unwrap(),
            metrics(),
            std::future::pending(),
        )
        .await
        .unwrap();
        // Connected, half a request, then nothing: holds one task only.
        let mut idle = TcpStream::connect(serving.addr).await.unwrap();
        idle.write_all(b"GET /metr").await.unwrap();
        let started = std::time::Instant::now();
        let ok = request(serving.addr, b"GET /metrics HTTP/1.0\r\n\r\n").await;
        assert!(ok.starts_with("HTTP/1.1 200 OK"), "{ok}");
        assert!(
            started.elapsed() < REQUEST_TIMEOUT,
            "served while the idle client waits"
        );
        serving.task.abort();
    }

    #[tokio::test]
    async fn a_silent_client_is_dropped_after_the_timeout() {
        let limits = Limits {
            request_timeout: Duration::from_millis(200),
            ..LIMITS
        };
        let serving = serve_with(
            "127.0.0.1:0".parse().unwrap(),
            metrics(),
            std::future::pending(),
            limits,
        )
        .await
        .unwrap();
        let mut idle = TcpStream::connect(serving.addr).await.unwrap();
        let mut out = String::new();
        tokio::time::timeout(Duration::from_secs(5), idle.read_to_string(&mut out))
            .await
            .unwrap()
            .unwrap();
        assert!(out.starts_with("HTTP/1.1 408 "), "{out}");
        serving.task.abort();
    }

    /// Connects and sends half a request head, then nothing.
    async fn idle_client(addr: SocketAddr) -> TcpStream {
        let mut s = TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /metr").await.unwrap();
        s
    }

    #[tokio::test]
    async fn idle_clients_give_way_to_a_scrape() {
        let limits = Limits {
            max_connections: 4,
            ..LIMITS
        };
        let serving = serve_with(
            "127.0.0.1:0".parse().unwrap(),
            metrics(),
            std::future::pending(),
            limits,
        )
        .await
        .unwrap();
        // Sixteen times the limit, all holding their slot until the
        // request timeout.
        let mut idle = Vec::new();
        for _ in 0..64 {
            idle.push(idle_client(serving.addr).await);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        for _ in 0..9 {
            let ok = tokio::time::timeout(
                Duration::from_secs(2),
                request(serving.addr, b"GET /metrics HTTP/1.0\r\n\r\n"),
            )
            .await
            .expect("a scrape waited behind idle sockets");
            assert!(ok.starts_with("HTTP/1.1 200 OK"), "{ok}");
        }
        // The oldest idle client was closed to make room.
        let mut out = Vec::new();
        let n = tokio::time::timeout(Duration::from_secs(2), idle[0].read_to_end(&mut out))
            .await
            .expect("the oldest idle client is still open");
        assert!(n.map_or(true, |n| n == 0), "{out:?}");
        serving.task.abort();
    }

    #[tokio::test]
    async fn a_client_being_answered_is_not_evicted() {
        let limits = Limits {
            max_connections: 1,
            ..LIMITS
        };
        let serving = serve_with(
            "127.0.0.1:0".parse().unwrap(),
            metrics(),
            std::future::pending(),
            limits,
        )
        .await
        .unwrap();
        // A whole head, then a body the server drains for a while: the
        // connection is answered and holds the only slot.
        let mut busy = TcpStream::connect(serving.addr).await.unwrap();
        busy.write_all(b"POST /metrics HTTP/1.1\r\nContent-Length: 9\r\n\r\n")
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
        let refused = try_request(serving.addr, b"GET /metrics HTTP/1.0\r\n\r\n").await;
        assert!(
            refused.as_deref().unwrap_or_default().is_empty(),
            "{refused:?}"
        );
        let mut out = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(2), busy.read_to_end(&mut out)).await;
        assert!(out.starts_with(b"HTTP/1.1 405 "), "{out:?}");
        serving.task.abort();
    }

    #[test]
    fn non_loopback_binds_are_warned_about() {
        for quiet in [
            "127.0.0.1:9465",
            "[::1]:9465",
            "[::ffff:127.0.0.1]:9465",
            "127.8.0.1:1",
        ] {
            assert_eq!(exposure_warning(quiet.parse().unwrap()), None, "{quiet}");
        }
        for (loud, what) in [
            ("0.0.0.0:9465", "every network interface"),
            ("[::]:9465", "every network interface"),
            ("10.1.2.3:9465", "the network"),
            ("[2001:db8::1]:9465", "the network"),
        ] {
            let w = exposure_warning(loud.parse().unwrap()).unwrap();
            assert!(w.contains(what) && w.contains(loud), "{w}");
        }
    }

    #[tokio::test]
    async fn bind_errors_name_the_address() {
        let first = serve(
            "127.0.0.1:0".parse().unwrap(),
            metrics(),
            std::future::pending(),
        )
        .await
        .unwrap();
        let err = serve(first.addr, metrics(), std::future::pending())
            .await
            .unwrap_err();
        assert!(err.to_string().contains(&first.addr.to_string()), "{err}");
        first.task.abort();
    }
}
