//! The daemon on Citus: a coordinator and two workers of the test's own
//! (`tests/common/citus.rs`), the write tables distributed by the daemon's own migrations.
//! Every test skips, saying why, where the Citus extension is not installed.
//! Run with `cargo test --features failpoints --test citus`.

#[path = "../common/mod.rs"]
mod common;

mod acceptance;
mod daemons;
mod faults;
mod hung;
mod moving;
mod nodes;
mod operations;
mod shard_move;
mod slow;
mod standby;
