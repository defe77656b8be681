//! Ties between folders: within each folder, its files and subfolders are the units, and no
//! units may import each other in a circle, whichever files inside them carry the imports.
//!
//! A file `x/foo.rs` beside a folder `x/foo/` is that folder's module file and belongs to the
//! folder. Circles between two plain files are the file-level check's (`cycles`); this check
//! reports a circle at a folder's level only when a subfolder is one of its units.

use super::cycles;
use super::resolve::Edges;
use std::collections::{BTreeMap, BTreeSet};

/// Every circle between the units of a folder, ordered by folder, one line each:
/// `folder-tie in c/src: elastic/ -> plan.rs (Plan: c/src/elastic/agent.rs -> c/src/plan.rs); ...`
pub fn folder_ties(edges: &Edges) -> Vec<String> {
    let files: BTreeSet<&str> = edges
        .keys()
        .flat_map(|(a, b)| [a.as_str(), b.as_str()])
        .collect();
    let folders: BTreeSet<String> = files
        .iter()
        .flat_map(|file| {
            let parts: Vec<&str> = file.split('/').collect();
            (1..parts.len()).map(move |n| parts[..n].join("/"))
        })
        .collect();
    // Per folder, the edges between its units, each labelled with the file edges it stands for.
    let mut levels: BTreeMap<String, Edges> = BTreeMap::new();
    for ((from, to), names) in edges {
        let (a, b) = (units_path(from, &folders), units_path(to, &folders));
        let common = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
        // Both inside one unit of the deepest common folder: a tie at a deeper level, if any.
        if common >= a.len().min(b.len()) || common == 0 {
            continue;
        }
        let (unit_a, unit_b) = (&a[common], &b[common]);
        let is_folder = |unit: &String| unit.ends_with('/');
        if !is_folder(unit_a) && !is_folder(unit_b) {
            continue;
        }
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        levels
            .entry(a[..common].join(""))
            .or_default()
            .entry((unit_a.clone(), unit_b.clone()))
            .or_default()
            .insert(format!("{}: {from} -> {to}", names.join(", ")));
    }
    let mut ties = Vec::new();
    for (folder, unit_edges) in &levels {
        let folder = folder.trim_end_matches('/').to_string();
        for (_, circle) in cycles::circle_components(unit_edges) {
            let circle = circle.trim_start_matches("circle: ");
            ties.push(format!("folder-tie in {folder}: {circle}"));
        }
    }
    ties
}

/// A file's path as units from the workspace root down: `["c/", "src/", "foo/", "bar.rs"]`,
/// with `x/foo.rs` counted as `["x/", "foo/", "foo.rs"]` when the folder `x/foo/` exists.
fn units_path(file: &str, folders: &BTreeSet<String>) -> Vec<String> {
    let mut units: Vec<String> = file.split('/').map(str::to_string).collect();
    let last = units.len() - 1;
    for unit in &mut units[..last] {
        unit.push('/');
    }
    if let Some(stem) = file.strip_suffix(".rs")
        && folders.contains(stem)
    {
        let name = units[last].clone();
        units[last] = format!("{}/", name.trim_end_matches(".rs"));
        units.push(name);
    }
    units
}
