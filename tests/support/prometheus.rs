//! Test helper: a real Prometheus server (Debian's `prometheus` package) on
//! loopback, `promtool check metrics`, a tiny HTTP/1.0 client on std
//! sockets, and the Grafana dashboards' PromQL (`crate::support::prometheus`).
//!
//! Everything binds 127.0.0.1 only. The server is killed when its handle is
//! dropped, also when the test panics.

#![allow(dead_code, clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// Whether the Prometheus binaries are installed.
pub fn tools_installed() -> bool {
    ["prometheus", "promtool"].iter().all(|t| {
        Command::new(t)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    })
}

/// A loopback port that was free a moment ago (bound to port 0, read,
/// closed). Another process could take it in between; on a test machine
/// that is rare enough.
pub fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// An HTTP response, as far as the tests care.
#[derive(Debug)]
pub struct Response {
    pub status: u16,
    /// Header lines, names lower-cased.
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// `GET path` over HTTP/1.0 (no chunked encoding, the server closes).
pub fn http_get(addr: SocketAddr, path: &str) -> std::io::Result<Response> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.set_write_timeout(Some(Duration::from_secs(5)))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw)?;
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("no head: {text:?}"),
        )
    })?;
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidData, head.to_string()))?;
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    Ok(Response {
        status,
        headers,
        body: body.to_string(),
    })
}

/// Percent-encodes a query parameter value.
pub fn url_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                out.push(b as char)
            }
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// `promtool check metrics` on an exposition: `Err(promtool's output)` when
/// it finds a problem (lint or parse).
pub fn promtool_check_metrics(text: &str) -> Result<(), String> {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if out.status.success() && said.trim().is_empty() {
        Ok(())
    } else {
        Err(format!("promtool ({}): {said}", out.status))
    }
}

/// A Prometheus server on a random loopback port with its own temporary
/// storage, scraping the given targets every second through file-based
/// discovery (as `dashboards/README.md` describes). Killed on drop.
pub struct Prometheus {
    child: Child,
    pub addr: SocketAddr,
    dir: tempfile::TempDir,
    /// The scrape job name: the `job` label of every series.
    pub job: String,
}

impl Prometheus {
    pub fn start(job: &str, targets: &[SocketAddr]) -> Prometheus {
        let dir = tempfile::Builder::new()
            .prefix("oomguard-prom-")
            .tempdir()
            .unwrap();
        let sd = dir.path().join("targets");
        std::fs::create_dir(&sd).unwrap();
        let list: Vec<String> = targets.iter().map(|t| t.to_string()).collect();
        std::fs::write(
            sd.join("oomguard.json"),
            serde_json::json!([{ "targets": list, "labels": {} }]).to_string(),
        )
        .unwrap();
        let config = format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\n  evaluation_interval: 1s\n\
             scrape_configs:\n  - job_name: {job}\n    file_sd_configs:\n      - files: ['{}/*.json']\n        refresh_interval: 1s\n",
            sd.display()
        );
        let cfg = dir.path().join("prometheus.yml");
        std::fs::write(&cfg, config).unwrap();
        let check = Command::new("promtool")
            .args(["check", "config"])
            .arg(&cfg)
            .output()
            .unwrap();
        assert!(
            check.status.success(),
            "promtool check config: {}",
            String::from_utf8_lossy(&check.stdout)
        );

        let port = free_port();
        let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
        let log = std::fs::File::create(dir.path().join("prometheus.log")).unwrap();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", cfg.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .arg("--log.level=warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .unwrap();
        let mut p = Prometheus {
            child,
            addr,
            dir,
            job: job.to_string(),
        };
        let ready = wait(Duration::from_secs(30), || {
            http_get(p.addr, "/-/ready").is_ok_and(|r| r.status == 200)
        });
        if !ready {
            let exited = p.child.try_wait().ok().flatten();
            panic!(
                "Prometheus not ready after 30 s (exited: {exited:?}); log:\n{}",
                p.log()
            );
        }
        p
    }

    /// Prometheus's own log, for failure messages.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("prometheus.log")).unwrap_or_default()
    }

    /// An instant query; the `data.result` vector. Panics on API errors
    /// (a bad expression is a test failure, not "no data").
    pub fn query(&self, promql: &str) -> Vec<Value> {
        let r = http_get(
            self.addr,
            &format!("/api/v1/query?query={}", url_encode(promql)),
        )
        .unwrap();
        let v: Value = serde_json::from_str(&r.body)
            .unwrap_or_else(|e| panic!("query {promql}: {e}: {}", r.body));
        assert_eq!(v["status"], "success", "query {promql}: {}", r.body);
        v["data"]["result"].as_array().cloned().unwrap_or_default()
    }

    /// Polls `query` until it returns something (or the timeout passes).
    pub fn wait_for(&self, promql: &str, timeout: Duration) -> Vec<Value> {
        let end = Instant::now() + timeout;
        loop {
            let r = self.query(promql);
            if !r.is_empty() || Instant::now() >= end {
                return r;
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// The health of every scrape target, for failure messages.
    pub fn targets(&self) -> String {
        http_get(self.addr, "/api/v1/targets")
            .map(|r| r.body)
            .unwrap_or_default()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The value of one instant-vector element as a number.
pub fn value(sample: &Value) -> f64 {
    sample["value"][1]
        .as_str()
        .and_then(|s| s.parse().ok())
        .unwrap_or(f64::NAN)
}

/// The labels of one instant-vector element.
pub fn labels(sample: &Value) -> BTreeMap<String, String> {
    sample["metric"]
        .as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                .collect()
        })
        .unwrap_or_default()
}

fn wait(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + timeout;
    while Instant::now() < end {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    f()
}

// ---------------------------------------------------------------------------
// Dashboards
// ---------------------------------------------------------------------------

/// The shipped dashboards: (file name, parsed JSON).
pub fn dashboards() -> Vec<(String, Value)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("dashboards");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap();
            let v: Value = serde_json::from_str(&text)
                .unwrap_or_else(|e| panic!("{} is not JSON: {e}", p.display()));
            (p.file_name().unwrap().to_string_lossy().into_owned(), v)
        })
        .collect()
}

/// The dashboard's Prometheus annotations: (name, expr).
pub fn annotation_exprs(dashboard: &Value) -> Vec<(String, String)> {
    dashboard["annotations"]["list"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .filter(|a| a["datasource"]["uid"] == "${datasource}")
        .filter_map(|a| {
            let name = a["name"].as_str()?.to_string();
            assert_eq!(a["useValueForTime"], true, "{name}: at the series' time");
            Some((name, a["expr"].as_str()?.to_string()))
        })
        .collect()
}

/// Every panel, rows' nested panels included.
pub fn panels(dashboard: &Value) -> Vec<&Value> {
    fn walk<'a>(list: &'a Value, out: &mut Vec<&'a Value>) {
        for p in list.as_array().map(Vec::as_slice).unwrap_or_default() {
            out.push(p);
            walk(&p["panels"], out);
        }
    }
    let mut out = Vec::new();
    walk(&dashboard["panels"], &mut out);
    out
}

/// Every query of every panel: (panel title, refId, expr).
pub fn exprs(dashboard: &Value) -> Vec<(String, String, String)> {
    panels(dashboard)
        .into_iter()
        .flat_map(|p| {
            let title = p["title"].as_str().unwrap_or_default().to_string();
            p["targets"]
                .as_array()
                .cloned()
                .unwrap_or_default()
                .into_iter()
                .filter_map(move |t| {
                    let expr = t["expr"].as_str()?.to_string();
                    Some((
                        title.clone(),
                        t["refId"].as_str().unwrap_or_default().to_string(),
                        expr,
                    ))
                })
        })
        .collect()
}

/// Replaces Grafana variables (`$name`, `${name}`, `${name:fmt}`,
/// `[[name]]`) with values from `vars`; `$__rate_interval` and friends get
/// durations that suit a one-second scrape interval. Panics on a variable
/// it does not know, so a dashboard cannot use one the test ignores.
pub fn substitute(expr: &str, vars: &BTreeMap<&str, String>) -> String {
    let builtins: BTreeMap<&str, &str> = [
        ("__rate_interval", "15s"),
        ("__interval", "2s"),
        ("__range", "5m"),
        ("__range_s", "300"),
        ("__interval_ms", "2000"),
    ]
    .into_iter()
    .collect();
    let re = regex::Regex::new(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]").unwrap();
    re.replace_all(expr, |c: &regex::Captures<'_>| {
        let name = c
            .get(1)
            .or_else(|| c.get(2))
            .or_else(|| c.get(3))
            .unwrap()
            .as_str();
        if let Some(v) = vars.get(name) {
            return v.clone();
        }
        match builtins.get(name) {
            Some(v) => (*v).to_string(),
            None => panic!("unknown dashboard variable ${name} in {expr}"),
        }
    })
    .into_owned()
}

/// Evaluates every dashboard expression against `prom` (instant queries)
/// and returns the ones that gave no data, as "file / panel / refId: expr".
/// `skip` decides which expressions may legitimately be empty. Empty
/// answers are retried for a while (shared 20 s budget): `increase()` over
/// a window needs two scrapes inside it, which a fresh server may not have.
pub fn empty_dashboard_queries(
    prom: &Prometheus,
    vars: &BTreeMap<&str, String>,
    skip: impl Fn(&str) -> bool,
) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut empty = Vec::new();
    let mut evaluated = 0;
    for (file, d) in dashboards() {
        for (panel, ref_id, expr) in exprs(&d) {
            if skip(&expr) {
                eprintln!("not required to have data here: {expr}");
                continue;
            }
            let q = substitute(&expr, vars);
            evaluated += 1;
            let left = deadline.saturating_duration_since(Instant::now());
            if prom.wait_for(&q, left).is_empty() {
                empty.push(format!("{file} / {panel} / {ref_id}: {q}"));
            }
        }
    }
    assert!(
        evaluated > 10,
        "only {evaluated} dashboard expressions found"
    );
    empty
}
