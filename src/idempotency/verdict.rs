//! The verdict on a request under an idempotency key: the rule that the write path and the
//! admin actions both follow, in one place.

/// How a request is judged against what its key already holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict<T> {
    /// The key held nothing: this request acted, and `T` is its answer (now saved under the key).
    New(T),
    /// The key holds this same request: its first answer, given again; nothing more is done.
    Replay(T),
    /// The key holds another request: refused, nothing done.
    Conflict,
}

impl<T> Verdict<T> {
    /// The verdict on a request whose hash is `request_hash` for a key that already holds the
    /// request hashed `saved_hash` and its answer (`saved`, read only for a replay): the same
    /// request is a replay, another one a conflict.
    pub fn of_saved<H: PartialEq + ?Sized>(
        saved_hash: &H,
        request_hash: &H,
        saved: impl FnOnce() -> T,
    ) -> Self {
        if saved_hash == request_hash {
            Verdict::Replay(saved())
        } else {
            Verdict::Conflict
        }
    }

    /// The same verdict with its answer turned by `convert`, which may fail.
    pub fn try_map<U, E>(self, convert: impl FnOnce(T) -> Result<U, E>) -> Result<Verdict<U>, E> {
        Ok(match self {
            Verdict::New(answer) => Verdict::New(convert(answer)?),
            Verdict::Replay(answer) => Verdict::Replay(convert(answer)?),
            Verdict::Conflict => Verdict::Conflict,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_request_is_a_replay_and_another_a_conflict() {
        assert_eq!(Verdict::of_saved("a", "a", || 1), Verdict::Replay(1));
        assert_eq!(
            Verdict::of_saved("a", "b", || -> i32 { panic!("a conflict reads no answer") }),
            Verdict::Conflict
        );
        let parsed: Result<Verdict<i32>, std::num::ParseIntError> =
            Verdict::Replay("7").try_map(str::parse);
        assert_eq!(parsed, Ok(Verdict::Replay(7)));
    }
}
