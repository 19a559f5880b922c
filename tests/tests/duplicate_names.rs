//! A binary where two remote functions share a `name = ...` is refused at
//! `init`, naming the clash, instead of running whichever one a call's
//! lookup happened to keep.

#[prism::remote(name = "shared.name")]
fn first() -> u32 {
    1
}

mod elsewhere {
    #[prism::remote(name = "shared.name")]
    pub fn second() -> u32 {
        2
    }
}

#[test]
fn init_refuses_two_remote_functions_with_one_name() {
    let err = prism::init(prism::Config::default().num_cpus(1)).unwrap_err();
    let said = err.to_string();
    assert!(
        matches!(err, prism::Error::InvalidArgument { .. }) && said.contains("shared.name"),
        "{said}"
    );
    assert!(!prism::is_initialized(), "nothing was started");
    // Both are still plain functions here.
    assert_eq!(first() + elsewhere::second(), 3);
}
