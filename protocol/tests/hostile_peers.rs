//! Peers that hold the cluster token and misbehave: a frame header that
//! announces a gigabyte must cost nothing until the gigabyte arrives, and
//! must not keep the listener from serving everyone else.

use prism_protocol::messages::{GetClusterResources, KvPut, Request, Response};
use prism_protocol::rpc::{self, Connection, Handler, MAX_FRAME_BYTES};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

struct Answer;

impl Handler for Answer {
    fn handle(&self, conn: &Connection, id: Option<u64>, _request: Request) {
        conn.respond(id, Response::Ok);
    }
}

/// This process's resident memory, in bytes.
fn resident_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("read /proc/self/status");
    let line = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .expect("a VmRSS line");
    let kib: u64 = line
        .split_whitespace()
        .nth(1)
        .and_then(|n| n.parse().ok())
        .expect("a number of KiB");
    kib * 1024
}

/// A raw TCP connection past the greeting, as any token holder can make.
async fn greeted(address: &str, token: &str) -> TcpStream {
    let mut tcp = TcpStream::connect(address).await.expect("connect");
    let mut hello = b"PRSM".to_vec();
    hello.extend_from_slice(&(token.len() as u16).to_le_bytes());
    hello.extend_from_slice(token.as_bytes());
    tcp.write_all(&hello).await.expect("greet");
    let mut verdict = [0u8; 1];
    tcp.read_exact(&mut verdict).await.expect("a verdict");
    assert_eq!(verdict[0], 1, "the token is accepted");
    tcp
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frame_headers_announcing_a_gigabyte_cost_nothing_and_starve_no_one() {
    rpc::set_cluster_token(Some("secret".into()));
    let (server, bound) = rpc::serve_tcp(
        "127.0.0.1:0".parse().expect("an address"),
        "secret".into(),
        || Arc::new(Answer),
        None,
    )
    .await
    .expect("serve");
    let address = bound.to_string();
    let before = resident_bytes();

    // Four connections at once announce a frame of the largest size
    // accepted, then send nothing more.
    let announced = u32::try_from(MAX_FRAME_BYTES).expect("fits a header");
    let mut attackers = Vec::new();
    for _ in 0..4 {
        let mut tcp = greeted(&address, "secret").await;
        tcp.write_all(&announced.to_le_bytes())
            .await
            .expect("send a header");
        attackers.push(tcp);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;

    // Others are served at once meanwhile.
    let conn = Connection::connect_tcp(&address, "secret", Arc::new(Answer))
        .await
        .expect("connect");
    let started = Instant::now();
    for _ in 0..10 {
        let call = conn
            .start_call(GetClusterResources {}.into())
            .expect("send");
        let answer = tokio::time::timeout(Duration::from_secs(2), call)
            .await
            .expect("answered within 2 s while the announced frames wait");
        assert!(matches!(answer, Ok(Response::Ok)), "{answer:?}");
    }
    assert!(started.elapsed() < Duration::from_secs(2));

    let grown = resident_bytes().saturating_sub(before);
    assert!(
        grown < 64 << 20,
        "four headers announcing {MAX_FRAME_BYTES} bytes each grew this process by {grown} bytes; \
         a buffer must grow with the bytes that arrive, not with the header's claim"
    );

    // A frame that does arrive whole, larger than the eager limit, is read.
    let big = vec![7u8; 3 << 20];
    let call = conn
        .start_call(
            KvPut {
                key: "k".into(),
                value: big.into(),
                overwrite: true,
            }
            .into(),
        )
        .expect("send");
    let answer = tokio::time::timeout(Duration::from_secs(10), call).await;
    assert!(
        matches!(answer, Ok(Ok(Response::Ok))),
        "a 3 MiB frame is served: {answer:?}"
    );
    drop(attackers);
    server.abort();
}
