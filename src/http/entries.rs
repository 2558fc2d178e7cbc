//! `POST /v1/entries` and `GET /v1/entries/{id}`; the listing, `GET /v1/entries`, is
//! [`crate::http::listing`].

use actix_web::http::header::{self, HeaderName, HeaderValue};
use actix_web::http::StatusCode;
use actix_web::web::{self, Bytes, BytesMut};
use actix_web::{HttpRequest, HttpResponse};
use futures_util::StreamExt;
use serde_json::{Map, Value};
use uuid::Uuid;

use crate::entry::{
    decode_write, format_time, EntryView, NewEntryRequest, WriteRequest, ENTRIES_ROUTE,
};
use crate::http::observe::RequestOutcome;
use crate::http::problem::ApiError;
use crate::http::SharedState;
use crate::idempotency::{IdempotencyKey, Verdict};
use crate::metric;
use crate::write::{Answer, SavedRecord, ScopedKey, Write};

pub const ENTRIES_PATH: &str = ENTRIES_ROUTE;

pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

pub const IDEMPOTENCY_REPLAYED: &str = "idempotency-replayed";

/// The two headers' names, made once: a name given as a string is parsed, and (not being a
/// standard header) copied, at every use.
const KEY_HEADER: HeaderName = HeaderName::from_static(IDEMPOTENCY_KEY);
const REPLAYED_HEADER: HeaderName = HeaderName::from_static(IDEMPOTENCY_REPLAYED);

/// Creates an entry, once per Idempotency-Key. A retry with the same key and request gets the
/// first response again; the same key with another request is refused.
#[utoipa::path(
    post,
    path = "/v1/entries",
    tag = "entries",
    params(("Idempotency-Key" = String, Header, description = "1 to 255 visible ASCII characters; a structured-field string (\"abc\") is unquoted first")),
    request_body(content = NewEntryRequest, content_type = "application/json"),
    responses(
        (status = 201, description = "Created; or, with `Idempotency-Replayed: true`, the first response to this key and request replayed", body = EntryView, content_type = "application/json",
            headers(("Location" = String, description = "/v1/entries/{id}"), ("Idempotency-Replayed" = String, description = "`true` on a replay"))),
        // The problems it answers: crate::http::openapi::ROUTE_PROBLEMS.
    ),
    security(("bearer" = [])),
)]
pub async fn create_entry(
    request: HttpRequest,
    payload: web::Payload,
    state: SharedState,
) -> Result<HttpResponse, ApiError> {
    let client = state.auth.admit(&request).await?;
    // Held until the answer is made: the client's writes in flight are bounded.
    let _writing = client.limits.start_write().await?;
    let key = ScopedKey {
        client_id: client.id.clone(),
        key: idempotency_key(&request)?,
    };
    require_json(&request)?;
    let body =
        read_body_within(state.body_timeout, &request, payload, state.max_body_bytes).await?;
    let shard = state.shard_for(&key);
    // A retry of a completed request usually sends its very bytes: answered without decoding.
    if let Some(answer) = shard.replay_of_same_body(&key, &body) {
        return respond(&state, answer);
    }
    let write = Write {
        key,
        request: decode(&state, body).await?,
        remote_addr: request.peer_addr().map(|addr| addr.ip().to_string()),
        trace: Some(crate::otlp::write_context(&request)),
    };
    respond(&state, shard.submit(write).await)
}

/// `POST /bench/same-bytes?bytes=N` (cargo feature `bench-routes`, for bench/run alone): what a
/// replay costs the HTTP stack and nothing else. The client is admitted and the key, the media
/// type and the body are read as [`create_entry`] does; the answer is a 201 of N bytes with a
/// replay's header fields. A replay adds to this only the lookup of its key and the comparison
/// of the body with the saved one.
#[cfg(feature = "bench-routes")]
pub async fn same_bytes(
    request: HttpRequest,
    payload: web::Payload,
    state: SharedState,
) -> Result<HttpResponse, ApiError> {
    let _client = state.auth.admit(&request).await?;
    idempotency_key(&request)?;
    require_json(&request)?;
    let body =
        read_body_within(state.body_timeout, &request, payload, state.max_body_bytes).await?;
    let _ = body;
    // The answer's bytes are borrowed, as a replay's are (its saved answer is shared).
    static ANSWER: [u8; 64 * 1024] = [b' '; 64 * 1024];
    let bytes = request
        .query_string()
        .strip_prefix("bytes=")
        .and_then(|n| n.parse::<usize>().ok())
        .unwrap_or(400)
        .min(ANSWER.len());
    let response = SavedRecord {
        request_hash: crate::idempotency::RequestHash([0; 32]),
        status: 201,
        body: Bytes::from_static(&ANSWER[..bytes]),
        entry_id: Some(Uuid::nil()),
        live_until: std::time::Instant::now(),
    };
    Ok(saved_response(&response, true))
}

/// The HTTP response for what became of a write.
fn respond(state: &SharedState, answer: Answer) -> Result<HttpResponse, ApiError> {
    match answer {
        Answer::Judged(Verdict::New(response)) => Ok(saved_response(&response, false)),
        Answer::Judged(Verdict::Replay(response)) => Ok(saved_response(&response, true)),
        Answer::Judged(Verdict::Conflict) => Err(ApiError::IdempotencyKeyReused {
            status: state.mismatch_status,
        }),
        Answer::InProgress => Err(ApiError::RequestInProgress),
        Answer::Failed(error) => Err(error.into()),
    }
}

/// Bodies up to this size are decoded on the HTTP worker; larger ones on the blocking pool, so
/// that a flood of large, costly bodies cannot keep the workers from reading other requests.
const INLINE_DECODE_BYTES: usize = 16 * 1024;

/// Decodes, validates, hashes and canonicalizes the body. A large one goes to the blocking
/// pool, at most `decoders` at a time; waiting for a turn is bounded by `wait_timeout`.
async fn decode(state: &SharedState, body: Bytes) -> Result<WriteRequest, ApiError> {
    if body.len() <= INLINE_DECODE_BYTES {
        return Ok(decode_write(&body)?);
    }
    let Ok(Ok(_turn)) =
        tokio::time::timeout(state.wait_timeout, state.decoders.clone().acquire_owned()).await
    else {
        metrics::counter!(metric::WRITES_SHED, "reason" => "busy").increment(1);
        return Err(ApiError::Overloaded(
            "too many large requests are being decoded".into(),
        ));
    };
    let decoded = web::block(move || decode_write(&body))
        .await
        .map_err(|error| ApiError::Internal(anyhow::anyhow!("decoding stopped: {error}")))?;
    Ok(decoded?)
}

/// The response saved with a record, as first sent or replayed.
fn saved_response(response: &SavedRecord, replayed: bool) -> HttpResponse {
    let status = StatusCode::from_u16(response.status).unwrap_or(StatusCode::OK);
    let mut builder = HttpResponse::build(status);
    builder.content_type("application/json");
    if let Some(entry_id) = response.entry_id {
        builder.insert_header((header::LOCATION, entry_location(entry_id)));
    }
    if replayed {
        builder.insert_header((REPLAYED_HEADER, HeaderValue::from_static("true")));
    }
    let mut response = builder.body(response.body.clone());
    response.extensions_mut().insert(if replayed {
        RequestOutcome::Replayed
    } else {
        RequestOutcome::Created
    });
    response
}

/// `/v1/entries/{id}`, written without the formatting machinery (it is on every replay).
fn entry_location(entry_id: Uuid) -> HeaderValue {
    const PREFIX: &[u8] = b"/v1/entries/";
    let mut location = [0u8; PREFIX.len() + uuid::fmt::Hyphenated::LENGTH];
    location[..PREFIX.len()].copy_from_slice(PREFIX);
    entry_id
        .hyphenated()
        .encode_lower(&mut location[PREFIX.len()..]);
    HeaderValue::from_bytes(&location).expect("a path and a UUID are visible ASCII")
}

pub(crate) fn idempotency_key(request: &HttpRequest) -> Result<IdempotencyKey, ApiError> {
    let mut values = request.headers().get_all(KEY_HEADER);
    let value = values.next().ok_or(ApiError::MissingIdempotencyKey)?;
    if values.next().is_some() {
        return Err(ApiError::InvalidIdempotencyKey(
            crate::idempotency::KeyError::MalformedString,
        ));
    }
    IdempotencyKey::parse_header(value.as_bytes()).map_err(ApiError::InvalidIdempotencyKey)
}

/// Accepts `application/json`, optionally with `charset=utf-8`.
pub(crate) fn require_json(request: &HttpRequest) -> Result<(), ApiError> {
    let refuse = |what: &str| {
        ApiError::UnsupportedMediaType(format!("{what}; send Content-Type: application/json"))
    };
    if let Some(sent) = request.headers().get(header::CONTENT_ENCODING) {
        let encoding = sent.to_str().unwrap_or("?").trim();
        if !encoding.eq_ignore_ascii_case("identity") {
            return Err(ApiError::UnsupportedMediaType(format!(
                "Content-Encoding {encoding:?} is not supported; send the body uncompressed"
            )));
        }
    }
    let value = request
        .headers()
        .get(header::CONTENT_TYPE)
        .ok_or_else(|| refuse("the Content-Type header is missing"))?;
    let text = value
        .to_str()
        .map_err(|_| refuse("the Content-Type header is not ASCII"))?;
    let mut parts = text.split(';');
    let essence = parts.next().unwrap_or_default().trim();
    if !essence.eq_ignore_ascii_case("application/json") {
        return Err(refuse(&format!(
            "Content-Type {essence:?} is not supported"
        )));
    }
    for parameter in parts {
        let (name, value) = parameter.split_once('=').unwrap_or((parameter, ""));
        if name.trim().eq_ignore_ascii_case("charset") {
            let charset = value.trim().trim_matches('"');
            if !charset.eq_ignore_ascii_case("utf-8") && !charset.eq_ignore_ascii_case("utf8") {
                return Err(refuse(&format!(
                    "charset {charset:?} is not supported, only utf-8"
                )));
            }
        }
    }
    Ok(())
}

/// [`read_body`] within `http.body_timeout` (408 past it): a client trickling its body cannot
/// hold a connection and a task for ever.
pub(crate) async fn read_body_within(
    body_timeout: std::time::Duration,
    request: &HttpRequest,
    payload: web::Payload,
    limit: usize,
) -> Result<Bytes, ApiError> {
    tokio::time::timeout(body_timeout, read_body(request, payload, limit))
        .await
        .map_err(|_| ApiError::RequestTimeout(body_timeout))?
}

/// Reads the body, refusing it (413) as soon as it is known to exceed `limit`.
async fn read_body(
    request: &HttpRequest,
    mut payload: web::Payload,
    limit: usize,
) -> Result<Bytes, ApiError> {
    let too_large = ApiError::PayloadTooLarge { limit };
    if let Some(sent) = request.headers().get(header::CONTENT_LENGTH) {
        let length: usize = sent
            .to_str()
            .ok()
            .and_then(|text| text.trim().parse().ok())
            .ok_or_else(|| {
                ApiError::MalformedJson("the Content-Length header is not a number".into())
            })?;
        if length > limit {
            return Err(too_large);
        }
    }
    let read_error =
        |error| ApiError::MalformedJson(format!("the body could not be read: {error}"));
    // A small body usually comes in one chunk: it is kept as it came, not copied.
    let Some(first) = payload.next().await.transpose().map_err(read_error)? else {
        return Ok(Bytes::new());
    };
    if first.len() > limit {
        return Err(too_large);
    }
    let Some(second) = payload.next().await.transpose().map_err(read_error)? else {
        return Ok(first);
    };
    let mut body = BytesMut::from(first);
    let mut chunk = Some(second);
    while let Some(next) = chunk {
        if body.len() + next.len() > limit {
            return Err(too_large);
        }
        body.extend_from_slice(&next);
        chunk = payload.next().await.transpose().map_err(read_error)?;
    }
    Ok(body.freeze())
}

/// An entry's `data` as stored (`data::text`), read back with its numbers digit for digit.
pub fn entry_data(stored: String) -> Result<Map<String, Value>, ApiError> {
    serde_json::from_str(&stored).map_err(|error| {
        ApiError::Internal(anyhow::anyhow!(
            "stored entry data is not a JSON object: {error}"
        ))
    })
}

const SELECT_ENTRY: &str =
    "SELECT id, kind, data::text, created_at, ordering_key, sequence FROM entries WHERE id = $1 AND client_id = $2";

/// An entry of the calling client.
#[utoipa::path(
    get,
    path = "/v1/entries/{id}",
    tag = "entries",
    params(("id" = String, Path, description = "Entry id (UUID)")),
    responses(
        (status = 200, description = "The entry", body = EntryView, content_type = "application/json"),
        // The problems it answers: crate::http::openapi::ROUTE_PROBLEMS.
    ),
    security(("bearer" = [])),
)]
pub async fn get_entry(
    request: HttpRequest,
    path: web::Path<String>,
    state: SharedState,
) -> Result<HttpResponse, ApiError> {
    let client_id = state.auth.admit(&request).await?.id.clone();
    let not_found = || ApiError::NotFound(format!("no entry {}", path.as_str()));
    let id = Uuid::parse_str(path.as_str()).map_err(|_| not_found())?;
    let row = state
        .reads
        .run(async |connection| {
            Ok(connection
                .query_opt(SELECT_ENTRY, &[&id, &&*client_id])
                .await?)
        })
        .await?
        .ok_or_else(not_found)?;
    let view = EntryView {
        id: row.get(0),
        kind: row.get(1),
        data: entry_data(row.get(2))?,
        created_at: format_time(row.get(3)),
        ordering_key: row.get(4),
        sequence: row.get(5),
    };
    let body = crate::idempotency::canonical_json(
        &serde_json::to_value(&view).expect("an entry view always serializes"),
    );
    Ok(HttpResponse::Ok()
        .content_type("application/json")
        .body(body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entrys_location_is_its_path_under_the_entries_route() {
        let id = Uuid::new_v4();
        assert_eq!(
            entry_location(id).to_str().unwrap(),
            format!("{ENTRIES_PATH}/{id}")
        );
    }
}
