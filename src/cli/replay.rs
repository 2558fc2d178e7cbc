//! `retrysafe outbox replay`: past events published again, to the exchange or to one queue,
//! paced, resumable, recorded. The work is [`crate::outbox::replay`]'s; this is the command
//! line around it: options, signals, progress and the summary.

use std::io::IsTerminal;
use std::path::Path;
use std::process::ExitCode;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use clap::{ArgGroup, Args};
use tokio::signal::unix::{signal, Signal, SignalKind};
use tokio::sync::watch;
use uuid::Uuid;

use crate::config::{is_valid_client_id, Config};
use crate::db::Database;
use crate::entry::format_time;
use crate::events::{AUDIT_ENTRY_CREATED, ENTRY_CREATED};
use crate::outbox::replay::{
    self, Ending, OutboxExtent, Pace, Plan, ReplayError, ReplayRecord, ReplayTo, RunReport,
    Selection, TimeBound,
};
use crate::outbox::Broker;

pub const EXIT_STATUS_HELP: &str = "\
Selection (at least one is required, so that a careless command cannot resend everything to every
consumer): --since and --until (creation time; an RFC 3339 time such as 2026-12-01T00:00:00Z, or a
duration meaning that long ago, such as 24h or 7d), --type, --client, --event, or --all. Only
events still in the outbox can be sent: sent events are deleted outbox.retention after delivery.
Events are selected whatever their delivery state (events the relay has not delivered yet are
sent too, and counted apart).

Running the same command again (same selection and target) resumes an unfinished replay where it
stopped; once a replay has completed, the same command starts another and sends everything again
(consumers dedupe on the event id).

Exit status:
  0    completed, nothing to replay, or --dry-run
  1    error: the database or the broker failed, the broker did not take a batch (returned: no
       such queue, or no queue bound for an event type; nacked; not confirmed), unknown --event;
       what the broker confirmed is recorded, and the same command goes on from there
  2    usage error, including a replay without any selection
  130  stopped by SIGINT (Ctrl-C) after the current batch; the same command goes on
  143  stopped by SIGTERM, likewise";

/// The event types a replay may name: those the daemon emits.
pub(super) const EVENT_TYPES: [&str; 2] = [ENTRY_CREATED, AUDIT_ENTRY_CREATED];

/// Replays kept in `outbox status`.
pub const RECENT_REPLAYS: i64 = 10;

#[derive(Args)]
#[command(group(
    ArgGroup::new("selection")
        .required(true)
        .multiple(true)
        .args(["since", "until", "event_type", "client", "event", "all"])
))]
pub struct ReplayArgs {
    /// Events created at or after TIME: RFC 3339, or a duration ago (24h)
    #[arg(long, value_name = "TIME", value_parser = TimeBound::parse)]
    since: Option<TimeBound>,
    /// Events created before TIME: RFC 3339, or a duration ago (1h)
    #[arg(long, value_name = "TIME", value_parser = TimeBound::parse)]
    until: Option<TimeBound>,
    /// Events of this type (repeatable)
    #[arg(long = "type", value_name = "TYPE", value_parser = EVENT_TYPES)]
    event_type: Vec<String>,
    /// Events of this client (repeatable)
    #[arg(long, value_name = "ID", value_parser = client_id)]
    client: Vec<String>,
    /// One event, by its event id
    #[arg(long, value_name = "ID", conflicts_with_all = ["since", "until", "event_type", "client", "all"])]
    event: Option<Uuid>,
    /// Every event the outbox still holds
    #[arg(long, conflicts_with_all = ["since", "until", "event_type", "client"])]
    all: bool,
    /// Publish to this queue only, through the default exchange (other queues get nothing);
    /// without it, to amqp.exchange with each event's type as routing key
    #[arg(long, value_name = "NAME", value_parser = queue_name)]
    to_queue: Option<String>,
    /// Events per second at most [default: unlimited]
    #[arg(long, value_name = "N", value_parser = rate)]
    rate: Option<f64>,
    /// Events per batch (one round of confirms, recorded together); smaller with a low --rate
    #[arg(long, value_name = "N", default_value_t = 500, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    batch_size: u32,
    /// Count what would be sent, by type, and say how far back the outbox goes; send and
    /// record nothing
    #[arg(long)]
    dry_run: bool,
}

pub(super) fn client_id(text: &str) -> Result<String, String> {
    if is_valid_client_id(text) {
        Ok(text.to_owned())
    } else {
        Err("must be 1 to 64 of a-z A-Z 0-9 . _ -".into())
    }
}

/// AMQP names are short strings: at most 255 bytes.
fn queue_name(text: &str) -> Result<String, String> {
    if (1..=255).contains(&text.len()) {
        Ok(text.to_owned())
    } else {
        Err("must be 1 to 255 bytes".into())
    }
}

pub(super) fn rate(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(rate) if rate.is_finite() && rate > 0.0 => Ok(rate),
        _ => Err("must be a number of events per second above 0".into()),
    }
}

impl ReplayArgs {
    fn selection(&self) -> Selection {
        Selection {
            since: self.since,
            until: self.until,
            types: self.event_type.clone(),
            clients: self.client.clone(),
            event: self.event,
            all: self.all,
        }
    }

    fn target(&self, config: &Config) -> ReplayTo {
        match &self.to_queue {
            Some(queue) => ReplayTo::Queue(queue.clone()),
            None => ReplayTo::Exchange(config.amqp.exchange.clone()),
        }
    }
}

/// Runs the command; its exit status is one of those in [`EXIT_STATUS_HELP`].
///
/// A command's script, step by step (plan, dry run, checks, start, send, summary); each step is
/// a call, and the length is their sequence.
pub async fn run(
    config: &Config,
    db: &Database,
    config_path: Option<&Path>,
    args: &ReplayArgs,
) -> anyhow::Result<ExitCode> {
    // Relative times (`--since 24h`) count back from the database's clock, as everything else
    // that decides does: this machine's may be wrong.
    let now = db
        .run(async |connection| crate::outbox::store::database_now(&**connection).await)
        .await?;
    let planned = replay::plan(db, args.selection(), args.target(config), now).await;
    let plan = match planned {
        Ok(plan) => plan,
        Err(ReplayError::UnknownEvent(event_id)) => {
            let extent = replay::outbox_extent(db).await?;
            let gone = horizon(&extent, None, config.outbox.retention, now);
            anyhow::bail!("no event with id {event_id} in the outbox; {}", gone.holds);
        }
        Err(error) => return Err(error.into()),
    };
    let gone = horizon(
        &plan.extent,
        plan.set.created_since,
        config.outbox.retention,
        now,
    );
    let broker = Broker::new(&config.amqp)?;
    if args.dry_run {
        print_dry_run(&plan, &broker, &gone).await;
        broker.close().await;
        return Ok(ExitCode::SUCCESS);
    }
    if let Some(note) = &gone.asked_too_far {
        eprintln!("note: {note}");
    }
    if plan.resumes.is_none() && plan.to_send() == 0 {
        println!(
            "nothing to replay: no event in the outbox matches; {}",
            gone.holds
        );
        return Ok(ExitCode::SUCCESS);
    }
    if let ReplayTo::Queue(queue) = &plan.target {
        if !broker.queue_exists(queue).await? {
            broker.close().await;
            anyhow::bail!(
                "no queue named {queue:?} on the broker; declare it first (and bind it to {:?} for the events written from now on), then replay into it",
                config.amqp.exchange
            );
        }
    }
    let channel = broker.open_channel().await?.channel;
    let stopped_by = Arc::new(AtomicI32::new(0));
    let terminal = std::io::stderr().is_terminal();
    let stop = watch_signals(stopped_by.clone(), terminal)?;
    let replay = replay::start(db, &plan, &crate::operator::Operator::current()).await?;
    print_start(&plan, &replay);
    let pace = Pace {
        batch_size: args.batch_size as usize,
        rate: args.rate,
    };
    let mut progress = Progress::new(terminal);
    let report = replay::send(
        db,
        &channel,
        config.outbox.confirm_timeout,
        &plan,
        replay,
        pace,
        stop,
        |replay, sent, elapsed| progress.show(replay, sent, elapsed),
    )
    .await;
    progress.finish();
    broker.close().await;
    let report = report?;
    let resume = resume_command(config_path, &plan);
    Ok(print_summary(
        &report,
        &resume,
        stopped_by.load(Ordering::SeqCst),
    ))
}

/// What the command says about how far back the outbox goes: the janitor deletes events
/// delivered more than `outbox.retention` ago, so nothing created before about then can be
/// replayed.
struct Horizon {
    /// What the outbox holds, and why not more.
    holds: String,
    /// Set when the selection asks for events from before the retention.
    asked_too_far: Option<String>,
}

fn horizon(
    extent: &OutboxExtent,
    since: Option<DateTime<Utc>>,
    retention: Duration,
    now: DateTime<Utc>,
) -> Horizon {
    let retention_text = humantime::format_duration(retention);
    let cutoff = chrono::Duration::from_std(retention)
        .ok()
        .and_then(|retention| now.checked_sub_signed(retention))
        .unwrap_or(DateTime::<Utc>::MIN_UTC);
    let gone = format!(
        "events before {} are gone: outbox.retention is {retention_text}",
        format_time(cutoff)
    );
    let holds = match (extent.oldest_created_at, extent.newest_created_at) {
        (Some(oldest), Some(newest)) => format!(
            "the outbox holds events created from {} to {}; {gone}",
            format_time(oldest),
            format_time(newest)
        ),
        _ => format!("the outbox is empty; {gone}"),
    };
    let asked_too_far = since.filter(|since| *since < cutoff).map(|since| {
        format!(
            "--since asks for events from {}, but {gone}",
            format_time(since)
        )
    });
    Horizon {
        holds,
        asked_too_far,
    }
}

async fn print_dry_run(plan: &Plan, broker: &Broker, horizon: &Horizon) {
    println!("dry run: nothing is sent or recorded");
    match &plan.resumes {
        Some(replay) => println!(
            "would resume replay {} ({}, {} of {} sent, stopped after outbox id {})",
            replay.id, replay.status, replay.events_sent, replay.events_total, replay.last_event_id
        ),
        None => println!("would start a new replay"),
    }
    println!("selection: {}", plan.selection.arguments().join(" "));
    let target_state = match &plan.target {
        ReplayTo::Exchange(_) => String::new(),
        ReplayTo::Queue(queue) => match broker.queue_exists(queue).await {
            Ok(true) => " (the queue exists)".to_owned(),
            Ok(false) => " (NO SUCH QUEUE: the replay would fail; declare it first)".to_owned(),
            Err(error) => format!(" (could not check that it exists: {error})"),
        },
    };
    println!("target: {}{target_state}", plan.target);
    println!("events to send: {}", plan.to_send());
    for count in &plan.counts {
        println!("  {:<32} {:>10}", count.event_type, count.selected);
    }
    if let Some(note) = undelivered_note(plan) {
        println!("  {note}");
    }
    println!("{}", horizon.holds);
    if let Some(note) = &horizon.asked_too_far {
        println!("note: {note}");
    }
}

fn print_start(plan: &Plan, replay: &ReplayRecord) {
    let to = &plan.target;
    match &plan.resumes {
        Some(_) => println!(
            "replay {} resumed after outbox id {}: {} event(s) left of {}, to {to}",
            replay.id,
            replay.last_event_id,
            plan.to_send(),
            replay.events_total
        ),
        None => println!(
            "replay {} started: {} event(s) to {to}",
            replay.id,
            plan.to_send()
        ),
    }
    if let Some(note) = undelivered_note(plan) {
        println!("  {note}");
    }
}

/// Events the relay has not delivered are sent too; says how many.
fn undelivered_note(plan: &Plan) -> Option<String> {
    let undelivered = plan.not_delivered();
    let parked: i64 = plan.counts.iter().map(|c| c.parked).sum();
    (undelivered > 0).then(|| {
        format!(
            "{undelivered} of them not yet delivered by the relay ({parked} parked); consumers dedupe the copies the relay sends later"
        )
    })
}

/// Prints the summary and says which exit status it ends with.
fn print_summary(report: &RunReport, resume: &str, signal: i32) -> ExitCode {
    let replay = &report.replay;
    let totals = format!(
        "{} event(s) sent in this run, {} of {} in all, in {:.1}s",
        report.sent,
        replay.events_sent,
        replay.events_total,
        report.elapsed.as_secs_f64()
    );
    match &report.ending {
        Ending::Completed => {
            println!("replay {} completed: {totals}", replay.id);
            let missing = replay.events_total - replay.events_sent;
            if missing > 0 {
                println!(
                    "  {missing} selected event(s) were no longer in the outbox when their turn came (deleted by the janitor after outbox.retention)"
                );
            }
            ExitCode::SUCCESS
        }
        Ending::Interrupted => {
            println!("replay {} interrupted: {totals}", replay.id);
            println!("to go on where it stopped, run the same command again:\n  {resume}");
            ExitCode::from(u8::try_from(128 + signal).unwrap_or(130))
        }
        Ending::Failed {
            failed,
            first_error,
        } => {
            println!("replay {} failed: {totals}", replay.id);
            eprintln!(
                "retrysafe: replay {}: the broker did not take {failed} event(s) of a batch: {first_error}",
                replay.id
            );
            println!(
                "what the broker confirmed is recorded; once the cause is fixed, run the same command again to go on:\n  {resume}"
            );
            ExitCode::FAILURE
        }
    }
}

/// The command that resumes this replay: the same selection and target.
fn resume_command(config: Option<&Path>, plan: &Plan) -> String {
    let mut words = vec!["retrysafe".to_owned()];
    if let Some(config) = config {
        words.push("--config".to_owned());
        words.push(config.display().to_string());
    }
    words.extend(["outbox".to_owned(), "replay".to_owned()]);
    words.extend(plan.selection.arguments());
    if let ReplayTo::Queue(queue) = &plan.target {
        words.push("--to-queue".to_owned());
        words.push(queue.clone());
    }
    words
        .iter()
        .map(|word| shell_quote(word))
        .collect::<Vec<_>>()
        .join(" ")
}

fn shell_quote(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.:/@+=,".contains(&b));
    if plain {
        word.to_owned()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}

/// The first SIGINT or SIGTERM asks the replay to stop after its current batch (its confirms
/// recorded); a second one ends the process at once, leaving that batch unrecorded (the same
/// command sends it again). `stopped_by` gets the first signal's number.
fn watch_signals(
    stopped_by: Arc<AtomicI32>,
    terminal: bool,
) -> anyhow::Result<watch::Receiver<bool>> {
    let mut interrupt = signal(SignalKind::interrupt())?;
    let mut terminate = signal(SignalKind::terminate())?;
    let (stop_sender, stop) = watch::channel(false);
    tokio::spawn(async move {
        let first = next_signal(&mut interrupt, &mut terminate).await;
        stopped_by.store(first, Ordering::SeqCst);
        stop_sender.send_replace(true);
        // On a terminal, after the progress line.
        let after_progress = if terminal { "\n" } else { "" };
        eprintln!(
            "{after_progress}retrysafe: stopping once the current batch is confirmed and recorded (signal again to stop at once)"
        );
        let second = next_signal(&mut interrupt, &mut terminate).await;
        eprintln!(
            "retrysafe: stopped at once: the batch in flight is not recorded; the same command sends it again"
        );
        std::process::exit(128 + second);
    });
    Ok(stop)
}

async fn next_signal(interrupt: &mut Signal, terminate: &mut Signal) -> i32 {
    const SIGINT: i32 = 2;
    const SIGTERM: i32 = 15;
    tokio::select! {
        _ = interrupt.recv() => SIGINT,
        _ = terminate.recv() => SIGTERM,
    }
}

/// One line on standard error, redrawn after each batch: only on a terminal.
struct Progress {
    terminal: bool,
    shown: bool,
}

impl Progress {
    fn new(terminal: bool) -> Self {
        Self {
            terminal,
            shown: false,
        }
    }

    fn show(&mut self, replay: &ReplayRecord, sent: u64, elapsed: Duration) {
        if !self.terminal {
            return;
        }
        let rate = sent as f64 / elapsed.as_secs_f64().max(0.001);
        let left = (replay.events_total - replay.events_sent).max(0);
        let eta = if rate > 0.0 {
            humantime::format_duration(Duration::from_secs((left as f64 / rate).ceil() as u64))
                .to_string()
        } else {
            "?".into()
        };
        let percent = if replay.events_total > 0 {
            100 * replay.events_sent / replay.events_total
        } else {
            100
        };
        eprint!(
            "\r\x1b[Kreplay {}: {}/{} events ({percent}%), {rate:.0} events/s, ETA {eta}",
            replay.id, replay.events_sent, replay.events_total
        );
        self.shown = true;
    }

    fn finish(&mut self) {
        if self.shown {
            eprintln!();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resume_commands_quote_what_the_shell_would_split() {
        assert_eq!(shell_quote("--since"), "--since");
        assert_eq!(
            shell_quote("2026-12-01T00:00:00.000000Z"),
            "2026-12-01T00:00:00.000000Z"
        );
        assert_eq!(shell_quote("1h 30m"), "'1h 30m'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote(""), "''");
    }
}
