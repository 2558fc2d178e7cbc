//! Fault tests: the daemon under crashes, database and broker faults, several daemons, and
//! hostile connections. docs/reliability.md says what each proves and what bug it would catch.
//! Run with `cargo test --features failpoints --test faults`.

#[path = "../common/mod.rs"]
mod common;

mod bounds;
mod broker_faults;
mod broker_pressure;
mod crash_under_load;
mod database_faults;
mod database_pressure;
mod exactness;
mod hostile_connections;
mod hung_peers;
mod many_daemons;
mod noisy_client;
mod ordering;
mod outbox_pressure;
mod secrets;
mod skewed_clock;
