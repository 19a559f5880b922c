//! [`ReplyTo`]: the handle that answers one request of a client, now or
//! later (the scheduler, pulls and placement keep it while the client
//! waits).

use prism_protocol::error::Error;
use prism_protocol::messages::{Reply, Response};
use prism_protocol::rpc::Connection;

/// Answers one request, now or later.
#[derive(Debug)]
pub(crate) struct ReplyTo {
    conn: Connection,
    request: Option<u64>,
}

impl ReplyTo {
    pub(crate) fn new(conn: &Connection, request: Option<u64>) -> Self {
        ReplyTo {
            conn: conn.clone(),
            request,
        }
    }

    /// The connection the request came on.
    pub(crate) fn conn(&self) -> &Connection {
        &self.conn
    }

    pub(crate) fn send(self, response: Response) {
        self.conn.respond(self.request, response);
    }

    pub(crate) fn send_result<T: Reply>(self, answer: Result<T, Error>) {
        self.send(Response::from_result(answer));
    }
}
