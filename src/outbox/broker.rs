//! The daemon's connection to RabbitMQ: one connection, a confirm-mode channel per relay.
//!
//! lapin's automatic recovery stays off: a lost connection is noticed (through its events, or a
//! failed publish), marked down, and opened again by the next relay that needs a channel, with
//! the relay's own backoff between attempts.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures_util::StreamExt;
use lapin::options::{ConfirmSelectOptions, ExchangeDeclareOptions};
use lapin::types::FieldTable;
use lapin::uri::AMQPUri;
use lapin::{Channel, Connection, ConnectionProperties, Event, ExchangeKind};

use crate::config::AmqpSettings;

/// Heartbeat asked for when the URL sets none: a silently dead peer is noticed within about
/// two heartbeats instead of RabbitMQ's default of two minutes.
const DEFAULT_HEARTBEAT_SECONDS: u16 = 10;

#[derive(Debug, Clone, thiserror::Error)]
pub enum BrokerError {
    #[error("cannot connect to the broker: {0}")]
    Connect(String),
    #[error("broker error: {0}")]
    Protocol(#[from] lapin::Error),
}

pub struct Broker {
    uri: AMQPUri,
    exchange: String,
    connect_timeout: Duration,
    connection: tokio::sync::Mutex<Option<Connection>>,
    connected: Arc<AtomicBool>,
    /// Set by `close`, so that the connection's end is not reported as a loss.
    closing: Arc<AtomicBool>,
}

impl Broker {
    pub fn new(settings: &AmqpSettings, connect_timeout: Duration) -> Result<Self, BrokerError> {
        let mut uri: AMQPUri = settings.url.parse().map_err(|error| {
            BrokerError::Connect(format!("amqp.url is not a valid AMQP URL: {error}"))
        })?;
        if uri.query.heartbeat.is_none() {
            uri.query.heartbeat = Some(DEFAULT_HEARTBEAT_SECONDS);
        }
        Ok(Self {
            uri,
            exchange: settings.exchange.clone(),
            connect_timeout,
            connection: tokio::sync::Mutex::new(None),
            connected: Arc::new(AtomicBool::new(false)),
            closing: Arc::new(AtomicBool::new(false)),
        })
    }

    pub fn exchange(&self) -> &str {
        &self.exchange
    }

    /// Whether the connection is up, as far as the daemon knows.
    pub fn is_connected(&self) -> bool {
        self.connected.load(Ordering::Relaxed)
    }

    /// A new confirm-mode channel, connecting (and declaring the exchange) first if needed.
    pub async fn open_channel(&self) -> Result<Channel, BrokerError> {
        let mut connection = self.connection.lock().await;
        if let Some(existing) = connection.as_ref() {
            if existing.status().connected() {
                match confirm_channel(existing, &self.exchange).await {
                    Ok(channel) => return Ok(channel),
                    Err(error) => {
                        tracing::warn!(error = %error, "cannot open a channel; reconnecting")
                    }
                }
            }
        }
        self.connected.store(false, Ordering::Relaxed);
        *connection = None;
        let fresh = self.connect().await?;
        let channel = confirm_channel(&fresh, &self.exchange).await?;
        *connection = Some(fresh);
        self.connected.store(true, Ordering::Relaxed);
        Ok(channel)
    }

    /// Marks the connection down after a publish showed it broken, so that the next
    /// `open_channel` reconnects.
    pub async fn connection_lost(&self) {
        let mut connection = self.connection.lock().await;
        if connection.as_ref().is_some_and(|c| !c.status().connected()) {
            *connection = None;
            self.connected.store(false, Ordering::Relaxed);
        }
    }

    async fn connect(&self) -> Result<Connection, BrokerError> {
        let properties = ConnectionProperties::default().with_connection_name("retrysafe".into());
        let connection = tokio::time::timeout(
            self.connect_timeout,
            Connection::connect_uri(self.uri.clone(), properties),
        )
        .await
        .map_err(|_| BrokerError::Connect(format!("no answer within {:?}", self.connect_timeout)))?
        .map_err(|error| BrokerError::Connect(error.to_string()))?;
        // Events reach only listeners that exist, so listen before anything can go wrong.
        let mut events = connection.events_listener();
        let connected = self.connected.clone();
        let closing = self.closing.clone();
        tokio::spawn(async move {
            while let Some(event) = events.next().await {
                if let Event::Error(error) = event {
                    connected.store(false, Ordering::Relaxed);
                    if closing.load(Ordering::Relaxed) {
                        tracing::debug!(error = %error, "broker connection closed");
                    } else {
                        tracing::warn!(error = %error, "broker connection lost");
                    }
                }
            }
        });
        tracing::info!(exchange = %self.exchange, "connected to the broker");
        Ok(connection)
    }

    /// Closes the connection, for shutdown.
    pub async fn close(&self) {
        self.closing.store(true, Ordering::Relaxed);
        if let Some(connection) = self.connection.lock().await.take() {
            // Closing a connection that already failed reports that failure; nothing to do.
            let _ = connection
                .close(200, "retrysafe shutting down".into())
                .await;
        }
        self.connected.store(false, Ordering::Relaxed);
    }
}

/// A confirm-mode channel, after declaring the exchange on it: declaring is idempotent and
/// cheap, and doing it for every channel re-creates an exchange deleted while the connection
/// stayed up (publishing to a missing exchange fails and closes the channel).
async fn confirm_channel(connection: &Connection, exchange: &str) -> Result<Channel, BrokerError> {
    let channel = connection.create_channel().await?;
    channel
        .exchange_declare(
            exchange.into(),
            ExchangeKind::Topic,
            ExchangeDeclareOptions {
                durable: true,
                ..ExchangeDeclareOptions::default()
            },
            FieldTable::default(),
        )
        .await?;
    channel
        .confirm_select(ConfirmSelectOptions::default())
        .await?;
    Ok(channel)
}
