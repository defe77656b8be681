//! Token trees of one module to what the graph needs: the names it defines, its `use`
//! items, its child modules and the paths and names its code refers to.
//!
//! Items under `#[cfg(test)]` are left out: test code may import anything from its parent.

use super::lexer::{Delim, Tree};
use super::refs::{collect_refs, parse_use_tree};
use std::collections::BTreeSet;

/// One `use` binding: `path` bound under `name` (`None` for a glob or `as _`).
#[derive(Debug, Clone, PartialEq)]
pub struct UseItem {
    pub path: Vec<String>,
    pub kind: UseKind,
    /// `pub`, `pub(crate)`, ...: a re-export, which is not an import by itself.
    pub public: bool,
}

#[derive(Debug, Clone, PartialEq)]
pub enum UseKind {
    Named(String),
    Glob,
    Anonymous,
}

/// A child module: declared `mod x;` (its file is looked up) or inline `mod x { ... }`.
#[derive(Debug)]
pub enum ChildModule {
    File { name: String, has_path_attr: bool },
    Inline { name: String, items: ModuleItems },
}

/// What one module (a file, or an inline `mod` block) contains.
#[derive(Debug, Default)]
pub struct ModuleItems {
    /// Names of the items defined here: struct, enum, union, fn, trait, type, const,
    /// static, macro_rules.
    pub defs: BTreeSet<String>,
    pub uses: Vec<UseItem>,
    pub children: Vec<ChildModule>,
    /// Multi-segment paths written in code (`super::x::f`, `config::Foo`).
    pub paths: Vec<Vec<String>>,
    /// Single names used in code (not after `.`), to tell whether a re-export is used here.
    pub idents: BTreeSet<String>,
}

/// Parses the items of a module body (a whole file, or the inside of `mod x { ... }`).
pub fn parse_module(trees: &[Tree]) -> ModuleItems {
    let mut items = ModuleItems::default();
    let mut i = 0;
    while i < trees.len() {
        let mut test_only = false;
        let mut has_path_attr = false;
        // Attributes, inner (`#![...]`) and outer (`#[...]`).
        while trees.get(i).is_some_and(|t| t.is_punct("#")) {
            let inner = trees.get(i + 1).is_some_and(|t| t.is_punct("!"));
            let at = if inner { i + 2 } else { i + 1 };
            if let Some(Tree::Group(Delim::Bracket, attr)) = trees.get(at) {
                test_only |= !inner && is_cfg_test(attr);
                has_path_attr |= is_path_attribute(attr);
            }
            i = at + 1;
        }
        if i >= trees.len() {
            break;
        }
        let end = parse_item(trees, i, test_only, has_path_attr, &mut items);
        i = end.max(i + 1);
    }
    items
}

/// Parses the item starting at `start` into `items`; returns the index after it.
fn parse_item(
    trees: &[Tree],
    start: usize,
    test_only: bool,
    has_path_attr: bool,
    items: &mut ModuleItems,
) -> usize {
    let mut i = start;
    let mut public = false;
    if trees[i].is_ident("pub") {
        public = true;
        i += 1;
        if matches!(trees.get(i), Some(Tree::Group(Delim::Paren, _))) {
            i += 1;
        }
    }
    while let Some(Tree::Ident(word)) = trees.get(i) {
        let modifier = match word.as_str() {
            "unsafe" | "async" | "default" | "auto" | "safe" => true,
            "const" => trees.get(i + 1).is_some_and(|t| {
                t.is_ident("fn")
                    || t.is_ident("unsafe")
                    || t.is_ident("async")
                    || t.is_ident("extern")
            }),
            "extern" => !trees.get(i + 1).is_some_and(|t| t.is_ident("crate")),
            _ => false,
        };
        if !modifier {
            break;
        }
        i += 1;
        if word == "extern" && matches!(trees.get(i), Some(Tree::Opaque)) {
            i += 1; // the ABI string
        }
    }
    // `extern "C" { ... }`: a block of foreign items defined in this module.
    if let Some(Tree::Group(Delim::Brace, body)) = trees.get(i) {
        if !test_only {
            let foreign = parse_module(body);
            items.defs.extend(foreign.defs);
            items.paths.extend(foreign.paths);
            items.idents.extend(foreign.idents);
        }
        return i + 1;
    }
    let Some(Tree::Ident(keyword)) = trees.get(i) else {
        // Not an item (stray token): skip it, keeping what it refers to.
        let end = item_end(trees, i, false);
        if !test_only {
            collect_refs(&trees[i..end], items);
        }
        return end;
    };
    let name = match trees.get(i + 1) {
        Some(Tree::Ident(n)) => Some(n.clone()),
        _ => None,
    };
    match keyword.as_str() {
        "use" => {
            let end = item_end(trees, i, true);
            if !test_only {
                parse_use_tree(&trees[i + 1..end], &[], public, &mut items.uses);
            }
            end
        }
        "mod" => {
            let Some(name) = name else { return i + 1 };
            match trees.get(i + 2) {
                Some(Tree::Group(Delim::Brace, body)) => {
                    if !test_only {
                        let inner = parse_module(body);
                        items
                            .children
                            .push(ChildModule::Inline { name, items: inner });
                    }
                    i + 3
                }
                _ => {
                    if !test_only {
                        items.children.push(ChildModule::File {
                            name,
                            has_path_attr,
                        });
                    }
                    item_end(trees, i, true)
                }
            }
        }
        "macro_rules" => {
            // macro_rules! name { ... } | ( ... );
            let name = match trees.get(i + 2) {
                Some(Tree::Ident(n)) => Some(n.clone()),
                _ => None,
            };
            let end = item_end(trees, i, false);
            if !test_only {
                items.defs.extend(name);
                collect_refs(&trees[(i + 3).min(end)..end], items);
            }
            end
        }
        "struct" | "enum" | "union" | "trait" | "fn" | "impl" | "const" | "static" | "type" => {
            let by_semicolon = matches!(keyword.as_str(), "const" | "static" | "type");
            let end = item_end(trees, i, by_semicolon);
            if !test_only {
                if keyword != "impl" {
                    items.defs.extend(name.filter(|n| n != "_" && n != "mut"));
                }
                if keyword == "static"
                    && trees.get(i + 1).is_some_and(|t| t.is_ident("mut"))
                    && let Some(Tree::Ident(n)) = trees.get(i + 2)
                {
                    items.defs.insert(n.clone());
                }
                collect_refs(&trees[i + 1..end], items);
            }
            end
        }
        _ => {
            // A macro invocation (`name!(...);`, `name! { ... }`), `extern crate`, ...
            let end = item_end(trees, i, false);
            if !test_only {
                collect_refs(&trees[i..end], items);
            }
            end
        }
    }
}

/// The index after the item starting at `i`: after its `;`, or (unless `by_semicolon`)
/// after its first `{ ... }` body, whichever comes first.
fn item_end(trees: &[Tree], i: usize, by_semicolon: bool) -> usize {
    for (k, tree) in trees.iter().enumerate().skip(i) {
        if tree.is_punct(";") {
            return k + 1;
        }
        if !by_semicolon && matches!(tree, Tree::Group(Delim::Brace, _)) {
            // `macro! { ... };` may end in a stray `;`.
            return k + 1;
        }
    }
    trees.len()
}

/// `cfg(test)`, or `cfg(all(test, ...))`: items only compiled for tests. `cfg(not(test))`
/// and `cfg(any(test, ...))` are kept.
fn is_cfg_test(attr: &[Tree]) -> bool {
    match attr {
        [Tree::Ident(cfg), Tree::Group(Delim::Paren, args)] if cfg == "cfg" => requires_test(args),
        _ => false,
    }
}

fn requires_test(predicate: &[Tree]) -> bool {
    match predicate {
        [Tree::Ident(word)] => word == "test",
        [Tree::Ident(all), Tree::Group(Delim::Paren, args)] if all == "all" => {
            args.split(|t| t.is_punct(",")).any(requires_test)
        }
        _ => false,
    }
}

/// `#[path = "..."]`: the checker reports such a module rather than guess its file.
fn is_path_attribute(attr: &[Tree]) -> bool {
    matches!(attr, [Tree::Ident(path), Tree::Punct("="), ..] if path == "path")
}
