//! Helper program of `tests/processes/checkpoint_crash.rs` (not a user example): a one-rank run that
//! saves checkpoint `step-<STEP>` of a model whose every parameter equals `STEP`, then exits.
//!
//! ```text
//! checkpoint_crash_writer <DIR> <STEP>
//! ```
//!
//! The test runs it once to write step 1, then again for step 2 with the test-only hook
//! `DDP_CHECKPOINT_TEST_CRASH_AT` set, which makes it SIGKILL itself at one phase of the
//! write. It keeps the last checkpoint only, so a save also prunes.

use burn::module::{Module, ModuleMapper, Param};
use burn::optim::AdamConfig;
use burn::tensor::Tensor;
use ddp_core::checkpoint::{CheckpointConfig, FullCheckpointer, TrainingState};
use ddp_tests::fixtures::{SmallMlp, TestBackend as B};

/// Sets every float parameter to `value`.
struct Fill(f32);

impl ModuleMapper<B> for Fill {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<B, D>>) -> Param<Tensor<B, D>> {
        let value = self.0;
        param.map(|t| t.zeros_like().add_scalar(value).require_grad())
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let usage = "usage: checkpoint_crash_writer <DIR> <STEP>";
    let dir = args.next().ok_or(usage)?;
    let step: u64 = args.next().ok_or(usage)?.parse()?;

    let (_server, pg) = ddp_tests::one_rank_group()?;
    let ckpt = FullCheckpointer::new(CheckpointConfig::new(dir).with_keep_last(1), pg)?;

    let device = Default::default();
    let model = SmallMlp::<B>::new(&device).map(&mut Fill(step as f32));
    let optim = AdamConfig::new().init::<B, SmallMlp<B>>();
    let state = TrainingState::new(0, step).with_user(&format!("written by step {step}"))?;
    println!("saving step {step}");
    let saved = ckpt.save(&model, &optim, &state)?;
    println!("saved {}", saved.name);
    Ok(())
}
