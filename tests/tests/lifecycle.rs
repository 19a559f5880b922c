//! init, shutdown and init again, in one process.

use prism::Error;

#[prism::remote]
fn double(x: i64) -> i64 {
    x * 2
}

#[test]
fn init_twice_fails_and_shutdown_then_init_works() {
    assert!(!prism::is_initialized());
    let err = prism::put(1i64).unwrap_err();
    assert!(matches!(err, Error::NotInitialized), "{err}");

    prism::init(prism::Config::default().num_cpus(1)).unwrap();
    assert!(prism::is_initialized());
    let err = prism::init(prism::Config::default()).unwrap_err();
    assert!(matches!(err, Error::AlreadyInitialized), "{err}");
    prism::init(prism::Config::default().ignore_reinit_error(true)).expect("ignored when asked");
    let first_session = prism::runtime_context().unwrap().session_dir;
    assert_eq!(prism::get(&double::remote(21).unwrap()).unwrap(), 42);
    let stale = double::remote(1).unwrap();
    prism::get(&stale).unwrap();

    prism::shutdown();
    assert!(!prism::is_initialized());
    prism::shutdown(); // harmless twice

    prism::init(prism::Config::default().num_cpus(1)).unwrap();
    assert_ne!(prism::runtime_context().unwrap().session_dir, first_session);
    assert_eq!(prism::get(&double::remote(5).unwrap()).unwrap(), 10);
    drop(stale); // a ref from the old cluster drops quietly
    prism::shutdown();
}

#[test]
fn a_bad_environment_value_stops_init_with_key_value_and_type() {
    // Runs in a child process so the variable cannot leak into other tests.
    if std::env::var_os("PRISM_LIFECYCLE_CHILD").is_some() {
        let err = prism::init(prism::Config::default()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "config PRISM_NUM_CPUS: cannot parse \"lots\" as an unsigned integer"
        );
        return;
    }
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "a_bad_environment_value_stops_init_with_key_value_and_type",
            "--nocapture",
        ])
        .env("PRISM_LIFECYCLE_CHILD", "1")
        .env("PRISM_NUM_CPUS", "lots")
        .status()
        .unwrap();
    assert!(status.success(), "the child test failed");
}
