#![doc = include_str!("guide/README.md")]
//!
//! This crate holds no code: each module below is one chapter of the guide (the Markdown files
//! in `docs/guide/`), so `cargo doc -p ddp-guide` renders the guide and
//! `cargo test -p ddp-guide` compiles and runs its Rust snippets as doc tests.

#[doc = include_str!("guide/getting-started.md")]
pub mod getting_started {}

#[doc = include_str!("guide/from-pytorch.md")]
pub mod from_pytorch {}

#[doc = include_str!("guide/launching.md")]
pub mod launching {}

#[doc = include_str!("guide/gpus.md")]
pub mod gpus {}

#[doc = include_str!("guide/checkpoints.md")]
pub mod checkpoints {}

#[doc = include_str!("guide/faults.md")]
pub mod faults {}

#[doc = include_str!("guide/performance.md")]
pub mod performance {}

#[doc = include_str!("guide/troubleshooting.md")]
pub mod troubleshooting {}

#[doc = include_str!("guide/training.md")]
pub mod training {}

#[doc = include_str!("guide/sharding.md")]
pub mod sharding {}

#[doc = include_str!("guide/ddp-train.md")]
pub mod ddp_train {}

#[doc = include_str!("guide/features.md")]
pub mod features {}

#[doc = include_str!("guide/benchmarks.md")]
pub mod benchmarks {}

#[cfg(test)]
mod tests {
    /// The text of the first fenced block in `page` that opens with `fence`.
    fn block<'a>(page: &'a str, fence: &str) -> &'a str {
        let start = page
            .find(&format!("\n{fence}\n"))
            .unwrap_or_else(|| panic!("no {fence} block"))
            + fence.len()
            + 2;
        let len = page[start..].find("\n```\n").expect("an unclosed block") + 1;
        &page[start..start + len]
    }

    /// The ddp-train page's excerpt is, line for line (indentation aside), a run of lines of
    /// the example it quotes.
    #[test]
    fn the_ddp_train_page_quotes_its_example() {
        let page = include_str!("guide/ddp-train.md");
        let excerpt: Vec<&str> = block(page, "```rust,ignore")
            .lines()
            .map(str::trim)
            .collect();
        let example: Vec<&str> = include_str!("../ddp-train/examples/digits_learner.rs")
            .lines()
            .map(str::trim)
            .collect();
        assert!(
            example
                .windows(excerpt.len())
                .any(|w| w == excerpt.as_slice()),
            "docs/guide/ddp-train.md's excerpt is no longer in ddp-train/examples/digits_learner.rs"
        );
    }

    #[test]
    fn the_pytorch_page_shows_the_files_it_names() {
        let page = include_str!("guide/from-pytorch.md");
        assert_eq!(
            block(page, "```python"),
            include_str!("guide/pytorch/mlp_ddp.py"),
            "docs/guide/from-pytorch.md's Python block differs from docs/guide/pytorch/mlp_ddp.py"
        );
        assert_eq!(
            block(page, "```rust,ignore"),
            include_str!("../ddp-examples/src/bin/from_pytorch.rs"),
            "docs/guide/from-pytorch.md's port differs from ddp-examples/src/bin/from_pytorch.rs"
        );
    }
}
