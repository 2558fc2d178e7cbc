//! The states of an outbox event, each defined once, as the SQL condition that tells it on a row
//! of `outbox_events` (macros, so that a statement is still one string literal, built with
//! `concat!`). Each takes an optional table alias: `unsent!()` or `unsent!("e")`.
//!
//! An event is **unsent** from its write until a relay records the broker's confirm: due now,
//! due later (backing off after a failed attempt), or **held** (due at `infinity`: an ordered
//! event whose key's earlier events are not all done; a relay releases it). After
//! `outbox.max_attempts` failed attempts it is **parked** (`failed_at` set) until retried.
//! It ends **sent** (`sent_at` set), or **skipped** by an operator (never published; `failed_at`
//! set too, so that no relay takes it). An event is **done** once sent or skipped: what an
//! ordering key's next event waits for.
//!
//! The conditions are those of the partial indexes that find each state (`outbox_events_due`:
//! unsent; `outbox_events_parked`: parked or skipped; `outbox_events_sent`: sent;
//! `outbox_events_ordered_unsent`: not done, of an ordering key), so that the planner sees a
//! statement's condition imply its index's.

/// Delivered: the broker confirmed it, and a relay recorded that.
macro_rules! sent {
    () => {
        "sent_at IS NOT NULL"
    };
    ($table:literal) => {
        concat!($table, ".sent_at IS NOT NULL")
    };
}

/// Still to be delivered by a relay (due now or later, or held); not parked, nor skipped.
macro_rules! unsent {
    () => {
        "sent_at IS NULL AND failed_at IS NULL"
    };
    ($table:literal) => {
        concat!(
            $table,
            ".sent_at IS NULL AND ",
            $table,
            ".failed_at IS NULL"
        )
    };
}

/// Given up on by the relays after `outbox.max_attempts`, waiting for a retry (or a skip).
macro_rules! parked {
    () => {
        "sent_at IS NULL AND failed_at IS NOT NULL AND skipped_at IS NULL"
    };
    ($table:literal) => {
        concat!(
            $table,
            ".sent_at IS NULL AND ",
            $table,
            ".failed_at IS NOT NULL AND ",
            $table,
            ".skipped_at IS NULL"
        )
    };
}

/// Given up on for good by an operator: never published.
macro_rules! skipped {
    () => {
        "sent_at IS NULL AND failed_at IS NOT NULL AND skipped_at IS NOT NULL"
    };
    ($table:literal) => {
        concat!(
            $table,
            ".sent_at IS NULL AND ",
            $table,
            ".failed_at IS NOT NULL AND ",
            $table,
            ".skipped_at IS NOT NULL"
        )
    };
}

/// Neither sent nor skipped (unsent or parked): what the later events of its ordering key wait
/// behind.
macro_rules! not_done {
    () => {
        "sent_at IS NULL AND skipped_at IS NULL"
    };
    ($table:literal) => {
        concat!(
            $table,
            ".sent_at IS NULL AND ",
            $table,
            ".skipped_at IS NULL"
        )
    };
}

/// The `next_attempt_at` of a held event: due never, until a relay (or a skip) releases it.
macro_rules! held_until {
    () => {
        "'infinity'::timestamptz"
    };
}

/// Of an unsent event: held behind the earlier events of its ordering key (see
/// [`held_until!`]).
macro_rules! held {
    () => {
        concat!(
            "next_attempt_at = ",
            $crate::db::outbox_state::held_until!()
        )
    };
    ($table:literal) => {
        concat!(
            $table,
            ".next_attempt_at = ",
            $crate::db::outbox_state::held_until!()
        )
    };
}

pub(crate) use {held, held_until, not_done, parked, sent, skipped, unsent};

#[cfg(test)]
mod tests {
    #[test]
    fn each_state_reads_the_same_with_a_table_alias() {
        for (bare, aliased) in [
            (sent!(), sent!("e")),
            (unsent!(), unsent!("e")),
            (parked!(), parked!("e")),
            (skipped!(), skipped!("e")),
            (not_done!(), not_done!("e")),
            (held!(), held!("e")),
        ] {
            let mut words = bare.split(' ');
            let mut aliased_words = aliased.split(' ');
            loop {
                match (words.next(), aliased_words.next()) {
                    (None, None) => break,
                    (Some(word), Some(with_alias)) if word.ends_with("_at") => {
                        assert_eq!(with_alias, format!("e.{word}"))
                    }
                    (word, with_alias) => assert_eq!(word, with_alias),
                }
            }
        }
    }
}
