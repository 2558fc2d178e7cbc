//! The command line: `serve`, `migrate`, `check-config`, `token new`.

use std::path::{Path, PathBuf};

use clap::{Parser, Subcommand};

use crate::config::{is_valid_client_id, Settings};
use crate::startup::Application;
use crate::{db, http, telemetry};

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
    /// Run the daemon: apply migrations, then serve HTTP
    Serve,
    /// Create the database if missing and apply pending migrations, then exit
    Migrate,
    /// Validate the configuration (file and environment) without starting
    CheckConfig,
    /// Manage client tokens
    Token {
        #[command(subcommand)]
        command: TokenCommand,
    },
}

#[derive(Subcommand)]
enum TokenCommand {
    /// Print a fresh bearer token and the configuration lines that admit it
    New {
        /// Client id: 1 to 64 of a-z A-Z 0-9 . _ -
        #[arg(long, value_name = "NAME")]
        client: String,
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

/// Runs the command line; the process exit code is 0 on success, 1 on error.
pub fn run() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match &cli.command {
        Command::Token {
            command: TokenCommand::New { client },
        } => token_new(client),
        Command::CheckConfig => {
            let path = cli.config_path();
            Settings::load(&path)?;
            println!("{}: configuration is valid", path.display());
            Ok(())
        }
        Command::Migrate => {
            let settings = cli.settings()?;
            telemetry::init(&settings.log);
            let runtime = tokio::runtime::Runtime::new()?;
            let applied = runtime
                .block_on(db::migrate(&settings.database))
                .map_err(|error| anyhow::anyhow!("migration failed: {error}"))?;
            println!(
                "applied {applied} migration(s); the schema is at version {}",
                db::latest_migration_version()
            );
            Ok(())
        }
        Command::Serve => {
            let settings = cli.settings()?;
            telemetry::init(&settings.log);
            actix_web::rt::System::new().block_on(serve(settings))
        }
    }
}

async fn serve(settings: Settings) -> anyhow::Result<()> {
    tracing::info!(version = env!("CARGO_PKG_VERSION"), database = %crate::config::redact_url(&settings.database.url), "starting");
    let application = Application::build(settings).await?;
    application.run_until_stopped().await?;
    tracing::info!("stopped");
    Ok(())
}

fn token_new(client: &str) -> anyhow::Result<()> {
    if !is_valid_client_id(client) {
        anyhow::bail!("--client {client:?}: must be 1 to 64 of a-z A-Z 0-9 . _ -");
    }
    let (token, digest) = http::auth::new_token();
    println!("# token for client {client:?}; give it to the client, it is not stored anywhere:");
    println!("# Authorization: Bearer {token}");
    println!("{token}");
    println!();
    println!("# add to config.toml:");
    println!("[[auth.clients]]");
    println!("id = \"{client}\"");
    println!("token_sha256 = \"{digest}\"");
    Ok(())
}
