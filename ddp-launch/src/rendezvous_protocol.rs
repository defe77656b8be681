//! The version of the launchers' rendezvous keys, which both rendezvous (a static job's,
//! `rendezvous/`, and elastic rounds, `supervise/elastic/`) append to the settings every node
//! must match: launchers of different versions misread each other's keys, so they refuse to
//! share a job instead, naming both versions.
//!
//! Version 1: before versions were recorded (settings without one). Version 2: a static job's
//! node claims keep a heartbeat and a node can rejoin; an elastic round's `closed` holds the
//! members' join indices and joiners withdraw. Bump it whenever a launcher would misread an
//! older one's keys.

/// This launcher's rendezvous protocol.
pub(crate) const PROTOCOL: u32 = 2;

/// What precedes the version in the settings.
const TAG: &str = " (rendezvous protocol ";

/// `settings` (what shapes the job) with this launcher's [`PROTOCOL`].
pub(crate) fn with_protocol(settings: &str) -> String {
    format!("{settings}{TAG}{PROTOCOL})")
}

/// [`with_protocol`]'s result split back into the settings and the version (1 when there is
/// none: a launcher from before versions were recorded).
pub(crate) fn split_protocol(config: &str) -> (&str, u32) {
    config
        .strip_suffix(')')
        .and_then(|c| c.rsplit_once(TAG))
        .and_then(|(settings, v)| Some((settings, v.parse().ok()?)))
        .unwrap_or((config, 1))
}

/// The words for a refusal when `theirs` (the first node's settings) has another protocol
/// than this launcher's: `None` when the versions agree.
pub(crate) fn protocol_mismatch(theirs: &str) -> Option<String> {
    let (_, version) = split_protocol(theirs);
    (version != PROTOCOL).then(|| {
        let before = if version == 1 {
            " (a ddp-launch from before the versions were recorded)"
        } else {
            ""
        };
        format!(
            "the first node's launcher speaks rendezvous protocol {version}{before}, this one \
             rendezvous protocol {PROTOCOL}: launchers of different protocols cannot share a \
             job (run the same ddp-launch version on every node)"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_keep_their_version_and_older_launchers_read_as_version_1() {
        let shape = "--nnodes 2 --nproc-per-node 1 --max-restarts 0";
        assert_eq!(split_protocol(&with_protocol(shape)), (shape, PROTOCOL));
        assert_eq!(split_protocol(shape), (shape, 1));
        assert_eq!(protocol_mismatch(&with_protocol(shape)), None);
        let newer = format!("{shape}{TAG}{})", PROTOCOL + 1);
        let said = protocol_mismatch(&newer).expect("another version");
        assert!(
            said.contains(&format!("speaks rendezvous protocol {},", PROTOCOL + 1))
                && said.contains(&format!("this one rendezvous protocol {PROTOCOL}")),
            "{said}"
        );
        let said = protocol_mismatch(shape).expect("version 1");
        assert!(
            said.contains("speaks rendezvous protocol 1 (a ddp-launch from before"),
            "{said}"
        );
    }
}
