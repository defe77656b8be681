//! The transformer benches' model and batch shape (`--d-model --layers --heads --seq-len
//! --batch`), checked before any model is built, so a GPU machine's limited time is not spent
//! on a shape that cannot run.

use anyhow::{Result, bail};

/// `transformer_step`'s shape flags. The defaults are the `transformer` example's tiny model
/// (3.2M parameters); `--d-model 768 --layers 12 --heads 12 --seq-len 127` is the 85M shape the
/// GPU checks compare with PyTorch.
#[derive(clap::Args, Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShapeArgs {
    /// Width of the residual stream.
    #[arg(long, default_value_t = 256)]
    pub d_model: usize,
    /// Transformer layers.
    #[arg(long, default_value_t = 4)]
    pub layers: usize,
    /// Attention heads per layer (must divide `--d-model`).
    #[arg(long, default_value_t = 4)]
    pub heads: usize,
    /// Tokens per input sequence: 2n + 1 for n reversed digits (BOS, the digits, SEP, the
    /// reversed digits but the last), so 13 reverses 6 digits.
    #[arg(long, default_value_t = 13)]
    pub seq_len: usize,
    /// Sequences per step.
    #[arg(long, default_value_t = 32)]
    pub batch: usize,
}

impl ShapeArgs {
    /// The digits each sequence reverses (`n` of `--seq-len 2n + 1`), or what is wrong with the
    /// shape and how to fix it.
    pub fn digits(&self) -> Result<usize> {
        if self.d_model == 0 || self.layers == 0 || self.heads == 0 || self.batch == 0 {
            bail!(
                "--d-model, --layers, --heads and --batch must be at least 1 (got {}, {}, {}, {})",
                self.d_model,
                self.layers,
                self.heads,
                self.batch
            );
        }
        if !self.d_model.is_multiple_of(self.heads) {
            bail!(
                "--heads {} does not divide --d-model {}: each head gets d_model / heads \
                 dimensions (e.g. --d-model 768 --heads 12)",
                self.heads,
                self.d_model
            );
        }
        if self.seq_len < 3 || self.seq_len.is_multiple_of(2) {
            bail!(
                "--seq-len {} must be odd and at least 3: a sequence is BOS, n digits, SEP and \
                 n reversed digits, of which the input holds 2n + 1 tokens (e.g. 13 or 127)",
                self.seq_len
            );
        }
        Ok((self.seq_len - 1) / 2)
    }

    /// The shape as the benches' headers print it.
    pub fn describe(&self) -> String {
        format!(
            "d_model {}, {} layers, {} heads, batch {} x {} tokens",
            self.d_model, self.layers, self.heads, self.batch, self.seq_len
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        shape: ShapeArgs,
    }

    fn parse(args: &[&str]) -> ShapeArgs {
        Cli::try_parse_from(std::iter::once("bench").chain(args.iter().copied()))
            .expect("parses")
            .shape
    }

    #[test]
    fn the_defaults_are_the_tiny_shape_and_the_85m_shape_parses() {
        let tiny = parse(&[]);
        assert_eq!((tiny.d_model, tiny.layers, tiny.heads), (256, 4, 4));
        assert_eq!(
            (tiny.seq_len, tiny.batch, tiny.digits().unwrap()),
            (13, 32, 6)
        );
        let big = parse(&[
            "--d-model",
            "768",
            "--layers",
            "12",
            "--heads",
            "12",
            "--seq-len",
            "127",
        ]);
        assert_eq!(big.digits().unwrap(), 63);
        assert_eq!(
            big.describe(),
            "d_model 768, 12 layers, 12 heads, batch 32 x 127 tokens"
        );
    }

    #[test]
    fn shapes_that_cannot_run_are_refused_saying_why() {
        let err = |args: &[&str]| parse(args).digits().unwrap_err().to_string();
        assert!(err(&["--heads", "5"]).contains("does not divide --d-model 256"));
        assert!(err(&["--seq-len", "12"]).contains("must be odd"));
        assert!(err(&["--seq-len", "1"]).contains("at least 3"));
        assert!(err(&["--batch", "0"]).contains("at least 1"));
    }
}
