//! No import circles between the files of any workspace crate's `src/`.
//!
//! File A depends on file B when A imports (a `use` item, or a path such as
//! `super::b::f` in code) a name defined in B, within one crate. Re-exports (`pub use`)
//! are followed to the defining file and are not imports themselves unless the
//! re-exporting file's own code uses the name; `mod x;` is not an import; items under
//! `#[cfg(test)]` are skipped. A circle is a strongly connected component of 2+ files:
//! such files cannot be understood, tested or moved one at a time.
//!
//! Nor between folders: within each folder, its files and subfolders may not import each other
//! in a circle (`folders`).

mod checker_tests;
mod cycles;
mod folders;
mod items;
mod lexer;
mod refs;
mod resolve;
mod tree;
mod workspace;

use resolve::Edges;
use tree::{ModuleTree, ReadSource};

/// The import edges between the files reached from `roots` (one crate root each).
fn edges_of(roots: &[String], read: ReadSource) -> Result<Edges, String> {
    let mut edges = Edges::new();
    for root in roots {
        let tree = ModuleTree::load(root, read)?;
        resolve::add_edges(&tree, &mut edges);
    }
    Ok(edges)
}

/// The circles among the files reached from `roots`, one line each.
fn circles_of(roots: &[String], read: ReadSource) -> Result<Vec<String>, String> {
    Ok(cycles::circles(&edges_of(roots, read)?))
}

/// The circles among the folders (and the files beside them) reached from `roots`.
fn folder_ties_of(roots: &[String], read: ReadSource) -> Result<Vec<String>, String> {
    Ok(folders::folder_ties(&edges_of(roots, read)?))
}

#[test]
fn workspace_crates_have_no_import_circles() {
    let root = workspace::workspace_root().unwrap();
    let read = |path: &str| std::fs::read_to_string(root.join(path)).ok();
    let mut circles = Vec::new();
    let members = workspace::members(&root).unwrap();
    assert!(!members.is_empty(), "no workspace members found");
    for member in members {
        let roots = workspace::crate_roots(&root, &member);
        circles.extend(circles_of(&roots, &read).unwrap_or_else(|e| panic!("{e}")));
        circles.extend(folder_ties_of(&roots, &read).unwrap_or_else(|e| panic!("{e}")));
    }
    assert!(
        circles.is_empty(),
        "{} import circle(s):\n{}",
        circles.len(),
        circles.join("\n")
    );
}
