//! Connection strings as logs and messages show them: where they point, never a password.
//!
//! A string is read by the parser that the daemon connects with, and shown rebuilt from the
//! parts that parser found, so that no text of the input is copied through unread:
//!
//! - a PostgreSQL URL or `key=value` string as [`DatabaseUrl`] reads it (libpq's grammar: the
//!   user info runs to the first `@`, so a password may hold `?`, `/` or `#` unencoded), shown
//!   as that parsed value shows itself. The `url` crate reads such a URL differently
//!   (`u:123/x@db` as host `u`, port 123 and path `/x@db`), so its parts could show a password;
//! - an AMQP URL as the `url` crate reads it, which is lapin's parser.
//!
//! The query string is never shown (it may carry `password=`). A string that does not parse is
//! shown as [`UNPARSABLE`], with none of its text; so is a PostgreSQL URL that
//! [`DatabaseUrl::parse`] refuses because only a password typed unencoded explains it (an `@`
//! after the one that ends the user info; a user name holding `/`, `?`, `=` or `&`).

use std::fmt::Write as _;

use crate::config::DatabaseUrl;

/// What a connection string that cannot be shown safely is shown as.
pub const UNPARSABLE: &str = "<unparsable url>";

/// What stands for a password.
const MASK: &str = "***";

/// Shows a connection string (a `postgres://`, `postgresql://`, `amqp://` or `amqps://` URL, or
/// libpq's `key=value` pairs) without its password and without its query string.
pub fn redact_url(url: &str) -> String {
    let postgres = url.starts_with("postgres://") || url.starts_with("postgresql://");
    let shown = if has_scheme(url) && !postgres {
        other_url(url)
    } else if postgres || url.contains('=') {
        DatabaseUrl::parse(url).ok().map(|url| url.to_string())
    } else {
        None
    };
    shown.unwrap_or_else(|| UNPARSABLE.to_owned())
}

/// An AMQP URL (or one of a scheme the daemon refuses) as the `url` crate, lapin's parser,
/// reads it. An `@` after the host means a password typed unencoded (`amqp://u:12/x@mq` reads
/// as port 12 and path `/x@mq`), so nothing is shown then.
fn other_url(text: &str) -> Option<String> {
    let url = url::Url::parse(text).ok()?;
    let host = url.host_str()?;
    let after_host = [Some(url.path()), url.query(), url.fragment()];
    if after_host
        .into_iter()
        .flatten()
        .any(|part| part.contains('@'))
    {
        return None;
    }
    let mut shown = format!("{}://", url.scheme());
    let user = url.username();
    let password = url.password().is_some();
    shown.push_str(user);
    if password {
        let _ = write!(shown, ":{MASK}");
    }
    if !user.is_empty() || password {
        shown.push('@');
    }
    shown.push_str(host);
    if let Some(port) = url.port() {
        let _ = write!(shown, ":{port}");
    }
    shown.push_str(url.path());
    Some(shown)
}

/// Whether `text` starts with a URL scheme and `://` (a `key=value` value may hold `://`).
fn has_scheme(text: &str) -> bool {
    text.split_once("://").is_some_and(|(scheme, _)| {
        scheme.starts_with(|c: char| c.is_ascii_alphabetic())
            && scheme
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"+-.".contains(&b))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redacts_passwords() {
        assert_eq!(
            redact_url("postgres://app:secret@db:5433/x"),
            "postgres://app:***@db:5433/x"
        );
        // Every host is shown with its port, 5432 when the URL names none.
        assert_eq!(
            redact_url("postgres://app@db/x"),
            "postgres://app@db:5432/x"
        );
        assert_eq!(redact_url("postgres://db/x"), "postgres://db:5432/x");
        assert_eq!(
            redact_url("postgres://app@db/x?password=hunter2&sslmode=disable"),
            "postgres://app:***@db:5432/x"
        );
        assert_eq!(
            redact_url("postgres://db/x?password=hunter2"),
            "postgres://:***@db:5432/x"
        );
        assert_eq!(
            redact_url("amqp://guest:guest@127.0.0.1:5672/%2f?heartbeat=10"),
            "amqp://guest:***@127.0.0.1:5672/%2f"
        );
    }

    #[test]
    fn a_password_with_a_question_mark_is_not_cut_into() {
        // The old redaction cut at the first `?` before looking for the `@`, and logged
        // `postgres://u:se`.
        assert_eq!(
            redact_url("postgres://u:se?cret@host/db"),
            "postgres://u:***@host:5432/db"
        );
        assert_eq!(
            redact_url("postgresql://u:a/b#c:d@host:5433/db"),
            "postgresql://u:***@host:5433/db"
        );
        // lapin cannot read these either: nothing of them is shown.
        assert_eq!(redact_url("amqp://u:se?cret@host/%2f"), UNPARSABLE);
        assert_eq!(redact_url("amqp://u:se#cret@host/%2f"), UNPARSABLE);
        assert_eq!(redact_url("amqp://u:12/cret@host/%2f"), UNPARSABLE);
        assert_eq!(
            redact_url("amqp://u:se%3Fcret@host/%2f"),
            "amqp://u:***@host/%2f"
        );
    }

    #[test]
    fn several_hosts_and_sockets_are_shown() {
        assert_eq!(
            redact_url(
                "postgres://app:pw@db1:5432,db2:5433/x?target_session_attrs=read-write&sslmode=verify-full"
            ),
            "postgres://app:***@db1:5432,db2:5433/x"
        );
        assert_eq!(
            redact_url("postgres://app@[::1]:5432/x"),
            "postgres://app@[::1]:5432/x"
        );
        assert_eq!(
            redact_url("postgres://%2Fvar%2Frun%2Fpostgresql/x"),
            "postgres://%2Fvar%2Frun%2Fpostgresql:5432/x"
        );
    }

    #[test]
    fn key_values_are_shown_as_key_values() {
        assert_eq!(
            redact_url(
                "host=db port=5433 user=app password='it\\'s secret' dbname=x sslmode=require"
            ),
            "host=db port=5433 user=app password=*** dbname=x"
        );
        assert_eq!(
            redact_url("host=db user=app password=hunter2"),
            "host=db user=app password=***"
        );
        assert_eq!(redact_url("host=db password='unclosed"), UNPARSABLE);
    }

    #[test]
    fn what_only_an_unencoded_password_explains_is_not_shown() {
        // `@` inside the password: tokio-postgres reads the host as `ss@db`.
        assert_eq!(redact_url("postgres://u:p@ss@db/x"), UNPARSABLE);
        // `@` inside a query password: tokio-postgres reads `db/x?password=a` as the user.
        assert_eq!(redact_url("postgres://db/x?password=a@b"), UNPARSABLE);
        // `@` and `?` inside the password: tokio-postgres reads the host as `Q`.
        assert_eq!(
            redact_url("postgres://u:P@Q?application_name=Z@db/x"),
            UNPARSABLE
        );
        // A URL of a scheme the daemon refuses is named in the refusal, as the url crate reads it.
        assert_eq!(redact_url("http://u:pw@db/x?p=1"), "http://u:***@db/x");
        assert_eq!(redact_url("http://u:se?cret@db/x"), UNPARSABLE);
        assert_eq!(redact_url("u:pw@db"), UNPARSABLE);
        assert_eq!(redact_url(""), UNPARSABLE);
    }
}
