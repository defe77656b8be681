//! Running a job of `digits` under an external launcher and checking what it did.

use super::{latest, percent_after};
use std::io::Read;
use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

/// Generous: the machine running the tests may be loaded.
pub const DEADLINE: Duration = Duration::from_secs(240);

/// Waits for `child` (`mpirun`, `srun`...) up to [`DEADLINE`] (SIGTERM to it then, which stops
/// its processes, and a failure): (success, stdout, stderr).
pub fn finish(mut child: Child) -> (bool, String, String) {
    let mut out = child.stdout.take().expect("stdout");
    let mut err = child.stderr.take().expect("stderr");
    let read_out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = out.read_to_string(&mut s);
        s
    });
    let read_err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break Some(status);
        }
        if start.elapsed() > DEADLINE {
            // SAFETY: plain syscall on the launcher this test started.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let stdout = read_out.join().unwrap_or_default();
    let stderr = read_err.join().unwrap_or_default();
    let Some(status) = status else {
        panic!("the job did not finish within {DEADLINE:?}:\n{stdout}\n{stderr}");
    };
    (status.success(), stdout, stderr)
}

/// The checks every run shares: one job of two ranks (not two jobs of one), trained, with a
/// checkpoint written.
pub fn assert_trained(dir: &Path, out: &str, err: &str, min_accuracy: f64) {
    assert_eq!(
        out.matches("test accuracy").count(),
        1,
        "only rank 0 reports:\n{out}\n{err}"
    );
    assert!(
        out.contains("on 2 rank(s)") && err.contains("2 rank(s)"),
        "the two processes form one job:\n{out}\n{err}"
    );
    let accuracy = percent_after(out, "test accuracy");
    assert!(
        accuracy >= min_accuracy,
        "accuracy {accuracy}% below {min_accuracy}%:\n{out}\n{err}"
    );
    let name = latest(dir).unwrap_or_else(|| panic!("no checkpoint:\n{out}\n{err}"));
    for file in ["model.safetensors", "optimizer.bin", "training_state.json"] {
        assert!(
            dir.join(&name).join(file).is_file(),
            "{file} missing in {name}"
        );
    }
    assert!(
        out.contains(&format!("checkpoint: {}", dir.join(&name).display())),
        "{out}"
    );
}
