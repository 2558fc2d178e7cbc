//! The bound on the bytes pending writes hold: queued in a writer, being committed, or waiting
//! in a shard for another write of their key. Past `database.max_pending_bytes` a new write is
//! refused at once with 503, rather than letting memory grow while the database is slow or
//! stalled.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use crate::metric;

/// The budget: its limit and what is held now.
#[derive(Debug, Clone)]
pub struct PendingBytes {
    limit: usize,
    used: Arc<AtomicUsize>,
}

/// A write's share of [`PendingBytes`], given back when dropped: it travels with the write
/// through the shard and the writer, and is dropped once the write is answered.
#[derive(Debug)]
pub struct PendingPermit {
    bytes: usize,
    used: Arc<AtomicUsize>,
}

impl PendingBytes {
    pub fn new(limit: usize) -> Self {
        Self {
            limit,
            used: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// A permit for `bytes`, or None when that would pass the limit.
    pub fn try_acquire(&self, bytes: usize) -> Option<PendingPermit> {
        let mut used = self.used.load(Ordering::Relaxed);
        loop {
            let wanted = used.checked_add(bytes)?;
            if wanted > self.limit {
                return None;
            }
            match self
                .used
                .compare_exchange_weak(used, wanted, Ordering::AcqRel, Ordering::Relaxed)
            {
                Ok(_) => {
                    metrics::gauge!(metric::PENDING_WRITE_BYTES).increment(bytes as f64);
                    return Some(PendingPermit {
                        bytes,
                        used: self.used.clone(),
                    });
                }
                Err(actual) => used = actual,
            }
        }
    }

    /// Bytes held now.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }
}

impl PendingPermit {
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for PendingPermit {
    fn drop(&mut self) {
        self.used.fetch_sub(self.bytes, Ordering::AcqRel);
        metrics::gauge!(metric::PENDING_WRITE_BYTES).decrement(self.bytes as f64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pending_bytes_are_bounded_and_given_back() {
        let pending = PendingBytes::new(1000);
        let first = pending.try_acquire(600).unwrap();
        assert!(pending.try_acquire(600).is_none(), "past the limit");
        let second = pending.try_acquire(400).unwrap();
        assert_eq!(pending.used(), 1000);
        drop(first);
        assert_eq!(pending.used(), 400);
        drop(second);
        assert_eq!(pending.used(), 0);
    }
}
