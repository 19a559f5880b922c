//! The guard of Prism's module structure.
//!
//! Every crate of the workspace is read from its source: each file's
//! imports of the crate's other files (`use` declarations, and paths such
//! as `crate::runtime::current()` in bodies; code under `#[cfg(test)]`
//! left out). Two rules hold for every crate:
//!
//! 1. **No import loop.** No two files may import each other, directly or
//!    around a loop.
//! 2. **No import from a layer above.** Where `docs/architecture.md`
//!    declares a crate's layers (a fenced block marked `layers`, see
//!    [`layers`]), a file imports only from its own layer and the ones
//!    below, and every file of the crate is placed in a layer.
//!
//! `cargo test -p prism-structure` checks the workspace; a failure names
//! each import that breaks a rule and how to mend it.
//! `cargo run -p prism-structure -- <crate>` prints a crate's arrows.
//!
//! ```
//! let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
//! let report = prism_structure::check_workspace(&root).expect("the workspace reads");
//! assert!(report.crates_read > 0);
//! ```

#![warn(missing_docs)]

mod error;
pub mod graph;
pub mod layers;
pub mod modules;

use std::fmt;
use std::path::{Path, PathBuf};

pub use error::StructureError;
pub use graph::Import;
pub use layers::Layers;
pub use modules::Crate;

/// A broken rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Violation {
    /// Files that import each other around a loop.
    Loop {
        /// The crate.
        crate_name: String,
        /// Its source folder, relative to the workspace.
        src_dir: String,
        /// The arrows among the loop's files.
        imports: Vec<Import>,
    },
    /// An import from a layer above the importing file's.
    Upward {
        /// The crate.
        crate_name: String,
        /// Its source folder.
        src_dir: String,
        /// The arrow.
        import: Import,
        /// The importing file's layer.
        from_layer: String,
        /// The imported file's layer.
        to_layer: String,
    },
    /// A file of a crate with layers that no layer names.
    Unplaced {
        /// The crate.
        crate_name: String,
        /// The file.
        file: String,
    },
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Violation::Loop {
                crate_name,
                src_dir,
                imports,
            } => {
                writeln!(f, "import loop in crate {crate_name}; these imports close it:")?;
                for i in imports {
                    writeln!(
                        f,
                        "  {src_dir}/{} -> {src_dir}/{}  ({})",
                        i.from,
                        i.to,
                        names(i)
                    )?;
                }
                write!(
                    f,
                    "  to fix: pick the arrow that runs back up (usually from a lower-level file to the one that uses it) and remove it: \
                     move the item it needs down into a leaf module both can import, or hand it in \
                     from above (a parameter, a callback, a trait the upper file implements)"
                )
            }
            Violation::Upward {
                crate_name,
                src_dir,
                import,
                from_layer,
                to_layer,
            } => write!(
                f,
                "crate {crate_name}: {src_dir}/{} (layer `{from_layer}`) imports {src_dir}/{} (layer `{to_layer}`, above it): {}\n  \
                 to fix: move what it uses down into layer `{from_layer}` or below, or hand it in from above; \
                 if the layers in docs/architecture.md are wrong, change them there",
                import.from,
                import.to,
                names(import)
            ),
            Violation::Unplaced { crate_name, file } => write!(
                f,
                "crate {crate_name}: {file} is in no layer; add it to the crate's `layers` block in docs/architecture.md"
            ),
        }
    }
}

fn names(i: &Import) -> String {
    let mut shown: Vec<&str> = i.names.iter().map(String::as_str).take(4).collect();
    let more = i.names.len().saturating_sub(shown.len());
    let mut s = shown.join(", ");
    if more > 0 {
        shown.clear();
        s.push_str(&format!(" and {more} more"));
    }
    s
}

/// What a check found.
#[derive(Debug, Default)]
pub struct Report {
    /// How many crates were read.
    pub crates_read: usize,
    /// Every broken rule.
    pub violations: Vec<Violation>,
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.violations.is_empty() {
            return write!(
                f,
                "{} crates: no import loop, no import from a layer above",
                self.crates_read
            );
        }
        for v in &self.violations {
            writeln!(f, "{v}\n")?;
        }
        write!(f, "{} structure violation(s)", self.violations.len())
    }
}

/// A crate found in the workspace: its name and root file.
#[derive(Debug, Clone)]
pub struct Member {
    /// The package name.
    pub name: String,
    /// The root file (`lib.rs` or `main.rs`), relative to the workspace.
    pub root_file: PathBuf,
}

/// The library and binary roots of every workspace member.
pub fn members(root: &Path) -> Result<Vec<Member>, StructureError> {
    let manifest = read(&root.join("Cargo.toml"))?;
    let mut out = Vec::new();
    for dir in workspace_member_dirs(&manifest) {
        let member_manifest = read(&root.join(&dir).join("Cargo.toml"))?;
        let name = toml_value(&member_manifest, "package", "name").unwrap_or_else(|| dir.clone());
        let lib = toml_value(&member_manifest, "lib", "path")
            .map(|p| Path::new(&dir).join(p))
            .unwrap_or_else(|| Path::new(&dir).join("src/lib.rs"));
        if root.join(&lib).exists() {
            out.push(Member {
                name: name.clone(),
                root_file: lib,
            });
        }
        let main = Path::new(&dir).join("src/main.rs");
        if root.join(&main).exists() {
            out.push(Member {
                name: format!("{name} (binary)"),
                root_file: main,
            });
        }
    }
    Ok(out)
}

/// Checks every crate of the workspace at `root` against the layers of
/// `root/docs/architecture.md`.
pub fn check_workspace(root: &Path) -> Result<Report, StructureError> {
    let doc_path = root.join("docs/architecture.md");
    let doc = read(&doc_path)?;
    let declared = layers::parse(&doc, "docs/architecture.md")?;
    let members = members(root)?;
    for d in &declared {
        let known = members
            .iter()
            .any(|m| m.name == d.crate_name && m.root_file.parent() == Some(Path::new(&d.src_dir)));
        if !known {
            return Err(StructureError::UnknownCrate {
                source_file: "docs/architecture.md".into(),
                crate_name: d.crate_name.clone(),
                src_dir: d.src_dir.clone(),
            });
        }
    }
    let mut report = Report::default();
    for member in &members {
        let krate = Crate::read(&member.name, &root.join(&member.root_file))?;
        let src_dir = member
            .root_file
            .parent()
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        let layers = declared
            .iter()
            .find(|d| d.crate_name == member.name && d.src_dir == src_dir);
        report
            .violations
            .extend(check_crate(&krate, &src_dir, layers));
        report.crates_read += 1;
    }
    Ok(report)
}

/// The violations of one crate read already.
pub fn check_crate(krate: &Crate, src_dir: &str, layers: Option<&Layers>) -> Vec<Violation> {
    let imports = graph::imports(krate);
    let mut out = Vec::new();
    for files in graph::loops(&imports) {
        let inside: Vec<Import> = imports
            .iter()
            .filter(|i| files.contains(&i.from) && files.contains(&i.to))
            .cloned()
            .collect();
        out.push(Violation::Loop {
            crate_name: krate.name.clone(),
            src_dir: src_dir.to_string(),
            imports: inside,
        });
    }
    let Some(layers) = layers else {
        return out;
    };
    for file in &krate.files {
        let file = file.display().to_string();
        if layers.layer_of(&file).is_none() {
            out.push(Violation::Unplaced {
                crate_name: krate.name.clone(),
                file,
            });
        }
    }
    for import in imports {
        let (Some((from, from_layer)), Some((to, to_layer))) =
            (layers.layer_of(&import.from), layers.layer_of(&import.to))
        else {
            continue;
        };
        if to < from {
            out.push(Violation::Upward {
                crate_name: krate.name.clone(),
                src_dir: src_dir.to_string(),
                from_layer: from_layer.to_string(),
                to_layer: to_layer.to_string(),
                import,
            });
        }
    }
    out
}

fn read(path: &Path) -> Result<String, StructureError> {
    std::fs::read_to_string(path).map_err(|source| StructureError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// The `members = [...]` of a workspace manifest.
fn workspace_member_dirs(manifest: &str) -> Vec<String> {
    let Some(start) = manifest.find("members") else {
        return Vec::new();
    };
    let rest = &manifest[start..];
    let (Some(open), Some(close)) = (rest.find('['), rest.find(']')) else {
        return Vec::new();
    };
    rest[open + 1..close]
        .split(',')
        .map(|s| s.trim().trim_matches('"').to_string())
        .filter(|s| !s.is_empty())
        .collect()
}

/// `key = "value"` in `[section]` of a manifest.
fn toml_value(manifest: &str, section: &str, key: &str) -> Option<String> {
    let header = format!("[{section}]");
    let mut inside = false;
    for line in manifest.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            inside = line == header;
            continue;
        }
        if !inside {
            continue;
        }
        if let Some((k, v)) = line.split_once('=') {
            if k.trim() == key {
                return Some(v.trim().trim_matches('"').to_string());
            }
        }
    }
    None
}
