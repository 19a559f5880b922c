//! TLS on the links between hosts, over real loopback sockets: ranks that
//! pretend to be on three hosts (`host_id`) reduce through encrypted links;
//! a rank without TLS, and one whose certificate another CA signed, are
//! refused with errors that say so.

use prism_collective::{
    CollectiveConfig, CollectiveError, GroupOptions, GroupTls, ProcessGroup, ReduceOp,
    TcpRendezvous, TransportChoice,
};
use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
use std::time::Duration;

/// A CA of its own and a certificate for 127.0.0.1 that it signed, as
/// TLS for a group.
fn tls_signed_by_a_new_ca() -> GroupTls {
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca =
        CertifiedIssuer::self_signed(params, KeyPair::generate().expect("a key")).expect("a CA");
    let key = KeyPair::generate().expect("a key");
    let cert = CertificateParams::new(vec!["127.0.0.1".to_string()])
        .expect("leaf params")
        .signed_by(&key, &ca)
        .expect("a signed certificate");
    let (cert, key, ca) = (cert.pem(), key.serialize_pem(), ca.pem());
    GroupTls::from_pem(cert.as_bytes(), key.as_bytes(), ca.as_bytes()).expect("TLS from PEM")
}

#[test]
fn pem_that_holds_no_certificate_or_key_is_named() {
    let e = GroupTls::from_pem(b"", b"", b"").expect_err("nothing to read");
    assert!(
        matches!(
            e,
            CollectiveError::TlsConfig {
                what: "the certificate",
                ..
            }
        ),
        "{e}"
    );
}

/// Runs `world` ranks on threads, rank `r` on host `hosts[r]` with TLS
/// `tls[r]`, each calling `body`; returns each rank's outcome.
fn run_group<T: Send + 'static>(
    hosts: &[&str],
    tls: Vec<Option<GroupTls>>,
    timeout: Duration,
    body: fn(&ProcessGroup) -> Result<T, CollectiveError>,
) -> Vec<Result<T, CollectiveError>> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    let rdv = TcpRendezvous::on_listener(listener).expect("a bound listener");
    let world = hosts.len();
    let ranks: Vec<_> = tls
        .into_iter()
        .enumerate()
        .map(|(rank, tls)| {
            let rdv = rdv.clone();
            let host = hosts[rank].to_string();
            std::thread::spawn(move || {
                let config = CollectiveConfig {
                    host_id: Some(host),
                    transport: TransportChoice::Auto,
                    // Small chunks and socket buffers: many records per
                    // call, and writes that find the socket full.
                    chunk_bytes: 64 * 1024,
                    tcp_socket_buffer_bytes: 64 * 1024,
                    ..CollectiveConfig::default()
                };
                let mut options = GroupOptions::new(rank, world, rdv.master())
                    .config(config)
                    .timeout(timeout);
                if let Some(tls) = tls {
                    options = options.tls(tls);
                }
                let group = ProcessGroup::join_with(options, &rdv)?;
                body(&group)
            })
        })
        .collect();
    ranks
        .into_iter()
        .map(|r| r.join().expect("a rank does not panic"))
        .collect()
}

type Reduced = (Vec<f32>, Vec<i64>, usize);

fn reduce_large_and_small(group: &ProcessGroup) -> Result<Reduced, CollectiveError> {
    let rank = group.rank() as f32;
    let mut large: Vec<f32> = (0..1 << 20).map(|i| (i % 1000) as f32 + rank).collect();
    group.all_reduce(&mut large, ReduceOp::Sum)?;
    let mut small = vec![group.rank() as i64 + 1; 3];
    group.all_reduce(&mut small, ReduceOp::Max)?;
    group.barrier()?;
    Ok((large, small, group.encrypted_links()))
}

#[test]
fn ranks_on_different_hosts_reduce_over_tls() {
    let tls = tls_signed_by_a_new_ca();
    // Hosts a, b, b: rank 0 reaches 1 and 2 over TLS; 1 and 2 share memory.
    for hosts in [["a", "b", "c"], ["a", "b", "b"]] {
        let tls = vec![Some(tls.clone()); 3];
        let outcomes = run_group(&hosts, tls, Duration::from_secs(30), reduce_large_and_small);
        for (rank, outcome) in outcomes.into_iter().enumerate() {
            let (large, small, encrypted) = outcome.unwrap_or_else(|e| panic!("rank {rank}: {e}"));
            let other_hosts = hosts.iter().filter(|h| **h != hosts[rank]).count();
            assert_eq!(encrypted, other_hosts, "hosts {hosts:?}, rank {rank}");
            for (i, v) in large.iter().enumerate().step_by(997) {
                let want = 3.0 * (i % 1000) as f32 + 3.0;
                assert_eq!(*v, want, "hosts {hosts:?}, rank {rank}, element {i}");
            }
            assert_eq!(small, [3, 3, 3], "hosts {hosts:?}, rank {rank}");
        }
    }
}

#[test]
fn a_rank_without_tls_is_refused_by_a_group_in_tls() {
    let tls = tls_signed_by_a_new_ca();
    // Long enough for the rendezvous and a handshake on a loaded machine;
    // the rank that is not refused waits this long for the other.
    let refused = Duration::from_secs(10);
    let outcomes = run_group(&["a", "b"], vec![Some(tls), None], refused, |g| g.barrier());
    let e = outcomes[0].as_ref().expect_err("rank 0 refuses rank 1");
    assert!(
        matches!(e, CollectiveError::Tls { peer: Some(1), .. })
            && e.to_string().contains("without TLS"),
        "{e}"
    );
    assert!(outcomes[1].is_err(), "rank 1 never forms the group");
}

#[test]
fn a_certificate_from_another_ca_fails_the_handshake() {
    let outcomes = run_group(
        &["a", "b"],
        vec![
            Some(tls_signed_by_a_new_ca()),
            Some(tls_signed_by_a_new_ca()),
        ],
        Duration::from_secs(10),
        |g| g.barrier(),
    );
    // Rank 1 connects to rank 0 and checks its certificate.
    let e = outcomes[1]
        .as_ref()
        .expect_err("rank 1 does not trust rank 0");
    assert!(
        matches!(e, CollectiveError::Tls { peer: Some(0), .. }),
        "{e}"
    );
    assert!(e.to_string().contains("CA"), "{e}");
    assert!(outcomes[0].is_err(), "rank 0 never forms the group");
}
