//! `#[prism::main]` reports an error that `main` returns as `error: ` and
//! the error's `Display` on stderr, and exits with code 1 (rather than
//! Rust's `Error: ` and its `Debug`, `HeadUnreachable { message: ".." }`).
//!
//! Each test runs a program's `main` in a child process (this test binary
//! again, with `PRISM_MAIN_ERROR_CHILD` set), which runs it as Rust's
//! runtime would, and reads the child's stderr and exit code.

use std::io::Read;
use std::process::{Command, ExitCode, Stdio, Termination};
use std::time::{Duration, Instant};

/// A program whose `main` fails with one of prism's errors.
mod cluster_error {
    /// The message of its error.
    pub const MESSAGE: &str = "no head answered at \"10.0.0.1:6380\"; is it running?";

    #[prism::main]
    pub fn main() -> prism::Result<()> {
        Err(prism::Error::HeadUnreachable {
            message: MESSAGE.to_string(),
        })
    }
}

/// A program whose error type has `Debug` only, which Rust accepts from a
/// `main`: so does `#[prism::main]`.
mod debug_only_error {
    #[derive(Debug)]
    pub struct Refused {
        #[allow(dead_code)] // read by its Debug only
        pub code: u8,
    }

    #[prism::main]
    pub fn main() -> Result<(), Refused> {
        Err(Refused { code: 7 })
    }
}

/// A program whose `main` succeeds.
mod success {
    #[prism::main]
    pub fn main() -> prism::Result<()> {
        Ok(())
    }
}

/// Set in the child: the program's `main` runs there.
const CHILD: &str = "PRISM_MAIN_ERROR_CHILD";

/// In the child: runs `main` as Rust's runtime runs a program's (what it
/// returns is reported, an `Err` as `Error: {:?}`, and ends the process
/// with the code that gives).
fn run_as_program<T: Termination>(main: fn() -> T) -> ! {
    let code = main().report();
    std::process::exit(if code == ExitCode::SUCCESS { 0 } else { 1 })
}

/// Runs test `name` again in a child process: its exit code and stderr.
fn child(name: &str) -> (Option<i32>, String) {
    let exe = std::env::current_exe().expect("the test binary must be known");
    let mut child = Command::new(exe)
        .args(["--exact", name, "--nocapture"])
        .env(CHILD, "1")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("the child must start");
    let mut stderr = child.stderr.take().expect("the child's stderr");
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        let _ = stderr.read_to_string(&mut text);
        text
    });
    let limit = Duration::from_secs(60);
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("the child must be waited on") {
            break status;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the child {name} must finish within {limit:?}; it was killed");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let text = reader.join().expect("the child's stderr must be read");
    (status.code(), text)
}

#[test]
fn an_error_from_main_is_printed_with_its_display_and_exits_with_1() {
    const NAME: &str = "an_error_from_main_is_printed_with_its_display_and_exits_with_1";
    if std::env::var_os(CHILD).is_some() {
        run_as_program(cluster_error::main);
    }
    let (code, stderr) = child(NAME);
    let display = prism::Error::HeadUnreachable {
        message: cluster_error::MESSAGE.to_string(),
    }
    .to_string();
    let line = format!("error: {display}");
    assert!(
        stderr.lines().any(|l| l == line),
        "stderr must have the line {line:?}; it was:\n{stderr}"
    );
    assert!(
        !stderr.contains("HeadUnreachable {") && !stderr.contains("message:") && !stderr.contains("Error:"),
        "stderr must not have the error's Debug (Rust's report of a main's error); it was:\n{stderr}"
    );
    assert_eq!(
        code,
        Some(1),
        "a main that returns an error must exit with code 1; stderr:\n{stderr}"
    );
}

#[test]
fn an_error_without_display_is_printed_with_its_debug_and_exits_with_1() {
    const NAME: &str = "an_error_without_display_is_printed_with_its_debug_and_exits_with_1";
    if std::env::var_os(CHILD).is_some() {
        run_as_program(debug_only_error::main);
    }
    let (code, stderr) = child(NAME);
    assert!(
        stderr.lines().any(|l| l == "error: Refused { code: 7 }"),
        "stderr must have the line \"error: Refused {{ code: 7 }}\"; it was:\n{stderr}"
    );
    assert_eq!(code, Some(1), "stderr:\n{stderr}");
}

#[test]
fn a_main_that_succeeds_exits_with_0_and_prints_no_error() {
    const NAME: &str = "a_main_that_succeeds_exits_with_0_and_prints_no_error";
    if std::env::var_os(CHILD).is_some() {
        run_as_program(success::main);
    }
    let (code, stderr) = child(NAME);
    assert!(!stderr.contains("rror"), "stderr:\n{stderr}");
    assert_eq!(code, Some(0), "stderr:\n{stderr}");
}
