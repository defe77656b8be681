//! The plan's tests: validating the flags into a plan, and the plans and hosts that the tests
//! of the files beside this one share.

use crate::error::LaunchError;
use crate::plan::args::{LaunchArgs, NprocPerNode};
use crate::plan::host::HostInfo;
use crate::plan::program::WorkerCommand;
use crate::plan::{LaunchPlan, MasterPort};
use ddp_comm::TOKEN_ENV;
use std::collections::HashMap;

pub(super) fn command() -> WorkerCommand {
    WorkerCommand {
        program: "/bin/true".into(),
        arg0: "true".into(),
        args: vec![],
    }
}

pub(super) fn host(cores: usize, vars: &[(&str, &str)]) -> HostInfo {
    HostInfo {
        cores,
        process_limit: None,
        vars: vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    }
}

pub(super) fn plan(args: &LaunchArgs) -> Result<LaunchPlan, LaunchError> {
    LaunchPlan::with_host(args, command(), &host(8, &[]))
}

/// A valid plan for `args` on a host with `cores` cores and the variables `vars`.
pub(super) fn valid_plan(args: &LaunchArgs, cores: usize, vars: &[(&str, &str)]) -> LaunchPlan {
    LaunchPlan::with_host(args, command(), &host(cores, vars)).expect("valid")
}

pub(super) fn env_of(plan: &LaunchPlan, local_rank: usize) -> HashMap<String, String> {
    plan.worker_env(local_rank, 2, 4242).into_iter().collect()
}

/// Asserts that `env` holds each of `expected`'s variables with its value.
pub(super) fn assert_vars(env: &HashMap<String, String>, expected: &[(&str, &str)]) {
    for (k, v) in expected {
        assert_eq!(env.get(*k).map(String::as_str), Some(*v), "{k}");
    }
}

/// The environment of local rank 0 of [`valid_plan`]`(args, cores, vars)`.
pub(super) fn first_env(
    args: &LaunchArgs,
    cores: usize,
    vars: &[(&str, &str)],
) -> HashMap<String, String> {
    env_of(&valid_plan(args, cores, vars), 0)
}

#[test]
fn defaults_are_one_process_on_one_node_with_an_auto_port() {
    let p = plan(&LaunchArgs::new()).expect("valid");
    assert_eq!((p.world_size(), p.nnodes(), p.node_rank()), (1, 1, 0));
    assert_eq!(p.master_port(), MasterPort::Auto);
    assert_eq!(p.master_addr(), "127.0.0.1");
    assert_eq!(p.job_token.len(), 32);
}

#[test]
fn auto_uses_available_cores() {
    let args = LaunchArgs::new().with_nproc_per_node(NprocPerNode::Auto);
    let p = valid_plan(&args, 6, &[]);
    assert_eq!(p.nproc_per_node(), 6);
}

#[test]
fn existing_job_token_is_inherited() {
    let p = valid_plan(&LaunchArgs::new(), 1, &[(TOKEN_ENV, "abc")]);
    assert_eq!(p.job_token, "abc");
    let q = plan(&LaunchArgs::new()).expect("valid");
    assert_ne!(
        q.job_token,
        plan(&LaunchArgs::new()).expect("valid").job_token,
        "random per job"
    );
}

#[test]
fn fixed_port_is_kept() {
    let p = plan(&LaunchArgs::new().with_master_port(1234)).expect("valid");
    assert_eq!(p.master_port(), MasterPort::Fixed(1234));
}

#[test]
fn invalid_flags_are_rejected_with_messages_naming_the_values() {
    let cases: Vec<(LaunchArgs, &str)> = vec![
        (
            LaunchArgs::new().with_nproc_per_node(NprocPerNode::Count(0)),
            "--nproc-per-node must be at least 1, got 0",
        ),
        (
            LaunchArgs::new().with_nodes(0, 0),
            "--nnodes must be at least 1, got 0",
        ),
        (
            LaunchArgs::new()
                .with_nodes(2, 2)
                .with_master_addr("h")
                .with_master_port(1),
            "--node-rank 2 is out of range for --nnodes 2 (node ranks are 0..=1)",
        ),
        (
            LaunchArgs::new().with_nodes(2, 0).with_master_port(1),
            "--master-addr is required when --nnodes is 2",
        ),
        (
            LaunchArgs::new().with_nodes(2, 0).with_master_addr("h"),
            "--master-port is required when --nnodes is 2",
        ),
        (
            LaunchArgs::new()
                .with_nodes(2, 0)
                .with_master_addr("h")
                .with_master_port(9),
            "a multi-node job (--nnodes 2) needs a shared job token: set DDP_JOB_TOKEN",
        ),
        (
            LaunchArgs::new().with_master_port(0),
            "--master-port 0 is not allowed",
        ),
        (
            LaunchArgs::new().with_standalone(true).with_nodes(2, 0),
            "--standalone runs one node on this host with a free port, but --nnodes 2 was also given",
        ),
        (
            LaunchArgs::new().with_standalone(true).with_master_port(80),
            "but --master-port 80 was also given",
        ),
        (
            // Past the per-core bound (asked for), the world size overflows.
            LaunchArgs::new()
                .with_nproc_per_node(NprocPerNode::Count(usize::MAX))
                .with_oversubscribe(true)
                .with_nodes(2, 0),
            "is too many processes",
        ),
    ];
    for (args, expected) in cases {
        let err = plan(&args).expect_err(expected).to_string();
        assert!(
            err.contains(expected),
            "{err:?} should contain {expected:?}"
        );
    }
}

#[test]
fn multi_node_with_token_addr_and_port_is_valid() {
    let args = LaunchArgs::new()
        .with_nodes(2, 1)
        .with_master_addr(" 10.1.1.1 ")
        .with_master_port(29400);
    let p = valid_plan(&args, 4, &[(TOKEN_ENV, "t")]);
    assert!(p.is_multi_node());
    assert_eq!(p.master_addr(), "10.1.1.1");
    assert_eq!(p.global_rank(0), 1);
}

/// A duration set in code beyond [`crate::MAX_DURATION`] is refused as the flag would be, not
/// left to panic in `Instant::now() + d`.
#[test]
fn durations_set_in_code_beyond_a_year_are_refused() {
    let too_long = crate::MAX_DURATION + std::time::Duration::from_secs(1);
    let cases = [
        (
            "--grace-period",
            LaunchArgs::new().with_grace_period(too_long),
        ),
        (
            "--join-timeout",
            LaunchArgs::new().with_join_timeout(too_long),
        ),
        (
            "--rdzv-last-call",
            LaunchArgs::new().with_rdzv_last_call(too_long),
        ),
        (
            "--rdzv-heartbeat-timeout",
            LaunchArgs::new().with_rdzv_heartbeat_timeout(std::time::Duration::MAX),
        ),
    ];
    for (flag, args) in cases {
        let err = plan(&args).expect_err(flag);
        assert!(
            matches!(err, LaunchError::DurationTooLong { flag: f, .. } if f == flag),
            "{flag}: {err}"
        );
        assert_eq!(err.exit_code(), 2);
        assert!(
            err.to_string()
                .contains("is longer than the maximum of 31536000 s (365 days)"),
            "{err}"
        );
    }
    let max = crate::MAX_DURATION;
    let fine = LaunchArgs::new()
        .with_grace_period(max)
        .with_join_timeout(max);
    assert!(plan(&fine).is_ok());
}

/// `DDP_NODE_TAKEOVER_SECS` reaches the plan, and a bad value is refused when the plan is made.
#[test]
fn the_takeover_grace_comes_from_the_environment_and_is_checked() {
    let args = LaunchArgs::new();
    let set = |v: &str| {
        LaunchPlan::with_host(&args, command(), &host(8, &[("DDP_NODE_TAKEOVER_SECS", v)]))
    };
    assert_eq!(
        valid_plan(&args, 8, &[]).takeover_grace,
        std::time::Duration::from_secs(15)
    );
    assert_eq!(
        set("5").expect("5 s").takeover_grace,
        std::time::Duration::from_secs(5)
    );
    let err = set("2").expect_err("below the minimum");
    assert_eq!(err.exit_code(), 2);
    assert!(
        err.to_string()
            .starts_with("DDP_NODE_TAKEOVER_SECS: '2' is shorter than the minimum of 4 s"),
        "{err}"
    );
}
