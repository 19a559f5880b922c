//! Helpers the subcommands share: the cluster token they use and the
//! runtime for their network calls.

/// The token a command uses: given, or the one saved on this machine.
pub(crate) fn find_token(
    given: Option<&str>,
    temp_dir: &std::path::Path,
) -> Result<prism_gcs::Token, String> {
    prism_gcs::Token::find(given, temp_dir).map_err(|e| e.to_string())
}

/// A small multi-threaded runtime for the command's network calls.
pub(crate) fn runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))
}
