//! One crate's module tree, from its root file through every `mod x;` to the files.

use super::items::{ChildModule, ModuleItems, parse_module};
use super::lexer::parse_trees;
use std::collections::BTreeMap;

/// Reads a file by its path relative to the workspace root; `None` if it does not exist.
pub type ReadSource<'a> = &'a dyn Fn(&str) -> Option<String>;

/// One module: a file, or an inline `mod x { ... }` inside one.
#[derive(Debug)]
pub struct Module {
    /// The file its items are written in, relative to the workspace root.
    pub file: String,
    pub parent: Option<usize>,
    pub children: BTreeMap<String, usize>,
    pub items: ModuleItems,
}

/// The modules of one crate (a library or one binary); index 0 is the crate root.
#[derive(Debug, Default)]
pub struct ModuleTree {
    pub modules: Vec<Module>,
}

impl ModuleTree {
    /// Loads the crate whose root file is `root` (`ddp-core/src/lib.rs`).
    pub fn load(root: &str, read: ReadSource) -> Result<Self, String> {
        let mut tree = ModuleTree::default();
        let items = parse_file(root, read)?;
        let dir = parent_dir(root).to_string();
        tree.add(root, None, items, dir, read)?;
        Ok(tree)
    }

    /// Adds a module and, recursively, its children; `child_dir` is where `mod x;` finds
    /// `x.rs` or `x/mod.rs`.
    fn add(
        &mut self,
        file: &str,
        parent: Option<usize>,
        mut items: ModuleItems,
        child_dir: String,
        read: ReadSource,
    ) -> Result<usize, String> {
        let id = self.modules.len();
        let children = std::mem::take(&mut items.children);
        self.modules.push(Module {
            file: file.to_string(),
            parent,
            children: BTreeMap::new(),
            items,
        });
        for child in children {
            let (name, child_id) = match child {
                ChildModule::Inline { name, items } => {
                    let dir = format!("{child_dir}/{name}");
                    let child_id = self.add(file, Some(id), items, dir, read)?;
                    (name, child_id)
                }
                ChildModule::File {
                    name,
                    has_path_attr,
                } => {
                    if has_path_attr {
                        return Err(format!(
                            "{file}: `#[path]` on `mod {name}` is not supported"
                        ));
                    }
                    let (path, source) = [
                        format!("{child_dir}/{name}.rs"),
                        format!("{child_dir}/{name}/mod.rs"),
                    ]
                    .into_iter()
                    .find_map(|path| read(&path).map(|source| (path, source)))
                    .ok_or_else(|| format!("{file}: no file for `mod {name};` in {child_dir}"))?;
                    let items = parse_source(&path, &source)?;
                    let dir = match path.strip_suffix("/mod.rs") {
                        Some(dir) => dir.to_string(),
                        None => path.trim_end_matches(".rs").to_string(),
                    };
                    let child_id = self.add(&path, Some(id), items, dir, read)?;
                    (name, child_id)
                }
            };
            self.modules[id].children.insert(name, child_id);
        }
        Ok(id)
    }
}

fn parse_file(path: &str, read: ReadSource) -> Result<ModuleItems, String> {
    let source = read(path).ok_or_else(|| format!("{path}: cannot be read"))?;
    parse_source(path, &source)
}

fn parse_source(path: &str, source: &str) -> Result<ModuleItems, String> {
    let trees = parse_trees(source).map_err(|e| format!("{path}: {e}"))?;
    Ok(parse_module(&trees))
}

fn parent_dir(path: &str) -> &str {
    path.rsplit_once('/').map_or("", |(dir, _)| dir)
}
