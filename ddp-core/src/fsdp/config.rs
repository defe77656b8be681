//! [`FsdpConfig`]: which parts of the model are units.

/// How [`FullyShardedDataParallel`](super::FullyShardedDataParallel) groups the parameters.
///
/// A unit is every trainable parameter whose path starts with a marked prefix: mark layers or
/// blocks (`"blocks.0"`, `"blocks.1"`, ... for a `Vec` field `blocks`), as FSDP2's
/// `fully_shard` is applied to each block. The parameters no prefix matches form one more unit,
/// `(root)`. Each unit is gathered and reduce-scattered as one collective; each rank holds
/// `1/world` of each.
#[derive(Debug, Clone, Default)]
pub struct FsdpConfig {
    units: Vec<String>,
}

impl FsdpConfig {
    /// No units marked: the whole model is one unit.
    pub fn new() -> Self {
        Self::default()
    }

    /// Marks the parameters under `prefix` (a module path, `.`-separated, such as `"encoder"`
    /// or `"blocks.3"`) as one unit. A prefix that matches no trainable parameter is an error
    /// at construction.
    pub fn with_unit(mut self, prefix: impl Into<String>) -> Self {
        self.units.push(prefix.into());
        self
    }

    /// Marks each prefix as its own unit, in order.
    pub fn with_units<S: Into<String>>(mut self, prefixes: impl IntoIterator<Item = S>) -> Self {
        self.units.extend(prefixes.into_iter().map(Into::into));
        self
    }

    /// The marked prefixes.
    pub fn units(&self) -> &[String] {
        &self.units
    }
}
