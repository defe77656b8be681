//! Rank 0's live progress under the launcher: rank 0 alone gets an inherited report pipe
//! (`DDP_PROGRESS_FD`) and the launcher draws the bar from it, only when its stderr should show
//! one; with stderr in a pipe, no pipe and no bar. (A terminal cannot be had in a test:
//! `DDP_PROGRESS=bar` stands for one; the decision itself is unit-tested.)
use crate::launch_common::*;

/// A worker that says whether it got a report pipe, and reports through it when it did.
const WORKER: &str = r#"
if [ -n "$DDP_PROGRESS_FD" ]; then
  printf 'begin 3 epoch 1/1\npos 2 loss 0.25 9 samples/s\n' >&"$DDP_PROGRESS_FD"
  sleep 0.3
  echo "line while the bar is shown"
  printf 'end\n' >&"$DDP_PROGRESS_FD"
fi
echo "progress fd: ${DDP_PROGRESS_FD:-none}"
"#;

fn launcher(progress: Option<&str>) -> Finished {
    let mut cmd = ddp_run();
    if let Some(p) = progress {
        cmd.env("DDP_PROGRESS", p);
    }
    cmd.args(["--nproc-per-node", "2", "--", "sh", "-c", WORKER]);
    run(cmd)
}

#[test]
fn forced_bar_rank_0_reports_through_its_pipe_and_the_launcher_draws() {
    let out = launcher(Some("bar"));
    assert!(out.status.success(), "{}", out.all());
    let fd_line = out
        .stdout
        .lines()
        .find(|l| l.starts_with("[rank 0]: progress fd: "))
        .unwrap_or_else(|| panic!("{}", out.all()));
    let fd: i32 = fd_line["[rank 0]: progress fd: ".len()..]
        .parse()
        .unwrap_or_else(|_| panic!("rank 0 gets a descriptor number: {}", out.all()));
    assert!(fd > 2, "{fd}");
    assert!(
        out.stdout.contains("[rank 1]: progress fd: none"),
        "only rank 0 reports:\n{}",
        out.all()
    );
    // The launcher drew the bar from rank 0's reports (rank 0 itself wrote no ANSI sequence),
    // and rank 0's line went above it.
    assert!(
        out.stderr.contains("[rank 0]: epoch 1/1 [") && out.stderr.contains("2/3 loss 0.25"),
        "{:?}",
        out.stderr
    );
    assert!(
        out.stderr.contains("\x1b[2K"),
        "the bar is cleared: {:?}",
        out.stderr
    );
    assert!(
        out.stdout.contains("[rank 0]: line while the bar is shown"),
        "{}",
        out.all()
    );
}

#[test]
fn piped_stderr_gives_no_report_pipe_and_no_bar() {
    for setting in [None, Some("lines"), Some("auto")] {
        let out = launcher(setting);
        assert!(out.status.success(), "{}", out.all());
        for rank in 0..2 {
            assert!(
                out.stdout
                    .contains(&format!("[rank {rank}]: progress fd: none")),
                "{setting:?}: {}",
                out.all()
            );
        }
        assert!(
            !out.stderr.contains('\x1b') && !out.stdout.contains('\x1b'),
            "{setting:?}: no ANSI sequences into a pipe: {:?}",
            out.all()
        );
    }
}
