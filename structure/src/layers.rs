//! The layers each crate declares in `docs/architecture.md`, in fenced
//! blocks marked `layers`:
//!
//! ````text
//! ```layers
//! prism core/src
//!   api        lib.rs api.rs
//!   runtime    runtime/*
//!   leaves     codec.rs config.rs
//! ```
//! ````
//!
//! A line at the left margin names a crate and its source folder; each
//! indented line under it is one layer, highest first: its name, then the
//! files in it (relative to the source folder; `dir/*` is every file under
//! `dir`). A file may import from its own layer and the ones below it.

use crate::error::StructureError;

/// One crate's layers, highest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layers {
    /// The crate's package name.
    pub crate_name: String,
    /// Its source folder, relative to the workspace root.
    pub src_dir: String,
    /// `(layer name, file patterns)`, highest first.
    pub layers: Vec<(String, Vec<String>)>,
}

impl Layers {
    /// The index (0 = highest) and name of the layer `file` is placed in.
    pub fn layer_of(&self, file: &str) -> Option<(usize, &str)> {
        self.layers
            .iter()
            .enumerate()
            .find_map(|(i, (name, patterns))| {
                patterns
                    .iter()
                    .any(|p| matches(p, file))
                    .then_some((i, name.as_str()))
            })
    }
}

fn matches(pattern: &str, file: &str) -> bool {
    match pattern.strip_suffix("/*") {
        Some(dir) => file.starts_with(dir) && file[dir.len()..].starts_with('/'),
        None => pattern == file,
    }
}

/// Every `layers` block of a markdown text (`source` names it in errors).
pub fn parse(markdown: &str, source: &str) -> Result<Vec<Layers>, StructureError> {
    let mut out: Vec<Layers> = Vec::new();
    let mut inside = false;
    for (n, line) in markdown.lines().enumerate() {
        let trimmed = line.trim();
        if trimmed.starts_with("```") {
            inside = !inside && trimmed == "```layers";
            continue;
        }
        if !inside || trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let bad = |why: &str| StructureError::Layers {
            source_file: source.to_string(),
            line: n + 1,
            message: why.to_string(),
        };
        let mut words = trimmed.split_whitespace();
        let first = words.next().unwrap_or_default().to_string();
        if !line.starts_with(char::is_whitespace) {
            let src_dir = words
                .next()
                .ok_or_else(|| bad("a crate line needs the crate's name and its source folder"))?;
            out.push(Layers {
                crate_name: first,
                src_dir: src_dir.trim_end_matches('/').to_string(),
                layers: Vec::new(),
            });
        } else {
            let current = out
                .last_mut()
                .ok_or_else(|| bad("a layer line must follow a crate line (`name src/dir`)"))?;
            let files: Vec<String> = words.map(str::to_string).collect();
            if files.is_empty() {
                return Err(bad("a layer needs at least one file after its name"));
            }
            current.layers.push((first, files));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_gives_each_crate_its_layers_highest_first() {
        let md = "text\n```layers\nprism core/src\n  api lib.rs api.rs\n  runtime runtime/*\n```\n";
        let layers = parse(md, "a.md").expect("parses");
        assert_eq!(layers.len(), 1);
        assert_eq!(layers[0].layer_of("api.rs"), Some((0, "api")));
        assert_eq!(layers[0].layer_of("runtime/mod.rs"), Some((1, "runtime")));
        assert_eq!(layers[0].layer_of("runtimes.rs"), None);
    }

    #[test]
    fn a_layer_line_without_a_crate_is_refused_with_its_line() {
        let err = parse("```layers\n  api lib.rs\n```\n", "a.md").unwrap_err();
        assert!(err.to_string().contains("a.md:2"), "{err}");
    }
}
