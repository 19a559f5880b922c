//! [`ReplyTo`]: a request's [`Answer`] with its type put aside, for the
//! components that keep answers to several kinds of request in one place
//! while their clients wait (the scheduler's leases and group answers,
//! the actor table's waiters, pulls, placement).

use prism_protocol::error::Error;
use prism_protocol::messages::{Call, Reply, Response};
use prism_protocol::rpc::Connection;
use prism_protocol::serve::Answer;

/// Answers one request, now or later.
#[derive(Debug)]
pub(crate) struct ReplyTo {
    conn: Connection,
    request: Option<u64>,
}

impl ReplyTo {
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

impl<C: Call> From<Answer<C>> for ReplyTo {
    fn from(answer: Answer<C>) -> Self {
        let (conn, request) = answer.into_parts();
        ReplyTo { conn, request }
    }
}
