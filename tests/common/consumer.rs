//! A test consumer: an exclusive queue bound to a test's exchange (gone with its connection).

use std::time::Duration;

use futures_util::StreamExt;
use lapin::message::Delivery;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, QueueBindOptions, QueueDeclareOptions};
use lapin::types::FieldTable;
use lapin::{Connection, ConnectionProperties, Consumer};
use retrysafe::outbox::declare_exchange;

use crate::common::helpers::AMQP_URL;

pub struct TestConsumer {
    connection: Connection,
    consumer: Consumer,
    queue: String,
}

/// A connection of the test's own and a channel on it, with `exchange` declared as the daemon
/// declares it (so that queues can be bound before the daemon connects).
pub async fn connect_and_declare(exchange: &str) -> (Connection, lapin::Channel) {
    connect_and_declare_at(AMQP_URL, exchange).await
}

/// [`connect_and_declare`] on the broker at `url`.
pub async fn connect_and_declare_at(url: &str, exchange: &str) -> (Connection, lapin::Channel) {
    let connection = Connection::connect(url, ConnectionProperties::default())
        .await
        .unwrap();
    let channel = connection.create_channel().await.unwrap();
    declare_exchange(&channel, exchange).await.unwrap();
    (connection, channel)
}

impl TestConsumer {
    /// Declares `exchange` as the daemon does (so binding works before the daemon connects),
    /// and binds a fresh exclusive queue to it with `pattern`.
    pub async fn bind(exchange: &str, pattern: &str) -> Self {
        Self::bind_at(AMQP_URL, exchange, pattern).await
    }

    /// [`bind`](Self::bind) on the broker at `url`.
    pub async fn bind_at(url: &str, exchange: &str, pattern: &str) -> Self {
        Self::declare_at(url, exchange, "", Some(pattern)).await
    }

    /// An exclusive queue named `queue` (a server-made name when empty), bound to `exchange`
    /// with `pattern` if one is given; gone with the test's connection.
    pub async fn declare(exchange: &str, queue: &str, pattern: Option<&str>) -> Self {
        Self::declare_at(AMQP_URL, exchange, queue, pattern).await
    }

    async fn declare_at(url: &str, exchange: &str, queue: &str, pattern: Option<&str>) -> Self {
        let (connection, channel) = connect_and_declare_at(url, exchange).await;
        let queue = channel
            .queue_declare(
                queue.into(),
                QueueDeclareOptions::exclusive(),
                FieldTable::default(),
            )
            .await
            .unwrap();
        if let Some(pattern) = pattern {
            channel
                .queue_bind(
                    queue.name().clone(),
                    exchange.into(),
                    pattern.into(),
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await
                .unwrap();
        }
        let consumer = channel
            .basic_consume(
                queue.name().clone(),
                "".into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .unwrap();
        Self {
            connection,
            consumer,
            queue: queue.name().to_string(),
        }
    }

    /// Closes the connection, and with it the exclusive queue.
    pub async fn close(self) {
        self.connection
            .close(200, "done".into())
            .await
            .expect("the test's connection closes");
    }

    pub fn queue(&self) -> &str {
        &self.queue
    }

    /// Every delivery until none arrives within `quiet`.
    pub async fn drain(&mut self, quiet: Duration) -> Vec<Delivery> {
        let mut deliveries = Vec::new();
        while let Some(delivery) = self.next(quiet).await {
            deliveries.push(delivery);
        }
        deliveries
    }

    /// The next delivery, acked, or None if none arrives within `wait`.
    pub async fn next(&mut self, wait: Duration) -> Option<Delivery> {
        let delivery = tokio::time::timeout(wait, self.consumer.next())
            .await
            .ok()??
            .unwrap();
        delivery.ack(BasicAckOptions::default()).await.unwrap();
        Some(delivery)
    }

    /// Receives exactly `count` deliveries (waiting up to `wait` for each).
    pub async fn take(&mut self, count: usize, wait: Duration) -> Vec<Delivery> {
        let mut deliveries = Vec::with_capacity(count);
        while deliveries.len() < count {
            match self.next(wait).await {
                Some(delivery) => deliveries.push(delivery),
                None => panic!("expected {count} deliveries, got {}", deliveries.len()),
            }
        }
        deliveries
    }
}

pub fn message_id(delivery: &Delivery) -> String {
    delivery
        .properties
        .message_id()
        .as_ref()
        .expect("every event has a message_id")
        .to_string()
}

pub fn header(delivery: &Delivery, name: &str) -> Option<String> {
    delivery
        .properties
        .headers()
        .as_ref()?
        .inner()
        .get(name)?
        .as_long_string()
        .map(|value| value.to_string())
}
