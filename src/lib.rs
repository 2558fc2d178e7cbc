//! retrysafe: a daemon that makes retried writes safe.
//!
//! # Layout
//!
//! A write travels down this list:
//!
//! - [`http`]: actix-web routes; authenticates the client, validates the `Idempotency-Key` and
//!   the body, hashes the request, and maps every error to problem+json ([`http::problem`]).
//! - [`write`]: the write path and its types (a [`write::Write`] is [`write::Waiting`], then
//!   [`write::Decided`]; each request gets a [`write::Answer`]): `KeyShard` actors, one per
//!   shard of (client, key), where duplicates meet and completed responses are replayed from a
//!   bounded cache ([`write::shard`], [`write::cache`]); `Writer` actors that commit writes in
//!   batches, one transaction each, with `INSERT ... ON CONFLICT` as the final guard against
//!   duplicates ([`write::writer`], [`write::batch`]).
//! - [`db`]: the PostgreSQL pool, database creation and migrations, where the rows live (one
//!   server or Citus: [`db::topology`], the one module that knows, with the statement shapes
//!   that differ), the outbox's states ([`db::outbox_state`]), readiness of writes, and the
//!   SQLSTATE mapping.
//! - [`outbox`]: relay actors that publish committed events to RabbitMQ with publisher
//!   confirms ([`outbox::relay`], one batch in [`outbox::batch`], [`outbox::publish`]), over
//!   the daemon's broker connection ([`outbox::broker`]); `retrysafe outbox replay` publishes
//!   past events again ([`outbox::replay`]).
//! - [`inbox`]: for consumers; dedupes deliveries on the event id in PostgreSQL.
//! - [`janitor`]: deletes expired idempotency records and old sent outbox rows.
//!
//! The caller's side: [`client`] sends a write with one stable key and retries it safely;
//! `retrysafe send` is its command line. Operators: [`admin`] (the admin API and the console,
//! on a listener of their own) and [`cli`].
//!
//! Beside them: [`config`] (layered configuration, validated into types), [`idempotency`] (key
//! parsing, canonical JSON, the request hash, the verdict), [`entry`] (the business write and
//! its validation), [`events`] (the CloudEvents a write emits), [`startup`] (wiring),
//! [`operator`] (who runs an administrative command, as its records name them), [`metric`] (the
//! metrics table), [`telemetry`] (logging start-up), [`otlp`] (span export), and [`tls`] (TLS
//! for the database, the broker and the HTTPS listener, with rustls).
//!
//! # Layers
//!
//! A module imports only modules of the layers below its own, so the import graph has no cycle:
//!
//! ```text
//! 7  cli
//! 6  startup
//! 5  admin   client
//! 4  http    inbox
//! 3  write   outbox   janitor
//! 2  db      telemetry
//! 1  tls     entry    events   otlp
//! 0  config  metric   idempotency   trace_context   lifecycle   operator
//! ```

pub mod admin;
pub mod cli;
pub mod client;
pub mod config;
pub mod db;
pub mod entry;
pub mod events;
pub mod http;
pub mod idempotency;
pub mod inbox;
pub mod janitor;
pub mod lifecycle;
pub mod metric;
pub mod operator;
pub mod otlp;
pub mod outbox;
#[cfg(test)]
mod reference_docs;
pub mod startup;
pub mod telemetry;
pub mod tls;
pub mod trace_context;
pub mod write;
