//! The outbox: events committed with their write, relayed to RabbitMQ at least once, and
//! replayed on an operator's request.

pub mod batch;
pub mod broker;
pub mod gauges;
pub mod publish;
pub mod relay;
pub mod replay;
pub mod spans;
pub mod store;

pub use batch::{relay_once, relay_until_empty, RelayConfig, RelayReport};
pub use broker::declare_exchange;
pub use broker::{Broker, BrokerError};
pub use publish::{event_properties, message_properties, APP_ID, CONTENT_TYPE};
pub use relay::{OutboxRelay, OutboxWaker};
