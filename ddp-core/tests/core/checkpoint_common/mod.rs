//! Fixtures of the checkpoint tests: a shuffled distributed loader over the synthetic set of
//! `common`, a DDP + Adam training loop that can stop and resume, log capture.
//! Every test crate using it also declares `mod common;`.
#![allow(dead_code)]

use crate::common::{B, HIDDEN, Mlp, batch, flat_params, mlp_from, record_bytes};
use burn::backend::flex::FlexDevice;
use burn::data::dataloader::batcher::Batcher;
use burn::data::dataset::Dataset;
use burn::nn::loss::{MseLoss, Reduction};
use burn::optim::AdamConfig;
use ddp_core::checkpoint::{
    CheckpointConfig, FullCheckpointer, LoadOutcome, Resumed, SavedCheckpoint, TrainingState,
};
use ddp_core::{DdpConfig, DistributedDataParallel, comm::ProcessGroup};
use ddp_data::{DistributedDataLoader, DistributedDataLoaderBuilder, DistributedSamplerConfig};
use std::path::Path;
use std::sync::{Arc, Mutex};

pub const DATASET_LEN: usize = 24;
pub const BATCH_PER_RANK: usize = 3;
pub const EPOCHS: u64 = 2;
pub const SEED: u64 = 11;
pub const LR: f64 = 0.01;

/// Item `i` is the index `i` of the synthetic set.
#[derive(Debug, Clone, Copy)]
pub struct Indices(pub usize);

impl Dataset<usize> for Indices {
    fn get(&self, index: usize) -> Option<usize> {
        (index < self.0).then_some(index)
    }
    fn len(&self) -> usize {
        self.0
    }
}

/// Batches are the indices themselves; the training loop builds tensors with `common::batch`.
#[derive(Debug, Clone, Copy)]
pub struct Collect;

impl Batcher<B, usize, Vec<usize>> for Collect {
    fn batch(&self, items: Vec<usize>, _device: &FlexDevice) -> Vec<usize> {
        items
    }
}

pub type Loader = DistributedDataLoader<B, usize, Vec<usize>>;

pub fn sampler_config(world: usize, rank: usize) -> DistributedSamplerConfig {
    DistributedSamplerConfig::new(world, rank).with_seed(SEED)
}

/// A shuffled loader of this rank's share.
pub fn loader(world: usize, rank: usize) -> Loader {
    DistributedDataLoaderBuilder::new(Collect)
        .batch_size(BATCH_PER_RANK)
        .build(Indices(DATASET_LEN), sampler_config(world, rank))
        .expect("loader")
}

/// A fixed initial model, as recorder bytes (ids included); `common::mlp_from` loads it.
pub fn init_bytes() -> Vec<u8> {
    record_bytes(&Mlp::<B>::new(&Default::default(), HIDDEN))
}

/// When a run stops (after saving a checkpoint).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// Train all epochs.
    Never,
    /// Save and stop at the end of this epoch.
    AfterEpoch(u64),
    /// Save and stop right after this global step (mid-epoch).
    AtStep(u64),
}

/// How a run starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// From the fixed initial model.
    Init,
    /// From a fresh random model, fresh Adam and fresh loader, restored from the checkpoint.
    Resume,
    /// Like `Resume`, then the optimizer state is thrown away (a control).
    ResumeWithoutOptimizerState,
    /// Like `Resume`, but the loader is not restored (a control).
    ResumeWithoutLoaderState,
}

#[derive(Debug)]
pub struct RunResult {
    /// Parameters at the end.
    pub params: Vec<f32>,
    /// Steps this run took.
    pub steps: usize,
    /// The resume, for `Start::Resume*`.
    pub resumed: Option<Resumed>,
    /// The training state saved at the stop.
    pub saved: Option<TrainingState>,
}

/// Trains the Mlp with DDP + Adam on a shuffled loader over `pg`'s ranks.
pub fn run(pg: ProcessGroup, init: &[u8], dir: &Path, start: Start, stop: Stop) -> RunResult {
    let device: FlexDevice = Default::default();
    let (rank, world) = (pg.rank(), pg.world_size());
    let ckpt = FullCheckpointer::new(CheckpointConfig::new(dir), pg.clone()).expect("checkpointer");
    let mut model = match start {
        // Only rank 0 holds the reference weights; DDP copies them to the others.
        Start::Init if rank == 0 => mlp_from(init),
        _ => Mlp::<B>::new(&device, HIDDEN),
    };
    let mut optim = AdamConfig::new().init::<B, Mlp<B>>();
    let mut loader = loader(world, rank);
    let (mut first_epoch, mut step, mut resumed) = (0, 0u64, None);
    if start != Start::Init {
        let outcome = ckpt
            .load_latest(&device, &mut model, &mut optim)
            .expect("load_latest");
        let LoadOutcome::Resumed(r) = outcome else {
            panic!("expected a checkpoint to resume from, got: {outcome}");
        };
        if start != Start::ResumeWithoutLoaderState {
            r.restore_loader(&mut loader).expect("restore loader");
        }
        if start == Start::ResumeWithoutOptimizerState {
            optim = AdamConfig::new().init::<B, Mlp<B>>();
        }
        first_epoch = r.state.epoch;
        step = r.state.global_step;
        resumed = Some(*r);
    }
    let mut ddp = DistributedDataParallel::new(model, pg, DdpConfig::new()).expect("ddp");
    let (mut steps, mut saved) = (0, None);
    'epochs: for epoch in first_epoch..EPOCHS {
        loader.set_epoch(epoch);
        for indices in loader.iter() {
            let indices = indices.expect("batch");
            let (x, y) = batch(&indices, &device);
            let pred = ddp.forward(|m| m.forward(x, false)).expect("forward");
            let loss = MseLoss::new().forward(pred, y, Reduction::Mean);
            let grads = ddp.backward(loss).expect("backward");
            ddp.optimizer_step(&mut optim, LR, grads);
            step += 1;
            steps += 1;
            if stop == Stop::AtStep(step) {
                let state = TrainingState::new(epoch, step).with_sampler(loader.state());
                ckpt.save(ddp.module(), &optim, &state).expect("save");
                saved = Some(state);
                break 'epochs;
            }
        }
        if stop == Stop::AfterEpoch(epoch) {
            let state = TrainingState::new(epoch, step).with_sampler(loader.state());
            ckpt.save(ddp.module(), &optim, &state).expect("save");
            saved = Some(state);
            break;
        }
    }
    RunResult {
        params: flat_params(ddp.module()),
        steps,
        resumed,
        saved,
    }
}

pub type Adam = burn::optim::adaptor::OptimizerAdaptor<burn::optim::Adam, Mlp<B>, B>;

pub fn adam() -> Adam {
    AdamConfig::new().init::<B, Mlp<B>>()
}

/// Saves a fresh random model (hidden size 4) with `state` (each rank its own; rank 0's is
/// written); returns the save and this rank's parameters.
pub fn save_random(ckpt: &FullCheckpointer, state: TrainingState) -> (SavedCheckpoint, Vec<f32>) {
    let model = Mlp::<B>::new(&Default::default(), 4);
    let saved = ckpt.save(&model, &adam(), &state).expect("save");
    (saved, flat_params(&model))
}

/// Loads the latest checkpoint into a fresh model (hidden size 4) and Adam.
pub fn load_latest_fresh(ckpt: &FullCheckpointer) -> (LoadOutcome, Mlp<B>) {
    let device = Default::default();
    let mut model = Mlp::<B>::new(&device, 4);
    let mut optim = adam();
    let outcome = ckpt
        .load_latest(&device, &mut model, &mut optim)
        .expect("load_latest");
    (outcome, model)
}

/// Whether two parameter vectors are bitwise equal.
pub fn bitwise_eq(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// Runs `f` with a tracing subscriber that records every event (this thread only); returns
/// `f`'s value and the log text.
pub fn capture_logs<T>(f: impl FnOnce() -> T) -> (T, String) {
    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Buf {
        fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
            self.0.lock().expect("log buffer").extend_from_slice(data);
            Ok(data.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let buf = Buf::default();
    let writer = buf.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let value = tracing::subscriber::with_default(subscriber, f);
    let text = String::from_utf8_lossy(&buf.0.lock().expect("log buffer")).into_owned();
    (value, text)
}

/// The entries of `dir` whose names start with `prefix`.
pub fn entries_with_prefix(dir: &Path, prefix: &str) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with(prefix))
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

/// Runs this test binary's ignored test `child` (a module path such as
/// `checkpoint_sharded::sharded_crash_child`) with `dir_env` set to `dir` and the checkpoint
/// crash point `point` armed, and checks that the crash point killed it.
pub fn run_child_killed_at(child: &str, dir_env: &str, dir: &Path, point: &str) {
    use std::os::unix::process::ExitStatusExt;
    let exe = std::env::current_exe().expect("test binary");
    let out = std::process::Command::new(&exe)
        .args(["--exact", child, "--ignored", "--test-threads", "1"])
        .env(dir_env, dir)
        .env(ddp_core::checkpoint::TEST_CRASH_AT_ENV, point)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run the child");
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGKILL),
        "{point}: the child was not killed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
