//! init, shutdown and init again, in one process.

use prism::Error;

#[prism::remote]
fn double(x: i64) -> i64 {
    x * 2
}

#[prism::actor]
struct Lonely;

#[prism::actor]
impl Lonely {
    fn new() -> Self {
        Lonely
    }
    fn hello(&self) -> u32 {
        1
    }
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
            "config PRISM_NUM_CPUS: \"lots\" is not an unsigned integer"
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

#[test]
fn a_worker_that_cannot_start_fails_the_request_that_waits_for_it() {
    const NAME: &str = "a_worker_that_cannot_start_fails_the_request_that_waits_for_it";
    if std::env::var_os("PRISM_START_FAILURE_CHILD").is_some() {
        prism::init(prism::Config::default().num_cpus(2)).unwrap();
        // This driver is a copy of the test binary: delete it, so that no
        // new worker process can be started from it.
        std::fs::remove_file(std::env::current_exe().unwrap()).unwrap();
        // The two prestarted workers may serve two actors; the others need
        // new processes, which cannot start.
        let actors: Vec<_> = (0..4).map(|_| Lonely::remote().unwrap()).collect();
        let mut failed = 0;
        for actor in &actors {
            match prism::get(&actor.hello().unwrap()) {
                Ok(one) => assert_eq!(one, 1),
                Err(err) => {
                    let text = err.to_string();
                    assert!(
                        text.contains("could not start a worker process")
                            && text.contains("3 attempts")
                            && text.contains("driver-copy"),
                        "{text}"
                    );
                    failed += 1;
                }
            }
        }
        assert!(failed >= 2, "only {failed} of 4 actors failed to start");
        prism::shutdown();
        return;
    }
    let dir = std::env::temp_dir().join(format!("prism-start-failure-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let copy = dir.join("driver-copy");
    std::fs::copy(std::env::current_exe().unwrap(), &copy).unwrap();
    // Bounded: before the fix the actor call waited forever.
    let outcome = std::panic::catch_unwind(|| {
        prism_tests::must_run_child(
            "a driver whose workers cannot start (its requests must fail, not wait)",
            std::process::Command::new(&copy)
                .args(["--exact", NAME, "--nocapture"])
                .env("PRISM_START_FAILURE_CHILD", "1"),
            std::time::Duration::from_secs(60),
        )
    });
    let _ = std::fs::remove_dir_all(&dir);
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}
