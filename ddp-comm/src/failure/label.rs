//! [`CollectiveLabel`]: which collective an error or a watchdog report is about.

/// What a collective is, for the watchdog's report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CollectiveLabel {
    /// The operation, e.g. `all_reduce`.
    pub op: &'static str,
    /// The gradient bucket it carries, when it carries one.
    pub bucket: Option<usize>,
}

impl CollectiveLabel {
    /// A collective `op` outside any bucket.
    pub fn new(op: &'static str) -> Self {
        CollectiveLabel { op, bucket: None }
    }

    /// The same label for bucket `bucket`.
    pub fn with_bucket(mut self, bucket: usize) -> Self {
        self.bucket = Some(bucket);
        self
    }
}
