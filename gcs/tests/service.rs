//! The control store over real TCP: tokens, membership, death by silence.

use prism_gcs::pb::{NodeInfo, NodeState, Resource};
use prism_gcs::{GcsClient, GcsError, GcsServer, GcsSettings, NameHolder, Token};
use std::time::{Duration, Instant};

fn node(id: &str) -> NodeInfo {
    NodeInfo {
        node_id: id.into(),
        node_ip: "127.0.0.1".into(),
        total: vec![Resource {
            name: "CPU".into(),
            units: 10_000,
        }],
        ..NodeInfo::default()
    }
}

async fn start(death: Duration) -> (GcsServer, Token) {
    let token = Token::generate();
    let settings = GcsSettings::new(token.clone(), Duration::from_millis(50), death);
    let gcs = GcsServer::start("127.0.0.1:0".parse().unwrap(), settings)
        .await
        .expect("the control store starts on a free port");
    (gcs, token)
}

#[tokio::test]
async fn calls_without_the_right_token_are_refused_with_how_to_fix_it() {
    let (gcs, token) = start(Duration::from_secs(5)).await;
    let address = gcs.address().to_string();
    let mut wrong = GcsClient::connect(&address, &Token::generate())
        .await
        .unwrap();
    match wrong.get_nodes().await {
        Err(GcsError::Unauthenticated { message, .. }) => {
            assert!(message.contains("wrong cluster token"), "{message}");
            assert!(message.contains("PRISM_AUTH_TOKEN"), "{message}");
        }
        other => panic!("a wrong token must be refused, got {other:?}"),
    }
    let mut right = GcsClient::connect(&address, &token).await.unwrap();
    assert!(right.get_nodes().await.unwrap().is_empty());
    let err = wrong.register_node(node("n1")).await.unwrap_err();
    assert!(err.to_string().contains("refused this connection"), "{err}");
    assert!(
        right.get_nodes().await.unwrap().is_empty(),
        "a refused call changes nothing"
    );
    gcs.shutdown().await;
}

#[tokio::test]
async fn a_second_server_on_a_taken_port_says_so() {
    let (gcs, token) = start(Duration::from_secs(5)).await;
    let err = GcsServer::start(
        gcs.address(),
        GcsSettings::new(token, Duration::from_millis(50), Duration::from_secs(5)),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, GcsError::PortInUse { .. }), "{err:?}");
    assert!(err.to_string().contains("--port"), "{err}");
    gcs.shutdown().await;
}

#[tokio::test]
async fn an_unreachable_head_and_a_bad_address_are_named() {
    let token = Token::generate();
    // A port that was free a moment ago: nothing listens there.
    let free = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let err = GcsClient::connect(&free.to_string(), &token)
        .await
        .unwrap_err();
    assert!(matches!(err, GcsError::Unreachable { .. }), "{err:?}");
    assert!(err.to_string().contains("prism start --head"), "{err}");
    for bad in ["localhost", "host:port", ":6380"] {
        let err = GcsClient::connect(bad, &token).await.unwrap_err();
        assert!(matches!(err, GcsError::BadAddress { .. }), "{bad}: {err:?}");
    }
}

#[tokio::test]
async fn a_node_that_stops_beating_is_marked_dead_and_told_when_it_returns() {
    let (gcs, token) = start(Duration::from_millis(300)).await;
    let mut client = GcsClient::connect(&gcs.address().to_string(), &token)
        .await
        .unwrap();
    let reply = client.register_node(node("n1")).await.unwrap();
    assert_eq!(reply.heartbeat_period_ms, 50);
    assert_eq!(reply.cluster_id, gcs.cluster_id());
    client.register_node(node("n2")).await.unwrap();
    let err = client.register_node(node("n2")).await.unwrap_err();
    assert!(err.to_string().contains("already registered"), "{err}");
    // n1 beats, n2 stays silent.
    let deadline = Instant::now() + Duration::from_secs(10);
    let dead = loop {
        assert!(client.heartbeat("n1", vec![], vec![]).await.unwrap().alive);
        let nodes = client.get_nodes().await.unwrap();
        if nodes[1].state == NodeState::Dead as i32 {
            break nodes;
        }
        assert!(
            Instant::now() < deadline,
            "n2 was never marked dead: {nodes:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(dead[0].state, NodeState::Alive as i32);
    assert!(
        dead[1].death_cause.contains("no heartbeat"),
        "{}",
        dead[1].death_cause
    );
    let late = client.heartbeat("n2", vec![], vec![]).await.unwrap();
    assert!(!late.alive && late.death_cause.contains("no heartbeat"));
    client
        .unregister_node("n1", "stopped by prism stop")
        .await
        .unwrap();
    let nodes = client.get_nodes().await.unwrap();
    assert_eq!(nodes[0].death_cause, "stopped by prism stop");
    gcs.shutdown().await;
}

#[tokio::test]
async fn the_key_value_table_is_shared_by_every_client() {
    let (gcs, token) = start(Duration::from_secs(5)).await;
    let address = gcs.address().to_string();
    let mut a = GcsClient::connect(&address, &token).await.unwrap();
    let mut b = GcsClient::connect(&address, &token).await.unwrap();
    assert!(a
        .kv_put("run/rank0".into(), b"10.0.0.1:7000".to_vec(), false)
        .await
        .unwrap());
    assert!(!b
        .kv_put("run/rank0".into(), b"other".to_vec(), false)
        .await
        .unwrap());
    assert_eq!(
        b.kv_get("run/rank0".into()).await.unwrap().as_deref(),
        Some(&b"10.0.0.1:7000"[..]),
        "a value put by one client is read by another, and not overwritten"
    );
    b.kv_put("run/rank1".into(), Vec::new(), true)
        .await
        .unwrap();
    assert_eq!(
        a.kv_keys("run/".into()).await.unwrap(),
        vec!["run/rank0".to_string(), "run/rank1".to_string()]
    );
    assert!(a.kv_delete("run/rank0".into()).await.unwrap());
    assert!(!a.kv_delete("run/rank0".into()).await.unwrap());
    assert_eq!(b.kv_get("run/rank0".into()).await.unwrap(), None);
    gcs.shutdown().await;
}

#[tokio::test]
async fn an_actor_name_has_one_holder_until_its_node_dies_or_it_is_replaced() {
    let (gcs, token) = start(Duration::from_secs(5)).await;
    let mut client = GcsClient::connect(&gcs.address().to_string(), &token)
        .await
        .unwrap();
    client.register_node(node("n1")).await.unwrap();
    client.register_node(node("n2")).await.unwrap();
    let first = client
        .register_actor_name("ns", "counter", "actor-1", "n1", None)
        .await
        .unwrap();
    assert!(first.registered);
    let second = client
        .register_actor_name("ns", "counter", "actor-2", "n2", None)
        .await
        .unwrap();
    assert!(!second.registered, "a live holder keeps the name");
    assert_eq!(
        (
            second.holder_actor_id.as_str(),
            second.holder_node_id.as_str()
        ),
        ("actor-1", "n1")
    );
    // Another namespace is another name.
    assert!(
        client
            .register_actor_name("other", "counter", "actor-2", "n2", None)
            .await
            .unwrap()
            .registered
    );
    assert_eq!(
        client.lookup_actor_name("ns", "counter").await.unwrap(),
        NameHolder::Alive {
            actor_id: "actor-1".to_string(),
            node_id: "n1".to_string()
        }
    );
    // The caller found actor-1 dead: it takes the name over.
    assert!(
        client
            .register_actor_name("ns", "counter", "actor-2", "n2", Some("actor-1"))
            .await
            .unwrap()
            .registered
    );
    // A holder whose node is gone holds nothing; the lookup says so.
    client.unregister_node("n2", "stopped").await.unwrap();
    match client.lookup_actor_name("ns", "counter").await.unwrap() {
        NameHolder::NodeDied {
            actor_id,
            node_id,
            died_at_ms,
            cause,
        } => {
            assert_eq!((actor_id.as_str(), node_id.as_str()), ("actor-2", "n2"));
            assert_eq!(cause, "stopped");
            assert!(died_at_ms > 1_700_000_000_000, "{died_at_ms}");
        }
        other => panic!("the holder's death must be told: {other:?}"),
    }
    assert!(
        client
            .register_actor_name("ns", "counter", "actor-3", "n1", None)
            .await
            .unwrap()
            .registered
    );
    gcs.shutdown().await;
}

#[tokio::test]
async fn a_node_with_a_huge_or_empty_id_or_absurd_resources_is_refused_as_invalid() {
    let (gcs, token) = start(Duration::from_secs(5)).await;
    let address = gcs.address().to_string();
    let mut client = GcsClient::connect(&address, &token).await.unwrap();
    // A 1 MiB id, an empty one, 50,000 resources at i64::MAX: each is
    // refused with the field named, and nothing is registered.
    let huge = client
        .register_node(node(&"n".repeat(1 << 20)))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        huge.contains("node_id") && huge.contains("longer than 64"),
        "{huge}"
    );
    assert!(huge.len() < 1000, "the refusal does not echo the megabyte");
    let empty = client
        .register_node(node(""))
        .await
        .unwrap_err()
        .to_string();
    assert!(empty.contains("node_id: is empty"), "{empty}");
    assert!(
        !empty.contains("already"),
        "an empty id is invalid, not taken: {empty}"
    );
    let mut greedy = node("n2");
    greedy.total = (0..50_000)
        .map(|i| Resource {
            name: format!("r{i}"),
            units: i64::MAX,
        })
        .collect();
    let greedy = client.register_node(greedy).await.unwrap_err().to_string();
    assert!(greedy.contains("at most 1024"), "{greedy}");
    assert!(
        client.get_nodes().await.unwrap().is_empty(),
        "nothing was registered"
    );
    client
        .register_node(node("node-ok"))
        .await
        .expect("a sound node registers");
    gcs.shutdown().await;
}

/// Starts a control store keeping its state in `state`, at `address`.
async fn start_with_state(
    address: std::net::SocketAddr,
    token: &Token,
    state: &std::path::Path,
) -> Result<GcsServer, GcsError> {
    let mut settings = GcsSettings::new(
        token.clone(),
        Duration::from_millis(50),
        Duration::from_millis(1500),
    );
    settings.state = Some(prism_gcs::StateStore::File(state.to_path_buf()));
    GcsServer::start(address, settings).await
}

#[tokio::test]
async fn a_restarted_control_store_resumes_its_cluster_and_callers_wait_for_it() {
    let dir = std::env::temp_dir().join(format!("prism-gcs-state-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let state = dir.join("state.redb");
    let token = Token::generate();
    let gcs = start_with_state("127.0.0.1:0".parse().unwrap(), &token, &state)
        .await
        .expect("the control store starts");
    let (address, cluster) = (gcs.address(), gcs.cluster_id().to_string());
    let mut client = GcsClient::connect(&address.to_string(), &token)
        .await
        .unwrap()
        .with_patience(Duration::from_secs(20));
    client.register_node(node("beats")).await.unwrap();
    client.register_node(node("silent")).await.unwrap();
    client
        .kv_put("ckpt/a".into(), b"state".to_vec(), false)
        .await
        .unwrap();
    client
        .kv_put("gone".into(), b"x".to_vec(), false)
        .await
        .unwrap();
    assert!(client.kv_delete("gone".into()).await.unwrap());
    let named = client
        .register_actor_name("ns", "ctr", "actor-1", "beats", None)
        .await
        .unwrap();
    assert!(named.registered);
    gcs.shutdown().await;

    // Down: a call with no patience fails at once and says so; one with
    // patience waits, and fails with HeadDown when the head stays down.
    let mut hasty = client.clone().with_patience(Duration::ZERO);
    assert!(matches!(
        hasty.kv_get("ckpt/a".into()).await,
        Err(GcsError::Unreachable { .. })
    ));
    let mut brief = client.clone().with_patience(Duration::from_millis(300));
    let asked = Instant::now();
    match brief.kv_get("ckpt/a".into()).await {
        Err(e @ GcsError::HeadDown { .. }) => {
            assert!(asked.elapsed() >= Duration::from_millis(300), "{e}");
            let said = e.to_string();
            assert!(said.contains("down or restarting"), "{said}");
            assert!(said.contains("PRISM_HEAD_RECONNECT_TIMEOUT_MS"), "{said}");
        }
        other => panic!("a head that stays down must be named, got {other:?}"),
    }

    // Another token cannot take the state over.
    let err = start_with_state(address, &Token::generate(), &state)
        .await
        .unwrap_err();
    assert!(matches!(err, GcsError::TokenMismatch { .. }), "{err:?}");
    assert!(err.to_string().contains(&cluster), "{err}");

    // A read made while the head is down is answered once it is back.
    let mut waiting = client.clone();
    let read = tokio::spawn(async move { waiting.kv_get("ckpt/a".into()).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let again = start_with_state(address, &token, &state)
        .await
        .expect("the control store starts again on its state");
    assert_eq!(again.cluster_id(), cluster, "the same cluster");
    assert_eq!(read.await.unwrap().unwrap().as_deref(), Some(&b"state"[..]));
    assert_eq!(client.kv_get("gone".into()).await.unwrap(), None);
    assert_eq!(
        client.lookup_actor_name("ns", "ctr").await.unwrap(),
        NameHolder::Alive {
            actor_id: "actor-1".to_string(),
            node_id: "beats".to_string()
        }
    );
    // The member that beats stays; the silent one is marked dead.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let reply = client.heartbeat("beats", vec![], vec![]).await.unwrap();
        assert!(reply.alive, "a member that beats is taken back");
        let nodes = client.get_nodes().await.unwrap();
        let silent = nodes.iter().find(|n| n.node_id == "silent").unwrap();
        if silent.state == NodeState::Dead as i32 {
            assert!(silent.death_cause.contains("no heartbeat"), "{silent:?}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the silent member is never marked dead"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    again.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// A redis-server of this test's own on a free loopback port, killed on
/// drop; `None` (and a note) where Redis is not installed.
struct RedisServer {
    child: std::process::Child,
    address: String,
}

impl RedisServer {
    fn start(password: Option<&str>) -> Option<RedisServer> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .ok()?;
        let mut command = std::process::Command::new("redis-server");
        command.args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ]);
        if let Some(p) = password {
            command.args(["--requirepass", p]);
        }
        let child = match command
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
        {
            Ok(child) => child,
            Err(e) => {
                eprintln!("skipped: redis-server cannot run here ({e}); .ci/run installs it");
                return None;
            }
        };
        let address = format!("127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(&address).is_err() {
            assert!(Instant::now() < deadline, "redis-server did not start");
            std::thread::sleep(Duration::from_millis(20));
        }
        Some(RedisServer { child, address })
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[tokio::test]
async fn a_control_store_on_redis_resumes_its_cluster_on_a_new_machine() {
    let Some(redis) = RedisServer::start(Some("s3cret")) else {
        return;
    };
    let place = |password: Option<&str>, namespace: &str| {
        prism_gcs::StateStore::Redis(prism_gcs::RedisPlace {
            address: redis.address.clone(),
            password: password.map(str::to_string),
            namespace: namespace.to_string(),
        })
    };
    let token = Token::generate();
    let start = |store: prism_gcs::StateStore, token: Token| async move {
        let mut settings = GcsSettings::new(
            token,
            Duration::from_millis(50),
            Duration::from_millis(1500),
        );
        settings.state = Some(store);
        GcsServer::start("127.0.0.1:0".parse().unwrap(), settings).await
    };
    // A wrong password is told at start.
    let err = start(place(Some("wrong"), "c1"), token.clone())
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("refused the password"), "{err}");

    let gcs = start(place(Some("s3cret"), "c1"), token.clone())
        .await
        .expect("the control store starts on Redis");
    let cluster = gcs.cluster_id().to_string();
    let mut client = GcsClient::connect(&gcs.address().to_string(), &token)
        .await
        .unwrap();
    client.register_node(node("n1")).await.unwrap();
    client
        .kv_put("bin".into(), vec![0, 255, 13, 10, 0], false)
        .await
        .unwrap();
    client
        .register_actor_name("a:b", ":ctr", "actor-1", "n1", None)
        .await
        .unwrap();
    gcs.shutdown().await;

    // Another head (another port, no disk of the first): the same cluster.
    assert_eq!(
        GcsSettings::saved_token(&place(Some("s3cret"), "c1"))
            .unwrap()
            .map(|t| t.reveal().to_string()),
        Some(token.reveal().to_string()),
        "a new head finds the cluster's token in Redis"
    );
    let again = start(place(Some("s3cret"), "c1"), token.clone())
        .await
        .expect("a second head resumes from Redis");
    assert_eq!(again.cluster_id(), cluster);
    let mut client = GcsClient::connect(&again.address().to_string(), &token)
        .await
        .unwrap();
    assert_eq!(
        client.kv_get("bin".into()).await.unwrap(),
        Some(vec![0, 255, 13, 10, 0])
    );
    assert_eq!(
        client.lookup_actor_name("a:b", ":ctr").await.unwrap(),
        NameHolder::Alive {
            actor_id: "actor-1".into(),
            node_id: "n1".into()
        }
    );
    assert!(client.heartbeat("n1", vec![], vec![]).await.unwrap().alive);
    // Another namespace is another cluster.
    let other = start(place(Some("s3cret"), "c2"), token.clone())
        .await
        .expect("a second namespace");
    assert_ne!(other.cluster_id(), cluster);
    other.shutdown().await;

    // Redis gone: a change fails, saying where, and nothing changed.
    drop(redis);
    let err = client
        .kv_put("k".into(), b"v".to_vec(), false)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("Redis at 127.0.0.1:"), "{err}");
    assert_eq!(client.kv_get("k".into()).await.unwrap(), None);
    again.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_does_not_wait_for_a_peer_that_never_closes_its_connection() {
    use tokio::io::AsyncWriteExt;
    let (gcs, _) = start(Duration::from_secs(5)).await;
    // A peer that greets in HTTP/2 and then goes silent for good, as a
    // node on a machine that vanished from the network does.
    let mut tcp = tokio::net::TcpStream::connect(gcs.address())
        .await
        .expect("connect");
    tcp.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        .await
        .expect("the preface is sent");
    // An empty SETTINGS frame: length 0, type 4, no flags, stream 0.
    tcp.write_all(&[0, 0, 0, 4, 0, 0, 0, 0, 0])
        .await
        .expect("the settings are sent");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let started = std::time::Instant::now();
    let stopped = tokio::time::timeout(Duration::from_secs(20), gcs.shutdown()).await;
    assert!(
        stopped.is_ok(),
        "shutdown waited over 20 s for a connection its peer never closes"
    );
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    drop(tcp);
}
