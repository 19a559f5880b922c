//! What can go wrong talking to, or starting, the control store.

use std::net::SocketAddr;

/// An error of the control store or of a call to it.
#[derive(Debug, thiserror::Error)]
pub enum GcsError {
    /// The head could not be reached at all.
    #[error(
        "cannot reach the cluster's head at {address}: {reason} \
         (is `prism start --head` running there, and is the port open between the machines?)"
    )]
    Unreachable {
        /// The address tried.
        address: String,
        /// What the connection attempt said.
        reason: String,
    },
    /// The head could not be reached for as long as the caller waits for
    /// it (it is down or restarting).
    #[error(
        "the cluster's head at {address} did not answer for {} s ({tries} tries; the last: \
         {reason}): it is down or restarting; work that needs it (a new named actor, a \
         placement group, the key-value table) waits up to PRISM_HEAD_RECONNECT_TIMEOUT_MS \
         for it; check it with `prism status` on the head's machine",
        waited.as_secs_f64()
    )]
    HeadDown {
        /// The head's address.
        address: String,
        /// How long the call kept trying.
        waited: std::time::Duration,
        /// How many times it tried.
        tries: u32,
        /// What the last try said.
        reason: String,
    },
    /// The head refused the token.
    #[error("the head at {address} refused this connection: {message}")]
    Unauthenticated {
        /// The head's address.
        address: String,
        /// The head's explanation.
        message: String,
    },
    /// The address is not `host:port`.
    #[error("{address:?} is not a head address: give it as HOST:PORT, such as 10.0.0.1:6380")]
    BadAddress {
        /// What was given.
        address: String,
    },
    /// The port the head was to listen on is taken.
    #[error(
        "cannot listen on {address}: the port is in use (is a head already running here? \
         `prism status` tells; or choose another with --port)"
    )]
    PortInUse {
        /// The address asked for.
        address: SocketAddr,
    },
    /// Any other I/O failure, with what was being done.
    #[error("{action}: {source}")]
    Io {
        /// What was being done.
        action: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The head answered a call with an error.
    #[error("the head at {address} answered {call} with {code:?}: {message}")]
    Call {
        /// The head's address.
        address: String,
        /// The call.
        call: &'static str,
        /// The gRPC status code.
        code: tonic::Code,
        /// The head's message.
        message: String,
    },
    /// No token was given and none is saved on this machine.
    #[error(
        "no cluster token: give the one `prism start --head` printed, with --token-file or \
         PRISM_AUTH_TOKEN (none is saved in {})",
        looked_in.display()
    )]
    NoToken {
        /// The token file looked for.
        looked_in: std::path::PathBuf,
    },
    /// A token that cannot be a cluster token.
    #[error("the cluster token {reason}: give the token `prism start --head` printed")]
    BadToken {
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The connection to the head broke off under a call.
    #[error("the connection to the head at {address} broke off under {call} ({message}); {hint}")]
    BrokeOff {
        /// The head's address.
        address: String,
        /// The call.
        call: &'static str,
        /// What the transport said.
        message: String,
        /// What to check.
        hint: &'static str,
    },
    /// The head's durable state could not be opened, read or written.
    #[error("the head's state in {place}: {message}")]
    State {
        /// The state file, or the Redis server and namespace.
        place: String,
        /// What went wrong, and what to do.
        message: String,
    },
    /// Another control store has the state file open.
    #[error(
        "the head's state in {} is open in another control store (is a head already running \
         with this state? `prism status` tells; or give another --state-dir)", path.display()
    )]
    StateInUse {
        /// The state file.
        path: std::path::PathBuf,
    },
    /// The state belongs to a cluster whose token is another one than the
    /// token given.
    #[error(
        "the head's state in {place} belongs to cluster {cluster_id}, whose token is not the \
         one given: start without a token to resume that cluster with its own, or give another \
         --state-dir (or Redis namespace) to start a new cluster"
    )]
    TokenMismatch {
        /// The state file, or the Redis server and namespace.
        place: String,
        /// The cluster the state belongs to.
        cluster_id: String,
    },
    /// This process's TLS files could not be used for the control
    /// store's connections.
    #[error("TLS for the control store: {message}")]
    Tls {
        /// What was wrong, naming the file.
        message: String,
    },
}

impl From<GcsError> for prism_protocol::Error {
    fn from(e: GcsError) -> Self {
        let message = e.to_string();
        match e {
            GcsError::Unreachable { .. }
            | GcsError::HeadDown { .. }
            | GcsError::BrokeOff { .. } => prism_protocol::Error::HeadUnreachable { message },
            GcsError::Unauthenticated { .. }
            | GcsError::NoToken { .. }
            | GcsError::BadToken { .. }
            | GcsError::TokenMismatch { .. } => prism_protocol::Error::HeadRefused { message },
            _ => prism_protocol::Error::HeadFailed { message },
        }
    }
}

/// Checks that `address` is `HOST:PORT`.
pub fn check_address(address: &str) -> Result<(), GcsError> {
    match address.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => Ok(()),
        _ => Err(GcsError::BadAddress {
            address: address.to_string(),
        }),
    }
}
