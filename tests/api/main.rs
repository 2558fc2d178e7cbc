//! Integration tests against the real PostgreSQL: each test has its own database and daemon.

mod auth;
mod consumer;
mod crash;
mod daemon;
mod entries;
mod helpers;
mod outbox;
mod proxy;
mod refusals;
mod storage_outage;
