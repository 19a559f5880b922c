//! The cluster token: made by the head, presented on every call.

use crate::GcsError;
use std::fmt;
use std::path::Path;

/// A cluster's shared secret. Its `Debug` form hides the value, so it never
/// reaches a log by accident.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(String);

impl Token {
    /// A fresh random token: 64 hex digits (256 bits from the OS's
    /// generator, through two v4 UUIDs).
    pub fn generate() -> Token {
        let (a, b) = (uuid::Uuid::new_v4(), uuid::Uuid::new_v4());
        Token(format!("{}{}", a.simple(), b.simple()))
    }

    /// A token given by the user (`--token`, `PRISM_AUTH_TOKEN`); it must
    /// be printable ASCII without spaces, as it travels in a header.
    pub fn parse(text: &str) -> Result<Token, GcsError> {
        let text = text.trim();
        if text.is_empty() {
            return Err(GcsError::BadToken { reason: "is empty" });
        }
        if !text.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(GcsError::BadToken {
                reason: "holds spaces or characters that are not printable ASCII",
            });
        }
        Ok(Token(text.to_string()))
    }

    /// Reads a token file (as written by [`Token::save`]).
    pub fn load(path: &Path) -> Result<Token, GcsError> {
        let text = std::fs::read_to_string(path).map_err(|source| GcsError::Io {
            action: format!("read the cluster token from {}", path.display()),
            source,
        })?;
        Token::parse(&text)
    }

    /// Writes the token to `path`, readable and writable by this user only.
    pub fn save(&self, path: &Path) -> Result<(), GcsError> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let io = |source| GcsError::Io {
            action: format!("write the cluster token to {}", path.display()),
            source,
        };
        let _ = std::fs::remove_file(path);
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
            .map_err(io)?;
        file.write_all(self.0.as_bytes()).map_err(io)?;
        file.sync_all().map_err(io)
    }

    /// The token's text, for a header or to print once to its owner.
    pub fn reveal(&self) -> &str {
        &self.0
    }

    /// Compares in time that does not depend on where the texts differ.
    pub(crate) fn matches(&self, presented: &[u8]) -> bool {
        prism_protocol::rpc::constant_time_eq(self.0.as_bytes(), presented)
    }

    /// The token to use: `given` (a flag or `PRISM_AUTH_TOKEN`), else the
    /// one saved in `<temp_dir>/token` on this machine by a node.
    pub fn find(given: Option<&str>, temp_dir: &Path) -> Result<Token, GcsError> {
        if let Some(text) = given {
            return Token::parse(text);
        }
        let path = temp_dir.join("token");
        if !path.exists() {
            return Err(GcsError::NoToken { looked_in: path });
        }
        Token::load(&path)
    }
}

impl fmt::Debug for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Token(<hidden>)")
    }
}

/// The header every call carries.
pub(crate) const HEADER: &str = "authorization";

/// Refused calls, logged a line per interval at most (the first at once,
/// then how many were held back): a flood of bad tokens cannot fill the
/// head's log.
static REFUSED: prism_protocol::guard::LogLimiter =
    prism_protocol::guard::LogLimiter::new(prism_protocol::guard::REFUSAL_LOG_INTERVAL);

/// The server's check of every incoming call.
pub(crate) fn check(
    token: Token,
) -> impl Fn(tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> + Clone {
    move |request: tonic::Request<()>| {
        let presented = request
            .metadata()
            .get(HEADER)
            .and_then(|v| v.as_bytes().strip_prefix(b"Bearer "));
        match presented {
            Some(p) if token.matches(p) => Ok(request),
            other => {
                let peer = request
                    .remote_addr()
                    .map(|a| a.to_string())
                    .unwrap_or_else(|| "an unknown peer".into());
                let what = if other.is_some() { "a wrong" } else { "no" };
                if let Some(held_back) = REFUSED.allow() {
                    tracing::warn!(%peer, refusals_not_logged = held_back, "refused a connection with {what} cluster token");
                }
                Err(tonic::Status::unauthenticated(format!(
                    "{what} cluster token was given; pass the token that `prism start --head` \
                     printed, with --token-file or PRISM_AUTH_TOKEN (on the head it is in the file \
                     `token` of its temp dir: /tmp/prism/token by default for root, \
                     /tmp/prism-<uid>/token for another user)"
                )))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_long_random_and_hidden_from_debug() {
        let (a, b) = (Token::generate(), Token::generate());
        assert_ne!(a, b);
        assert_eq!(a.reveal().len(), 64);
        assert!(!format!("{a:?}").contains(a.reveal()));
        assert!(a.matches(a.reveal().as_bytes()));
        assert!(!a.matches(b.reveal().as_bytes()));
        assert!(!a.matches(&a.reveal().as_bytes()[1..]));
    }

    #[test]
    fn user_tokens_must_fit_in_a_header() {
        assert!(Token::parse("  abc \n").is_ok_and(|t| t.reveal() == "abc"));
        assert!(Token::parse("").is_err());
        assert!(Token::parse("a b").is_err());
        assert!(Token::parse("é").is_err());
    }

    #[test]
    fn saved_tokens_are_private_and_read_back() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("prism-token-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("token");
        let token = Token::generate();
        token.save(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(Token::load(&path).unwrap(), token);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
