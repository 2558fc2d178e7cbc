//! Shared by the test binaries: each test gets its own database, exchange and daemon.
#![allow(dead_code)]

pub mod consumer;
pub mod daemon;
pub mod helpers;
pub mod proxy;
