//! Per-request observability: a request id on every log line and in `X-Request-Id`, the
//! outcome and latency metrics, and `GET /metrics`.

use std::time::{Duration, Instant};

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header::{HeaderName, HeaderValue};
use actix_web::http::StatusCode;
use actix_web::middleware::Next;
use actix_web::{Error, HttpResponse};
use tracing::Instrument;
use uuid::Uuid;

use std::collections::HashMap;

use crate::http::SharedState;
use crate::metric;

pub const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// What became of a request, for metrics and logs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RequestOutcome {
    Created,
    Replayed,
    Conflict,
    InProgress,
    RateLimited,
    Invalid,
    Unauthorized,
    Unavailable,
    Error,
    Ok,
    NotFound,
}

impl RequestOutcome {
    pub fn as_str(self) -> &'static str {
        match self {
            RequestOutcome::Created => "created",
            RequestOutcome::Replayed => "replayed",
            RequestOutcome::Conflict => "conflict",
            RequestOutcome::InProgress => "in_progress",
            RequestOutcome::RateLimited => "rate_limited",
            RequestOutcome::Invalid => "invalid",
            RequestOutcome::Unauthorized => "unauthorized",
            RequestOutcome::Unavailable => "unavailable",
            RequestOutcome::Error => "error",
            RequestOutcome::Ok => "ok",
            RequestOutcome::NotFound => "not_found",
        }
    }

    fn from_status(status: StatusCode) -> Self {
        match status.as_u16() {
            200..=399 => RequestOutcome::Ok,
            401 => RequestOutcome::Unauthorized,
            404 => RequestOutcome::NotFound,
            429 => RequestOutcome::RateLimited,
            503 => RequestOutcome::Unavailable,
            400..=499 => RequestOutcome::Invalid,
            _ => RequestOutcome::Error,
        }
    }
}

/// A client's own request id is kept when it is short and plain; otherwise a new one is made.
fn request_id(request: &ServiceRequest) -> String {
    request
        .headers()
        .get(&REQUEST_ID)
        .and_then(|value| value.to_str().ok())
        .filter(|id| {
            (1..=128).contains(&id.len())
                && id
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'))
        })
        .map(str::to_owned)
        .unwrap_or_else(|| Uuid::new_v4().to_string())
}

pub async fn observe(
    request: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<impl MessageBody>, Error> {
    let id = request_id(&request);
    // trace_id and span_id for the log lines (the write's trace when not exporting: see
    // otlp::write_context); the otel.* fields are recorded only while exporting.
    let span = tracing::info_span!(
        "request",
        request_id = %id,
        method = %request.method(),
        path = %request.path(),
        trace_id = tracing::field::Empty,
        span_id = tracing::field::Empty,
        "otel.kind" = tracing::field::Empty,
        "otel.name" = tracing::field::Empty,
        "otel.status_code" = tracing::field::Empty,
    );
    // Probes and scrapes (every few seconds, from every monitor) are not traced.
    let exporting =
        crate::otlp::exporting() && !matches!(request.path(), "/healthz" | "/readyz" | "/metrics");
    let method = exporting.then(|| request.method().clone());
    if exporting {
        crate::otlp::start_server_span(&span, &request);
    }
    let started = Instant::now();
    let mut response = next.call(request).instrument(span.clone()).await?;
    let elapsed = started.elapsed();
    let route = response
        .request()
        .match_pattern()
        .unwrap_or_else(|| "unmatched".to_owned());
    let status = response.status();
    let outcome = response
        .response()
        .extensions()
        .get::<RequestOutcome>()
        .copied()
        .unwrap_or_else(|| RequestOutcome::from_status(status));
    record(&route, outcome, elapsed);
    if let Some(method) = method {
        crate::otlp::end_server_span(&span, method.as_str(), &route, status.as_u16());
    }
    if let Ok(value) = HeaderValue::from_str(&id) {
        response.headers_mut().insert(REQUEST_ID, value);
    }
    span.in_scope(|| {
        let elapsed_ms = elapsed.as_secs_f64() * 1000.0;
        match outcome {
            RequestOutcome::Error | RequestOutcome::Unavailable => {
                tracing::warn!(
                    status = status.as_u16(),
                    outcome = outcome.as_str(),
                    elapsed_ms,
                    "request failed"
                )
            }
            _ => tracing::debug!(
                status = status.as_u16(),
                outcome = outcome.as_str(),
                elapsed_ms,
                "request"
            ),
        }
    });
    Ok(response)
}

/// Counts the request and records its latency. The metric handles are kept per thread for each
/// route and outcome (a few dozen: routes are patterns, not paths), so that a request does not
/// build and look up the labelled keys in the registry again.
fn record(route: &str, outcome: RequestOutcome, elapsed: Duration) {
    type Handles = (metrics::Counter, metrics::Histogram);
    thread_local! {
        static HANDLES: std::cell::RefCell<HashMap<String, HashMap<RequestOutcome, Handles>>> =
            Default::default();
    }
    HANDLES.with_borrow_mut(|handles| {
        if !handles.contains_key(route) {
            handles.insert(route.to_owned(), HashMap::new());
        }
        let by_outcome = handles.get_mut(route).expect("inserted above");
        let (requests, duration) = by_outcome.entry(outcome).or_insert_with(|| {
            (
                metrics::counter!(metric::HTTP_REQUESTS, "route" => route.to_owned(), "outcome" => outcome.as_str()),
                metrics::histogram!(metric::HTTP_DURATION, "route" => route.to_owned()),
            )
        });
        requests.increment(1);
        duration.record(elapsed.as_secs_f64());
    });
}

/// Prometheus text exposition. The outbox gauges are refreshed in the background every few
/// seconds, so a scrape costs the database nothing.
#[utoipa::path(get, path = "/metrics", tag = "operations", responses((status = 200, description = "Prometheus text exposition", content_type = "text/plain", body = String)))]
pub async fn metrics(state: SharedState) -> HttpResponse {
    for (pool, db) in [("writes", &state.writes), ("reads", &state.reads)] {
        let pool_state = db.state();
        metrics::gauge!(metric::POOL_CONNECTIONS, "pool" => pool)
            .set(pool_state.connections as f64);
        metrics::gauge!(metric::POOL_IDLE, "pool" => pool).set(pool_state.idle_connections as f64);
        metrics::gauge!(metric::POOL_MAX, "pool" => pool).set(f64::from(db.max_size()));
    }
    metrics::gauge!(metric::BROKER_CONNECTED).set(if state.broker.is_connected() {
        1.0
    } else {
        0.0
    });
    metric::collect_process_metrics();
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4; charset=utf-8")
        .body(metric::metrics_handle().render())
}
