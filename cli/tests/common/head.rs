//! A head started by `prism start --head` on this machine's loopback
//! (ports picked free, a temp folder of its own): no namespaces needed.

use super::{run_bounded, text, PRISM};
use prism_tests::must;
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

/// A head on this machine's loopback, stopped and removed when dropped.
pub struct Head {
    pub temp: PathBuf,
    /// The control store, HOST:PORT.
    pub address: String,
    /// The dashboard, HOST:PORT.
    pub dashboard: String,
    pub token: String,
}

impl Head {
    /// A head with 1 CPU.
    pub fn start(tag: &str) -> Head {
        Head::start_with(tag, 1)
    }

    /// A head with `cpus` CPUs.
    pub fn start_with(tag: &str, cpus: u32) -> Head {
        Head::start_env(tag, cpus, &[])
    }

    /// A head with `cpus` CPUs, started with `env`.
    pub fn start_env(tag: &str, cpus: u32, env: &[(&str, &str)]) -> Head {
        let temp = std::env::temp_dir().join(format!("prism-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&temp);
        let mut start = Command::new(PRISM);
        start.args(["start", "--head", "--port", "0", "--dashboard-port", "0"]);
        start
            .args(["--num-cpus", &cpus.to_string()])
            .args(["--node-ip-address", "127.0.0.1", "--temp-dir"])
            .arg(&temp);
        let out = run_bounded(start, env, Duration::from_secs(60));
        assert!(out.status.success(), "the head must start: {}", text(&out));
        let record = prism_raylet::NodeRecord::list(&temp)
            .into_iter()
            .find(|r| r.is_head)
            .expect("the head is recorded");
        let dashboard = record.dashboard.expect("the head serves a dashboard");
        let token = must(
            std::fs::read_to_string(temp.join("token")),
            "the head saves its token",
        );
        Head {
            temp,
            address: record.head.clone(),
            dashboard,
            token: token.trim().to_string(),
        }
    }

    /// The dashboard's URL.
    pub fn url(&self) -> String {
        format!("http://{}", self.dashboard)
    }
}

impl Drop for Head {
    fn drop(&mut self) {
        let mut stop = Command::new(PRISM);
        stop.args(["stop", "--force", "--temp-dir"]).arg(&self.temp);
        let _ = run_bounded(stop, &[], Duration::from_secs(30));
        let _ = std::fs::remove_dir_all(&self.temp);
    }
}

/// One HTTP/1.1 request on a connection of its own: the status and body.
pub fn http(at: &str, method: &str, path: &str, token: Option<&str>, body: &[u8]) -> (u16, String) {
    let mut stream = must(
        std::net::TcpStream::connect(at),
        "the dashboard takes connections",
    );
    must(
        stream.set_read_timeout(Some(Duration::from_secs(10))),
        "a read timeout",
    );
    let auth = token
        .map(|t| format!("Authorization: Bearer {t}\r\n"))
        .unwrap_or_default();
    let head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {at}\r\n{auth}Content-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    must(stream.write_all(head.as_bytes()), "the request is sent");
    must(stream.write_all(body), "the body is sent");
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer).into_owned();
    let status = answer
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}
