//! Peers that hold the cluster token and misbehave: a frame header that
//! announces a gigabyte must cost nothing until the gigabyte arrives, and
//! must not keep the listener from serving everyone else; a frame larger
//! than its kind may be is refused without being read.

use prism_protocol::messages::{
    FrameBound, GetClusterResources, GetNamedActor, KvPut, RayletRequest, Request, Response,
};
use prism_protocol::rpc::{self, Connection, Frame, Handler, MAX_FRAME_BYTES};
use prism_protocol::Error;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

struct Answer;

/// The name that makes [`Answer`] answer with more than an answer of its
/// kind may hold.
const BIG_ANSWER: &str = "big-answer";

impl Handler for Answer {
    fn handle(&self, conn: &Connection, id: Option<u64>, request: Request) {
        match request {
            Request::Raylet(RayletRequest::GetNamedActor(GetNamedActor { name, .. }))
                if name == BIG_ANSWER =>
            {
                let text = "x".repeat(FrameBound::Control.bytes() + 1);
                conn.respond(id, Response::WorkerExit(Some(text)));
            }
            _ => conn.respond(id, Response::Ok),
        }
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

/// A TCP listener on loopback serving [`Answer`] to holders of the token
/// `secret`, and its address.
async fn serve_answers() -> (tokio::task::JoinHandle<()>, String) {
    rpc::set_cluster_token(Some("secret".into()));
    let (server, bound) = rpc::serve_tcp(
        "127.0.0.1:0".parse().expect("an address"),
        "secret".into(),
        || Arc::new(Answer),
        None,
    )
    .await
    .expect("serve");
    (server, bound.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frame_headers_announcing_a_gigabyte_cost_nothing_and_starve_no_one() {
    let (server, address) = serve_answers().await;
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

/// Reads one frame from a raw connection.
async fn read_frame(tcp: &mut TcpStream) -> Frame {
    let mut len = [0u8; 4];
    tcp.read_exact(&mut len).await.expect("a frame header");
    let mut body = vec![0u8; u32::from_le_bytes(len) as usize];
    tcp.read_exact(&mut body).await.expect("a frame body");
    rmp_serde::from_slice(&body).expect("a frame")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frame_larger_than_its_kind_may_be_is_refused_unread() {
    let (server, address) = serve_answers().await;

    // A token holder announces a name lookup of 8 MiB: only the first bytes
    // (the frame's kind) are read before the answer says why it is refused.
    let announced = 8usize << 20;
    let lookup = Frame::Request {
        id: 9,
        body: GetNamedActor {
            name: "n".repeat(40),
            namespace: "default".into(),
        }
        .into(),
    };
    // The reader looks at the first 128 bytes: the message, then padding.
    let mut head = rmp_serde::to_vec_named(&lookup).expect("encode");
    head.resize(128, 0);
    let mut tcp = greeted(&address, "secret").await;
    tcp.write_all(&(announced as u32).to_le_bytes())
        .await
        .expect("send a header");
    tcp.write_all(&head)
        .await
        .expect("send the frame's first bytes");
    let answer = tokio::time::timeout(Duration::from_secs(5), read_frame(&mut tcp))
        .await
        .expect("refused before the rest arrives");
    match answer {
        Frame::Response {
            id: 9,
            body: Response::Error(Error::FrameTooLarge { kind, bytes, limit }),
        } => {
            assert_eq!(kind, "Raylet/GetNamedActor");
            assert_eq!(bytes, announced as u64);
            assert_eq!(limit, FrameBound::Control.bytes() as u64);
        }
        other => panic!("expected FrameTooLarge for request 9, got {other:?}"),
    }
    // The rest of the frame is skipped, and the connection goes on.
    let rest = vec![0u8; announced - head.len()];
    tcp.write_all(&rest).await.expect("send the rest");
    let next = rmp_serde::to_vec_named(&Frame::Request {
        id: 10,
        body: GetClusterResources {}.into(),
    })
    .expect("encode");
    tcp.write_all(&(next.len() as u32).to_le_bytes())
        .await
        .expect("send a header");
    tcp.write_all(&next).await.expect("send a request");
    let answer = tokio::time::timeout(Duration::from_secs(5), read_frame(&mut tcp))
        .await
        .expect("the next request is answered");
    assert!(
        matches!(
            answer,
            Frame::Response {
                id: 10,
                body: Response::Ok
            }
        ),
        "{answer:?}"
    );

    // A caller that would send such a frame is told so, and sends nothing.
    let conn = Connection::connect_tcp(&address, "secret", Arc::new(Answer))
        .await
        .expect("connect");
    let refused = conn
        .request(GetNamedActor {
            name: "n".repeat(FrameBound::Control.bytes()),
            namespace: "default".into(),
        })
        .await;
    assert!(
        matches!(&refused, Err(Error::FrameTooLarge { kind, .. }) if kind == "Raylet/GetNamedActor"),
        "{refused:?}"
    );
    let display = refused.expect_err("refused").to_string();
    assert!(display.contains("over the 4194304 bytes"), "{display}");

    // An answer too large for its kind reaches its caller as that error,
    // instead of leaving the call waiting.
    let answer = tokio::time::timeout(
        Duration::from_secs(5),
        conn.request(GetNamedActor {
            name: BIG_ANSWER.into(),
            namespace: "default".into(),
        }),
    )
    .await
    .expect("answered");
    assert!(
        matches!(&answer, Err(Error::FrameTooLarge { kind, .. }) if kind == "response WorkerExit"),
        "{answer:?}"
    );
    // And the connection still serves.
    conn.request(GetClusterResources {})
        .await
        .expect_err("Answer says Ok, which is not ClusterResources");
    assert!(!conn.is_closed());
    server.abort();
}
