//! The command line: `serve`, `migrate`, `check-config`, `outbox status|retry|replay`
//! (`outbox replay` is the module `replay`), `purge`, `token new`, and the caller's side, `send`
//! ([`send`]).

mod replay;
mod retry;
mod send;
mod skip;

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{Parser, Subcommand};

use crate::config::{is_valid_client_id, Config, Settings};
use crate::startup::Application;
use crate::{db, http, janitor, outbox, telemetry};

/// Where the configuration is looked for when `--config` is not given: the working directory,
/// then the installed location.
const DEFAULT_CONFIG_PATHS: [&str; 2] = ["./config.toml", "/etc/retrysafe/config.toml"];

#[derive(Parser)]
#[command(
    name = "retrysafe",
    version,
    about = "Makes retried writes safe: idempotency keys, exactly-once writes, outbox delivery to RabbitMQ"
)]
pub struct Cli {
    /// Configuration file [default: ./config.toml, else /etc/retrysafe/config.toml]
    #[arg(long, global = true, value_name = "PATH", env = "RETRYSAFE_CONFIG")]
    config: Option<PathBuf>,

    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the daemon: apply migrations, then serve HTTP and relay events until SIGTERM
    Serve,
    /// Create the database if missing and apply pending migrations, then exit
    Migrate,
    /// Validate the configuration (file and environment) without starting
    CheckConfig,
    /// Inspect, requeue and replay outbox events
    Outbox {
        #[command(subcommand)]
        command: OutboxCommand,
    },
    /// Run one janitor pass: delete expired idempotency records and old sent events
    Purge,
    /// Manage client tokens
    Token {
        #[command(subcommand)]
        command: TokenCommand,
    },
    /// Send one write to a daemon, retrying it safely with one stable key (for scripts, cron and
    /// systemd timers)
    #[command(after_help = send::EXIT_STATUS_HELP)]
    Send(send::SendArgs),
}

#[derive(Subcommand)]
enum OutboxCommand {
    /// Unsent and parked events per event type, the age of the oldest unsent one, and the
    /// recent replays
    Status {
        /// Print JSON instead of a table
        #[arg(long)]
        json: bool,
    },
    /// Requeue parked events for delivery, with a fresh attempt count: a selection of them
    /// (type, client, error, when parked), paced with --rate
    #[command(after_help = retry::HELP)]
    Retry(retry::RetryArgs),
    /// Give up on one event for good: it is never published, and the later events of its
    /// ordering key, which it held back, go on; recorded with who, when and why
    Skip(skip::SkipArgs),
    /// Publish past events again, with their original event ids: to the exchange, or to one
    /// queue (--to-queue); paced, resumable, recorded
    #[command(after_help = replay::EXIT_STATUS_HELP)]
    Replay(replay::ReplayArgs),
}

#[derive(Subcommand)]
enum TokenCommand {
    /// Print a fresh bearer token and the configuration lines that admit it: a client's (the
    /// API), or an admin's (the admin listener: admin API and console)
    #[command(group(clap::ArgGroup::new("principal").required(true).args(["client", "admin"])))]
    New {
        /// Client id: 1 to 64 of a-z A-Z 0-9 . _ -
        #[arg(long, value_name = "NAME")]
        client: Option<String>,
        /// Admin id: 1 to 64 of a-z A-Z 0-9 . _ -
        #[arg(long, value_name = "NAME")]
        admin: Option<String>,
    },
}

impl Cli {
    fn config_path(&self) -> PathBuf {
        if let Some(path) = &self.config {
            return path.clone();
        }
        DEFAULT_CONFIG_PATHS
            .iter()
            .map(Path::new)
            .find(|path| path.exists())
            .unwrap_or(Path::new(DEFAULT_CONFIG_PATHS[0]))
            .to_path_buf()
    }

    fn settings(&self) -> anyhow::Result<Settings> {
        Ok(Settings::load(&self.config_path())?)
    }
}

/// Runs the command line; the process exit code is 0 on success, 1 on error, and for `send` and
/// `outbox replay` the statuses their help documents.
pub fn run() -> anyhow::Result<ExitCode> {
    let cli = Cli::parse();
    match &cli.command {
        // These read no configuration file: a job's machine may have none.
        Command::Send(args) => send::run(args),
        Command::Token {
            command: TokenCommand::New { client, admin },
        } => match (client, admin) {
            (Some(client), _) => token_new("client", client),
            (None, Some(admin)) => token_new("admin", admin),
            (None, None) => unreachable!("clap requires --client or --admin"),
        }
        .map(|()| ExitCode::SUCCESS),
        _ => run_with_settings(&cli),
    }
}

fn run_with_settings(cli: &Cli) -> anyhow::Result<ExitCode> {
    let path = cli.config_path();
    let settings = cli.settings()?;
    let config = settings.validated()?;
    let stray = crate::config::stray_environment();
    let done = match &cli.command {
        Command::CheckConfig => {
            for name in &stray {
                eprintln!("warning: {name} is ignored: configuration variables are RETRYSAFE_<SECTION>__<KEY>");
            }
            for warning in crate::config::warnings(&config, &path) {
                eprintln!("warning: {warning}");
            }
            check_tls_files(&config)?;
            println!("{}: configuration is valid", path.display());
            Ok(())
        }
        Command::Serve => {
            let export = telemetry::init_logging_and_traces(&config.log, &config.telemetry);
            for name in &stray {
                tracing::warn!(variable = %name, "ignored: configuration variables are RETRYSAFE_<SECTION>__<KEY>");
            }
            for warning in crate::config::warnings(&config, &path) {
                tracing::warn!(key = %warning.key, "{}", warning.message);
            }
            let served = actix_web::rt::System::new().block_on(serve(config));
            if let Some(export) = export {
                export.shutdown();
            }
            served
        }
        Command::Migrate => {
            telemetry::init_logging(&config.log);
            let migrated = block_on(async {
                db::migrate(&config.database)
                    .await
                    .map_err(|error| anyhow::anyhow!("{error}"))
            })?;
            println!(
                "applied {} migration(s); the schema is at version {}",
                migrated.applied,
                db::latest_migration_version()
            );
            if !migrated.distributed.is_empty() {
                println!(
                    "distributed over the Citus workers, their rows moved into the shards: {}",
                    migrated.distributed.join(", ")
                );
            }
            Ok(())
        }
        Command::Outbox { command } => {
            return block_on(outbox_command(&config, cli.config.as_deref(), command));
        }
        Command::Purge => block_on(async {
            let db = db::Database::new(&config.database)?;
            let report = janitor::purge_once(&db, config.outbox.retention).await?;
            println!(
                "deleted {} expired idempotency record(s) and {} sent event(s) older than {}",
                report.records_deleted,
                report.events_deleted,
                humantime::format_duration(config.outbox.retention)
            );
            Ok(())
        }),
        Command::Token { .. } | Command::Send(_) => {
            unreachable!("handled before the configuration is loaded")
        }
    };
    done.map(|()| ExitCode::SUCCESS)
}

/// Reads every TLS file the configuration names, as `serve` would at start, without
/// connecting: each is readable, PEM, with a certificate or a key as expected, and each key
/// matches its certificate. An error names the key and the file.
fn check_tls_files(config: &Config) -> anyhow::Result<()> {
    if let Some((certificate_file, key_file)) = config.http.tls_files() {
        let info = crate::tls::server::ServerCertificate::check(certificate_file, key_file)
            .map_err(|error| anyhow::anyhow!("invalid configuration: {error}"))?;
        if info.has_expired() {
            eprintln!(
                "warning: http.tls_cert_file: {}: the certificate expired on {}",
                certificate_file.display(),
                info.not_after_text()
            );
        }
    }
    db::tls::connector(config.database.url.tls())
        .map_err(|error| anyhow::anyhow!("invalid configuration: database.url: {error}"))?;
    outbox::broker::tls_config(&config.amqp)?;
    Ok(())
}

fn block_on<T>(future: impl std::future::Future<Output = anyhow::Result<T>>) -> anyhow::Result<T> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?
        .block_on(future)
}

async fn outbox_command(
    config: &Config,
    config_path: Option<&Path>,
    command: &OutboxCommand,
) -> anyhow::Result<ExitCode> {
    let db = db::Database::new(&config.database)?;
    match command {
        OutboxCommand::Replay(args) => return replay::run(config, &db, config_path, args).await,
        OutboxCommand::Status { json } => {
            let (rows, parked, blocked, blocking) = db
                .run(async |connection| {
                    let rows = outbox::store::status(&**connection).await?;
                    let parked = outbox::store::parked_groups(&**connection).await?;
                    let blocked = outbox::store::blocked(&**connection).await?;
                    let blocking = outbox::store::blocking_events(&**connection).await?;
                    Ok((rows, parked, blocked, blocking))
                })
                .await?;
            let replays = outbox::replay::recent(&db, replay::RECENT_REPLAYS).await?;
            if *json {
                let status = serde_json::json!({
                    "backlog": rows,
                    "parked": parked,
                    "blocked": {"events": blocked.events, "keys": blocked.keys, "by": blocking},
                    "replays": replays,
                });
                println!("{}", serde_json::to_string_pretty(&status)?);
                return Ok(ExitCode::SUCCESS);
            }
            print_backlog(&rows);
            print_parked(&parked);
            print_blocked(&blocked, &blocking);
            print_replays(&replays);
        }
        OutboxCommand::Retry(args) => retry::run(&db, args).await?,
        OutboxCommand::Skip(args) => skip::run(&db, args).await?,
    }
    Ok(ExitCode::SUCCESS)
}

fn print_backlog(rows: &[outbox::store::TypeStatus]) {
    println!(
        "{:<32} {:>10} {:>10} {:>14}",
        "event type", "unsent", "parked", "oldest unsent"
    );
    let (mut unsent, mut parked) = (0, 0);
    for row in rows {
        let oldest = row
            .oldest_unsent_age_seconds
            .map(|age| {
                humantime::format_duration(Duration::from_secs(age.max(0.0) as u64)).to_string()
            })
            .unwrap_or_else(|| "-".into());
        println!(
            "{:<32} {:>10} {:>10} {:>14}",
            row.event_type, row.unsent, row.parked, oldest
        );
        unsent += row.unsent;
        parked += row.parked;
    }
    println!("{:<32} {:>10} {:>10}", "total", unsent, parked);
}

/// Parked events by event type and last error, the largest groups first.
fn print_parked(groups: &[outbox::store::ParkedGroup]) {
    if groups.is_empty() {
        return;
    }
    println!();
    println!(
        "parked events by last error (requeue a group with `retrysafe outbox retry --type TYPE --error TEXT`):"
    );
    println!(
        "{:>10}  {:<32}  {:<20}  {:<20}  last error",
        "parked", "event type", "first parked", "last parked"
    );
    for group in groups {
        println!(
            "{:>10}  {:<32}  {:<20}  {:<20}  {}",
            group.parked,
            group.event_type,
            group.first_parked_at.format("%Y-%m-%dT%H:%M:%SZ"),
            group.last_parked_at.format("%Y-%m-%dT%H:%M:%SZ"),
            group.last_error
        );
    }
    if groups.len() as i64 == outbox::store::PARKED_GROUPS_SHOWN {
        println!(
            "(the {} largest groups)",
            outbox::store::PARKED_GROUPS_SHOWN
        );
    }
}

/// Ordered delivery held back by parked events: how much, and which events to retry or skip.
fn print_blocked(blocked: &outbox::store::Blocked, blocking: &[outbox::store::BlockingEvent]) {
    println!();
    let at_least = if blocked.events >= outbox::store::GAUGE_COUNT_CAP {
        "at least "
    } else {
        ""
    };
    println!(
        "blocked: {at_least}{} event(s) of {} ordering key(s) wait behind a parked event",
        blocked.events, blocked.keys
    );
    if blocking.is_empty() {
        return;
    }
    println!(
        "(`retrysafe outbox retry --event ID` once its cause is fixed, or `retrysafe outbox skip --event ID` to give it up)"
    );
    println!(
        "{:>10}  {:<36}  {:<20}  {:<24}  {:>10}  last error",
        "blocked", "parked event", "client", "ordering key", "sequence"
    );
    for event in blocking {
        println!(
            "{:>10}  {:<36}  {:<20}  {:<24}  {:>10}  {}",
            event.blocked,
            event.event_id,
            event.client_id,
            event.ordering_key,
            event.sequence,
            event.last_error
        );
    }
    if blocking.len() as i64 == outbox::store::BLOCKING_SHOWN {
        println!(
            "(the {} that block the most)",
            outbox::store::BLOCKING_SHOWN
        );
    }
}

/// The recent replays, newest first: who asked for what, and how far each got.
fn print_replays(replays: &[outbox::replay::ReplayRecord]) {
    println!();
    if replays.is_empty() {
        println!("no replays");
        return;
    }
    println!(
        "{:>6}  {:<20}  {:<11}  {:>15}  {:<24}  {:<28}  selection",
        "replay", "started", "status", "sent/total", "requested by", "target"
    );
    for replay in replays {
        let selection = match replay.parsed_selection() {
            Some(selection) => selection.arguments().join(" "),
            None => replay.selection.to_string(),
        };
        println!(
            "{:>6}  {:<20}  {:<11}  {:>15}  {:<24}  {:<28}  {selection}",
            replay.id,
            replay.started_at.format("%Y-%m-%dT%H:%M:%SZ"),
            replay.status,
            format!("{}/{}", replay.events_sent, replay.events_total),
            replay.requested_by,
            replay.target,
        );
        if let Some(error) = &replay.last_error {
            println!("{:>6}  last error: {error}", "");
        }
    }
}

async fn serve(config: Config) -> anyhow::Result<()> {
    tracing::info!(
        version = env!("CARGO_PKG_VERSION"),
        database = %config.database.url,
        broker = %config.amqp.shown(),
        "starting"
    );
    let application = Application::build(config).await?;
    application.run_until_signal().await?;
    tracing::info!("stopped");
    Ok(())
}

/// Prints a token for a `kind` ("client" or "admin") named `name`, and its configuration.
fn token_new(kind: &str, name: &str) -> anyhow::Result<()> {
    if !is_valid_client_id(name) {
        anyhow::bail!("--{kind} {name:?}: must be 1 to 64 of a-z A-Z 0-9 . _ -");
    }
    let (token, digest) = http::auth::new_token();
    let (holder, table) = match kind {
        "admin" => (
            "the admin (the admin api and the console on admin.listen)",
            "auth.admins",
        ),
        _ => ("the client", "auth.clients"),
    };
    println!("# token for {kind} {name:?}; give it to {holder}, it is not stored anywhere:");
    println!("{token}");
    println!();
    println!("# add to the configuration ([[{table}]] may repeat):");
    println!("[[{table}]]");
    println!("id = \"{name}\"");
    println!("token_sha256 = \"{digest}\"");
    Ok(())
}
