//! TLS on real TCP sockets: message connections and bulk streams between
//! two sides that trust one CA, and a peer that does not speak TLS refused.
//! (A test binary of its own: TLS is set for the whole process.)

use prism_protocol::ids::ObjectId;
use prism_protocol::messages::{GetObject, ObjectLocation, RayletRequest, Request, Response};
use prism_protocol::rpc::{self, BulkHandler, Connection, Handler};
use prism_protocol::tls::{self, Tls, TlsFiles};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

struct Answer;

impl Handler for Answer {
    fn handle(&self, conn: &Connection, id: Option<u64>, request: Request) {
        let body = match request {
            Request::Raylet(RayletRequest::GetObject(_)) => {
                Response::ObjectLocation(ObjectLocation { offset: 3, size: 4 })
            }
            _ => Response::Ok,
        };
        conn.respond(id, body);
    }
}

/// A CA, and a certificate for 127.0.0.1 that it signed, in `dir`.
fn certificates(dir: &Path) -> TlsFiles {
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
    std::fs::create_dir_all(dir).unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
    let key = KeyPair::generate().unwrap();
    let cert = CertificateParams::new(vec!["127.0.0.1".to_string()])
        .unwrap()
        .signed_by(&key, &ca)
        .unwrap();
    let files = TlsFiles {
        cert: dir.join("node.pem"),
        key: dir.join("node.key"),
        ca: dir.join("ca.pem"),
    };
    std::fs::write(&files.ca, ca.pem()).unwrap();
    std::fs::write(&files.cert, cert.pem()).unwrap();
    std::fs::write(&files.key, key.serialize_pem()).unwrap();
    files
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_and_bulk_streams_speak_tls_and_plain_peers_are_refused() {
    let dir = std::env::temp_dir().join(format!("prism-tls-test-{}", std::process::id()));
    let files = certificates(&dir);
    tls::set(Some(Tls::load(&files).unwrap()));
    rpc::set_cluster_token(Some("secret".into()));
    // A bulk stream that answers each byte it reads with that byte plus one.
    let bulk: BulkHandler = Arc::new(|mut stream: tls::Stream| {
        assert!(stream.is_tls());
        tokio::spawn(async move {
            let mut buf = [0u8; 1];
            while stream.read_exact(&mut buf).await.is_ok() {
                let _ = stream.write_all(&[buf[0] + 1]).await;
                let _ = stream.flush().await;
            }
        });
    });
    let (server, bound) = rpc::serve_tcp(
        "127.0.0.1:0".parse().unwrap(),
        "secret".into(),
        || Arc::new(Answer),
        Some(bulk),
    )
    .await
    .unwrap();
    let address = bound.to_string();

    let conn = Connection::connect_tcp(&address, "secret", Arc::new(Answer))
        .await
        .unwrap();
    for _ in 0..3 {
        let at = conn
            .request(GetObject {
                id: ObjectId::new(),
            })
            .await
            .unwrap();
        assert_eq!(at, ObjectLocation { offset: 3, size: 4 });
    }
    // The token is still checked inside TLS.
    let err = Connection::connect_tcp(&address, "guess", Arc::new(Answer))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("wrong cluster token"), "{err}");

    let mut stream = rpc::connect_bulk(&address).await.unwrap();
    assert!(stream.is_tls());
    stream.write_all(&[41]).await.unwrap();
    stream.flush().await.unwrap();
    let mut back = [0u8; 1];
    stream.read_exact(&mut back).await.unwrap();
    assert_eq!(back, [42]);

    // A peer that greets in plain TCP gets no answer but a closed socket.
    let mut plain = tokio::net::TcpStream::connect(&address).await.unwrap();
    let mut hello = b"PRSM".to_vec();
    hello.extend_from_slice(&6u16.to_le_bytes());
    hello.extend_from_slice(b"secret");
    plain.write_all(&hello).await.unwrap();
    let mut answer = Vec::new();
    let read = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        plain.read_to_end(&mut answer),
    )
    .await
    .expect("the server closes the plain connection");
    assert!(
        read.is_err() || !answer.starts_with(&[1]),
        "a plain peer must not be accepted: {answer:?}"
    );
    server.abort();
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn tls_settings_come_whole_and_bad_files_are_named() {
    let err = TlsFiles::from_parts(Some(PathBuf::from("a.pem")), None, None).unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("--tls-key") && text.contains("--tls-ca") && !text.contains("--tls-cert"),
        "{text}"
    );
    assert_eq!(TlsFiles::from_parts(None, None, None).unwrap(), None);
    let dir = std::env::temp_dir().join(format!("prism-tls-files-{}", std::process::id()));
    let mut files = certificates(&dir);
    files.key = dir.join("missing.key");
    let err = Tls::load(&files).unwrap_err().to_string();
    assert!(err.contains("missing.key"), "{err}");
    // A CA file with no certificate in it is refused, naming the file.
    let mut files = certificates(&dir);
    std::fs::write(dir.join("empty.pem"), "nothing here").unwrap();
    files.ca = dir.join("empty.pem");
    let err = Tls::load(&files).unwrap_err().to_string();
    assert!(
        err.contains("empty.pem") && err.contains("no PEM certificate"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
