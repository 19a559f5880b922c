//! A listener's connection limits, through real sockets: one peer cannot
//! hold more than its share, and a connection that never greets is closed.
//! (A test binary of its own: the limits are read from the environment.)

use prism_protocol::messages::{Request, Response};
use prism_protocol::rpc::{self, Connection, Handler};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

struct Answer;

impl Handler for Answer {
    fn handle(&self, conn: &Connection, id: Option<u64>, _request: Request) {
        conn.respond(id, Response::Ok);
    }
}

/// Whether the server closes `tcp` within `limit` (reads end-of-stream).
async fn closed_within(tcp: &mut TcpStream, limit: Duration) -> bool {
    let mut buf = [0u8; 64];
    matches!(
        tokio::time::timeout(limit, tcp.read(&mut buf)).await,
        Ok(Ok(0)) | Ok(Err(_))
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_peer_holds_at_most_its_share_and_silent_connections_are_closed() {
    std::env::set_var("PRISM_MAX_CONNECTIONS_PER_PEER", "4");
    std::env::set_var("PRISM_HANDSHAKE_TIMEOUT_MS", "3000");
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

    // Four silent connections fill this peer's share.
    let mut silent = Vec::new();
    for _ in 0..4 {
        silent.push(TcpStream::connect(&address).await.expect("connect"));
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    // The fifth is closed at once, before its greeting times out.
    let mut fifth = TcpStream::connect(&address).await.expect("connect");
    assert!(
        closed_within(&mut fifth, Duration::from_millis(1500)).await,
        "a fifth connection from one peer must be closed at once"
    );

    // The silent ones are closed when their greeting is late.
    let started = Instant::now();
    for tcp in &mut silent {
        assert!(
            closed_within(tcp, Duration::from_secs(10)).await,
            "a connection that never greets must be closed"
        );
    }
    assert!(started.elapsed() >= Duration::from_millis(1000));

    // Their room came back: a real client is served.
    let conn = Connection::connect_tcp(&address, "secret", Arc::new(Answer))
        .await
        .expect("a client connects once the silent ones are gone");
    assert!(!conn.is_closed());
    server.abort();
}
