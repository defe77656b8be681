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
//! in a circle (`folders`), except the ties `KNOWN_FOLDER_TIES` lists with the work that
//! removes them.

mod checker_tests;
mod cycles;
mod folders;
mod items;
mod lexer;
mod refs;
mod resolve;
mod tree;
mod workspace;

use folders::FolderTie;
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
fn folder_ties_of(roots: &[String], read: ReadSource) -> Result<Vec<FolderTie>, String> {
    Ok(folders::folder_ties(&edges_of(roots, read)?))
}

/// Folder ties that were there when the check was written, each with the work that removes
/// it (issue 48). The check fails on any other tie, and on an entry here that is gone (so the
/// list only shrinks). Written as the folder, then its units in the circle, sorted.
const KNOWN_FOLDER_TIES: &[(&str, &[&str], &str)] = &[(
    "ddp-core/src",
    &["checkpoint/", "zero/"],
    "checkpoint/sharded/ saves ZeRO's optimizer state, and ZeRO saves through \
         checkpoint/: one checkpoint subsystem with a state-provider trait removes it",
)];

#[test]
fn workspace_crates_have_no_import_circles() {
    let root = workspace::workspace_root().unwrap();
    let read = |path: &str| std::fs::read_to_string(root.join(path)).ok();
    let mut circles = Vec::new();
    let mut known_left: Vec<_> = KNOWN_FOLDER_TIES.iter().collect();
    let members = workspace::members(&root).unwrap();
    assert!(!members.is_empty(), "no workspace members found");
    for member in members {
        let roots = workspace::crate_roots(&root, &member);
        circles.extend(circles_of(&roots, &read).unwrap_or_else(|e| panic!("{e}")));
        for tie in folder_ties_of(&roots, &read).unwrap_or_else(|e| panic!("{e}")) {
            let units: Vec<&str> = tie.units.iter().map(String::as_str).collect();
            match known_left
                .iter()
                .position(|(folder, known, _)| *folder == tie.folder && *known == units)
            {
                Some(i) => drop(known_left.remove(i)),
                None => circles.push(tie.line),
            }
        }
    }
    for (folder, units, _) in known_left {
        circles.push(format!(
            "KNOWN_FOLDER_TIES lists a tie that is gone (remove it): {folder}: {}",
            units.join(" ")
        ));
    }
    assert!(
        circles.is_empty(),
        "{} import circle(s):\n{}",
        circles.len(),
        circles.join("\n")
    );
}
