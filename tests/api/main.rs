//! Integration tests against the real PostgreSQL and RabbitMQ: each test has its own database,
//! exchange and daemon.

#[path = "../common/mod.rs"]
mod common;

mod admin;
mod alerts;
mod auth;
mod cli;
mod console;
mod crash;
mod entries;
mod listing;
mod operations;
mod ordering;
mod otlp_export;
mod outbox;
mod refusals;
mod replay;
mod send;
mod service;
mod storage_outage;
mod trace_context;
