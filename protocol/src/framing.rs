//! What a frame is, read from the first bytes of its body, so that its
//! size can be checked against its kind's bound ([`FrameBound`]) before
//! the rest is read.
//!
//! A frame is MessagePack with named fields: `{"Request": {"id": 7,
//! "body": {"Raylet": {"KvPut": {..}}}}}`, `{"Notify": {"Raylet":
//! {..}}}`, or `{"Response": {"id": 7, "body": "Ok"}}` (a unit answer is
//! its name alone, any other a one-entry map). The names come before any
//! field of the message, so [`PEEK_BYTES`] of the body always hold them.

use crate::messages::{FrameBound, Request, Response};
use rmp::decode;

/// How many bytes of a frame's body are read before its size is checked:
/// enough for the longest frame kind, id, service and request names.
pub(crate) const PEEK_BYTES: usize = 128;

/// A frame's kind, as its first bytes tell it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum FrameKind {
    /// A request wanting an answer.
    Request {
        /// Its id, for the answer.
        id: u64,
        /// The service.
        service: String,
        /// The request.
        name: String,
    },
    /// A request wanting no answer.
    Notify {
        /// The service.
        service: String,
        /// The request.
        name: String,
    },
    /// An answer.
    Response {
        /// The request it answers.
        id: u64,
        /// The answer's variant.
        name: String,
    },
}

impl FrameKind {
    /// The size class of the frame; [`FrameBound::Control`] for a name
    /// this process does not know (it cannot decode such a frame anyway).
    pub(crate) fn bound(&self) -> FrameBound {
        match self {
            FrameKind::Request { service, name, .. } | FrameKind::Notify { service, name } => {
                Request::frame_bound_of(service, name)
            }
            FrameKind::Response { name, .. } => Response::frame_bound_of(name),
        }
        .unwrap_or(FrameBound::Control)
    }

    /// The message's name, for errors: `Raylet/KvPut`, or `response Ok`.
    pub(crate) fn describe(&self) -> String {
        match self {
            FrameKind::Request { service, name, .. } | FrameKind::Notify { service, name } => {
                format!("{service}/{name}")
            }
            FrameKind::Response { name, .. } => format!("response {name}"),
        }
    }
}

/// Reads the kind of the frame whose body starts with `prefix`, or `None`
/// when those bytes are not the start of a frame.
pub(crate) fn peek(prefix: &[u8]) -> Option<FrameKind> {
    let (frame, rest) = variant(prefix)?;
    match frame {
        "Request" => {
            let (id, body) = id_and_body(rest)?;
            let (service, name) = request_name(body)?;
            Some(FrameKind::Request { id, service, name })
        }
        "Notify" => {
            let (service, name) = request_name(rest)?;
            Some(FrameKind::Notify { service, name })
        }
        "Response" => {
            let (id, body) = id_and_body(rest)?;
            let (name, _) = variant(body)?;
            Some(FrameKind::Response {
                id,
                name: name.to_string(),
            })
        }
        _ => None,
    }
}

/// An enum value's variant name and the bytes after it: a unit variant is
/// its name, any other a map of one entry from its name to its content.
fn variant(bytes: &[u8]) -> Option<(&str, &[u8])> {
    match bytes.first()? {
        // fixstr, str8, str16, str32
        0xa0..=0xbf | 0xd9 | 0xda | 0xdb => decode::read_str_from_slice(bytes).ok(),
        _ => {
            let mut rest = bytes;
            if decode::read_map_len(&mut rest).ok()? != 1 {
                return None;
            }
            decode::read_str_from_slice(rest).ok()
        }
    }
}

/// The `id` of a request or answer, and the bytes of its `body`.
fn id_and_body(bytes: &[u8]) -> Option<(u64, &[u8])> {
    let mut rest = bytes;
    let fields = decode::read_map_len(&mut rest).ok()?;
    let mut id = None;
    for _ in 0..fields {
        let (key, after) = decode::read_str_from_slice(rest).ok()?;
        rest = after;
        match key {
            "id" => id = Some(decode::read_int::<u64, _>(&mut rest).ok()?),
            "body" => return Some((id?, rest)),
            _ => return None,
        }
    }
    None
}

/// The service and request names of a [`Request`].
fn request_name(bytes: &[u8]) -> Option<(String, String)> {
    let (service, rest) = variant(bytes)?;
    let (name, _) = variant(rest)?;
    Some((service.to_string(), name.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::messages::{ActorCall, Call, GetClusterResources, KvPut, LeasesWanted};
    use crate::rpc::Frame;

    fn encoded(frame: &Frame) -> Vec<u8> {
        rmp_serde::to_vec_named(frame).expect("encode")
    }

    #[test]
    fn every_kind_is_read_from_its_first_bytes() {
        let request: Request = KvPut {
            key: "k".repeat(300),
            value: vec![1u8; 1000].into(),
            overwrite: true,
        }
        .into();
        let bytes = encoded(&Frame::Request {
            id: u64::MAX,
            body: request,
        });
        let kind = peek(&bytes[..PEEK_BYTES]).expect("a kind");
        assert_eq!(
            kind,
            FrameKind::Request {
                id: u64::MAX,
                service: "Raylet".into(),
                name: "KvPut".into()
            }
        );
        assert_eq!(kind.bound(), FrameBound::Payload);

        let notify = encoded(&Frame::Notify(GetClusterResources {}.into()));
        let kind = peek(&notify).expect("a kind");
        assert_eq!(kind.describe(), "Raylet/GetClusterResources");
        assert_eq!(kind.bound(), FrameBound::Control);

        let batch: Request = LeasesWanted { leases: Vec::new() }.into();
        let kind = peek(&encoded(&Frame::Notify(batch))).expect("a kind");
        assert_eq!(kind.bound(), FrameBound::Batch);

        for (id, body) in [
            (1, Response::Ok),
            (300, Response::KvChanged(true)),
            (70_000, Response::Chunk(vec![0u8; 4096].into())),
            (5, Response::KvKeys(vec!["a".into(); 100])),
            (
                6,
                Response::Error(crate::Error::Protocol {
                    message: "x".into(),
                }),
            ),
            (7, Response::WorkerExit(Some("killed".into()))),
        ] {
            let name = body.wire_name();
            let bound = body.frame_bound();
            let bytes = encoded(&Frame::Response { id, body });
            let kind = peek(&bytes[..bytes.len().min(PEEK_BYTES)]).expect("a kind");
            assert_eq!(
                kind,
                FrameKind::Response {
                    id,
                    name: name.into()
                }
            );
            assert_eq!(kind.bound(), bound, "{name}");
        }
        assert_eq!(ActorCall::FRAME_BOUND, FrameBound::Payload);
    }

    #[test]
    fn bytes_that_are_no_frame_have_no_kind() {
        assert_eq!(peek(&[]), None);
        assert_eq!(peek(b"GET / HTTP/1.1\r\n"), None);
        assert_eq!(peek(&[0x81, 0xa3, b'F', b'o', b'o', 0xc0]), None);
        // A request's name cut short.
        let bytes = encoded(&Frame::Notify(GetClusterResources {}.into()));
        assert_eq!(peek(&bytes[..6]), None);
    }

    #[test]
    fn unknown_names_have_no_bound() {
        assert_eq!(Response::frame_bound_of("Nope"), None);
        assert_eq!(Request::frame_bound_of("Raylet", "Nope"), None);
        assert_eq!(
            Request::frame_bound_of("Executor", "PushTask"),
            Some(FrameBound::Payload)
        );
    }
}
