//! What can go wrong with a state query.

/// A state query's error, shown to users with Display.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// The query is malformed: an unknown kind or field, a bad filter, a
    /// limit out of range.
    #[error("{0}")]
    BadRequest(String),
    /// Nothing of that kind has that id.
    #[error("no {kind} has the id {id:?} (`prism list {kind}` lists them)")]
    NotFound {
        /// The kind asked for.
        kind: String,
        /// The id asked for.
        id: String,
    },
    /// The head (or a node) could not be reached.
    #[error("{0}")]
    Connect(String),
    /// The server answered an error.
    #[error("the head answered {status}: {message}")]
    Server {
        /// The HTTP status.
        status: u16,
        /// What it said.
        message: String,
    },
}
