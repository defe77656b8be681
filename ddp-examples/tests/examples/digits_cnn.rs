//! The SyncBatchNorm CNN example as a user runs it: 3 processes (so the 359 test images do not
//! split evenly), exact evaluation.
use crate::common::{clean_command, output, percent_after};

#[test]
fn digits_cnn_with_sync_batch_norm_learns_and_counts_each_test_image_once() {
    let mut cmd = clean_command(env!("CARGO_BIN_EXE_digits_cnn"));
    cmd.args(["--nproc-per-node", "3", "--epochs", "3"]);
    let (ok, out, err) = output(cmd);
    assert!(ok, "digits_cnn failed:\n{out}\n{err}");
    assert!(err.contains("synchronised batch norm"), "{err}");
    let accuracy = percent_after(&out, "test accuracy");
    assert!(accuracy >= 90.0, "accuracy {accuracy}% below 90%:\n{out}");
    assert!(
        out.contains("on 359 images (each counted once, 359 test images)"),
        "every test image counted exactly once:\n{out}"
    );
}
