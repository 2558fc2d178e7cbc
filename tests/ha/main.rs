//! Failover on real high-availability setups: a pg_auto_failover formation (a monitor and two
//! nodes, synchronous replication) and a three-node RabbitMQ cluster with a quorum queue, both
//! started by `scripts/ha-lab` beside the machine's own services and torn down after.
//!
//! The daemon is the built binary; clients write under load and retry each key until they get
//! an answer, as a job does. After every fault the tests assert what a failover may cost (some
//! 503s, a few seconds) and what it may not (an acknowledged write lost or duplicated, an event
//! lost, a restart of the daemon, any operator action), and print how long writes or events
//! took to flow again (`cargo test --test ha -- --nocapture` shows the figures). A write whose
//! wait for the synchronous standby was cancelled must not have its event published before the
//! standby has it (unconfirmed.rs).

#[path = "../common/mod.rs"]
mod common;

mod postgres;
mod rabbitmq;
mod unconfirmed;
