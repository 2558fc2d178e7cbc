//! Integration tests against the real PostgreSQL and RabbitMQ: each test has its own database,
//! exchange and daemon.

#[path = "../common/mod.rs"]
mod common;

mod auth;
mod crash;
mod entries;
mod outbox;
mod refusals;
mod storage_outage;
