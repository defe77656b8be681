//! The collective behaviour of save and load: step agreement, per-rank rng state, parameter
//! ids, broadcast vs shared filesystem, exact optimizer state, the run-config hash.
use crate::checkpoint_common::*;
use crate::common::*;
use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::Optimizer;
use burn::tensor::Tensor;
use ddp_core::checkpoint::{
    CheckpointConfig, CheckpointError, FullCheckpointer, PARAM_IDS_FILE, Resumed, TrainingState,
    checkpoint_name,
};
use std::collections::BTreeMap;

#[test]
fn ranks_saving_different_steps_fail_together() {
    let dir = tempfile::tempdir().expect("tempdir");
    let errors = run_ranks(2, |pg| {
        let ckpt =
            FullCheckpointer::new(CheckpointConfig::new(dir.path()), pg.clone()).expect("new");
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
        let ckpt = FullCheckpointer::new(config.clone(), pg.clone()).expect("new");
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
        let ckpt = FullCheckpointer::new(config.clone(), pg.clone()).expect("new");
        let (outcome, model) = load_latest_fresh(&ckpt);
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
        let ckpt = FullCheckpointer::new(CheckpointConfig::new(dir.path()), pg).expect("new");
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
        let ckpt = FullCheckpointer::new(config, pg.clone()).expect("new");
        save_random(&ckpt, TrainingState::new(0, 1));
    });
    let changed = || {
        CheckpointConfig::new(dir.path())
            .with_run_config(&Run { lr: 0.2 })
            .expect("hash")
    };
    let lenient = run_ranks(2, |pg| {
        let ckpt = FullCheckpointer::new(changed(), pg).expect("new");
        capture_logs(|| load_latest_fresh(&ckpt).0)
    });
    assert!(lenient[0].0.resumed().is_some());
    assert!(
        lenient[0].1.contains("run config changed"),
        "{}",
        lenient[0].1
    );
    let strict = run_ranks(2, |pg| {
        let ckpt = FullCheckpointer::new(changed().with_strict_run_config(true), pg).expect("new");
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
