//! The model file opens in Python's `safetensors` with module paths as tensor names, and the
//! shapes and values are the Rust model's.
use crate::common::*;
use burn::module::{Module, ModuleVisitor, Param};
use burn::optim::AdamConfig;
use burn::tensor::Tensor;
use ddp_core::checkpoint::{CheckpointConfig, FullCheckpointer, MODEL_FILE, TrainingState};
use std::collections::BTreeMap;
use std::process::Command;

const SCRIPT: &str = r#"
import json, sys
from safetensors import safe_open
out = {}
with safe_open(sys.argv[1], framework="numpy") as f:
    for name in f.keys():
        t = f.get_tensor(name)
        out[name] = {"shape": list(t.shape), "dtype": str(t.dtype), "values": [float(v) for v in t.reshape(-1)]}
print(json.dumps(out))
"#;

/// Every float parameter by module path: shape and values.
fn rust_tensors(model: &Mlp<B>) -> BTreeMap<String, (Vec<usize>, Vec<f32>)> {
    struct Collect {
        path: Vec<String>,
        out: BTreeMap<String, (Vec<usize>, Vec<f32>)>,
    }
    impl ModuleVisitor<B> for Collect {
        fn enter_module(&mut self, name: &str, _: &str) {
            self.path.push(name.to_string());
        }
        fn exit_module(&mut self, _: &str, _: &str) {
            self.path.pop();
        }
        fn visit_float<const D: usize>(&mut self, p: &Param<Tensor<B, D>>) {
            let v = p.val();
            let values = v
                .clone()
                .into_data()
                .convert::<f32>()
                .iter::<f32>()
                .collect();
            self.out
                .insert(self.path.join("."), (v.dims().to_vec(), values));
        }
    }
    let mut c = Collect {
        path: Vec::new(),
        out: BTreeMap::new(),
    };
    model.visit(&mut c);
    c.out
}

/// python3 with safetensors and numpy, or a failure saying how to install them.
fn python() -> &'static str {
    let probe = Command::new("python3")
        .args(["-c", "import safetensors, numpy"])
        .output();
    match probe {
        Ok(out) if out.status.success() => "python3",
        Ok(out) => panic!(
            "python3 cannot import safetensors/numpy ({}); install with `python3 -m pip install safetensors numpy`",
            String::from_utf8_lossy(&out.stderr).trim()
        ),
        Err(e) => panic!("python3 is not available ({e})"),
    }
}

#[test]
#[ignore = "needs Python's safetensors and numpy (pip install safetensors numpy); .ci/run runs it"]
fn python_safetensors_reads_names_shapes_and_values() {
    let python = python();
    let dir = tempfile::tempdir().expect("tempdir");
    let model = run_ranks(1, |pg| {
        let device = Default::default();
        let ckpt =
            FullCheckpointer::new(CheckpointConfig::new(dir.path()), pg).expect("checkpointer");
        let model = Mlp::<B>::new(&device, 5);
        let optim = AdamConfig::new().init::<B, Mlp<B>>();
        let saved = ckpt
            .save(&model, &optim, &TrainingState::new(0, 7))
            .expect("save");
        (model, saved.path)
    })
    .remove(0);
    let (model, path) = model;
    let file = path.join(MODEL_FILE);
    let out = Command::new(python)
        .arg("-c")
        .arg(SCRIPT)
        .arg(&file)
        .output()
        .expect("run python3");
    assert!(
        out.status.success(),
        "python failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let py: BTreeMap<String, serde_json::Value> =
        serde_json::from_slice(&out.stdout).expect("python's json");

    let rust = rust_tensors(&model);
    let names: Vec<&String> = py.keys().collect();
    assert_eq!(
        names,
        [
            "extra.bias",
            "extra.weight",
            "fc1.bias",
            "fc1.weight",
            "fc2.bias",
            "fc2.weight"
        ],
        "tensor names are module paths"
    );
    assert_eq!(py.len(), rust.len());
    for (name, (shape, values)) in &rust {
        let t = &py[name];
        let py_shape: Vec<usize> = serde_json::from_value(t["shape"].clone()).expect("shape");
        assert_eq!(&py_shape, shape, "{name}: shape");
        assert_eq!(t["dtype"], "float32", "{name}: dtype");
        let py_values: Vec<f64> = serde_json::from_value(t["values"].clone()).expect("values");
        assert_eq!(py_values.len(), values.len(), "{name}: element count");
        for (i, (p, r)) in py_values.iter().zip(values).enumerate() {
            assert_eq!(
                (*p as f32).to_bits(),
                r.to_bits(),
                "{name}[{i}]: python {p}, rust {r}"
            );
        }
    }
    assert_eq!(rust["fc1.weight"].0, vec![6, 5]);
}
