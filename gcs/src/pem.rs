//! The PEM files of a node's TLS setup, read for tonic's client and server.

use crate::GcsError;

/// The PEM bytes of a node's certificate, key and CA.
pub(crate) struct Pem {
    pub(crate) cert: Vec<u8>,
    pub(crate) key: Vec<u8>,
    pub(crate) ca: Vec<u8>,
}

impl Pem {
    pub(crate) fn read(files: &prism_protocol::tls::TlsFiles) -> Result<Pem, GcsError> {
        let read = |path: &std::path::PathBuf| {
            std::fs::read(path).map_err(|e| GcsError::Tls {
                message: format!("cannot read {}: {e}", path.display()),
            })
        };
        Ok(Pem {
            cert: read(&files.cert)?,
            key: read(&files.key)?,
            ca: read(&files.ca)?,
        })
    }
}
