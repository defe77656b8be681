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

/// Why a completed round ended, in the store and in the summary.
const COMPLETED: &str = "every node's workers succeeded";

impl RoundEnd {
    /// The end's tag in the store, its name in the summary, and why it came.
    fn parts(&self) -> (&'static str, &'static str, &str) {
        match self {
            RoundEnd::Failure(why) => ("failure", "failure", why),
            RoundEnd::NodeJoined(why) => ("joined", "node joined", why),
            RoundEnd::MemberLeft(why) => ("left", "member left", why),
            RoundEnd::Completed => ("completed", "completed", COMPLETED),
        }
    }

    /// The text of `r/<n>/end`: `tag|why`.
    pub(super) fn encode(&self) -> String {
        let (tag, _, why) = self.parts();
        format!("{tag}|{why}")
    }

    /// The end `r/<n>/end` holds; a text without a known tag is a failure.
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
        let (_, name, why) = self.parts();
        format!("{name}: {why}")
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

    /// The store's text and the summary's, word for word: nodes of one job read each other's
    /// ends, and the summary's words are what a user sees.
    #[test]
    fn round_ends_are_spelled_as_the_store_and_the_summary_expect() {
        let cases = [
            (
                RoundEnd::Failure("a: x".into()),
                "failure|a: x",
                "failure: a: x",
            ),
            (
                RoundEnd::NodeJoined("n".into()),
                "joined|n",
                "node joined: n",
            ),
            (RoundEnd::MemberLeft("m".into()), "left|m", "member left: m"),
            (
                RoundEnd::Completed,
                "completed|every node's workers succeeded",
                "completed: every node's workers succeeded",
            ),
        ];
        for (end, stored, described) in cases {
            assert_eq!(end.encode(), stored);
            assert_eq!(end.describe(), described);
        }
    }
}
