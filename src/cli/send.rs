//! `retrysafe send`: one write from a shell script, a cron entry or a systemd timer, with one
//! stable key, retried safely. A thin shell over [`crate::client`]; it reads no configuration
//! file, so it runs on machines that have none.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{ArgGroup, Args};

use crate::client::{
    key_as_given, key_for_intent, Client, EntryRequest, Outcome, RequestError, RetryPolicy,
};

/// The daemon refused the request (or it failed the same checks here): it must be fixed.
/// EX_DATAERR in sysexits.h.
pub const EXIT_REFUSED: u8 = 65;

/// Transient failures until `--max-time`: trying again later with the same key is safe.
/// EX_TEMPFAIL in sysexits.h, which cron and systemd users know as "try again later".
pub const EXIT_GAVE_UP: u8 = 75;

/// Where the token comes from when `--token-file` is not given; never a command-line argument,
/// which every user of the machine can read in the process list.
pub const TOKEN_VARIABLE: &str = "RETRYSAFE_TOKEN";

pub const EXIT_STATUS_HELP: &str = "\
Exit status:
  0   created, or replayed (written before with this key): the entry is on standard output
  1   error before sending: unreadable --data file, --token-file or --ca-file, invalid --url
  2   usage error
  65  refused: the daemon answered a 4xx other than 408, 409 request-in-progress and 429 (or a
      redirect), or the request failed the daemon's checks here and was not sent; retrying is
      pointless, the request must be fixed
  75  gave up: transient failures (no connection, timeouts, 408, 409 request-in-progress, 429,
      5xx) until --max-time; the write may or may not have happened, and running again later
      with the same key is safe

Every attempt is logged on standard error with its outcome. The token is read from
--token-file (its first line) or RETRYSAFE_TOKEN, never from the command line. The key
derived from --intent is \"intent-\" followed by the lowercase hex SHA-256 of the intent's
UTF-8 bytes. Needs no configuration file.";

#[derive(Args)]
#[command(group(ArgGroup::new("idempotency_key").required(true).args(["key", "intent"])))]
pub struct SendArgs {
    /// The daemon's base URL, e.g. http://127.0.0.1:8080
    #[arg(long, env = "RETRYSAFE_URL", value_name = "URL")]
    url: String,
    /// The entry's kind: 1 to 64 of a-z 0-9 . _ -
    #[arg(long)]
    kind: String,
    /// The entry's data, a JSON object: the text itself, @FILE, or - for standard input
    #[arg(long, value_name = "JSON|@FILE|-")]
    data: String,
    /// The Idempotency-Key as given; use the same one on every run for the same intent
    #[arg(long, value_name = "KEY")]
    key: Option<String>,
    /// Derive the key from this text, the same on every run and machine, e.g.
    /// "nightly-invoices:2026-01-31"
    #[arg(long, value_name = "TEXT")]
    intent: Option<String>,
    /// Deliver this write's events after those of the client's earlier writes with the same
    /// ordering key (1 to 255 visible ASCII), e.g. "invoice-42"
    #[arg(long, value_name = "KEY")]
    ordering_key: Option<String>,
    /// A file whose first line is the bearer token [else RETRYSAFE_TOKEN]
    #[arg(long, value_name = "PATH")]
    token_file: Option<PathBuf>,
    /// PEM CA certificates trusted besides the platform's, for an https:// URL
    #[arg(long, env = "RETRYSAFE_CA_FILE", value_name = "PATH")]
    ca_file: Option<PathBuf>,
    /// Bound on one attempt: connect, send, read the answer
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = humantime::parse_duration)]
    timeout: Duration,
    /// Bound on the whole run, after which it gives up (exit 75)
    #[arg(long, value_name = "DURATION", default_value = "10m", value_parser = humantime::parse_duration)]
    max_time: Duration,
    /// Print the key and the request without sending it
    #[arg(long)]
    dry_run: bool,
}

pub fn run(args: &SendArgs) -> anyhow::Result<ExitCode> {
    let data = read_data(&args.data)?;
    let key = match (&args.key, &args.intent) {
        (Some(key), _) => key_as_given(key),
        (None, Some(intent)) => key_for_intent(intent),
        (None, None) => unreachable!("clap requires --key or --intent"),
    };
    let request = key
        .and_then(|key| EntryRequest::from_json_text(key, &args.kind, &data))
        .and_then(|request| match &args.ordering_key {
            Some(ordering_key) => request.with_ordering_key(ordering_key),
            None => Ok(request),
        });
    let request = match request {
        Ok(request) => request,
        Err(error) => return Ok(refused_here(&error)),
    };
    let mut builder = Client::builder(&args.url).policy(RetryPolicy {
        max_time: args.max_time,
        attempt_timeout: args.timeout,
        ..RetryPolicy::default()
    });
    if let Some(token) = read_token(args.token_file.as_deref())? {
        builder = builder.token(token);
    }
    if let Some(ca_file) = &args.ca_file {
        builder = builder.ca_file(ca_file);
    }
    // awc's futures are not Send: one actix system on this thread runs them.
    actix_web::rt::System::new().block_on(async {
        let client = builder.build()?;
        if args.dry_run {
            print_dry_run(&client, &request);
            return Ok(ExitCode::SUCCESS);
        }
        Ok(send(&client, &request).await)
    })
}

fn refused_here(error: &RequestError) -> ExitCode {
    eprintln!("send: refused, nothing sent: {error}");
    ExitCode::from(EXIT_REFUSED)
}

async fn send(client: &Client, request: &EntryRequest) -> ExitCode {
    let key = request.key();
    let outcome = client
        .send_observed(request, |report| eprintln!("send: key {key}: {report}"))
        .await;
    match outcome {
        Outcome::Created(written) | Outcome::Replayed(written) => {
            println!("{}", written.body);
            ExitCode::SUCCESS
        }
        Outcome::Refused { .. } => ExitCode::from(EXIT_REFUSED),
        Outcome::GaveUp {
            attempts,
            elapsed,
            last_error,
        } => {
            eprintln!(
                "send: key {key}: gave up after {attempts} attempt(s) in {:.1}s, the last: {last_error}; running again later with the same key is safe",
                elapsed.as_secs_f64()
            );
            ExitCode::from(EXIT_GAVE_UP)
        }
    }
}

/// The request as it would go out, the token masked.
fn print_dry_run(client: &Client, request: &EntryRequest) {
    println!("POST {}", client.entries_url());
    println!("Idempotency-Key: {}", request.key());
    println!("Content-Type: application/json");
    if client.has_token() {
        println!("Authorization: Bearer ***");
    }
    println!();
    println!("{}", request.body_text());
}

/// `--data`: the JSON text itself, `@FILE`, or `-` for standard input.
fn read_data(data: &str) -> anyhow::Result<String> {
    if data == "-" {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .context("--data -: reading standard input")?;
        return Ok(text);
    }
    match data.strip_prefix('@') {
        Some(path) => std::fs::read_to_string(path).with_context(|| format!("--data @{path}")),
        None => Ok(data.to_owned()),
    }
}

/// The first line of `--token-file`, else `RETRYSAFE_TOKEN`; None when neither is set (the
/// daemon's anonymous client).
fn read_token(token_file: Option<&Path>) -> anyhow::Result<Option<String>> {
    if let Some(path) = token_file {
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("--token-file {}", path.display()))?;
        let token = text.lines().next().unwrap_or_default().trim();
        if token.is_empty() {
            anyhow::bail!("--token-file {}: the first line is empty", path.display());
        }
        return Ok(Some(token.to_owned()));
    }
    match std::env::var(TOKEN_VARIABLE) {
        Ok(token) if !token.trim().is_empty() => Ok(Some(token)),
        Ok(_) | Err(std::env::VarError::NotPresent) => Ok(None),
        Err(std::env::VarError::NotUnicode(_)) => {
            anyhow::bail!("{TOKEN_VARIABLE} is not valid UTF-8")
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Wrapper {
        #[command(flatten)]
        send: SendArgs,
    }

    #[test]
    fn the_defaults_are_the_policys() {
        let args = Wrapper::parse_from([
            "send",
            "--url",
            "http://127.0.0.1:1",
            "--kind",
            "k",
            "--data",
            "{}",
            "--key",
            "k",
        ])
        .send;
        let policy = RetryPolicy::default();
        assert_eq!(args.timeout, policy.attempt_timeout);
        assert_eq!(args.max_time, policy.max_time);
    }
}
