//! TLS on the three connections, against real servers made for each test: a PostgreSQL cluster
//! with `ssl = on` and `hostssl` lines only, a RabbitMQ node with a TLS listener, and the
//! daemon's own HTTPS listener; with a certificate authority and certificates made in the test.
//! The machine's own PostgreSQL and RabbitMQ are left as they are.

#[path = "../common/mod.rs"]
mod common;

mod check_config;
mod database_password;
mod https;
mod pki;
mod postgres;
mod rabbitmq;
