//! From paths to files: which file of the crate each named path lands in,
//! the import arrows between files, and the loops among them.

use std::collections::{BTreeMap, BTreeSet};

use crate::modules::Crate;

/// An arrow: file `from` names items of file `to`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Import {
    /// The importing file, relative to the crate's source folder.
    pub from: String,
    /// The imported file.
    pub to: String,
    /// The paths as written in `from`, joined with `::`.
    pub names: BTreeSet<String>,
}

/// How deep re-exports are followed before a path is given up on.
const MAX_HOPS: u32 = 16;

/// Every arrow between two different files of the crate.
pub fn imports(krate: &Crate) -> Vec<Import> {
    let mut arrows: BTreeMap<(usize, usize), BTreeSet<String>> = BTreeMap::new();
    for (m, module) in krate.modules.iter().enumerate() {
        for path in &module.references {
            let Some(target) = resolve(krate, m, path, 0) else {
                continue;
            };
            let (from, to) = (module.file, krate.modules[target].file);
            if from != to {
                arrows
                    .entry((from, to))
                    .or_default()
                    .insert(path.join("::"));
            }
        }
    }
    arrows
        .into_iter()
        .map(|((from, to), names)| Import {
            from: krate.files[from].display().to_string(),
            to: krate.files[to].display().to_string(),
            names,
        })
        .collect()
}

/// The module that holds the item `path` names, seen from module `from`;
/// `None` for a path that leads outside the crate.
fn resolve(krate: &Crate, from: usize, path: &[String], hops: u32) -> Option<usize> {
    if hops > MAX_HOPS || path.is_empty() {
        return None;
    }
    let (start, rest) = match path[0].as_str() {
        "crate" => (0, &path[1..]),
        "self" => (from, &path[1..]),
        "super" => {
            let mut m = from;
            let mut i = 0;
            while path.get(i).map(String::as_str) == Some("super") {
                m = krate.modules[m].parent?;
                i += 1;
            }
            (m, &path[i..])
        }
        first => {
            let module = &krate.modules[from];
            if module.children.contains_key(first) {
                (from, path)
            } else if let Some(bound) = module.bindings.get(first) {
                if bound.len() == 1 && bound[0] == first {
                    return None; // `use some_crate;`
                }
                let mut next = bound.clone();
                next.extend_from_slice(&path[1..]);
                return resolve(krate, from, &next, hops + 1);
            } else if module.defs.contains(first) {
                return Some(from);
            } else {
                return None;
            }
        }
    };
    walk(krate, start, rest, hops)
}

fn walk(krate: &Crate, mut module: usize, rest: &[String], hops: u32) -> Option<usize> {
    for (i, segment) in rest.iter().enumerate() {
        let m = &krate.modules[module];
        if let Some(&child) = m.children.get(segment) {
            module = child;
            continue;
        }
        if m.defs.contains(segment) {
            return Some(module);
        }
        if let Some(bound) = m.bindings.get(segment) {
            let mut next = bound.clone();
            next.extend_from_slice(&rest[i + 1..]);
            return resolve(krate, module, &next, hops + 1);
        }
        for glob in &m.globs {
            let Some(target) = resolve_module(krate, module, glob, hops + 1) else {
                continue;
            };
            let t = &krate.modules[target];
            if t.defs.contains(segment)
                || t.bindings.contains_key(segment)
                || t.children.contains_key(segment)
            {
                return walk(krate, target, &rest[i..], hops + 1);
            }
        }
        // A name the reader does not see defined (made by a macro, an enum
        // variant, a method): it belongs to the module reached so far.
        return Some(module);
    }
    Some(module)
}

/// The module a glob's path names.
fn resolve_module(krate: &Crate, from: usize, path: &[String], hops: u32) -> Option<usize> {
    let target = resolve(krate, from, path, hops)?;
    let last = path.last()?;
    krate.modules[target]
        .children
        .get(last)
        .copied()
        .or(Some(target))
}

/// The groups of two or more files that import each other in a loop
/// (strongly connected components), each sorted, in a stable order.
pub fn loops(imports: &[Import]) -> Vec<Vec<String>> {
    let mut names: BTreeSet<&str> = BTreeSet::new();
    for i in imports {
        names.insert(&i.from);
        names.insert(&i.to);
    }
    let index: BTreeMap<&str, usize> = names.iter().enumerate().map(|(i, n)| (*n, i)).collect();
    let nodes: Vec<&str> = names.into_iter().collect();
    let mut next: Vec<Vec<usize>> = vec![Vec::new(); nodes.len()];
    for i in imports {
        next[index[i.from.as_str()]].push(index[i.to.as_str()]);
    }
    let components = strongly_connected(&next);
    let mut out: Vec<Vec<String>> = components
        .into_iter()
        .filter(|c| c.len() > 1)
        .map(|c| {
            let mut files: Vec<String> = c.into_iter().map(|i| nodes[i].to_string()).collect();
            files.sort();
            files
        })
        .collect();
    out.sort();
    out
}

/// Tarjan's algorithm, iterative so that a deep graph cannot overflow.
fn strongly_connected(next: &[Vec<usize>]) -> Vec<Vec<usize>> {
    const UNSEEN: usize = usize::MAX;
    let n = next.len();
    let mut order = vec![UNSEEN; n];
    let mut low = vec![0; n];
    let mut on_stack = vec![false; n];
    let mut stack = Vec::new();
    let mut counter = 0;
    let mut out = Vec::new();
    for root in 0..n {
        if order[root] != UNSEEN {
            continue;
        }
        let mut work: Vec<(usize, usize)> = vec![(root, 0)];
        order[root] = counter;
        low[root] = counter;
        counter += 1;
        stack.push(root);
        on_stack[root] = true;
        while let Some(&mut (v, ref mut edge)) = work.last_mut() {
            if let Some(&w) = next[v].get(*edge) {
                *edge += 1;
                if order[w] == UNSEEN {
                    order[w] = counter;
                    low[w] = counter;
                    counter += 1;
                    stack.push(w);
                    on_stack[w] = true;
                    work.push((w, 0));
                } else if on_stack[w] {
                    low[v] = low[v].min(order[w]);
                }
                continue;
            }
            work.pop();
            if let Some(&(parent, _)) = work.last() {
                low[parent] = low[parent].min(low[v]);
            }
            if low[v] == order[v] {
                let mut component = Vec::new();
                while let Some(w) = stack.pop() {
                    on_stack[w] = false;
                    component.push(w);
                    if w == v {
                        break;
                    }
                }
                out.push(component);
            }
        }
    }
    out
}
