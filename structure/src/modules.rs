//! A crate's module tree, read from its source files: which file holds
//! each module, what each module defines, what it brings into scope with
//! `use`, and every path it names that starts inside the crate.
//!
//! Code under `#[cfg(test)]` is left out: a unit test may reach anywhere.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use proc_macro2::{TokenStream, TokenTree};
use quote::ToTokens;

use crate::error::StructureError;

/// One module: a file, or an inline `mod name { ... }` inside one.
#[derive(Debug, Default)]
pub struct Module {
    /// The module's path from the crate root (`["runtime", "objects"]`).
    pub path: Vec<String>,
    /// Index of the file that holds it, in [`Crate::files`].
    pub file: usize,
    /// The enclosing module; `None` for the crate root.
    pub parent: Option<usize>,
    /// Child modules by name.
    pub children: BTreeMap<String, usize>,
    /// Names of the items it defines (functions, types, traits, macros ...).
    pub defs: BTreeSet<String>,
    /// Names brought in by `use`: the name in scope and the path it names.
    pub bindings: BTreeMap<String, Vec<String>>,
    /// `use path::*` paths.
    pub globs: Vec<Vec<String>>,
    /// Every path this module names that may start inside the crate, as
    /// written (`crate::a::B`, `super::c`, `child::d`).
    pub references: Vec<Vec<String>>,
}

/// A crate's source files and modules.
#[derive(Debug)]
pub struct Crate {
    /// The crate's name, as its manifest gives it.
    pub name: String,
    /// The folder its root file stands in (`core/src`).
    pub src_dir: PathBuf,
    /// Files, relative to `src_dir`.
    pub files: Vec<PathBuf>,
    /// Modules; index 0 is the crate root.
    pub modules: Vec<Module>,
}

impl Crate {
    /// Reads the crate whose root file is `root_file` (`core/src/lib.rs`).
    pub fn read(name: &str, root_file: &Path) -> Result<Crate, StructureError> {
        let src_dir = root_file
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_else(|| PathBuf::from("."));
        let mut krate = Crate {
            name: name.to_string(),
            src_dir,
            files: Vec::new(),
            modules: Vec::new(),
        };
        krate.read_file_module(root_file, Vec::new(), None, true)?;
        Ok(krate)
    }

    /// The file of module `m`, relative to the crate's source folder.
    pub fn file_of(&self, m: usize) -> &Path {
        &self.files[self.modules[m].file]
    }

    fn read_file_module(
        &mut self,
        file: &Path,
        path: Vec<String>,
        parent: Option<usize>,
        owns_dir: bool,
    ) -> Result<usize, StructureError> {
        let text = std::fs::read_to_string(file).map_err(|source| StructureError::Read {
            path: file.to_path_buf(),
            source,
        })?;
        let parsed = syn::parse_file(&text).map_err(|e| StructureError::Parse {
            path: file.to_path_buf(),
            message: e.to_string(),
        })?;
        let relative = file
            .strip_prefix(&self.src_dir)
            .unwrap_or(file)
            .to_path_buf();
        self.files.push(relative);
        let file_index = self.files.len() - 1;
        // Children of `a.rs` live in `a/`; of `lib.rs`, `main.rs`, `mod.rs`
        // beside them.
        let child_dir = if owns_dir {
            file.parent().map(Path::to_path_buf).unwrap_or_default()
        } else {
            file.with_extension("")
        };
        self.read_items(&parsed.items, path, parent, file_index, &child_dir)
    }

    fn read_items(
        &mut self,
        items: &[syn::Item],
        path: Vec<String>,
        parent: Option<usize>,
        file_index: usize,
        child_dir: &Path,
    ) -> Result<usize, StructureError> {
        let me = self.modules.len();
        self.modules.push(Module {
            path: path.clone(),
            file: file_index,
            parent,
            ..Module::default()
        });
        for item in items {
            if is_test_only(item_attrs(item)) {
                continue;
            }
            match item {
                syn::Item::Mod(m) => {
                    let name = m.ident.to_string();
                    self.modules[me].defs.insert(name.clone());
                    let mut child_path = path.clone();
                    child_path.push(name.clone());
                    let child = match &m.content {
                        Some((_, inner)) => {
                            let dir = child_dir.join(&name);
                            self.read_items(inner, child_path, Some(me), file_index, &dir)?
                        }
                        None => {
                            let (file, owns_dir) = match path_attr(&m.attrs) {
                                Some(p) => (child_dir.join(p), false),
                                None => {
                                    let flat = child_dir.join(format!("{name}.rs"));
                                    if flat.exists() {
                                        (flat, false)
                                    } else {
                                        (child_dir.join(&name).join("mod.rs"), true)
                                    }
                                }
                            };
                            self.read_file_module(&file, child_path, Some(me), owns_dir)?
                        }
                    };
                    self.modules[me].children.insert(name, child);
                }
                syn::Item::Use(u) => {
                    let mut found = Vec::new();
                    expand_use(&u.tree, Vec::new(), &mut found);
                    self.record_uses(me, found, true);
                }
                other => {
                    if let Some(name) = defined_name(other) {
                        self.modules[me].defs.insert(name);
                    }
                    let mut refs = Vec::new();
                    let mut local_uses = Vec::new();
                    scan_tokens(other.to_token_stream(), &mut refs, &mut local_uses);
                    self.modules[me].references.extend(refs);
                    self.record_uses(me, local_uses, false);
                }
            }
        }
        Ok(me)
    }

    fn record_uses(&mut self, m: usize, found: Vec<UseLeaf>, binds: bool) {
        for leaf in found {
            match leaf {
                UseLeaf::Name { name, path } => {
                    self.modules[m].references.push(path.clone());
                    if binds && name != "_" {
                        self.modules[m].bindings.insert(name, path);
                    }
                }
                UseLeaf::Glob(path) => {
                    self.modules[m].references.push(path.clone());
                    if binds {
                        self.modules[m].globs.push(path);
                    }
                }
            }
        }
    }
}

enum UseLeaf {
    Name { name: String, path: Vec<String> },
    Glob(Vec<String>),
}

fn expand_use(tree: &syn::UseTree, prefix: Vec<String>, out: &mut Vec<UseLeaf>) {
    match tree {
        syn::UseTree::Path(p) => {
            let mut next = prefix;
            next.push(p.ident.to_string());
            expand_use(&p.tree, next, out);
        }
        syn::UseTree::Name(n) => {
            let ident = n.ident.to_string();
            if ident == "self" {
                if let Some(last) = prefix.last().cloned() {
                    out.push(UseLeaf::Name {
                        name: last,
                        path: prefix,
                    });
                }
            } else {
                let mut path = prefix;
                path.push(ident.clone());
                out.push(UseLeaf::Name { name: ident, path });
            }
        }
        syn::UseTree::Rename(r) => {
            let ident = r.ident.to_string();
            let path = if ident == "self" {
                prefix
            } else {
                let mut p = prefix;
                p.push(ident);
                p
            };
            out.push(UseLeaf::Name {
                name: r.rename.to_string(),
                path,
            });
        }
        syn::UseTree::Glob(_) => out.push(UseLeaf::Glob(prefix)),
        syn::UseTree::Group(g) => {
            for t in &g.items {
                expand_use(t, prefix.clone(), out);
            }
        }
    }
}

/// Macros whose input is code for another program (a proc macro's output).
const QUOTING_MACROS: [&str; 3] = ["quote", "quote_spanned", "parse_quote"];

/// Finds paths that start with `crate`, `super`, `self` or any other name
/// followed by `::` (the resolver drops the ones that lead outside the
/// crate), and `use` statements inside bodies.
fn scan_tokens(stream: TokenStream, refs: &mut Vec<Vec<String>>, uses: &mut Vec<UseLeaf>) {
    let tokens: Vec<TokenTree> = stream.into_iter().collect();
    let mut i = 0;
    while i < tokens.len() {
        match &tokens[i] {
            TokenTree::Group(g) => {
                scan_tokens(g.stream(), refs, uses);
                i += 1;
            }
            // Code a macro writes (`quote!`) is the generated program's,
            // not this crate's: its paths are not imports.
            TokenTree::Ident(id)
                if QUOTING_MACROS.iter().any(|m| id == m)
                    && matches!(tokens.get(i + 1), Some(TokenTree::Punct(p)) if p.as_char() == '!')
                    && matches!(tokens.get(i + 2), Some(TokenTree::Group(_))) =>
            {
                i += 3;
            }
            TokenTree::Ident(id) if id == "use" => {
                let mut end = i + 1;
                while end < tokens.len()
                    && !matches!(&tokens[end], TokenTree::Punct(p) if p.as_char() == ';')
                {
                    end += 1;
                }
                let body: TokenStream = tokens[i + 1..end].iter().cloned().collect();
                if let Ok(tree) = syn::parse2::<syn::UseTree>(body) {
                    expand_use(&tree, Vec::new(), uses);
                }
                i = end + 1;
            }
            TokenTree::Ident(id) => {
                let preceded_by_colons =
                    i >= 2 && is_colon(&tokens[i - 1]) && is_colon(&tokens[i - 2]);
                if preceded_by_colons || !followed_by_colons(&tokens, i) {
                    i += 1;
                    continue;
                }
                let mut path = vec![id.to_string()];
                let mut j = i + 1;
                while followed_by_colons(&tokens, j - 1) {
                    match tokens.get(j + 2) {
                        Some(TokenTree::Ident(next)) => {
                            path.push(next.to_string());
                            j += 3;
                        }
                        _ => break,
                    }
                }
                refs.push(path);
                i = j;
            }
            _ => i += 1,
        }
    }
}

fn is_colon(t: &TokenTree) -> bool {
    matches!(t, TokenTree::Punct(p) if p.as_char() == ':')
}

fn followed_by_colons(tokens: &[TokenTree], i: usize) -> bool {
    matches!(tokens.get(i + 1), Some(t) if is_colon(t))
        && matches!(tokens.get(i + 2), Some(t) if is_colon(t))
}

fn item_attrs(item: &syn::Item) -> &[syn::Attribute] {
    match item {
        syn::Item::Const(i) => &i.attrs,
        syn::Item::Enum(i) => &i.attrs,
        syn::Item::ExternCrate(i) => &i.attrs,
        syn::Item::Fn(i) => &i.attrs,
        syn::Item::ForeignMod(i) => &i.attrs,
        syn::Item::Impl(i) => &i.attrs,
        syn::Item::Macro(i) => &i.attrs,
        syn::Item::Mod(i) => &i.attrs,
        syn::Item::Static(i) => &i.attrs,
        syn::Item::Struct(i) => &i.attrs,
        syn::Item::Trait(i) => &i.attrs,
        syn::Item::TraitAlias(i) => &i.attrs,
        syn::Item::Type(i) => &i.attrs,
        syn::Item::Union(i) => &i.attrs,
        syn::Item::Use(i) => &i.attrs,
        _ => &[],
    }
}

fn defined_name(item: &syn::Item) -> Option<String> {
    let ident = match item {
        syn::Item::Const(i) => &i.ident,
        syn::Item::Enum(i) => &i.ident,
        syn::Item::Fn(i) => &i.sig.ident,
        syn::Item::Macro(i) => i.ident.as_ref()?,
        syn::Item::Static(i) => &i.ident,
        syn::Item::Struct(i) => &i.ident,
        syn::Item::Trait(i) => &i.ident,
        syn::Item::TraitAlias(i) => &i.ident,
        syn::Item::Type(i) => &i.ident,
        syn::Item::Union(i) => &i.ident,
        _ => return None,
    };
    Some(ident.to_string())
}

/// `#[cfg(test)]` (not `#[cfg(not(test))]`, not `#[cfg(any(test, ...))]`).
fn is_test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        a.path().is_ident("cfg")
            && matches!(&a.meta, syn::Meta::List(l) if l.tokens.to_string().trim() == "test")
    })
}

fn path_attr(attrs: &[syn::Attribute]) -> Option<String> {
    attrs.iter().find_map(|a| match &a.meta {
        syn::Meta::NameValue(nv) if nv.path.is_ident("path") => match &nv.value {
            syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Str(s),
                ..
            }) => Some(s.value()),
            _ => None,
        },
        _ => None,
    })
}
