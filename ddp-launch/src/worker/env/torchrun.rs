//! The environment of `ddp-run` / [`launch`](crate::launch) and of torchrun (or a user setting
//! `RANK` and `WORLD_SIZE` by hand): the job's own variable names.

use super::{DEFAULT_MASTER_PORT, LauncherKind, Vars, WorkerEnv, derived_port, master_addr};
use crate::error::LaunchError;

/// The worker that torchrun-style variables describe; `ours` when `DDP_LAUNCH_WORKER=1` (the
/// ddp launcher) rather than torchrun or a user.
pub(super) fn from_torchrun(v: &Vars<'_>, ours: bool) -> Result<WorkerEnv, LaunchError> {
    let (launcher, name) = if ours {
        (LauncherKind::DdpRun, "the ddp launcher")
    } else {
        (LauncherKind::Torchrun, "torchrun")
    };
    let rank: usize = v.required("RANK", name)?;
    let world_size: usize = v.required("WORLD_SIZE", name)?;
    let local_rank = v.number("LOCAL_RANK")?;
    let local_world_size = match (v.number("LOCAL_WORLD_SIZE")?, local_rank) {
        (Some(n), _) => n,
        // As before: a script that sets LOCAL_RANK (an srun wrapper, say) names the device.
        (None, Some(_)) => world_size,
        (None, None) => one_host_or_error(v, world_size)?,
    };
    // torchrun places ranks node by node.
    let local_rank = local_rank.unwrap_or(rank % local_world_size.max(1));
    let node_rank = match v.number("GROUP_RANK")? {
        Some(n) => n,
        None => rank / local_world_size.max(1),
    };
    let (job_token, timeout, restart_count) = v.common()?;
    Ok(WorkerEnv {
        launcher,
        rank,
        world_size,
        local_rank,
        local_world_size,
        node_rank,
        master_addr: master_addr(v, local_world_size, world_size, name)?,
        master_port: store_port(v, ours)?,
        restart_count,
        job_token,
        timeout,
    })
}

/// The local world size when neither `LOCAL_WORLD_SIZE` nor `LOCAL_RANK` is set: the whole
/// world, on one host. Not when `MASTER_ADDR` names another host (Kubeflow's PyTorchJob and
/// hand-written scripts set only `RANK`, `WORLD_SIZE` and `MASTER_ADDR`): a guess would put
/// every rank's device index at its global rank, so that is an error naming the variables.
fn one_host_or_error(v: &Vars<'_>, world_size: usize) -> Result<usize, LaunchError> {
    let Some(addr) = v.get("MASTER_ADDR") else {
        return Ok(world_size);
    };
    let loopback = addr.eq_ignore_ascii_case("localhost")
        || addr
            .parse::<std::net::IpAddr>()
            .is_ok_and(|ip| ip.is_loopback());
    if loopback || world_size == 1 {
        return Ok(world_size);
    }
    Err(LaunchError::worker_env(
        "LOCAL_WORLD_SIZE",
        format!(
            "is not set, nor LOCAL_RANK, and MASTER_ADDR is {addr}, not loopback, so the \
             {world_size} ranks may run on several hosts and the device each uses is unknown: set \
             LOCAL_RANK and LOCAL_WORLD_SIZE for each process (for one process per host, \
             LOCAL_RANK=0 LOCAL_WORLD_SIZE=1)"
        ),
    ))
}

/// The port of this job's store. torchrun's agent hosts a store of its own on `MASTER_PORT`
/// and tells workers to use it (`TORCHELASTIC_USE_AGENT_STORE=True`, torch 2.x, with static
/// and c10d rendezvous alike); ours speaks another protocol, so under torchrun it takes a port
/// derived from `MASTER_PORT` alone (in [`DERIVED_PORTS`](super::worker_env::DERIVED_PORTS)),
/// instead of failing to bind. Only `MASTER_PORT` is sure to be the same on every node: torchrun's
/// agents do not agree on restart counts, nor check that their run ids match.
fn store_port(v: &Vars<'_>, ours: bool) -> Result<u16, LaunchError> {
    let master_port = v.port()?.unwrap_or(DEFAULT_MASTER_PORT);
    let agent_store = v
        .get("TORCHELASTIC_USE_AGENT_STORE")
        .is_some_and(|s| s.eq_ignore_ascii_case("true") || s == "1");
    if ours || !agent_store {
        return Ok(master_port);
    }
    let spread = u64::from(master_port).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    let port = match derived_port(spread) {
        taken if taken == master_port => derived_port(spread.wrapping_add(1)),
        port => port,
    };
    tracing::info!(
        master_port,
        store_port = port,
        "torchrun's agent holds MASTER_PORT for its own store; this job's store takes a derived port"
    );
    Ok(port)
}

#[cfg(test)]
mod tests {
    use super::super::tests::{placement, refusal, worker};
    use super::super::*;
    use crate::worker::env::launcher_vars::{RESTART_COUNT_ENV, WORKER_ENV};
    use ddp_comm::{TIMEOUT_ENV, TOKEN_ENV};

    #[test]
    fn ddp_launcher_environment_is_read_completely() {
        let env = worker(&[
            (WORKER_ENV, "1"),
            ("RANK", "3"),
            ("WORLD_SIZE", "4"),
            ("LOCAL_RANK", "1"),
            ("LOCAL_WORLD_SIZE", "2"),
            ("GROUP_RANK", "1"),
            ("MASTER_ADDR", "10.0.0.1"),
            ("MASTER_PORT", "1234"),
            (RESTART_COUNT_ENV, "2"),
            (TOKEN_ENV, "tok"),
            (TIMEOUT_ENV, "30"),
        ]);
        assert_eq!(env.launcher, LauncherKind::DdpRun);
        assert_eq!(placement(&env), (3, 4, 1, 2, 1));
        assert_eq!(
            (env.master_addr.as_str(), env.master_port),
            ("10.0.0.1", 1234)
        );
        assert_eq!(env.restart_count, 2);
        assert!(env.is_restart());
        assert_eq!(env.job_token.as_deref(), Some("tok"));
        assert_eq!(env.timeout, Some(Duration::from_secs(30)));
        assert!(
            !format!("{env:?}").contains("tok\""),
            "the token is not printed"
        );
    }

    #[test]
    fn torchrun_style_defaults_fill_in_local_values() {
        let env = worker(&[
            ("RANK", "1"),
            ("WORLD_SIZE", "2"),
            ("TORCHELASTIC_RESTART_COUNT", "1"),
        ]);
        assert_eq!(env.launcher, LauncherKind::Torchrun);
        assert_eq!(
            (env.local_rank, env.local_world_size, env.node_rank),
            (1, 2, 0)
        );
        let first = worker(&[("RANK", "1"), ("WORLD_SIZE", "2")]);
        assert!(!first.is_restart(), "no restart count: the first attempt");
        assert_eq!(
            (env.master_addr.as_str(), env.master_port),
            ("127.0.0.1", DEFAULT_MASTER_PORT)
        );
        assert_eq!(env.restart_count, 1);
    }

    #[test]
    fn under_torchrun_s_agent_store_the_job_s_store_takes_a_port_every_worker_derives_alike() {
        let torchrun = |rank: &str, restart: &str| {
            worker(&[
                ("RANK", rank),
                ("WORLD_SIZE", "2"),
                ("MASTER_PORT", "29500"),
                ("TORCHELASTIC_RUN_ID", "none"),
                ("TORCHELASTIC_RESTART_COUNT", restart),
                ("TORCHELASTIC_USE_AGENT_STORE", "True"),
            ])
            .master_port
        };
        let port = torchrun("0", "0");
        assert_ne!(port, 29500, "torchrun's agent holds MASTER_PORT");
        assert!(super::super::DERIVED_PORTS.contains(&port), "{port}");
        assert_eq!(torchrun("1", "0"), port, "every rank derives the same port");
        assert_eq!(
            torchrun("1", "1"),
            port,
            "also one whose agent counted a restart"
        );
        // The ddp launcher's workers, and torchrun without an agent store, use MASTER_PORT.
        let plain = worker(&[("RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_PORT", "29500")]);
        assert_eq!(plain.master_port, 29500);
    }

    #[test]
    fn local_placement_is_derived_from_the_local_world_size_or_asked_for() {
        // Rank 3 of 4, rank 0 on another host, and `local` (LOCAL_* variables).
        let rank_3_of_4 = |local: &[(&'static str, &'static str)]| {
            let base = [
                ("RANK", "3"),
                ("WORLD_SIZE", "4"),
                ("MASTER_ADDR", "node0"),
                (TOKEN_ENV, "secret"),
            ];
            [&base[..], local].concat()
        };
        // LOCAL_RANK follows from LOCAL_WORLD_SIZE, node by node, as torchrun places ranks.
        let env = worker(&rank_3_of_4(&[("LOCAL_WORLD_SIZE", "2")]));
        assert_eq!((env.local_rank, env.node_rank), (1, 1));
        // Neither, with rank 0 on another host (Kubeflow's PyTorchJob): an error naming them.
        let e = refusal(&rank_3_of_4(&[]));
        assert!(
            e.starts_with("LOCAL_WORLD_SIZE: is not set, nor LOCAL_RANK, and MASTER_ADDR is node0"),
            "{e}"
        );
        assert!(e.contains("LOCAL_RANK=0 LOCAL_WORLD_SIZE=1"), "{e}");
        // LOCAL_RANK alone (an srun wrapper exporting SLURM_LOCALID): taken as before.
        let env = worker(&rank_3_of_4(&[("LOCAL_RANK", "1")]));
        assert_eq!((env.local_rank, env.local_world_size), (1, 4));
        // On loopback, one host: the whole world is local.
        let env = worker(&[
            ("RANK", "3"),
            ("WORLD_SIZE", "4"),
            ("MASTER_ADDR", "127.0.0.1"),
        ]);
        assert_eq!((env.local_rank, env.local_world_size), (3, 4));
    }

    #[test]
    fn bad_launcher_variables_are_named() {
        let e = refusal(&[(WORKER_ENV, "1"), ("WORLD_SIZE", "2")]);
        assert_eq!(
            e,
            "RANK: is not set, but the ddp launcher sets it for every worker"
        );
        let e = refusal(&[("RANK", "x"), ("WORLD_SIZE", "2")]);
        assert_eq!(e, "RANK: 'x' is not a non-negative integer");
        let e = refusal(&[("RANK", "2"), ("WORLD_SIZE", "2")]);
        assert_eq!(e, "RANK: rank 2 is outside 0..2");
        let e = refusal(&[
            ("RANK", "0"),
            ("WORLD_SIZE", "4"),
            ("LOCAL_WORLD_SIZE", "2"),
        ]);
        assert!(
            e.starts_with("MASTER_ADDR: is not set, and torchrun placed ranks on several nodes"),
            "{e}"
        );
        let e = refusal(&[("RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_PORT", "0")]);
        assert_eq!(e, "MASTER_PORT: port 0 is not allowed");
    }
}
