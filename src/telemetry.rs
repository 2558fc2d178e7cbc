//! Logs, and the export of spans: text for terminals, JSON (`log.format = "json"`) for
//! journald and collectors; spans over OTLP when a collector is named ([`crate::otlp`]). The
//! metrics are [`crate::metric`]'s.

use std::time::Duration;

use crate::config::{LogConfig, LogFormat, TelemetryConfig, TracesEndpoint};
use crate::metric::{self, HTTP_PROTOCOL_ERRORS};

/// The target of actix-http's HTTP/1 connection handling, which answers some requests itself
/// (see [`ActixOwnAnswers`]).
const ACTIX_DISPATCHER: &str = "actix_http::h1::dispatcher";

/// Installs the global subscriber, with the configuration's filter (`RUST_LOG` when set, else
/// `log.level`, after the daemon's defaults: [`crate::config::LogFilter`]). No spans are
/// exported.
pub fn init_logging(settings: &LogConfig) {
    let _ = install(settings, None);
}

/// [`init_logging`], and the export of spans over OTLP when the configuration (or the
/// environment) names a collector ([`crate::otlp`]); shut the export down at exit. A collector
/// the environment names that cannot be used, or an export that cannot start, is logged, and
/// nothing is exported.
pub fn init_logging_and_traces(
    settings: &LogConfig,
    telemetry: &TelemetryConfig,
) -> Option<crate::otlp::TraceExport> {
    install(settings, Some(telemetry))
}

fn install(
    settings: &LogConfig,
    telemetry: Option<&TelemetryConfig>,
) -> Option<crate::otlp::TraceExport> {
    use tracing_subscriber::filter::{LevelFilter, Targets};
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::Layer;

    let mut refused = None;
    let traces = telemetry.map(|telemetry| (&telemetry.traces, telemetry.sample_ratio));
    let started = match traces {
        None | Some((TracesEndpoint::Off, _)) => None,
        Some((TracesEndpoint::Unusable(error), _)) => {
            refused = Some(error.clone());
            None
        }
        Some((TracesEndpoint::To(endpoint), sample_ratio)) => {
            match crate::otlp::TraceExport::start(endpoint, sample_ratio) {
                Ok(started) => Some(started),
                Err(error) => {
                    refused = Some(error);
                    None
                }
            }
        }
    };
    let (export, tracer) = match started {
        Some((export, tracer)) => (Some(export), Some(tracer)),
        None => (None, None),
    };
    // The daemon's own spans only, at INFO and above (the request, the writer's batch, the
    // relay's batch and each publish); the events logged inside them become span events.
    let spans = tracer.map(|tracer| {
        tracing_opentelemetry::layer()
            .with_tracer(tracer)
            .with_location(false)
            .with_threads(false)
            .with_target(false)
            .with_level(false)
            .with_filter(Targets::new().with_target("retrysafe", LevelFilter::INFO))
    });

    let filter = settings.filter.env_filter();
    let output_level = filter.max_level_hint();
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let output = match settings.format {
        LogFormat::Text => tracing_subscriber::fmt::layer()
            .with_ansi(ansi)
            .with_writer(std::io::stderr)
            .boxed(),
        LogFormat::Json => tracing_subscriber::fmt::layer()
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .with_writer(std::io::stderr)
            .boxed(),
    };
    let own_answers = ActixOwnAnswers::new().with_filter(OwnAnswerCallsites);
    let result = tracing_subscriber::registry()
        .with(output.with_filter(filter))
        .with(own_answers)
        .with(spans)
        .try_init();
    // A subscriber is already installed when the library is embedded (tests); keep that one.
    if result.is_ok() {
        // Records of the `log` crate (tokio-postgres logs every statement at debug) go to the
        // output only. try_init lets them all through, up to the trace level that
        // ActixOwnAnswers takes from actix-http (which logs with tracing, not log), and each one
        // then costs a filter match by target; cut at the output's level, the `log` macros
        // skip them at once.
        if let Some(level) = output_level {
            log::set_max_level(log_level(level));
        }
    }
    match (&export, refused) {
        (Some(export), _) => {
            tracing::info!(endpoint = %export.endpoint, "exporting spans over OTLP/HTTP")
        }
        (None, Some(error)) => tracing::warn!(error = %error, "spans are not exported"),
        (None, None) => {}
    }
    export
}

/// The `log` crate's filter for a tracing level filter.
fn log_level(level: tracing_subscriber::filter::LevelFilter) -> log::LevelFilter {
    use tracing_subscriber::filter::LevelFilter;
    match level {
        LevelFilter::OFF => log::LevelFilter::Off,
        LevelFilter::ERROR => log::LevelFilter::Error,
        LevelFilter::WARN => log::LevelFilter::Warn,
        LevelFilter::INFO => log::LevelFilter::Info,
        LevelFilter::DEBUG => log::LevelFilter::Debug,
        _ => log::LevelFilter::Trace,
    }
}

/// actix-http answers some requests itself, before any route or middleware sees them: a request
/// head that does not arrive within its time (408), one too large (431), or one it cannot parse
/// (400: a NUL byte in a header, a header line without a colon). It says so only in its own
/// trace logs, and logs a client's malformed request at ERROR. This layer, fed those events,
/// counts each answer in [`HTTP_PROTOCOL_ERRORS`] and logs it at WARN: the client's fault, not
/// one an operator must act on. The WARN lines are sampled ([`LogSampler`], one per kind of
/// answer): a flood of idle or slowloris connections, or a scanner, would otherwise write a line
/// each, and journald's rate limit would then drop the lines that matter. The counter counts
/// every one.
///
/// It is fed only the callsites that can say so ([`OwnAnswerCallsites`]); and below ERROR an
/// event's message is only compared with the few prefixes that matter while it is being
/// written, the writing stopping at the first character that rules them all out
/// ([`PrefixMatch`]).
struct ActixOwnAnswers {
    /// One per answer of [`OWN_ANSWERS`], in its order.
    samplers: [LogSampler; 3],
}

impl ActixOwnAnswers {
    fn new() -> Self {
        Self {
            samplers: std::array::from_fn(|_| LogSampler::new(OWN_ANSWER_LOG_INTERVAL)),
        }
    }
}

/// At most one WARN line per kind of actix-http's own answers in this time, after the first.
const OWN_ANSWER_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// Lets a log line through, then at most one per `interval`, each saying how many were left
/// out since the one before.
struct LogSampler {
    interval: Duration,
    state: std::sync::Mutex<Sampled>,
}

#[derive(Default)]
struct Sampled {
    /// When the last line went through; None before the first.
    last: Option<std::time::Instant>,
    /// Lines left out since then.
    suppressed: u64,
}

impl LogSampler {
    fn new(interval: Duration) -> Self {
        Self {
            interval,
            state: Default::default(),
        }
    }

    /// Whether the line of `now` goes through: then with the number of lines left out since
    /// the previous one.
    fn admit(&self, now: std::time::Instant) -> Option<u64> {
        // A panic while the lock is held cannot leave the two counts inconsistent.
        let mut state = self
            .state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let due = state
            .last
            .is_none_or(|last| now.saturating_duration_since(last) >= self.interval);
        if !due {
            state.suppressed += 1;
            return None;
        }
        state.last = Some(now);
        Some(std::mem::take(&mut state.suppressed))
    }
}

/// The lines of actix-http's dispatcher (`src/h1/dispatcher.rs` of actix-http 3.20, the version
/// Cargo.lock pins) whose trace events say it answered a request itself: 431, 400 and 408.
/// Only these callsites and the dispatcher's errors are enabled for [`ActixOwnAnswers`]; its
/// other trace events (several per request: timer states, flags) are never enabled, so they
/// cost nothing (dispatching them was about 5 % of the daemon's CPU samples under replays). An
/// upgrade that moves these lines fails tests/faults/hostile_connections.rs, which counts each
/// of the three answers.
const OWN_ANSWER_LINES: [u32; 3] = [1023, 1043, 1074];

/// The filter of [`ActixOwnAnswers`]: decided once per callsite, by [`is_own_answer_callsite`].
struct OwnAnswerCallsites;

fn is_own_answer_callsite(metadata: &tracing::Metadata<'_>) -> bool {
    metadata.target() == ACTIX_DISPATCHER
        && metadata.is_event()
        && match *metadata.level() {
            tracing::Level::ERROR => true,
            tracing::Level::TRACE => metadata
                .line()
                .is_some_and(|line| OWN_ANSWER_LINES.contains(&line)),
            _ => false,
        }
}

impl<S> tracing_subscriber::layer::Filter<S> for OwnAnswerCallsites {
    fn enabled(
        &self,
        metadata: &tracing::Metadata<'_>,
        _: &tracing_subscriber::layer::Context<'_, S>,
    ) -> bool {
        is_own_answer_callsite(metadata)
    }

    fn callsite_enabled(
        &self,
        metadata: &'static tracing::Metadata<'static>,
    ) -> tracing::subscriber::Interest {
        if is_own_answer_callsite(metadata) {
            tracing::subscriber::Interest::always()
        } else {
            tracing::subscriber::Interest::never()
        }
    }

    fn max_level_hint(&self) -> Option<tracing::level_filters::LevelFilter> {
        Some(tracing::level_filters::LevelFilter::TRACE)
    }
}

/// The messages of actix-http's own answers, and what each one is.
const OWN_ANSWERS: [(&str, &str, &str); 3] = [
    (
        "timed out on slow request",
        "408",
        "the request head did not arrive in time",
    ),
    (
        "request head was too big",
        "431",
        "the request head is too large",
    ),
    ("parse error", "400", "the request could not be parsed"),
];

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for ActixOwnAnswers {
    fn on_event(
        &self,
        event: &tracing::Event<'_>,
        _context: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let is_error = *event.metadata().level() == tracing::Level::ERROR;
        let mut prefix = PrefixMatch::new(OWN_ANSWERS.map(|(prefix, _, _)| prefix));
        event.record(&mut prefix);
        let message = || {
            let mut message = MessageText(String::new());
            event.record(&mut message);
            message.0
        };
        if let Some(index) = prefix.matched {
            let (_, status, reason) = OWN_ANSWERS[index];
            metrics::counter!(HTTP_PROTOCOL_ERRORS, "status" => status).increment(1);
            if let Some(suppressed) = self.samplers[index].admit(std::time::Instant::now()) {
                tracing::warn!(
                    status,
                    detail = %message(),
                    suppressed,
                    "refused a request before routing: {reason}"
                );
            }
            return;
        }
        if !is_error {
            return;
        }
        let message = message();
        // Errors of the connection other than the malformed requests counted above.
        if !message.starts_with("stream error: request parse error") {
            tracing::error!(detail = %message, "http connection error");
        }
    }
}

/// The `message` of an event, as text.
struct MessageText(String);

impl tracing::field::Visit for MessageText {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0 = format!("{value:?}");
        }
    }

    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        if field.name() == "message" {
            self.0 = value.to_owned();
        }
    }
}

/// Which of `N` prefixes an event's `message` starts with, found while the message is being
/// written, without keeping it: writing stops (with an error, which ends the formatting) once a
/// prefix is complete or the characters so far rule every prefix out.
struct PrefixMatch<const N: usize> {
    prefixes: [&'static str; N],
    /// Bytes of the message seen so far.
    seen: usize,
    /// The prefixes the message may still start with.
    alive: [bool; N],
    matched: Option<usize>,
}

impl<const N: usize> PrefixMatch<N> {
    fn new(prefixes: [&'static str; N]) -> Self {
        Self {
            prefixes,
            seen: 0,
            alive: [true; N],
            matched: None,
        }
    }
}

impl<const N: usize> std::fmt::Write for PrefixMatch<N> {
    fn write_str(&mut self, text: &str) -> std::fmt::Result {
        for &byte in text.as_bytes() {
            let mut any = false;
            for (index, prefix) in self.prefixes.iter().enumerate() {
                if !self.alive[index] {
                    continue;
                }
                if prefix.as_bytes().get(self.seen) != Some(&byte) {
                    self.alive[index] = false;
                    continue;
                }
                any = true;
                if self.seen + 1 == prefix.len() {
                    self.matched = Some(index);
                    return Err(std::fmt::Error);
                }
            }
            if !any {
                return Err(std::fmt::Error);
            }
            self.seen += 1;
        }
        Ok(())
    }
}

impl<const N: usize> tracing::field::Visit for PrefixMatch<N> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            // The error only means the writing stopped early: the answer is in `matched`.
            let _ = std::fmt::write(self, format_args!("{value:?}"));
        }
    }
}

/// Keeps histogram storage bounded, every few seconds until `shutdown`: a plain task of the
/// daemon ([`crate::lifecycle`]).
pub async fn metrics_upkeep(shutdown: tokio_util::sync::CancellationToken) {
    let handle = metric::metrics_handle();
    crate::lifecycle::every(Duration::from_secs(5), shutdown, || async {
        handle.run_upkeep();
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fmt::Write as _;

    fn matched(message: std::fmt::Arguments<'_>) -> Option<usize> {
        let mut prefix = PrefixMatch::new(OWN_ANSWERS.map(|(prefix, _, _)| prefix));
        let _ = prefix.write_fmt(message);
        prefix.matched
    }

    /// Counts how often it is formatted: the arguments after a ruled-out start must not be.
    struct Costly<'a>(&'a std::cell::Cell<u32>);

    impl std::fmt::Display for Costly<'_> {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            self.0.set(self.0.get() + 1);
            f.write_str("x")
        }
    }

    #[test]
    fn a_sampled_line_goes_through_once_per_interval_and_counts_the_rest() {
        let sampler = LogSampler::new(Duration::from_secs(10));
        let start = std::time::Instant::now();
        let at = |seconds: u64| start + Duration::from_secs(seconds);
        assert_eq!(sampler.admit(at(0)), Some(0), "the first line");
        for second in 0..10 {
            assert_eq!(sampler.admit(at(second)), None, "second {second}");
        }
        assert_eq!(sampler.admit(at(10)), Some(10), "ten left out meanwhile");
        assert_eq!(sampler.admit(at(12)), None);
        assert_eq!(sampler.admit(at(25)), Some(1));
        assert_eq!(sampler.admit(at(100)), Some(0));
        // A clock read before the last line (another thread's) is not a new interval.
        assert_eq!(sampler.admit(at(99)), None);
    }

    #[test]
    fn own_answers_are_told_from_the_connection_loops_trace() {
        let error = "invalid header";
        assert_eq!(matched(format_args!("parse error {error}")), Some(2));
        assert_eq!(
            matched(format_args!(
                "timed out on slow request; replying with 408 and closing connection"
            )),
            Some(0)
        );
        assert_eq!(
            matched(format_args!(
                "request head was too big; returning 431 response"
            )),
            Some(1)
        );
        // Split over several writes, as formatting does.
        assert_eq!(
            matched(format_args!("{}{}", "request head ", "was too big")),
            Some(1)
        );
        for other in [
            "  head Active",
            "request",
            "timed-out during linger",
            "",
            "parse",
        ] {
            assert_eq!(matched(format_args!("{other}")), None, "{other:?}");
        }
        let formatted = std::cell::Cell::new(0);
        assert_eq!(
            matched(format_args!("start flags: {}", Costly(&formatted))),
            None
        );
        assert_eq!(formatted.get(), 0, "ruled out at its first character");
        assert_eq!(
            matched(format_args!("parse error {}", Costly(&formatted))),
            Some(2)
        );
        assert_eq!(formatted.get(), 0, "known before the arguments");
    }
}
