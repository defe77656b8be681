//! How a round ended ([`RoundEnd`]), and its text in the store's `r/<n>/end` (first writer
//! wins, so every node reads the same end) and in the summary.

/// Why a round ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum RoundEnd {
    /// A node failed, died or left; counts against `--max-restarts`.
    Failure(String),
    /// A node asked to join; does not count.
    NodeJoined(String),
    /// A member left before the round started (it withdrew as the round closed with it); does
    /// not count: the round ran no training worth restarting.
    MemberLeft(String),
    /// Every member's workers succeeded: the job is done.
    Completed,
}

impl RoundEnd {
    pub(super) fn encode(&self) -> String {
        match self {
            RoundEnd::Failure(why) => format!("failure|{why}"),
            RoundEnd::NodeJoined(why) => format!("joined|{why}"),
            RoundEnd::MemberLeft(why) => format!("left|{why}"),
            RoundEnd::Completed => "completed|every node's workers succeeded".into(),
        }
    }

    pub(super) fn decode(raw: &[u8]) -> RoundEnd {
        let text = String::from_utf8_lossy(raw);
        match text.split_once('|') {
            Some(("joined", why)) => RoundEnd::NodeJoined(why.to_string()),
            Some(("left", why)) => RoundEnd::MemberLeft(why.to_string()),
            Some(("completed", _)) => RoundEnd::Completed,
            Some((_, why)) => RoundEnd::Failure(why.to_string()),
            None => RoundEnd::Failure(text.into_owned()),
        }
    }

    /// What the summary says.
    pub(crate) fn describe(&self) -> String {
        match self {
            RoundEnd::Failure(why) => format!("failure: {why}"),
            RoundEnd::NodeJoined(why) => format!("node joined: {why}"),
            RoundEnd::MemberLeft(why) => format!("member left: {why}"),
            RoundEnd::Completed => "completed: every node's workers succeeded".into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_ends_survive_the_store_and_say_what_happened() {
        for end in [
            RoundEnd::Failure("node a: rank 1 exited with code 1".into()),
            RoundEnd::NodeJoined("1 node(s) asked to join".into()),
            RoundEnd::MemberLeft("a:1 was interrupted by SIGTERM before round 0 started".into()),
            RoundEnd::Completed,
        ] {
            assert_eq!(RoundEnd::decode(end.encode().as_bytes()), end);
        }
        assert!(
            RoundEnd::Failure("x | y".into())
                .describe()
                .starts_with("failure: x | y")
        );
    }
}
