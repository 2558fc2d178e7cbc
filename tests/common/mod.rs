//! The tests' one harness, shared by the test binaries: each test gets its own database,
//! exchange and daemon (in-process or the built binary), and the helpers to drive and check it.
#![allow(dead_code)]

pub mod citus;
pub mod cli;
pub mod consumer;
pub mod daemon;
pub mod helpers;
pub mod lab;
pub mod load;
pub mod ordering;
pub mod passwords;
pub mod postgres;
pub mod proxy;
