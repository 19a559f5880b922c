//! One HTTP/1.1 GET on a connection of its own, with the cluster token:
//! what the client asks the head, and the head asks each node.

use crate::error::StateError;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use std::time::Duration;

/// `GET http://<authority><path>` with `Authorization: Bearer <token>`:
/// the status and body, within `timeout`.
pub(crate) async fn get(
    authority: &str,
    path: &str,
    token: Option<&str>,
    timeout: Duration,
) -> Result<(u16, Bytes), StateError> {
    let call = async {
        let stream = tokio::net::TcpStream::connect(authority)
            .await
            .map_err(|e| StateError::Connect(format!("cannot reach http://{authority}: {e}")))?;
        let io = hyper_util::rt::TokioIo::new(stream);
        let (mut sender, connection) = hyper::client::conn::http1::handshake(io)
            .await
            .map_err(|e| StateError::Connect(format!("http://{authority}: {e}")))?;
        let driver = tokio::spawn(connection);
        let mut request = hyper::Request::builder()
            .method("GET")
            .uri(path)
            .header("host", authority);
        if let Some(token) = token {
            request = request.header("authorization", format!("Bearer {token}"));
        }
        let request = request
            .body(Empty::<Bytes>::new())
            .map_err(|e| StateError::Connect(format!("cannot make the request {path}: {e}")))?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| StateError::Connect(format!("http://{authority}{path}: {e}")))?;
        let status = response.status().as_u16();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| StateError::Connect(format!("http://{authority}{path}: {e}")))?
            .to_bytes();
        driver.abort();
        Ok((status, body))
    };
    tokio::time::timeout(timeout, call).await.map_err(|_| {
        StateError::Connect(format!(
            "http://{authority}{path} did not answer within {} s",
            timeout.as_secs()
        ))
    })?
}
