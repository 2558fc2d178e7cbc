//! The admin actions (retry, skip): what a selector picks, what an action would change (a dry
//! run), and the action itself, done once per admin's Idempotency-Key and recorded in
//! `admin_actions` in the transaction that changes the events.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tokio_postgres::GenericClient;
use uuid::Uuid;

use crate::db::outbox_state::not_done;
use crate::db::{PgClient, StorageError};
use crate::idempotency::Verdict;
use crate::outbox::store::{self, ParkedSelection, Skip, SkippedBy, GAUGE_COUNT_CAP};

/// filter given. Nothing given matches every parked event, which must be said (`all`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Selector {
    /// These events (up to 1,000), whatever their filters: for a retry, each unsent one
    /// (parked or not); for a skip, each unsent one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub event_ids: Vec<Uuid>,
    /// Parked events of this type.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub event_type: Option<String>,
    /// Parked events of this client.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client: Option<String>,
    /// Parked events whose last error is exactly this (a group of the overview).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Parked events created after this time (RFC 3339, exclusive).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_after: Option<DateTime<Utc>>,
    /// Parked events created before this time (RFC 3339, exclusive).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_before: Option<DateTime<Utc>>,
    /// Says that a selector without ids or filters means every parked event.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub all: bool,
}

/// Event ids one selector may name.
pub const MAX_EVENT_IDS: usize = 1000;
/// Events one skip may change: a skip is for good, so a larger one is refused (narrow it); and
/// each is a few round trips, all within one transaction and its time limit
/// (`database.statement_timeout`), holding the events' ordering keys meanwhile.
pub const MAX_SKIPPED_AT_ONCE: i64 = 100;

impl Selector {
    /// Whether it picks parked events by a filter (type, client, error, created time).
    pub fn has_filters(&self) -> bool {
        self.event_type.is_some()
            || self.client.is_some()
            || self.error.is_some()
            || self.created_after.is_some()
            || self.created_before.is_some()
    }

    /// What is wrong with it, in words for the admin; None when it may be acted on.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if !self.event_ids.is_empty() {
            if self.has_filters() || self.all {
                problems.push("event_ids: name events, or filter them (type, client, error, created_after, created_before, all), not both".into());
            }
            if self.event_ids.len() > MAX_EVENT_IDS {
                problems.push(format!("event_ids: at most {MAX_EVENT_IDS} at once"));
            }
        } else if !self.has_filters() && !self.all {
            problems.push("the selector matches every parked event; send \"all\": true to mean that, or narrow it with event_ids, type, client, error, created_after or created_before".into());
        }
        let text = |name: &str, value: &Option<String>, max: usize, problems: &mut Vec<String>| {
            if let Some(value) = value {
                if value.is_empty() || value.len() > max || value.contains('\0') {
                    problems.push(format!("{name}: 1 to {max} bytes, without NUL"));
                }
            }
        };
        text("type", &self.event_type, 255, &mut problems);
        text("error", &self.error, 4096, &mut problems);
        if let Some(client) = &self.client {
            if !crate::config::is_valid_client_id(client) {
                problems.push("client: 1 to 64 of a-z A-Z 0-9 . _ -".into());
            }
        }
        for (name, time) in [
            ("created_after", self.created_after),
            ("created_before", self.created_before),
        ] {
            // PostgreSQL takes other years than RFC 3339's four digits, but not all that
            // chrono reads (a signed year of six digits): refused here, not by the database.
            if time.is_some_and(|time| !(1..=9999).contains(&chrono::Datelike::year(&time))) {
                problems.push(format!("{name}: a year from 1 to 9999"));
            }
        }
        if let (Some(after), Some(before)) = (self.created_after, self.created_before) {
            if after >= before {
                problems.push("created_after: must be before created_before".into());
            }
        }
        problems
    }

    fn parked(&self) -> ParkedSelection {
        ParkedSelection {
            types: self.event_type.iter().cloned().collect(),
            clients: self.client.iter().cloned().collect(),
            error_is: self.error.clone(),
            created_after: self.created_after,
            created_before: self.created_before,
            ..ParkedSelection::default()
        }
    }
}

/// What an admin may do to events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    /// Requeue for delivery, with a fresh attempt count.
    Retry,
    /// Give up on for good: never published; an ordering key goes on past it.
    Skip,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Retry => "retry",
            Action::Skip => "skip",
        }
    }

    pub fn parse(text: &str) -> Option<Self> {
        [Action::Retry, Action::Skip]
            .into_iter()
            .find(|action| action.as_str() == text)
    }
}

/// What an action did (or, for a dry run, would do): the answer of the admin POST, stored with
/// its key.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ActionOutcome {
    /// The action's row in the log (`GET /admin/v1/actions`); null for a dry run.
    pub action_id: Option<i64>,
    pub action: Action,
    pub admin_id: String,
    pub selector: Selector,
    /// Events the selector matched when the action ran. Parked events picked by filters are
    /// counted up to 100,000 (as the overview's counts): see `matched_capped`.
    pub matched: i64,
    /// True when the count of `matched` stopped at its cap: at least that many match (a retry
    /// answers at least as many as it changed). A retry still requeues every one, in one
    /// statement within `database.statement_timeout`; past it nothing changes (narrow the
    /// selector by created_after and created_before, or use `retrysafe outbox retry`).
    #[serde(default)]
    pub matched_capped: bool,
    /// Events it changed: requeued, or skipped. Less than `matched` when some changed
    /// meanwhile (sent, or being published by a relay: skip them again).
    pub changed: i64,
    pub dry_run: bool,
    pub created_at: DateTime<Utc>,
}

/// The hash that tells the same request from another under one key.
fn request_hash(action: Action, selector: &Selector) -> Vec<u8> {
    let canonical = serde_json::to_vec(&(action, selector)).expect("a selector serializes");
    Sha256::digest(&canonical).to_vec()
}

const FIND_ACTION: &str = "
SELECT request_hash, response::text FROM admin_actions WHERE admin_id = $1 AND idempotency_key = $2";

/// Claims the key: blocks while another transaction holds it, and inserts nothing when it was
/// used before (then [`FIND_ACTION`] tells what for).
const CLAIM_ACTION: &str = "
INSERT INTO admin_actions (admin_id, idempotency_key, request_hash, action, selector, changed, response)
VALUES ($1, $2, $3, $4, $5::text::jsonb, 0, '{}')
ON CONFLICT (admin_id, idempotency_key) DO NOTHING
RETURNING id, created_at";

const FINISH_ACTION: &str = "
UPDATE admin_actions SET changed = $2, response = $3::text::jsonb WHERE id = $1";

/// The events a selector matches now.
struct Matched {
    /// How many; up to [`GAUGE_COUNT_CAP`] for a retry by filters.
    count: i64,
    /// The count stopped at its cap.
    capped: bool,
    /// Their ids, where the action goes one by one (by ids, or a skip).
    ids: Vec<Uuid>,
}

impl Matched {
    fn ids(ids: Vec<Uuid>) -> Self {
        Matched {
            count: ids.len() as i64,
            capped: false,
            ids,
        }
    }
}

/// What the selector matches now. A retry by filters is counted up to [`GAUGE_COUNT_CAP`]
/// parked events, as the overview's counts: a dry run of a group of millions costs what one
/// of 100,000 does.
async fn matched(
    client: &impl GenericClient,
    action: Action,
    selector: &Selector,
) -> Result<Matched, StorageError> {
    if !selector.event_ids.is_empty() {
        let ids: Vec<Uuid> = client
            .query(
                concat!(
                    "SELECT event_id FROM outbox_events WHERE event_id = ANY($1) AND ",
                    not_done!(),
                    " ORDER BY id"
                ),
                &[&selector.event_ids],
            )
            .await?
            .iter()
            .map(|row| row.get(0))
            .collect();
        return Ok(Matched::ids(ids));
    }
    let parked = selector.parked();
    match action {
        Action::Retry => {
            let count = store::count_parked_up_to(client, &parked, GAUGE_COUNT_CAP).await?;
            Ok(Matched {
                count,
                capped: count >= GAUGE_COUNT_CAP,
                ids: Vec::new(),
            })
        }
        Action::Skip => {
            let ids = store::parked_event_ids(client, &parked, MAX_SKIPPED_AT_ONCE + 1).await?;
            Ok(Matched::ids(ids))
        }
    }
}

/// Refused before anything changes.
#[derive(Debug, thiserror::Error)]
pub enum ActionError {
    #[error("the selector matches more than {MAX_SKIPPED_AT_ONCE} parked events; a skip is for good, so skip at most {MAX_SKIPPED_AT_ONCE} at a time: narrow the selector (type, client, error, created_after, created_before)")]
    TooManyToSkip,
    #[error(transparent)]
    Storage(#[from] StorageError),
}

impl From<tokio_postgres::Error> for ActionError {
    fn from(error: tokio_postgres::Error) -> Self {
        ActionError::Storage(error.into())
    }
}

/// Counts what `action` would change, changing nothing.
pub async fn dry_run(
    connection: &mut PgClient,
    admin: &str,
    action: Action,
    selector: &Selector,
) -> Result<ActionOutcome, ActionError> {
    let matched = matched(&**connection, action, selector).await?;
    if action == Action::Skip && matched.count > MAX_SKIPPED_AT_ONCE {
        return Err(ActionError::TooManyToSkip);
    }
    Ok(ActionOutcome {
        action_id: None,
        action,
        admin_id: admin.to_owned(),
        selector: selector.clone(),
        matched: matched.count,
        matched_capped: matched.capped,
        changed: 0,
        dry_run: true,
        created_at: store::database_now(&**connection).await?,
    })
}

/// Acts, once per `key`: in one transaction, claims the key, changes the events and records
/// what it did. The same request again under the key gets the first answer; another request
/// under it is refused.
pub async fn act(
    connection: &mut PgClient,
    admin: &str,
    key: &str,
    action: Action,
    selector: &Selector,
) -> Result<Verdict<ActionOutcome>, ActionError> {
    let hash = request_hash(action, selector);
    let selector_json = serde_json::to_string(selector).expect("a selector serializes");
    let promised: bool = connection
        .query_one(crate::db::REPLICATION_PROMISED, &[])
        .await?
        .get(0);
    let warnings = connection.warnings();
    let recorded = act_in_transaction(
        connection,
        admin,
        key,
        (action, selector),
        (&hash, &selector_json),
    )
    .await?;
    // As a write batch's: a commit the database warned about (its synchronous standby did not
    // confirm it) is not reported done; and an answer found under the key is given only once
    // the standby has it too.
    connection.confirm_commit(warnings)?;
    if promised && matches!(recorded, Verdict::Replay(_)) {
        crate::db::barrier(connection).await?;
    }
    Ok(recorded)
}

async fn act_in_transaction(
    connection: &mut PgClient,
    admin: &str,
    key: &str,
    (action, selector): (Action, &Selector),
    (hash, selector_json): (&Vec<u8>, &String),
) -> Result<Verdict<ActionOutcome>, ActionError> {
    let mut transaction = connection.transaction().await?;
    let claimed = transaction
        .query_opt(
            CLAIM_ACTION,
            &[&admin, &key, &hash, &action.as_str(), &selector_json],
        )
        .await?;
    let Some(claimed) = claimed else {
        let row = transaction.query_one(FIND_ACTION, &[&admin, &key]).await?;
        let stored_hash: Vec<u8> = row.get(0);
        let verdict = Verdict::of_saved(&stored_hash, hash, || row.get::<_, String>(1));
        return verdict.try_map(|response| {
            serde_json::from_str(&response).map_err(|error| {
                ActionError::Storage(
                    anyhow::anyhow!("a stored admin answer is not one: {error}").into(),
                )
            })
        });
    };
    let (action_id, created_at): (i64, DateTime<Utc>) = (claimed.get(0), claimed.get(1));
    let Matched {
        count: mut matched,
        capped,
        ids,
    } = matched(&transaction, action, selector).await?;
    let changed = match action {
        Action::Retry if selector.event_ids.is_empty() => {
            store::requeue_parked(&transaction, &selector.parked(), None).await? as i64
        }
        Action::Retry => store::requeue_events(&transaction, &ids).await? as i64,
        Action::Skip => {
            if matched > MAX_SKIPPED_AT_ONCE {
                return Err(ActionError::TooManyToSkip);
            }
            let reason = format!("admin action {action_id}");
            // Every key at once, in key order: each skip would otherwise lock its key in the
            // events' order and hold it to the commit, against writers that lock in key order.
            store::lock_keys_of_events(&transaction, &ids).await?;
            let mut skipped = 0;
            for event_id in ids {
                let outcome =
                    store::skip_in(&mut transaction, event_id, SkippedBy::Admin(admin), &reason)
                        .await?;
                if matches!(outcome, Skip::Skipped { .. }) {
                    skipped += 1;
                }
            }
            skipped
        }
    };
    if capped {
        // Every event it changed matched: a better lower bound than the cap.
        matched = matched.max(changed);
    }
    let outcome = ActionOutcome {
        action_id: Some(action_id),
        action,
        admin_id: admin.to_owned(),
        selector: selector.clone(),
        matched,
        matched_capped: capped,
        changed,
        dry_run: false,
        created_at,
    };
    let response = serde_json::to_string(&outcome).expect("an outcome serializes");
    transaction
        .execute(FINISH_ACTION, &[&action_id, &changed, &response])
        .await?;
    transaction.commit().await?;
    Ok(Verdict::New(outcome))
}
