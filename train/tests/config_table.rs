//! docs/config.md is the table of every tunable of every crate, rendered
//! from the crates' own declarations; this test keeps the two the same.
//! After changing a table, regenerate the file with
//! `PRISM_WRITE_CONFIG_DOC=1 cargo test -p prism-train --test config_table`.

use prism_config::Entry;

fn section(out: &mut String, title: &str, entries: &[Entry]) {
    out.push_str(&format!(
        "\n## {title}\n\n| variable | type | default | what, and why that default |\n|---|---|---|---|\n"
    ));
    for e in entries {
        let doc = e.doc.split_whitespace().collect::<Vec<_>>().join(" ");
        out.push_str(&format!(
            "| `{}` | `{}` | `{}` | {} |\n",
            e.key(),
            e.ty.replace(' ', ""),
            e.default,
            doc.replace('|', "\\|")
        ));
    }
}

fn render() -> String {
    let mut out = String::from(
        "# Configuration: every tunable\n\n\
         Every tunable of every Prism crate, with its unit in its name, its type, its \
         default and why. Each is read from the environment variable named here; a value \
         that does not parse, or breaks its entry's rule, fails with `config <VARIABLE>: \
         \"<value>\" is not <what is expected>`, in every crate alike. The runtime's \
         entries can also be set in code, on `prism::Config` (its fields and builder \
         methods); a variable set in the environment \
         overrides them when `prism::init` runs. A `CollectiveConfig` given to a group in \
         code is used as given; `CollectiveConfig::from_env` reads the variables.\n\n\
         This file is generated from the crates' declarations (`prism_config::table!` in \
         `core/src/config.rs`, `protocol/src/guard.rs`, `collective/src/config.rs` and \
         `train/src/trainer/config.rs`) \
         by `PRISM_WRITE_CONFIG_DOC=1 cargo test -p prism-train --test config_table`, and a \
         test fails when it is out of date.\n",
    );
    section(
        &mut out,
        "Runtime (`prism::Config`, read by `prism::init`)",
        prism::Config::ENTRIES,
    );
    section(
        &mut out,
        "Listeners (`prism_protocol::guard::ConnectionLimits`, read when a node, the head's \
         control store or its dashboard starts listening)",
        prism_protocol::guard::ConnectionLimits::ENTRIES,
    );
    section(
        &mut out,
        "Jobs (`prism_jobs::JobConfig`, read when the head's control store starts)",
        prism_jobs::JobConfig::ENTRIES,
    );
    section(
        &mut out,
        "Collectives (`prism_collective::CollectiveConfig`, read when a group forms)",
        prism_collective::CollectiveConfig::ENTRIES,
    );
    section(
        &mut out,
        "Trainer (`prism_train::TrainerTunables`, read by every `fit`)",
        prism_train::TrainerTunables::ENTRIES,
    );
    out
}

#[test]
fn docs_config_md_lists_every_tunable_of_every_crate() {
    // The checkout this runs in (cargo sets it at run time), not the one a
    // cached build was made from.
    let manifest = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    let path = manifest.join("../docs/config.md");
    let want = render();
    if std::env::var_os("PRISM_WRITE_CONFIG_DOC").is_some() {
        std::fs::write(&path, &want).expect("docs/config.md is writable");
        return;
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        have == want,
        "docs/config.md is out of date with the crates' config tables; regenerate it with \
         PRISM_WRITE_CONFIG_DOC=1 cargo test -p prism-train --test config_table"
    );
}

#[test]
fn no_two_tunables_share_a_variable() {
    let mut keys: Vec<String> = prism::Config::ENTRIES
        .iter()
        .chain(prism_collective::CollectiveConfig::ENTRIES)
        .chain(prism_protocol::guard::ConnectionLimits::ENTRIES)
        .chain(prism_train::TrainerTunables::ENTRIES)
        .map(Entry::key)
        .collect();
    let n = keys.len();
    keys.sort();
    keys.dedup();
    assert_eq!(keys.len(), n, "a variable names two tunables");
}
