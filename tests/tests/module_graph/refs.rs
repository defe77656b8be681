//! The references inside code: `use` trees (also those inside function bodies), paths of
//! two or more segments, and single names.

use super::items::{ModuleItems, UseItem, UseKind};
use super::lexer::{Delim, Tree};

/// Flattens one `use` tree (without the `use` keyword) into bindings appended to `out`.
pub fn parse_use_tree(trees: &[Tree], prefix: &[String], public: bool, out: &mut Vec<UseItem>) {
    let trees = match trees.split_last() {
        Some((last, rest)) if last.is_punct(";") => rest,
        _ => trees,
    };
    let mut path = prefix.to_vec();
    let mut i = 0;
    if trees.first().is_some_and(|t| t.is_punct("::")) {
        // `use ::name::...`: another crate.
        path.push("::".to_string());
        i = 1;
    }
    while let Some(tree) = trees.get(i) {
        match tree {
            // `$crate::...` in a macro body.
            Tree::Punct("$") => i += 1,
            Tree::Punct("*") => {
                out.push(UseItem {
                    path,
                    kind: UseKind::Glob,
                    public,
                });
                return;
            }
            Tree::Group(Delim::Brace, inner) => {
                for part in inner.split(|t| t.is_punct(",")).filter(|p| !p.is_empty()) {
                    parse_use_tree(part, &path, public, out);
                }
                return;
            }
            Tree::Ident(segment) => {
                path.push(segment.clone());
                i += 1;
                if trees.get(i).is_some_and(|t| t.is_punct("::")) {
                    i += 1;
                    continue;
                }
                if segment == "self" {
                    // `use a::{self}`: binds `a` itself.
                    path.pop();
                }
                let kind = match (trees.get(i), trees.get(i + 1)) {
                    (Some(Tree::Ident(kw)), Some(Tree::Ident(alias))) if kw == "as" => {
                        if alias == "_" {
                            UseKind::Anonymous
                        } else {
                            UseKind::Named(alias.clone())
                        }
                    }
                    _ => match path.last() {
                        Some(name) => UseKind::Named(name.clone()),
                        None => return,
                    },
                };
                out.push(UseItem { path, kind, public });
                return;
            }
            _ => return,
        }
    }
}

/// Records what `trees` (code: signatures, bodies, macro arguments) refers to.
pub fn collect_refs(trees: &[Tree], items: &mut ModuleItems) {
    let mut i = 0;
    while i < trees.len() {
        match &trees[i] {
            Tree::Group(_, inner) => {
                collect_refs(inner, items);
                i += 1;
            }
            Tree::Ident(word)
                if word == "use" && !trees.get(i + 1).is_some_and(|t| t.is_punct("<")) =>
            {
                // A `use` inside a block: an import of this module's code.
                let end = trees[i..]
                    .iter()
                    .position(|t| t.is_punct(";"))
                    .map_or(trees.len(), |k| i + k);
                parse_use_tree(&trees[i + 1..end], &[], false, &mut items.uses);
                i = end + 1;
            }
            Tree::Ident(word) => {
                let after = i.checked_sub(1).map(|k| &trees[k]);
                if after.is_some_and(|t| t.is_punct(".") || t.is_punct("::")) {
                    // A field, a method, or a later segment of a `::name` path.
                    i += 1;
                    continue;
                }
                let mut path = vec![word.clone()];
                let mut j = i + 1;
                while let (Some(sep), Some(Tree::Ident(next))) = (trees.get(j), trees.get(j + 1)) {
                    if !sep.is_punct("::") {
                        break;
                    }
                    path.push(next.clone());
                    j += 2;
                }
                items.idents.insert(word.clone());
                if path.len() > 1 {
                    items.paths.push(path);
                }
                i = j;
            }
            _ => i += 1,
        }
    }
}
