//! Helpers the subcommands share: the cluster token they use and the
//! runtime for their network calls.

/// The token a command uses: given, or the one saved on this machine.
pub(crate) fn find_token(
    given: Option<&str>,
    temp_dir: &std::path::Path,
) -> Result<prism_gcs::Token, String> {
    prism_gcs::Token::find(given, temp_dir).map_err(|e| e.to_string())
}

/// The token given to a command: read from `file` (`--token-file`) when
/// one is named, else `token` (`--token` or `PRISM_AUTH_TOKEN`).
pub(crate) fn given_token(
    token: Option<&str>,
    file: Option<&std::path::Path>,
) -> Result<Option<String>, String> {
    let Some(path) = file else {
        return Ok(token.map(str::to_string));
    };
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("--token-file {}: cannot read it: {e}", path.display()))?;
    let text = text.trim();
    if text.is_empty() {
        return Err(format!(
            "--token-file {}: the file is empty; copy the head's token file (`token` in its temp \
             dir) here",
            path.display()
        ));
    }
    Ok(Some(text.to_string()))
}

/// Whether the token was typed on this command line, where every user of
/// the machine can read it (`ps`, `/proc/<pid>/cmdline`).
pub(crate) fn token_on_command_line() -> bool {
    std::env::args().any(|a| a == "--token" || a.starts_with("--token="))
}

/// A small multi-threaded runtime for the command's network calls.
pub(crate) fn runtime() -> Result<tokio::runtime::Runtime, String> {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start the async runtime: {e}"))
}

/// Writes a line to standard output, as `println!` does, except that a
/// reader that went away (`prism status | head`) ends the output quietly
/// instead of panicking.
pub(crate) fn say(line: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_fmt(format_args!("{line}\n")) {
        if e.kind() != std::io::ErrorKind::BrokenPipe {
            eprintln!("prism: cannot write to standard output: {e}");
        }
    }
}

/// `println!` through [`say`].
macro_rules! say {
    () => { $crate::common::say(format_args!("")) };
    ($($arg:tt)*) => { $crate::common::say(format_args!($($arg)*)) };
}
