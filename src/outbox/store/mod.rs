//! The outbox table as the relay and the operators see it: [`relaying`] (claiming due events
//! and recording what became of them, the backoff), [`backlog`] (what waits: the counts of
//! `outbox status`, the gauges and the admin API, bounded whatever the backlog), [`parked`]
//! (what operators do to parked events: requeue and skip).

mod backlog;
mod parked;
mod relaying;

pub use backlog::*;
pub use parked::*;
pub use relaying::*;
