//! The control store's port against connections that hold it without
//! speaking: one that never greets is closed after the handshake timeout,
//! and one peer cannot hold more than its share. (A test binary of its
//! own: the limits are read from the environment when the server starts.)

use prism_gcs::{GcsClient, GcsServer, GcsSettings, Token};
use std::time::{Duration, Instant};
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

/// Whether the server closes `tcp` within `limit`: what it sends first
/// (its HTTP/2 settings) is read past, up to the end of the stream.
async fn closed_within(tcp: &mut TcpStream, limit: Duration) -> bool {
    let mut buf = [0u8; 256];
    let until_closed = async {
        loop {
            match tcp.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    };
    tokio::time::timeout(limit, until_closed).await.is_ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_connections_are_closed_and_one_peer_holds_at_most_its_share() {
    std::env::set_var("PRISM_HANDSHAKE_TIMEOUT_MS", "3000");
    std::env::set_var("PRISM_MAX_CONNECTIONS_PER_PEER", "3");
    let token = Token::generate();
    let gcs = GcsServer::start(
        "127.0.0.1:0".parse().unwrap(),
        GcsSettings::new(
            token.clone(),
            Duration::from_millis(500),
            Duration::from_secs(5),
        ),
    )
    .await
    .expect("the control store starts");
    let address = gcs.address().to_string();

    let mut silent = Vec::new();
    for _ in 0..3 {
        silent.push(TcpStream::connect(&address).await.expect("connect"));
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut fourth = TcpStream::connect(&address).await.expect("connect");
    assert!(
        closed_within(&mut fourth, Duration::from_millis(1500)).await,
        "a fourth connection from one peer is closed at once"
    );
    let started = Instant::now();
    for tcp in &mut silent {
        assert!(
            closed_within(tcp, Duration::from_secs(10)).await,
            "a connection that sends nothing is closed after the handshake timeout"
        );
    }
    assert!(started.elapsed() >= Duration::from_millis(1000));

    // Room again: a real client is served, and stays served while it talks.
    let mut client = GcsClient::connect(&address, &token).await.expect("connect");
    for _ in 0..4 {
        client.get_nodes().await.expect("served");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    gcs.shutdown().await;
}
