//! `prism-structure [CRATE ...]`: checks the workspace's structure, or
//! prints the import arrows of the crates named (by package name).

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    // The checkout this runs in (cargo sets it at run time), not the one
    // a cached build was made from.
    let manifest = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    let root = manifest.join("..");
    let wanted: Vec<String> = std::env::args().skip(1).collect();
    if wanted.is_empty() {
        return match prism_structure::check_workspace(&root) {
            Ok(report) if report.violations.is_empty() => {
                println!("{report}");
                ExitCode::SUCCESS
            }
            Ok(report) => {
                eprintln!("{report}");
                ExitCode::FAILURE
            }
            Err(e) => {
                eprintln!("error: {e}");
                ExitCode::from(2)
            }
        };
    }
    let members = match prism_structure::members(&root) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    for name in &wanted {
        let Some(member) = members.iter().find(|m| &m.name == name) else {
            eprintln!("error: no crate named {name} in the workspace");
            return ExitCode::from(2);
        };
        match prism_structure::Crate::read(name, &root.join(&member.root_file)) {
            Ok(krate) => {
                for i in prism_structure::graph::imports(&krate) {
                    let names: Vec<&str> = i.names.iter().map(String::as_str).collect();
                    println!("{} -> {}  ({})", i.from, i.to, names.join(", "));
                }
                for l in prism_structure::graph::loops(&prism_structure::graph::imports(&krate)) {
                    println!("LOOP: {}", l.join(" "));
                }
            }
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::from(2);
            }
        }
    }
    ExitCode::SUCCESS
}
