//! The filter the daemon logs with: `log.level`, or `RUST_LOG` when set, after the daemon's
//! defaults for other crates' logs, parsed once when the configuration is validated.

use std::fmt;

use tracing_subscriber::filter::ParseError;
use tracing_subscriber::EnvFilter;

/// lapin's own logs repeat what the daemon reports itself (a lost connection, a returned
/// message, a channel closed by the broker) at levels that do not fit: an ERROR for every clean
/// shutdown and for the 404 that tells the daemon to declare a missing exchange, two ERRORs from
/// its I/O loop for every cut connection (which the daemon reports as one WARN, "broker
/// connection lost"), and a WARN carrying the whole body of every unroutable message. A `lapin`
/// directive in `log.level` or `RUST_LOG` takes precedence.
const QUIET_LAPIN: &[&str] = &[
    "lapin::channels=off",
    "lapin::channel=off",
    "lapin::io_loop=off",
    "lapin::returned_messages=off",
];

/// lapin's I/O loop at most at debug when trace is asked for.
const NO_SECRETS_FROM_LAPIN: &str = "lapin::io_loop=debug";

/// At debug, tokio-postgres logs every statement with its parameters: idempotency keys, entry
/// data, client addresses (its trace lines add only the connection's states). Kept at info
/// whatever level is asked for, trace included, unless a `tokio_postgres` directive names it:
/// client data reaches the log only when someone asks for exactly that.
const QUIET_TOKIO_POSTGRES: &str = "tokio_postgres=info";

/// actix-http's HTTP/1 connection handling, off: its ERROR for a client's malformed request is
/// replaced by the WARN of `telemetry`'s `ActixOwnAnswers`, which reads that target's events
/// through a filter of its own.
const QUIET_ACTIX_DISPATCHER: &str = "actix_http::h1::dispatcher=off";

/// A filter (`RUST_LOG` syntax) as asked for, with the daemon's defaults, parsed: what the
/// daemon's log output takes ([`env_filter`](Self::env_filter)).
#[derive(Clone)]
pub struct LogFilter {
    /// As asked for (`log.level` or `RUST_LOG`), for `Debug`.
    requested: String,
    filter: EnvFilter,
}

impl LogFilter {
    /// The daemon's defaults, then `requested`; an error is `requested`'s (the defaults parse).
    pub fn parse(requested: &str) -> Result<Self, ParseError> {
        Ok(Self {
            requested: requested.to_owned(),
            filter: EnvFilter::try_new(directives(requested))?,
        })
    }

    /// The filter, for a subscriber's layer.
    pub fn env_filter(&self) -> EnvFilter {
        self.filter.clone()
    }
}

impl fmt::Debug for LogFilter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.requested)
    }
}

/// The filter's directives: the daemon's defaults for other crates' logs, then `requested`
/// (`log.level` or `RUST_LOG`), which overrides a default for a target it names.
fn directives(requested: &str) -> String {
    let mut defaults = Vec::new();
    if !names_target(requested, "lapin") {
        defaults.extend_from_slice(QUIET_LAPIN);
    }
    if !names_target(requested, "tokio_postgres") {
        defaults.push(QUIET_TOKIO_POSTGRES);
    }
    if !names_target(requested, "actix_http") {
        defaults.push(QUIET_ACTIX_DISPATCHER);
    }
    defaults.push(requested);
    // Last, so that it wins over any other directive: at trace, lapin's I/O loop logs every
    // frame it writes, the SASL response with the broker password among them. Only then: as a
    // directive of its own it would also turn lapin's I/O loop up to debug at a lower level.
    if asks_for_trace(requested) {
        defaults.push(NO_SECRETS_FROM_LAPIN);
    }
    defaults.join(",")
}

/// Whether a filter (`RUST_LOG` syntax) has a directive for `target` or a module of it.
fn names_target(directives: &str, target: &str) -> bool {
    directives.split(',').any(|directive| {
        let directive_target = directive
            .trim()
            .split(['=', '['])
            .next()
            .unwrap_or_default();
        directive_target == target
            || directive_target
                .strip_prefix(target)
                .is_some_and(|rest| rest.starts_with("::"))
    })
}

/// Whether a filter (`RUST_LOG` syntax) asks for the trace level anywhere.
fn asks_for_trace(directives: &str) -> bool {
    directives.split(',').any(|directive| {
        let level = directive
            .rsplit_once('=')
            .map_or(directive, |(_, level)| level);
        let level = level.trim();
        level.eq_ignore_ascii_case("trace") || level == "5"
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trace_is_told_from_other_levels() {
        for yes in [
            "trace",
            "warn,lapin=TRACE",
            "info, retrysafe=trace ",
            "5",
            "a[s{f=1}]=trace",
        ] {
            assert!(asks_for_trace(yes), "{yes}");
        }
        for no in [
            "info",
            "warn,my_trace_module=debug",
            "debug,lapin::io_loop=debug",
            "",
        ] {
            assert!(!asks_for_trace(no), "{no}");
        }
    }

    /// Runs `check` under the filter built from `requested`.
    fn under_filter(requested: &str, check: impl FnOnce() -> bool) -> bool {
        use tracing_subscriber::layer::SubscriberExt;
        let filter = LogFilter::parse(requested).unwrap().env_filter();
        tracing::subscriber::with_default(tracing_subscriber::registry().with(filter), check)
    }

    #[test]
    fn tokio_postgres_statement_parameters_stay_out_unless_asked_for_by_name() {
        use tracing::Level;
        let parameters = || tracing::enabled!(target: "tokio_postgres::query", Level::DEBUG);
        let connection_errors = || tracing::enabled!(target: "tokio_postgres::query", Level::INFO);
        for level in ["info", "debug", "trace", "retrysafe=trace,trace", "5"] {
            assert!(
                !under_filter(level, parameters),
                "{level}: tokio-postgres logs statement parameters at debug"
            );
            assert!(under_filter(level, connection_errors), "{level}");
        }
        assert!(under_filter("trace", || tracing::enabled!(
            target: "retrysafe::write::writer",
            Level::TRACE
        )));
        for named in ["info,tokio_postgres=debug", "tokio_postgres::query=trace"] {
            assert!(under_filter(named, parameters), "{named}: named explicitly");
        }
        assert!(names_target("info,lapin::io_loop=debug", "lapin"));
        assert!(!names_target("info,lapinx=debug,my_lapin=trace", "lapin"));
    }
}
