//! Which unit each trainable parameter belongs to, and where it sits in the unit's flat buffer.
//!
//! A unit is the set of trainable parameters whose path (`blocks.0.attn.query.weight`) starts
//! with one of the prefixes the user marked (the longest that matches wins); the parameters no
//! prefix matches form the root unit, as FSDP2's root module does. Each unit is one flat f32
//! buffer, its parameters in module order, padded to a multiple of the world size so that rank
//! `r` owns elements `[r * chunk, (r + 1) * chunk)`.

use super::error::FsdpError;
use burn::module::{ModuleVisitor, Param, ParamId};
use burn::tensor::backend::Backend;
use burn::tensor::{DType, Tensor};
use std::collections::HashMap;

/// Where one parameter lives: its unit, its offset in the unit's flat buffer, its shape.
#[derive(Debug, Clone)]
pub(crate) struct Slot {
    pub(crate) unit: usize,
    pub(crate) offset: usize,
    pub(crate) shape: Vec<usize>,
}

impl Slot {
    pub(crate) fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// One unit: its name (the prefix, or `(root)`), its element count and padded length.
#[derive(Debug, Clone)]
pub(crate) struct Unit {
    pub(crate) name: String,
    pub(crate) numel: usize,
    pub(crate) padded: usize,
}

impl Unit {
    /// Elements each rank owns.
    pub(crate) fn chunk(&self, world: usize) -> usize {
        self.padded / world
    }
}

/// The units of a model and the slot of every trainable parameter.
#[derive(Debug, Clone)]
pub(crate) struct Layout {
    pub(crate) units: Vec<Unit>,
    pub(crate) slots: HashMap<ParamId, Slot>,
}

/// The name of the unit of the parameters no prefix matches.
pub(crate) const ROOT_UNIT: &str = "(root)";

impl Layout {
    /// Assigns every trainable parameter of `module` to a unit. Frozen parameters (no gradient)
    /// stay out: every rank keeps them whole.
    pub(crate) fn plan<B: Backend, M: burn::module::Module<B>>(
        module: &M,
        prefixes: &[String],
        world: usize,
    ) -> Result<Self, FsdpError> {
        let mut seen = Collect::default();
        module.visit(&mut seen);
        if let Some(p) = prefixes
            .iter()
            .enumerate()
            .find(|(i, p)| p.is_empty() || p.ends_with('.') || prefixes[..*i].contains(p))
            .map(|(_, p)| p)
        {
            return Err(FsdpError::Unsupported {
                path: p.clone(),
                reason: "a unit prefix must be a module path given once, without a trailing \
                         '.' (for example \"layers.0\")"
                    .into(),
            });
        }
        let mut units: Vec<Unit> = prefixes
            .iter()
            .map(|p| Unit {
                name: p.clone(),
                numel: 0,
                padded: 0,
            })
            .chain(std::iter::once(Unit {
                name: ROOT_UNIT.to_string(),
                numel: 0,
                padded: 0,
            }))
            .collect();
        let mut slots = HashMap::new();
        // Each trainable parameter's path and unit, to explain a unit left empty.
        let mut placed: Vec<(String, usize)> = Vec::new();
        for p in seen.params.into_iter().filter(|p| p.trainable) {
            if p.dtype != DType::F32 {
                return Err(FsdpError::Unsupported {
                    path: p.path,
                    reason: format!(
                        "its dtype is {:?}; fully sharded units hold f32 parameters (keep other \
                         dtypes frozen, or train them with DistributedDataParallel)",
                        p.dtype
                    ),
                });
            }
            if slots.contains_key(&p.id) {
                return Err(FsdpError::Unsupported {
                    path: p.path,
                    reason: "it is tied (the same parameter appears twice in the module): fully \
                             sharded units need each parameter once; train tied weights with \
                             DistributedDataParallel"
                        .into(),
                });
            }
            let unit = longest_match(prefixes, &p.path).unwrap_or(prefixes.len());
            let numel: usize = p.shape.iter().product();
            let offset = units[unit].numel;
            units[unit].numel += numel;
            placed.push((p.path, unit));
            slots.insert(
                p.id,
                Slot {
                    unit,
                    offset,
                    shape: p.shape,
                },
            );
        }
        if let Some(empty) = units[..prefixes.len()].iter().find(|u| u.numel == 0) {
            // Parameters under the prefix that a longer prefix took (the longest wins).
            let mut longer: Vec<&str> = Vec::new();
            for (_, unit) in placed.iter().filter(|(path, _)| under(path, &empty.name)) {
                if !longer.contains(&units[*unit].name.as_str()) {
                    longer.push(&units[*unit].name);
                }
            }
            if !longer.is_empty() {
                return Err(FsdpError::UnitCoveredByLongerUnits {
                    prefix: empty.name.clone(),
                    longer: longer.join(", "),
                });
            }
            let mut heads: Vec<String> = seen.paths.iter().map(|p| head(p)).collect();
            heads.dedup();
            return Err(FsdpError::UnitMatchesNothing {
                prefix: empty.name.clone(),
                known: heads.join(", "),
            });
        }
        // Renumber without an empty root unit.
        if units[prefixes.len()].numel == 0 {
            units.pop();
        }
        for u in &mut units {
            u.padded = u.numel.div_ceil(world) * world;
        }
        Ok(Layout { units, slots })
    }

    /// Elements of every unit's chunk on one rank.
    pub(crate) fn chunk_elements(&self, world: usize) -> usize {
        self.units.iter().map(|u| u.chunk(world)).sum()
    }
}

/// The index of the longest prefix that `path` equals or continues with a `.`.
fn longest_match(prefixes: &[String], path: &str) -> Option<usize> {
    prefixes
        .iter()
        .enumerate()
        .filter(|(_, p)| under(path, p))
        .max_by_key(|(_, p)| p.len())
        .map(|(i, _)| i)
}

/// Whether `path` equals `prefix` or continues it with a `.`.
fn under(path: &str, prefix: &str) -> bool {
    path == prefix || (path.starts_with(prefix) && path[prefix.len()..].starts_with('.'))
}

/// The first two segments of a path (`blocks.0`), to show what prefixes exist.
fn head(path: &str) -> String {
    path.split('.').take(2).collect::<Vec<_>>().join(".")
}

struct Seen {
    path: String,
    id: ParamId,
    shape: Vec<usize>,
    dtype: DType,
    trainable: bool,
}

#[derive(Default)]
struct Collect {
    stack: Vec<String>,
    params: Vec<Seen>,
    paths: Vec<String>,
}

impl<B: Backend> ModuleVisitor<B> for Collect {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.stack.push(name.to_string());
    }
    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.stack.pop();
    }
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<B, D>>) {
        let path = self.stack.join(".");
        let value = param.val();
        self.paths.push(path.clone());
        self.params.push(Seen {
            path,
            id: param.id,
            shape: value.shape().dims::<D>().to_vec(),
            dtype: value.dtype(),
            trainable: value.is_require_grad(),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prefixes(p: &[&str]) -> Vec<String> {
        p.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn the_longest_prefix_that_ends_at_a_dot_wins() {
        let p = prefixes(&["blocks", "blocks.1", "head"]);
        assert_eq!(longest_match(&p, "blocks.0.attn.weight"), Some(0));
        assert_eq!(longest_match(&p, "blocks.1.attn.weight"), Some(1));
        assert_eq!(longest_match(&p, "blocks.10.attn.weight"), Some(0));
        assert_eq!(longest_match(&p, "head"), Some(2));
        assert_eq!(longest_match(&p, "header.weight"), None);
        assert_eq!(longest_match(&p, "embed.weight"), None);
    }
}
