//! Name resolution inside one crate's module tree, and the file-to-file import edges.
//!
//! A name resolves through `use` items (re-exports included) to the module that defines
//! it; the edge points at that module's file.

use super::items::UseKind;
use super::tree::ModuleTree;
use std::collections::{BTreeMap, BTreeSet};

/// Deeper alias chains than this are taken as unresolvable (`use a::a;` loops).
const MAX_DEPTH: usize = 32;

/// What a path resolves to.
#[derive(Debug, Clone, PartialEq)]
enum Target {
    Module(usize),
    /// An item named `.1` defined in module `.0`.
    Def(usize, String),
}

/// Import edges: (importing file, defining file) -> the imported names.
pub type Edges = BTreeMap<(String, String), BTreeSet<String>>;

/// Adds the edges of every module of `tree` to `edges`.
pub fn add_edges(tree: &ModuleTree, edges: &mut Edges) {
    for (id, module) in tree.modules.iter().enumerate() {
        let items = &module.items;
        let mut found = Vec::new();
        for item in &items.uses {
            match &item.kind {
                UseKind::Named(name) if item.public && !items.idents.contains(name) => {}
                UseKind::Named(_) | UseKind::Anonymous => {
                    found.extend(resolve(tree, id, &item.path, 0))
                }
                UseKind::Glob => found.extend(glob_targets(tree, id, &item.path, item.public)),
            }
        }
        for path in &items.paths {
            found.extend(resolve(tree, id, path, 0));
        }
        for target in found {
            if let Target::Def(def_module, name) = target {
                let to = &tree.modules[def_module].file;
                if *to != module.file {
                    edges
                        .entry((module.file.clone(), to.clone()))
                        .or_default()
                        .insert(name);
                }
            }
        }
    }
}

/// A glob import counts for the names this module's code uses from it; a glob of an
/// enum's variants counts as an import of the enum.
fn glob_targets(tree: &ModuleTree, id: usize, path: &[String], public: bool) -> Vec<Target> {
    let module = &tree.modules[id];
    let bound: BTreeSet<&String> = module
        .items
        .uses
        .iter()
        .filter_map(|u| match &u.kind {
            UseKind::Named(n) => Some(n),
            _ => None,
        })
        .collect();
    let mut out = Vec::new();
    for target in resolve(tree, id, path, 0) {
        match target {
            Target::Module(glob_module) if glob_module != id => {
                for ident in &module.items.idents {
                    let local =
                        module.items.defs.contains(ident) || module.children.contains_key(ident);
                    if !local && !bound.contains(ident) {
                        out.extend(lookup(tree, glob_module, ident, 0));
                    }
                }
            }
            Target::Def(..) if !public => out.push(target),
            _ => {}
        }
    }
    out
}

/// Resolves `path` as written in module `from`; an empty answer means "not in this crate".
fn resolve(tree: &ModuleTree, from: usize, path: &[String], depth: usize) -> Vec<Target> {
    let Some((first, rest)) = path.split_first() else {
        return Vec::new();
    };
    if depth > MAX_DEPTH {
        return Vec::new();
    }
    let mut current = match first.as_str() {
        "crate" => vec![Target::Module(0)],
        "self" => vec![Target::Module(from)],
        "super" => tree.modules[from]
            .parent
            .map(Target::Module)
            .into_iter()
            .collect(),
        "::" | "Self" => Vec::new(),
        name => lookup(tree, from, name, depth + 1),
    };
    for segment in rest {
        let mut next = Vec::new();
        for target in current {
            match target {
                Target::Module(m) => match segment.as_str() {
                    "super" => next.extend(tree.modules[m].parent.map(Target::Module)),
                    "self" => next.push(Target::Module(m)),
                    name => next.extend(lookup(tree, m, name, depth + 1)),
                },
                // `Enum::Variant`, `Type::assoc`: the dependency is on the type.
                def @ Target::Def(..) => next.push(def),
            }
        }
        current = next;
    }
    current.dedup();
    current
}

/// What `name` means inside module `m`: its own items and child modules, then its
/// `use` bindings, then (only if nothing else matched) its glob imports.
fn lookup(tree: &ModuleTree, m: usize, name: &str, depth: usize) -> Vec<Target> {
    if depth > MAX_DEPTH {
        return Vec::new();
    }
    let module = &tree.modules[m];
    let mut out = Vec::new();
    if module.items.defs.contains(name) {
        out.push(Target::Def(m, name.to_string()));
    }
    if let Some(&child) = module.children.get(name) {
        out.push(Target::Module(child));
    }
    for item in &module.items.uses {
        if item.kind == UseKind::Named(name.to_string()) {
            out.extend(resolve(tree, m, &item.path, depth + 1));
        }
    }
    if out.is_empty() {
        for item in module.items.uses.iter().filter(|u| u.kind == UseKind::Glob) {
            for target in resolve(tree, m, &item.path, depth + 1) {
                if let Target::Module(glob_module) = target
                    && glob_module != m
                {
                    out.extend(lookup(tree, glob_module, name, depth + 1));
                }
            }
        }
    }
    out
}
