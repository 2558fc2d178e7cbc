//! One lifecycle for the daemon's long-lived work.
//!
//! Two shapes, each used where it fits:
//!
//! - **Actors**, for what receives messages: the key shards (writes to judge), the writers
//!   (writes to commit), the relays (wake-ups). Each stops on one message, [`Stop`], after
//!   finishing what it holds (a writer commits its queue, a relay ends its batches).
//! - **Tasks**, for what only runs on a timer (the janitor, the outbox gauges, the metrics'
//!   upkeep, the systemd watchdog): a loop that ends when the shutdown token is cancelled, as in
//!   mini-redis: one token tells every task to stop, one tracker says when all have ended
//!   ([`Tasks`]).
//!
//! The stop order is [`crate::startup::Application::run_until_stopped`]'s, in one place; the
//! systemd notifications that go with starting and stopping are here.

use std::future::Future;
use std::time::Duration;

use actix::dev::ToEnvelope;
use actix::{Actor, Addr, Handler, Message};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Finish what you hold, then stop; answered once stopped (or once nothing is left to finish).
#[derive(Message, Clone, Copy)]
#[rtype(result = "()")]
pub struct Stop;

/// The daemon's plain tasks: started on the actors' thread, stopped together.
#[derive(Clone, Default)]
pub struct Tasks {
    shutdown: CancellationToken,
    tracker: TaskTracker,
}

impl Tasks {
    /// Runs `work` (given the token that says when to stop) on the current thread's event loop,
    /// which is the actors' thread when called while the daemon starts.
    pub fn spawn<F>(&self, work: impl FnOnce(CancellationToken) -> F)
    where
        F: Future<Output = ()> + 'static,
    {
        self.tracker.spawn_local(work(self.shutdown.clone()));
    }

    /// Tells every task to stop and waits, at most `limit`, for all to have ended; false when
    /// the time ran out. A task's step in progress is abandoned at its next await.
    pub async fn stop(&self, limit: Duration) -> bool {
        self.shutdown.cancel();
        self.tracker.close();
        tokio::time::timeout(limit, self.tracker.wait())
            .await
            .is_ok()
    }
}

/// Runs `step` now and then every `period` until `shutdown`: what every timer task of the
/// daemon is. A step that takes longer than the period delays the next; none overlap.
pub async fn every<F, Fut>(period: Duration, shutdown: CancellationToken, mut step: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()>,
{
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = step() => {}
        }
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(period) => {}
        }
    }
}

/// Sends [`Stop`] to every actor and waits for all the answers, at most `limit`; false when
/// the time ran out.
pub async fn stop_all<A>(actors: &[Addr<A>], limit: Duration) -> bool
where
    A: Actor + Handler<Stop>,
    A::Context: ToEnvelope<A, Stop>,
{
    let answers = futures_util::future::join_all(actors.iter().map(|actor| actor.send(Stop)));
    // An actor already stopped answers with a mailbox error: it has nothing left to do.
    tokio::time::timeout(limit, answers).await.is_ok()
}

/// What the daemon tells systemd (`Type=notify`); outside systemd (no NOTIFY_SOCKET) nothing.
pub mod systemd {
    use std::time::Duration;

    use super::{every, Tasks};

    /// Migrations are applied and the listeners bound.
    pub fn ready() {
        notify(&[sd_notify::NotifyState::Ready]);
    }

    /// The daemon is shutting down.
    pub fn stopping() {
        notify(&[sd_notify::NotifyState::Stopping]);
    }

    /// Pings the watchdog at half its interval, from the actors' thread: if that thread stalls,
    /// the pings stop and systemd restarts the daemon.
    pub fn watchdog(tasks: &Tasks) {
        let mut interval_usec = 0;
        if !sd_notify::watchdog_enabled(false, &mut interval_usec) {
            return;
        }
        let period = Duration::from_micros(interval_usec / 2);
        tasks.spawn(|shutdown| {
            every(period, shutdown, || async {
                notify(&[sd_notify::NotifyState::Watchdog]);
            })
        });
    }

    fn notify(state: &[sd_notify::NotifyState]) {
        if let Err(error) = sd_notify::notify(false, state) {
            tracing::warn!(error = %error, "cannot notify systemd");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::rc::Rc;

    #[actix_web::test]
    async fn tasks_run_on_their_timer_and_all_stop_on_one_token() {
        let tasks = Tasks::default();
        let steps = Rc::new(Cell::new(0));
        for _ in 0..3 {
            let steps = steps.clone();
            tasks.spawn(move |shutdown| async move {
                every(Duration::from_millis(10), shutdown, || {
                    let steps = steps.clone();
                    async move { steps.set(steps.get() + 1) }
                })
                .await
            });
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(steps.get() >= 3, "each ran at once");
        assert!(tasks.stop(Duration::from_secs(5)).await, "all ended");
        let after = steps.get();
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(steps.get(), after, "none runs after the stop");
    }
}
