//! The guard: every crate of the workspace is free of import loops and of
//! imports from a layer above (docs/architecture.md), and the checker
//! itself catches both in a crate made for the purpose.

use std::path::PathBuf;

#[test]
fn no_crate_of_the_workspace_has_an_import_loop_or_an_upward_import() {
    // The checkout this runs in (cargo sets it at run time), not the one
    // a cached build was made from.
    let manifest = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    let root = manifest.join("..");
    let report = prism_structure::check_workspace(&root).expect("the workspace reads");
    assert!(
        report.crates_read >= 14,
        "read only {} crates",
        report.crates_read
    );
    assert!(report.violations.is_empty(), "\n{report}");
}

/// A scratch workspace under the target folder's temp space, removed at drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str, files: &[(&str, &str)]) -> Scratch {
        let dir =
            std::env::temp_dir().join(format!("prism-structure-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for (path, text) in files {
            let p = dir.join(path);
            std::fs::create_dir_all(p.parent().expect("a parent")).expect("mkdir");
            std::fs::write(p, text).expect("write");
        }
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

const MANIFESTS: [(&str, &str); 2] = [
    ("Cargo.toml", "[workspace]\nmembers = [\"a\"]\n"),
    ("a/Cargo.toml", "[package]\nname = \"a\"\n"),
];

#[test]
fn a_loop_through_a_re_export_and_a_body_path_is_named_with_both_imports() {
    let s = Scratch::new(
        "loop",
        &[
            MANIFESTS[0],
            MANIFESTS[1],
            ("docs/architecture.md", "no layers\n"),
            (
                "a/src/lib.rs",
                "mod low;\nmod high;\npub use high::Up;\npub struct Root;\n",
            ),
            (
                "a/src/low.rs",
                "pub fn f() { let _ = crate::Up; }\n#[cfg(test)]\nmod tests { use crate::Root; }\n",
            ),
            ("a/src/high.rs", "use crate::low::f;\npub struct Up;\n"),
        ],
    );
    let report = prism_structure::check_workspace(&s.0).expect("reads");
    let text = report.to_string();
    assert_eq!(report.violations.len(), 1, "{text}");
    assert!(
        text.contains("a/src/low.rs -> a/src/high.rs  (crate::Up)"),
        "{text}"
    );
    assert!(
        text.contains("a/src/high.rs -> a/src/low.rs  (crate::low::f)"),
        "{text}"
    );
    assert!(
        !text.contains("lib.rs -> "),
        "lib.rs re-exports, it is not in the loop: {text}"
    );
}

#[test]
fn an_import_from_a_higher_layer_and_an_unplaced_file_are_refused() {
    let s = Scratch::new(
        "layers",
        &[
            MANIFESTS[0],
            MANIFESTS[1],
            (
                "docs/architecture.md",
                "```layers\na a/src\n  top lib.rs api.rs\n  bottom inner/*\n```\n",
            ),
            ("a/src/lib.rs", "pub mod api;\nmod inner;\nmod stray;\n"),
            ("a/src/api.rs", "pub fn call() {}\n"),
            ("a/src/inner/mod.rs", "mod deep;\n"),
            (
                "a/src/inner/deep.rs",
                "fn g() { super::super::api::call() }\n",
            ),
            ("a/src/stray.rs", "\n"),
        ],
    );
    let report = prism_structure::check_workspace(&s.0).expect("reads");
    let text = report.to_string();
    assert!(
        text.contains("a/src/inner/deep.rs (layer `bottom`) imports a/src/api.rs (layer `top`, above it): super::super::api::call"),
        "{text}"
    );
    assert!(text.contains("stray.rs is in no layer"), "{text}");
    assert_eq!(report.violations.len(), 2, "{text}");
}

#[test]
fn a_glob_import_is_followed_to_the_file_that_defines_the_name() {
    let s = Scratch::new(
        "glob",
        &[
            MANIFESTS[0],
            MANIFESTS[1],
            ("docs/architecture.md", "\n"),
            (
                "a/src/lib.rs",
                "mod types;\nmod user;\nmod prelude { pub use crate::types::*; }\n",
            ),
            ("a/src/types.rs", "pub struct T;\n"),
            ("a/src/user.rs", "use crate::prelude::T;\n"),
        ],
    );
    let root = s.0.join("a/src/lib.rs");
    let krate = prism_structure::Crate::read("a", &root).expect("reads");
    let arrows: Vec<(String, String)> = prism_structure::graph::imports(&krate)
        .into_iter()
        .map(|i| (i.from, i.to))
        .collect();
    assert!(
        arrows.contains(&("user.rs".into(), "types.rs".into())),
        "{arrows:?}"
    );
    assert!(!arrows.iter().any(|(_, to)| to == "lib.rs"), "{arrows:?}");
}

#[test]
fn paths_inside_quote_are_the_generated_programs_not_imports() {
    let s = Scratch::new(
        "quote",
        &[
            MANIFESTS[0],
            MANIFESTS[1],
            ("docs/architecture.md", "\n"),
            ("a/src/lib.rs", "mod gen;\npub fn root() {}\n"),
            (
                "a/src/gen.rs",
                "pub fn expand() { let _ = quote! { super::root(); crate::root() }; let _ = crate::gen::expand; }\n",
            ),
        ],
    );
    let krate = prism_structure::Crate::read("a", &s.0.join("a/src/lib.rs")).expect("reads");
    let arrows = prism_structure::graph::imports(&krate);
    assert!(arrows.is_empty(), "{arrows:?}");
}
