//! keep-last-K, the `latest` pointer, cleanup of leftovers, replacing a checkpoint, and the
//! collective behaviour of save/load (step agreement, per-rank state, shared filesystem,
//! run-config hash).

mod checkpoint_common;
mod common;

use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::{AdamConfig, Optimizer};
use burn::tensor::Tensor;
use checkpoint_common::*;
use common::*;
use ddp_core::checkpoint::{
    CheckpointConfig, CheckpointError, Checkpointer, InvalidReason, LATEST_FILE, LoadOutcome,
    PARAM_IDS_FILE, Resumed, SavedCheckpoint, TrainingState, checkpoint_name,
};
use std::collections::BTreeMap;
use std::path::Path;

type Adam = burn::optim::adaptor::OptimizerAdaptor<burn::optim::Adam, Mlp<B>, B>;

fn adam() -> Adam {
    AdamConfig::new().init::<B, Mlp<B>>()
}

/// Saves a fresh random model with `state` (each rank its own; rank 0's is written); returns the
/// save and rank 0's parameters.
fn save_at(ckpt: &Checkpointer, state: TrainingState) -> (SavedCheckpoint, Vec<f32>) {
    let model = Mlp::<B>::new(&Default::default(), 4);
    let saved = ckpt.save(&model, &adam(), &state).expect("save");
    (saved, flat_params(&model))
}

fn load_latest(ckpt: &Checkpointer) -> (LoadOutcome, Mlp<B>) {
    let device = Default::default();
    let mut model = Mlp::<B>::new(&device, 4);
    let mut optim = adam();
    let outcome = ckpt
        .load_latest(&device, &mut model, &mut optim)
        .expect("load_latest");
    (outcome, model)
}

fn latest(dir: &Path) -> String {
    std::fs::read_to_string(dir.join(LATEST_FILE))
        .expect("latest")
        .trim()
        .to_string()
}

#[test]
fn keep_last_k_and_the_latest_pointer() {
    let dir = tempfile::tempdir().expect("tempdir");
    let results = run_ranks(2, |pg| {
        let ckpt = Checkpointer::new(
            CheckpointConfig::new(dir.path()).with_keep_last(2),
            pg.clone(),
        )
        .expect("new");
        let mut last_params = Vec::new();
        for step in 1..=4u64 {
            let (saved, params) = save_at(&ckpt, TrainingState::new(0, step));
            assert_eq!(saved.name, checkpoint_name(step));
            assert_eq!(
                saved.removed,
                if step > 2 {
                    vec![checkpoint_name(step - 2)]
                } else {
                    vec![]
                },
                "step {step}"
            );
            assert!(saved.bytes > 0);
            // Both ranks see the new state once save returns.
            assert_eq!(ckpt.latest().expect("latest"), Some(checkpoint_name(step)));
            let expected: Vec<String> = (step.saturating_sub(1).max(1)..=step)
                .map(checkpoint_name)
                .collect();
            assert_eq!(
                ckpt.list().expect("list"),
                expected,
                "after saving step {step}"
            );
            last_params = params;
        }
        let (outcome, model) = load_latest(&ckpt);
        let resumed = outcome.resumed().expect("resumed").clone();
        (resumed, flat_params(&model), last_params)
    });
    // Rank 0 wrote its own model; both ranks loaded it.
    let written = &results[0].2;
    for (rank, (resumed, loaded, _)) in results.iter().enumerate() {
        assert_eq!(resumed.info.name, checkpoint_name(4), "rank {rank}");
        assert_eq!(resumed.info.saved_world_size, 2);
        assert!(
            bitwise_eq(loaded, written),
            "rank {rank} holds rank 0's saved model"
        );
    }
    assert_eq!(latest(dir.path()), checkpoint_name(4));
    assert_eq!(
        entries_with_prefix(dir.path(), "."),
        Vec::<String>::new(),
        "no temporaries left"
    );
}

#[test]
fn latest_naming_a_missing_checkpoint_falls_back_and_newer_uncommitted_ones_are_ignored() {
    let dir = tempfile::tempdir().expect("tempdir");
    run_ranks(1, |pg| {
        let ckpt = Checkpointer::new(CheckpointConfig::new(dir.path()), pg.clone()).expect("new");
        for step in 1..=3 {
            save_at(&ckpt, TrainingState::new(0, step));
        }
    });
    // A complete checkpoint newer than `latest` (writer died before moving the pointer).
    let uncommitted = dir.path().join(checkpoint_name(9));
    std::fs::create_dir(&uncommitted).expect("mkdir");
    for entry in std::fs::read_dir(dir.path().join(checkpoint_name(3))).expect("read_dir") {
        let entry = entry.expect("entry");
        std::fs::copy(entry.path(), uncommitted.join(entry.file_name())).expect("copy");
    }
    std::fs::remove_dir_all(dir.path().join(checkpoint_name(3))).expect("remove step 3");

    let (outcome, log) = run_ranks(1, |pg| {
        capture_logs(|| {
            let ckpt = Checkpointer::new(CheckpointConfig::new(dir.path()), pg).expect("new");
            load_latest(&ckpt).0
        })
    })
    .remove(0);
    let resumed = outcome.resumed().expect("resumed");
    assert_eq!(
        resumed.info.name,
        checkpoint_name(2),
        "the one before `latest`'s, not the uncommitted step 9"
    );
    assert_eq!(resumed.invalid.len(), 1);
    assert_eq!(resumed.invalid[0].name, checkpoint_name(3));
    assert!(matches!(
        resumed.invalid[0].reason,
        InvalidReason::MissingDir { .. }
    ));
    assert!(
        log.contains("never committed") && log.contains("step-0000000009"),
        "{log}"
    );
}

#[test]
fn leftovers_of_an_interrupted_write_are_removed_at_start() {
    let dir = tempfile::tempdir().expect("tempdir");
    let tmp = dir.path().join(".tmp-step-0000000005-4242");
    std::fs::create_dir(&tmp).expect("mkdir");
    std::fs::write(tmp.join("model.safetensors"), b"half a model").expect("write");
    std::fs::write(dir.path().join(".tmp-latest-4242"), b"step-0000000005\n").expect("write");
    std::fs::create_dir(dir.path().join(".trash-step-0000000001-4242")).expect("mkdir");
    let (outcome, log) = run_ranks(1, |pg| {
        capture_logs(|| {
            let ckpt = Checkpointer::new(CheckpointConfig::new(dir.path()), pg).expect("new");
            load_latest(&ckpt).0
        })
    })
    .remove(0);
    assert_eq!(entries_with_prefix(dir.path(), "."), Vec::<String>::new());
    assert!(
        log.contains("removed the leftover of an interrupted checkpoint write"),
        "{log}"
    );
    assert!(
        matches!(outcome, LoadOutcome::Fresh { ref invalid, .. } if invalid.is_empty()),
        "{outcome}"
    );
}

#[test]
fn fresh_start_in_a_new_directory_is_reported() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sub = dir.path().join("runs").join("digits");
    let (outcome, log) = run_ranks(2, |pg| {
        capture_logs(|| {
            let ckpt = Checkpointer::new(CheckpointConfig::new(&sub), pg).expect("new");
            let device = Default::default();
            let mut model = Mlp::<B>::new(&device, 4);
            let before = flat_params(&model);
            let mut optim = adam();
            let outcome = ckpt
                .load_latest(&device, &mut model, &mut optim)
                .expect("load");
            assert!(
                bitwise_eq(&before, &flat_params(&model)),
                "a fresh start leaves the model alone"
            );
            outcome
        })
    })
    .remove(0);
    assert!(sub.is_dir(), "rank 0 created the directory");
    assert!(outcome.resumed().is_none());
    assert_eq!(
        outcome.to_string(),
        format!("no valid checkpoint in {}: starting fresh", sub.display())
    );
    assert!(
        log.contains("INFO") && log.contains("starting fresh"),
        "{log}"
    );
}

#[test]
fn saving_the_same_step_twice_replaces_the_checkpoint() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (second, loaded) = run_ranks(1, |pg| {
        let ckpt = Checkpointer::new(CheckpointConfig::new(dir.path()), pg.clone()).expect("new");
        save_at(&ckpt, TrainingState::new(0, 1));
        let (_, second) = save_at(&ckpt, TrainingState::new(1, 1));
        let (outcome, model) = load_latest(&ckpt);
        assert_eq!(outcome.resumed().expect("resumed").state.epoch, 1);
        (second, flat_params(&model))
    })
    .remove(0);
    assert!(bitwise_eq(&second, &loaded));
    assert_eq!(
        entries_with_prefix(dir.path(), ""),
        vec![LATEST_FILE.to_string(), checkpoint_name(1)]
    );
}

#[test]
fn ranks_saving_different_steps_fail_together() {
    let dir = tempfile::tempdir().expect("tempdir");
    let errors = run_ranks(2, |pg| {
        let ckpt = Checkpointer::new(CheckpointConfig::new(dir.path()), pg.clone()).expect("new");
        let model = Mlp::<B>::new(&Default::default(), 4);
        ckpt.save(
            &model,
            &adam(),
            &TrainingState::new(0, 10 + pg.rank() as u64),
        )
        .expect_err("different steps")
    });
    for e in &errors {
        assert!(
            matches!(e, CheckpointError::StepMismatch { min: 10, max: 11 }),
            "{e}"
        );
    }
    assert!(
        entries_with_prefix(dir.path(), "step-").is_empty(),
        "nothing was written"
    );
}

/// Every parameter's id by module path.
fn ids(model: &Mlp<B>) -> BTreeMap<String, u64> {
    struct Ids(Vec<String>, BTreeMap<String, u64>);
    impl ModuleVisitor<B> for Ids {
        fn enter_module(&mut self, name: &str, _: &str) {
            self.0.push(name.into());
        }
        fn exit_module(&mut self, _: &str, _: &str) {
            self.0.pop();
        }
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<B, D>>) {
            assert!(
                p.val().is_require_grad(),
                "a restored parameter still requires grad"
            );
            self.1.insert(self.0.join("."), p.id.val());
        }
    }
    let mut v = Ids(Vec::new(), BTreeMap::new());
    model.visit(&mut v);
    v.1
}

fn per_rank_round_trip(shared_filesystem: bool) {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = CheckpointConfig::new(dir.path()).with_shared_filesystem(shared_filesystem);
    let saved_ids = run_ranks(2, |pg| {
        let ckpt = Checkpointer::new(config.clone(), pg.clone()).expect("new");
        let model = Mlp::<B>::new(&Default::default(), 4);
        let state = TrainingState::new(3, 42)
            .with_rng(&(7u64, 1024u64))
            .and_then(|s| s.with_rank_rng(&format!("rank {} stream", pg.rank())))
            .and_then(|s| s.with_user(&serde_json::json!({ "best_loss": 0.25 })))
            .expect("state");
        ckpt.save(&model, &adam(), &state).expect("save");
        ids(&model)
    });
    let file: BTreeMap<String, u64> = serde_json::from_slice(
        &std::fs::read(dir.path().join(checkpoint_name(42)).join(PARAM_IDS_FILE)).expect("read"),
    )
    .expect("param ids");
    assert_eq!(file, saved_ids[0], "param_ids.json holds rank 0's ids");
    let resumed: Vec<(Resumed, BTreeMap<String, u64>)> = run_ranks(2, |pg| {
        let ckpt = Checkpointer::new(config.clone(), pg.clone()).expect("new");
        let (outcome, model) = load_latest(&ckpt);
        (outcome.into_resumed().expect("resumed"), ids(&model))
    });
    for (rank, (r, model_ids)) in resumed.iter().enumerate() {
        assert_eq!(
            model_ids, &saved_ids[0],
            "rank {rank}: the module takes the saved ids"
        );
        assert_eq!((r.state.epoch, r.state.global_step), (3, 42));
        assert_eq!(r.state.rng::<(u64, u64)>().expect("rng"), Some((7, 1024)));
        assert_eq!(
            r.state.rank_rng::<String>().expect("rank rng"),
            Some(format!("rank {rank} stream"))
        );
        assert_eq!(
            r.state.user::<serde_json::Value>().expect("user"),
            Some(serde_json::json!({ "best_loss": 0.25 }))
        );
        assert_eq!(r.info.framework_version, env!("CARGO_PKG_VERSION"));
    }
}

#[test]
fn per_rank_rng_ids_and_payload_round_trip_by_broadcast() {
    per_rank_round_trip(false);
}

#[test]
fn per_rank_rng_ids_and_payload_round_trip_on_a_shared_filesystem() {
    per_rank_round_trip(true);
}

#[test]
fn optimizer_state_is_restored_exactly() {
    // Train one Adam step, save, load into a fresh optimizer: the next step matches exactly.
    let dir = tempfile::tempdir().expect("tempdir");
    run_ranks(1, |pg| {
        let device = Default::default();
        let ckpt = Checkpointer::new(CheckpointConfig::new(dir.path()), pg).expect("new");
        let step = |model: Mlp<B>, optim: &mut Adam, idx: &[usize]| {
            let (x, y) = batch(idx, &device);
            let loss = burn::nn::loss::MseLoss::new().forward(
                model.forward(x, true),
                y,
                burn::nn::loss::Reduction::Mean,
            );
            let grads = burn::optim::GradientsParams::from_grads::<B, _>(loss.backward(), &model);
            optim.step(LR, model, grads)
        };
        let mut optim = adam();
        let model = step(Mlp::<B>::new(&device, 4), &mut optim, &[0, 1, 2]);
        ckpt.save(&model, &optim, &TrainingState::new(0, 1))
            .expect("save");
        let expected = flat_params(&step(model, &mut optim, &[3, 4, 5]));

        let (mut restored, mut restored_optim) = (Mlp::<B>::new(&device, 4), adam());
        ckpt.load_latest(&device, &mut restored, &mut restored_optim)
            .expect("load");
        let got = flat_params(&step(restored, &mut restored_optim, &[3, 4, 5]));
        assert!(
            bitwise_eq(&got, &expected),
            "the step after the resume is the same step"
        );
        let (mut fresh_model, mut fresh_optim) = (Mlp::<B>::new(&device, 4), adam());
        ckpt.load_latest(&device, &mut fresh_model, &mut adam())
            .expect("load");
        let without = flat_params(&step(fresh_model, &mut fresh_optim, &[3, 4, 5]));
        assert!(
            !bitwise_eq(&without, &expected),
            "control: without Adam's moments the step differs"
        );
    });
}

#[test]
fn run_config_changes_warn_or_fail_when_strict() {
    let dir = tempfile::tempdir().expect("tempdir");
    #[derive(serde::Serialize)]
    struct Run {
        lr: f64,
    }
    run_ranks(2, |pg| {
        let config = CheckpointConfig::new(dir.path())
            .with_run_config(&Run { lr: 0.1 })
            .expect("hash");
        let ckpt = Checkpointer::new(config, pg.clone()).expect("new");
        save_at(&ckpt, TrainingState::new(0, 1));
    });
    let changed = || {
        CheckpointConfig::new(dir.path())
            .with_run_config(&Run { lr: 0.2 })
            .expect("hash")
    };
    let lenient = run_ranks(2, |pg| {
        let ckpt = Checkpointer::new(changed(), pg).expect("new");
        capture_logs(|| load_latest(&ckpt).0)
    });
    assert!(lenient[0].0.resumed().is_some());
    assert!(
        lenient[0].1.contains("run config changed"),
        "{}",
        lenient[0].1
    );
    let strict = run_ranks(2, |pg| {
        let ckpt = Checkpointer::new(changed().with_strict_run_config(true), pg).expect("new");
        let device = Default::default();
        ckpt.load_latest(&device, &mut Mlp::<B>::new(&device, 4), &mut adam())
            .expect_err("strict mismatch")
    });
    for e in strict {
        assert!(
            matches!(e, CheckpointError::RunConfigMismatch { .. }),
            "{e}"
        );
    }
}
