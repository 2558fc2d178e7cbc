//! Integration tests against the real PostgreSQL: each test has its own database and daemon.

mod auth;
mod entries;
mod helpers;
mod proxy;
mod refusals;
mod storage_outage;
