//! A small object store fills up with a clear error and recovers when
//! references are dropped.

use prism::Error;
use std::time::{Duration, Instant};

#[test]
fn a_full_store_says_what_was_asked_and_what_is_used() {
    prism::init(
        prism::Config::default()
            .num_cpus(1)
            .object_store_memory(8 << 20),
    )
    .unwrap();
    let first = prism::put(vec![1u8; 6 << 20]).unwrap();
    let err = prism::put(vec![2u8; 6 << 20]).unwrap_err();
    match &err {
        Error::ObjectStoreFull {
            requested,
            used,
            capacity,
            num_objects,
        } => {
            assert_eq!(*requested, (6 << 20) + 64);
            assert!(*used >= 6 << 20);
            assert_eq!(*capacity, 8 << 20);
            assert_eq!(*num_objects, 1);
        }
        other => panic!("expected ObjectStoreFull, got {other}"),
    }
    assert!(err.to_string().contains("asked for"), "{err}");
    drop(first);
    let start = Instant::now();
    loop {
        match prism::put(vec![3u8; 6 << 20]) {
            Ok(r) => {
                assert_eq!(prism::get(&r).unwrap().len(), 6 << 20);
                break;
            }
            Err(Error::ObjectStoreFull { .. }) if start.elapsed() < Duration::from_secs(10) => {
                std::thread::sleep(Duration::from_millis(20))
            }
            Err(e) => panic!("the store must have room again once the first object is freed: {e}"),
        }
    }
    prism::shutdown();
}
