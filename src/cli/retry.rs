//! `retrysafe outbox retry`: parked events requeued for delivery, with a fresh attempt count.
//! A selection says which (by type, client, error, when parked, or one event), and `--rate`
//! spreads them out so that a consumer whose queue has room for a hundred is not handed
//! thousands at once, to park them again.

use clap::{ArgGroup, Args};
use uuid::Uuid;

use super::replay::{client_id, rate, EVENT_TYPES};
use crate::db::Database;
use crate::outbox::replay::TimeBound;
use crate::outbox::store::{self, ParkedSelection};

pub const HELP: &str = "\
Selection (one at least, so that a slip cannot requeue everything): --type, --client, --error,
--since (each narrows the selection; --type and --client repeat), --event for one event (unsent,
parked or not), or --all for every parked event. Events are requeued in the order they were
written; with --rate N, the first is due now and the others one after another, N a second, so
the relays deliver them at that pace (a consumer whose queue is limited and rejects publishes
when full would otherwise park them again). --dry-run counts what would be requeued.";

#[derive(Args)]
#[command(group(
    ArgGroup::new("selection")
        .required(true)
        .multiple(true)
        .args(["all", "event", "event_type", "client", "error", "since"])
))]
pub struct RetryArgs {
    /// Every parked event
    #[arg(long, conflicts_with_all = ["event", "event_type", "client", "error", "since"])]
    all: bool,
    /// One unsent event (parked or not), by its event id
    #[arg(long, value_name = "ID", conflicts_with_all = ["event_type", "client", "error", "since", "rate", "dry_run"])]
    event: Option<Uuid>,
    /// Parked events of this type (repeatable)
    #[arg(long = "type", value_name = "TYPE", value_parser = EVENT_TYPES)]
    event_type: Vec<String>,
    /// Parked events of this client (repeatable)
    #[arg(long, value_name = "ID", value_parser = client_id)]
    client: Vec<String>,
    /// Parked events whose last error contains TEXT (as `outbox status` and the key lookup
    /// show it), e.g. "NO_ROUTE" or "nacked"
    #[arg(long, value_name = "TEXT")]
    error: Option<String>,
    /// Parked at or after TIME: RFC 3339, or a duration ago (2h), on the database's clock
    #[arg(long, value_name = "TIME", value_parser = TimeBound::parse)]
    since: Option<TimeBound>,
    /// Events per second at most, the first due now [default: all due now]
    #[arg(long, value_name = "N", value_parser = rate)]
    rate: Option<f64>,
    /// Count what would be requeued, by type; change nothing
    #[arg(long)]
    dry_run: bool,
}

pub async fn run(db: &Database, args: &RetryArgs) -> anyhow::Result<()> {
    if let Some(event) = args.event {
        let requeued = db
            .run(async |connection| store::requeue_event(&**connection, event).await)
            .await?;
        if !requeued {
            anyhow::bail!("no unsent event with id {event}");
        }
        println!("requeued 1 event(s)");
        return Ok(());
    }
    let (selection, counts, requeued) = db
        .run(async |connection| {
            let now = store::database_now(&**connection).await?;
            let selection = ParkedSelection {
                types: args.event_type.clone(),
                clients: args.client.clone(),
                error: args.error.clone(),
                parked_since: args.since.map(|since| since.resolve(now)),
                ..ParkedSelection::default()
            };
            if args.dry_run {
                let counts = store::count_parked(&**connection, &selection).await?;
                return Ok((selection, counts, 0));
            }
            let requeued = store::requeue_parked(&**connection, &selection, args.rate).await?;
            Ok((selection, Vec::new(), requeued))
        })
        .await?;
    if args.dry_run {
        let total: i64 = counts.iter().map(|(_, count)| count).sum();
        println!("dry run: {total} parked event(s) would be requeued");
        for (event_type, count) in &counts {
            println!("  {event_type:<32} {count:>10}");
        }
        return Ok(());
    }
    match args.rate {
        Some(rate) if requeued > 1 => println!(
            "requeued {requeued} event(s), due at {rate} a second over the next {}",
            humantime::format_duration(std::time::Duration::from_secs(
                ((requeued - 1) as f64 / rate).ceil() as u64
            ))
        ),
        _ => println!("requeued {requeued} event(s)"),
    }
    if requeued == 0 && selection != ParkedSelection::default() {
        println!("no parked event matches the selection; `retrysafe outbox status` lists them");
    }
    Ok(())
}
