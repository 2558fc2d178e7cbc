//! The sections of the configuration, each key declared once ([`section!`]), and the small
//! types their keys take.

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::config::keys::{minutes, section, Bound, HOUR, TEN_YEARS};
use crate::config::redact_url;

fn localhost(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

fn secs(seconds: u64) -> Duration {
    Duration::from_secs(seconds)
}

section! {
    /// The listeners: the API's, and the probes' and metrics' when `operations_listen` is set.
    pub struct HttpSettings("http") {
        /// Address the HTTP server binds. An IP address, not a host name (`[::1]:8080` for IPv6).
        /// Port 0 picks a free port. Any address that is not loopback requires at least one
        /// `[[auth.clients]]`, or the daemon refuses to start. The listener speaks plain HTTP, or
        /// HTTPS only when `tls_cert_file` and `tls_key_file` are set. A non-loopback address with
        /// `[[auth.clients]]` and plain HTTP logs a warning at start: bearer tokens travel in
        /// clear.
        listen: SocketAddr = localhost(8080), Bound::Any;
        /// Largest request body accepted; a larger one gets 413 `payload-too-large`. Bodies over 16
        /// KiB are decoded off the HTTP workers, on the blocking pool, as many at a time as there
        /// are cores; a body that waits past `idempotency.wait_timeout` for its turn gets 503.
        max_body_bytes: usize = 64 * 1024, Bound::Count(64, 64 << 20);
        /// On SIGTERM/SIGINT: how long the whole stop may take, counted from the signal: the
        /// requests in flight, the writers' queues, the relays' batches, the background tasks and
        /// the broker's close each get what the steps before them left. See
        /// [Shutdown](operations.md#shutdown).
        shutdown_timeout: Duration = secs(30), Bound::Duration(HOUR);
        /// How long a client may take to send the body of `POST /v1/entries` once its headers are
        /// in; a body that does not arrive in time gets 408 `request-timeout` and nothing is
        /// written.
        body_timeout: Duration = secs(30), Bound::Duration(HOUR);
        /// How long a client may take to send a request's head (the request line and the headers).
        /// Past it the daemon answers 408 and closes the connection; such answers are counted in
        /// `retrysafe_http_protocol_errors_total{status="408"}`.
        head_timeout: Duration = secs(5), Bound::Duration(HOUR);
        /// HTTP worker threads, each with its own event loop; 0 is one per CPU core (actix-web's
        /// default). The daemon's other work (the key shards, the writers, the relays, the broker
        /// connection) runs on threads of its own beside them. On a machine of few cores shared
        /// with PostgreSQL and RabbitMQ, `1` may serve more replays, or make no difference: measure
        /// before you change it (see BENCHMARKS.md).
        workers: usize = 0, Bound::Count(0, 256);
        /// PEM certificate of the HTTPS listener, followed by its intermediate certificates (the
        /// chain, as certbot's `fullchain.pem`). With `tls_key_file`, `listen` serves HTTPS only
        /// (TLS 1.2 and 1.3, HTTP/1.1 only: the handshake offers no `h2`, see [The HTTPS
        /// listener](tls.md#the-https-listener)). Read at start; read again on SIGHUP (`systemctl
        /// reload retrysafe`), see [TLS](tls.md). Both keys or neither.
        tls_cert_file: Option<PathBuf> = None, Bound::Any;
        /// PEM private key of `tls_cert_file` (PKCS#8, PKCS#1 or SEC1, unencrypted). It must match
        /// the certificate.
        tls_key_file: Option<PathBuf> = None, Bound::Any;
        /// When set, `/readyz`, `/metrics` and `/openapi.json` are served on this address, plain
        /// HTTP, and answer 404 `not-found` on `listen`; `/healthz` is served on both, the API on
        /// `listen` only. They tell whoever reaches them the outbox backlog, the request counts,
        /// the version and whether anonymous mode is on, and need no credentials: keep this address
        /// loopback, or one only the monitoring network reaches (the daemon warns at start, and
        /// `check-config` prints a warning, when it is not loopback). Must differ from `listen`.
        /// Port 0 picks a free port.
        operations_listen: Option<SocketAddr> = None, Bound::Any;
    }
}

impl HttpSettings {
    /// The certificate and key files, when the listener is HTTPS.
    pub fn tls_files(&self) -> Option<(&Path, &Path)> {
        Some((
            self.tls_cert_file.as_deref()?,
            self.tls_key_file.as_deref()?,
        ))
    }
}

section! {
    /// PostgreSQL: the connection, the pools, the writers and their bounds.
    pub struct DatabaseSettings("database") {
        /// PostgreSQL connection string (a `postgres://` or `postgresql://` URL, or libpq's
        /// `key=value` pairs), parsed once at start; the pool, `migrate`, the warnings, the logs
        /// and the connect errors all take what was parsed. The URL's grammar: the user info runs
        /// to the first `@` (user and password split at the first `:`), so a password may hold `?`,
        /// `/`, `#` or `:` unencoded (libpq ends the user info at a `/` too; the daemon does not);
        /// then the hosts, to the next `/` or `?`: comma-separated, each `name[:port]`,
        /// `[IPv6][:port]` or a socket directory percent-encoded (`%2Fvar%2Frun%2Fpostgresql`);
        /// then `/dbname`; then `?key=value&...`. Every part is percent-decoded. A parameter given
        /// again takes the later value (the query's over the URL's parts, as in libpq: `?host=`
        /// replaces the hosts). Refused at validation, so that `check-config`, `migrate` and
        /// `serve` stop before anything connects, with a message that quotes no part of the string
        /// (any of it may be a piece of a password): an `@` after the one that ends the user info
        /// (a password holding `@` must write it `%40`; otherwise the rest of the password would be
        /// read as the host, and named in warnings and connect errors); a user info that is the
        /// rest of a URL (a user name holding `/`, `?`, `=` or `&`, or `?password=`-like text: an
        /// `@` in the query, which must be written `%40`); a host with a character no host name
        /// has, an empty host, no host at all; a port that is not 1 to 65535; a parameter the
        /// daemon does not know (libpq's others, such as `sslcrl` or `service`, are named). The
        /// database it names is created (at start and by `migrate`) only when connecting to it
        /// fails with SQLSTATE `3D000` (database does not exist): the daemon then connects to the
        /// `postgres` database as the same role and runs `CREATE DATABASE`. A role that cannot
        /// connect to `postgres` therefore works against an existing database. It may hold a
        /// password; logs show it rebuilt from the parsed parts: `postgres://user:***@host:5432/db`
        /// (every host with its port, no query string), or `host=db port=5432 user=app password=***
        /// dbname=x` for `key=value` pairs; connect errors name each host as `host:port`. TLS
        /// follows libpq's parameters, in the query after the host part (a `?` in the password does
        /// not hide them) or as `key=value` pairs: `sslmode` (`disable`, `prefer` the default,
        /// `require`, `verify-ca`, `verify-full`), `sslrootcert` (a PEM file of CA certificates, or
        /// `system`), `sslcert` and `sslkey` (a client certificate); see [TLS](tls.md).
        /// `application_name` is `retrysafe` unless the URL sets one.
        url: ConnectionString = ConnectionString::from("postgres://postgres@127.0.0.1:5432/retrysafe"), Bound::Any;
        /// Connections the daemon opens at most, in two pools: a quarter (at least one) for reads
        /// (`GET` routes), readiness checks and the outbox gauges, named `<application_name>
        /// (reads)` in `pg_stat_activity`, of which the admin listener's requests take at most half
        /// at once (at least one); the rest for the writers (one each while a batch commits), the
        /// outbox relays (one each for the whole of a batch, publishing included) and the janitor.
        /// So no flood of reads or probes can take the connections writes need.
        pool_size: u32 = 16, Bound::Count(2, 1000);
        /// Writer actors; each commits one batch (one transaction, one round trip) at a time,
        /// taking everything queued when it is free (the writers share one queue). Each holds a
        /// connection of the write pool (three quarters of `pool_size`) while its batch commits,
        /// which it shares with the relays (up to `2 × outbox.workers`) and the janitor (one): when
        /// they need more at once, each waits its turn for a connection (at most
        /// `connect_timeout`); with the defaults, 6 + 4 + 1 = 11 of the 12 never wait. The further
        /// PostgreSQL is, the more batches must be in flight to keep a write from waiting for a
        /// writer; but the more writers, the fewer writes each batch carries, and each batch costs
        /// PostgreSQL and the daemon a commit of its own. Measured side by side (see
        /// BENCHMARKS.md), 6 writers cost less CPU per write than 8 and wrote more with PostgreSQL
        /// on the same host or 2 ms away, and less with PostgreSQL 20 ms away. So 6 for PostgreSQL
        /// on the same host or network; 8 or more, with a `pool_size` that gives each a connection
        /// beside the relays, for a PostgreSQL many milliseconds away.
        writers: usize = 6, Bound::Count(1, 64);
        /// Most writes one batch takes; a batch also stops at 2 MiB of request data. A batch the
        /// server cancels for running past `statement_timeout` is committed again in halves. A
        /// writer with `8 × max_batch` writes queued refuses new ones at once with 503
        /// `storage-unavailable` (load shedding).
        max_batch: usize = 256, Bound::Count(1, 10_000);
        /// Bound on waiting for a free pooled connection, and on each attempt to open one: per host
        /// of `database.url`, the whole attempt (TCP, TLS, authentication, the read-write check) is
        /// bounded by it, so a host that accepts TCP but never answers costs one timeout and the
        /// next host is tried. Past it the request gets 503 `storage-unavailable`. A readiness
        /// check is bounded by this plus one second.
        connect_timeout: Duration = secs(2), Bound::Duration(minutes(5));
        /// How long `serve` (and `migrate`) wait at start for a database that is not there yet:
        /// unreachable, starting up (`57P03`), or with every connection slot taken (`53300`). They
        /// try again with backoff (0.25 s doubling to 5 s), each attempt within `connect_timeout`,
        /// logging at WARN why (`waiting for the database at start`), and exit 1 once the time is
        /// up. A refusal only the configuration can fix (authentication, TLS, a missing role) stops
        /// the start at once. Keep it below systemd's start timeout (the unit sets
        /// `TimeoutStartSec=90s`).
        start_timeout: Duration = secs(60), Bound::Duration(HOUR);
        /// Set on every pooled connection as PostgreSQL's `statement_timeout` and `lock_timeout`,
        /// so a statement that runs or waits for a lock longer is cancelled and its requests get
        /// 503 instead of hanging. The daemon also bounds every operation on its side, by this plus
        /// 2 seconds (a relay's batch gets `outbox.confirm_timeout` more): a server that hangs
        /// enforces no timeout of its own. A connection whose operation passed that deadline is
        /// dropped, never reused. Migrations run without these bounds (an index build may take
        /// long); connecting for them is bounded as above. Pooled connections also get
        /// `idle_in_transaction_session_timeout` of 5 minutes. The TCP user timeout is
        /// `statement_timeout + connect_timeout`.
        statement_timeout: Duration = secs(5), Bound::Duration(HOUR);
        /// Bound on the request data held by writes queued, being committed, or waiting for another
        /// write of their key. Past it a new write gets 503 `storage-unavailable` at once ("too
        /// many writes are pending"), so a stalled database cannot make memory grow without bound.
        /// A pending write is counted as its canonical data, kind and key plus 512 bytes; while its
        /// batch commits, the statement's copies take a few times that. At least
        /// `http.max_body_bytes` + 1 KiB, at most 16 GiB. `retrysafe_pending_write_bytes` shows the
        /// sum.
        max_pending_bytes: usize = 64 * 1024 * 1024, Bound::Count(64 + 1024, 16 << 30);
        /// On Citus, each shard's statements (a write batch, a relay's batch with its
        /// ordered-delivery statements, the janitor's deletes) go to the node that holds the shard,
        /// found in Citus's metadata (`pg_dist_node`, read again every 30 s), so that the
        /// coordinator is off the write path and the write rate grows with the nodes. Each node is
        /// reached with `database.url`'s user, password, database and TLS settings, in a pool of
        /// its own as large as the write pool. A node the daemon cannot reach directly is reached
        /// through the coordinator until it can. `false` sends every statement through the
        /// coordinator of `database.url`. Nothing changes on a single server.
        citus_direct: bool = true, Bound::Any;
        /// On Citus, where to reach nodes whose address in Citus's metadata is not the one the
        /// daemon reaches them at (a managed offering's internal names, a proxy): entries
        /// `name:port=host:port`, the node as `pg_dist_node` names it, then where to connect,
        /// e.g. `["10.0.0.5:5432=w1.example.com:6432"]` (in the environment, comma-separated).
        /// With `sslmode=verify-full` the certificate is checked against the host connected to.
        /// A node not listed is reached at its address in the metadata.
        citus_node_addresses: Vec<String> = Vec::new(), Bound::Any;
    }
}

section! {
    /// RabbitMQ: the brokers, and the exchange events are published to.
    pub struct AmqpSettings("amqp") {
        /// RabbitMQ URL, `amqp://` or `amqps://` (TLS, see [TLS](tls.md)); one, or a list tried in
        /// turn. A heartbeat of 10 s is asked for unless the URL sets `heartbeat`. Connecting and
        /// opening a channel are each bounded by `connect_timeout`. Logs show the URL with the
        /// password as `***` and without the query string.
        url: UrlList = UrlList::one("amqp://guest:guest@127.0.0.1:5672/%2f"), Bound::Any;
        /// The durable topic exchange the daemon declares and publishes to. It is declared on every
        /// channel the daemon opens, so an exchange deleted while the daemon runs is re-created.
        exchange: String = "retrysafe.events".into(), Bound::Any;
        /// Bound on connecting to one broker of `url` (TCP, TLS, the AMQP handshake) and on opening
        /// a channel; past it the next broker is tried.
        connect_timeout: Duration = secs(10), Bound::Duration(minutes(10));
        /// PEM file of the CA certificates that the certificates of `amqps://` brokers must chain
        /// to; only these are trusted then. Without it, the platform's roots (the system store, or
        /// `SSL_CERT_FILE`/`SSL_CERT_DIR`). Host names are always checked.
        tls_ca_file: Option<PathBuf> = None, Bound::Any;
        /// PEM client certificate (and chain) presented to brokers that ask for one (RabbitMQ's
        /// `ssl_options.verify = verify_peer`, or the EXTERNAL mechanism's certificate). With
        /// `tls_key_file`; both or neither.
        tls_cert_file: Option<PathBuf> = None, Bound::Any;
        /// PEM private key of `tls_cert_file`; it must match the certificate.
        tls_key_file: Option<PathBuf> = None, Bound::Any;
    }
}

/// A PostgreSQL connection string (a URL, or libpq's `key=value` pairs). It may hold a
/// password: shown (`Display`, `Debug`) without it.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ConnectionString(String);

impl ConnectionString {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The text itself (to build or change one), as a `String`; only `Display` and `Debug` hide the
/// password.
impl std::ops::Deref for ConnectionString {
    type Target = String;

    fn deref(&self) -> &String {
        &self.0
    }
}

impl std::ops::DerefMut for ConnectionString {
    fn deref_mut(&mut self) -> &mut String {
        &mut self.0
    }
}

impl From<&str> for ConnectionString {
    fn from(text: &str) -> Self {
        Self(text.to_owned())
    }
}

impl From<String> for ConnectionString {
    fn from(text: String) -> Self {
        Self(text)
    }
}

impl fmt::Display for ConnectionString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&redact_url(&self.0))
    }
}

impl fmt::Debug for ConnectionString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self}")
    }
}

/// One URL or several: a TOML string or array of strings; a string (as an environment variable
/// gives) may list several URLs separated by commas. Shown without passwords.
#[derive(Clone, PartialEq, Eq)]
pub struct UrlList(pub Vec<String>);

impl UrlList {
    pub fn one(url: &str) -> Self {
        Self(vec![url.to_owned()])
    }

    pub fn iter(&self) -> impl Iterator<Item = &str> {
        self.0.iter().map(String::as_str)
    }

    /// The URLs without their passwords, comma-separated, for logs.
    pub fn redacted(&self) -> String {
        self.iter().map(redact_url).collect::<Vec<_>>().join(",")
    }
}

impl fmt::Debug for UrlList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

impl Serialize for UrlList {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for UrlList {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum OneOrMany {
            One(String),
            Many(Vec<String>),
        }
        let urls = match OneOrMany::deserialize(deserializer)? {
            OneOrMany::One(text) => text.split(',').map(|url| url.trim().to_owned()).collect(),
            OneOrMany::Many(urls) => urls.into_iter().map(|url| url.trim().to_owned()).collect(),
        };
        Ok(Self(urls))
    }
}

section! {
    /// Keys, their records and the write path's in-memory state.
    pub struct IdempotencySettings("idempotency") {
        /// How long a completed key is remembered. Each record's `expires_at` is set when it is
        /// written, to the database's `now()` plus the retention (never from the daemon's clock,
        /// see [Clocks](operations.md#clocks)), so a change applies to new records only. After it a
        /// request with the key is new again (new entry, new events). Choose it longer than any
        /// client retries.
        retention: Duration = secs(24 * 3600), Bound::Duration(TEN_YEARS);
        /// Bound on every write request's wait for its answer. A request for a key whose write is
        /// in flight waits for that write's outcome this long, then gets 409 `request-in-progress`
        /// with `Retry-After: 1`; a request whose own write was sent to a writer gets 503
        /// `storage-unavailable` after it (the write may still commit: the retry with the same key
        /// then gets its answer). Also the bound on waiting for a turn to decode a large body.
        wait_timeout: Duration = secs(10), Bound::Duration(minutes(10));
        /// Status for a key reused with a different request: `409`, or `422` as in the IETF draft.
        /// The problem type is `idempotency-key-reused` either way.
        mismatch_status: u16 = 409, Bound::Count(409, 422);
        /// KeyShard actors; keys are spread over them by a hash of (client, key).
        shards: usize = 8, Bound::Count(1, 1024);
        /// Completed responses kept in memory for replays, across all shards (each holds
        /// `cache_entries / shards`, rounded up); oldest evicted first. Besides this count the
        /// cache holds at most 64 MiB in all (keys and bodies; each shard gets `64 MiB / shards`),
        /// whichever bound is reached first; a response larger than a shard's share is not cached.
        /// `0` turns the cache off: every replay reads the database. With each response the cache
        /// keeps a SHA-256 of the body bytes of the request that completed the key, so a retry that
        /// sends those very bytes is answered before its body is parsed; a retry of the same
        /// request spaced or ordered differently is parsed and judged by its canonical hash, as
        /// always.
        cache_entries: usize = 100_000, Bound::Count(0, 100_000_000);
    }
}

section! {
    /// Relaying committed events to the broker, and keeping them.
    pub struct OutboxSettings("outbox") {
        /// Outbox relay actors in this daemon.
        workers: usize = 2, Bound::Count(1, 64);
        /// Most events one relay claims, publishes and marks in one transaction. Each relay runs up
        /// to two batches at once, each on a pool connection and a channel of its own: once a full
        /// batch is published, the next is claimed while the first awaits its confirms, and an idle
        /// relay's second batch takes events committed meanwhile.
        batch_size: usize = 1000, Bound::Count(1, 10_000);
        /// How often an idle relay looks for due events (written by other daemons, left by a crash,
        /// or due for a retry). Events written by this daemon wake its relays at once.
        poll_interval: Duration = secs(1), Bound::Duration(HOUR);
        /// One deadline for a whole relay batch: writing its publishes to the socket and receiving
        /// every publisher confirm. An event not written or not confirmed by then counts as a
        /// failed attempt (`timeout`), and the channel is replaced. When a batch's confirms are
        /// incomplete (a timeout or a lost connection), no ack in it is trusted: its acked events
        /// count as failed too and are published again.
        confirm_timeout: Duration = secs(10), Bound::Duration(minutes(10));
        /// Failed publishes after which an event is parked (not retried until `retrysafe outbox
        /// retry`).
        max_attempts: i32 = 20, Bound::Count(1, 1000);
        /// How long sent events stay in `outbox_events` before the janitor deletes them. Unsent and
        /// parked events are never deleted.
        retention: Duration = secs(7 * 24 * 3600), Bound::Duration(TEN_YEARS);
    }
}

section! {
    /// What a write emits besides `entry.created`.
    pub struct EventSettings("events") {
        /// Also emit `audit.entry.created` for every write (client, key, request hash, remote
        /// address, entry id).
        audit: bool = false, Bound::Any;
    }
}

/// The most any limit of a client may be, daemon-wide or its own (`auth.max_concurrent_writes`,
/// `auth.max_requests_per_second`); 0 is no limit.
pub const MAX_CLIENT_LIMIT: u32 = 1_000_000;

section! {
    /// The clients and the admins, and the clients' limits.
    pub struct AuthSettings("auth") {
        /// `[[auth.clients]]` entries, each `id = "<1-64 of a-z A-Z 0-9 . _ ->"` (unique) and
        /// `token_sha256 = "<64 hex digits>"`, the SHA-256 of the client's bearer token, and
        /// optionally its own `max_concurrent_writes` and `max_requests_per_second` (below).
        /// `retrysafe token new --client NAME` makes the first two. With no clients every request
        /// is the client `anonymous`, which is allowed only while `http.listen` is a loopback
        /// address; the daemon then logs a WARN at start that the API is unauthenticated, and
        /// answers only requests whose `Host` is a loopback host (421 `misdirected-request`
        /// otherwise, see [anonymous mode](api.md#anonymous-mode)).
        clients: Vec<ClientSettings> = Vec::new(), Bound::Any;
        /// `[[auth.admins]]` entries, each `id = "<1-64 of a-z A-Z 0-9 . _ ->"` (unique) and
        /// `token_sha256 = "<64 hex digits>"`: the principals of the admin listener
        /// (`admin.listen`: the admin API and the console), who see every client's data. `retrysafe
        /// token new --admin NAME` makes them. An admin's token is refused by the API, and a
        /// client's by the admin listener; an admin may not share a client's token. With no admins
        /// the admin listener does not start. See [the console](console.md).
        admins: Vec<AdminPrincipal> = Vec::new(), Bound::Any;
        /// Writes of one client in flight at once (`POST /v1/entries`, from its admission to its
        /// answer), at most; past it the write gets 429 `rate-limited` at once, with `Retry-After:
        /// 1`. `0` is no limit. The default for every client, the anonymous one included; a
        /// client's own `max_concurrent_writes` replaces it. See [Client
        /// limits](operations.md#client-limits).
        max_concurrent_writes: u32 = 128, Bound::Count(0, MAX_CLIENT_LIMIT as u64);
        /// Requests of one client per second on any `/v1/` route, at most, with a burst of one
        /// second's worth; past it, 429 `rate-limited` with `Retry-After` the seconds until the
        /// next request may pass. The default for every client; a client's own
        /// `max_requests_per_second` replaces it. 0 to 1,000,000.
        max_requests_per_second: f64 = 0.0, Bound::Any;
    }
}

#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClientSettings {
    pub id: String,
    /// Hex SHA-256 of the client's bearer token; the token itself is never stored.
    pub token_sha256: String,
    /// This client's own `auth.max_concurrent_writes`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrent_writes: Option<u32>,
    /// This client's own `auth.max_requests_per_second`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_requests_per_second: Option<f64>,
}

impl fmt::Debug for ClientSettings {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientSettings")
            .field("id", &self.id)
            .field("max_concurrent_writes", &self.max_concurrent_writes)
            .field("max_requests_per_second", &self.max_requests_per_second)
            .finish_non_exhaustive()
    }
}

/// An admin (`[[auth.admins]]`): a principal of the admin listener, never of the API.
#[derive(Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminPrincipal {
    pub id: String,
    /// Hex SHA-256 of the admin's bearer token (`retrysafe token new --admin NAME`).
    pub token_sha256: String,
}

impl fmt::Debug for AdminPrincipal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AdminPrincipal")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

section! {
    /// The admin listener (the admin API and the console), started when `[[auth.admins]]` are
    /// configured.
    pub struct AdminSettings("admin") {
        /// Address of the admin listener, started when `[[auth.admins]]` are configured; port 0
        /// picks a free one. One that is not loopback is refused unless `tls_cert_file` and
        /// `tls_key_file` are set (admin tokens and session cookies would travel in clear): reach a
        /// loopback one through an SSH tunnel. Must differ from `http.listen` and
        /// `http.operations_listen`.
        listen: SocketAddr = localhost(8081), Bound::Any;
        /// PEM certificate (and chain) of the admin listener, which then speaks HTTPS only
        /// (HTTP/1.1, TLS 1.2 and 1.3, as the API's listener); the session cookie is then `Secure`.
        /// Reloaded on SIGHUP.
        tls_cert_file: Option<PathBuf> = None, Bound::Any;
        /// PEM private key of `tls_cert_file`.
        tls_key_file: Option<PathBuf> = None, Bound::Any;
        /// Host names the admin listener answers besides loopback hosts and its own address (a
        /// listener on `0.0.0.0` or `[::]` has none of its own: list the names and addresses it is
        /// reached by), e.g. a name in its certificate, `["ops.example.com"]`; a request naming any
        /// other `Host` gets 421 `misdirected-request`, so that a page made to resolve to the
        /// listener (DNS rebinding) cannot drive the console. Each is a name (letters, digits, `.`,
        /// `-`, `_`), an IPv4 address or an IPv6 address in brackets, optionally with a port, which
        /// is not compared (a request names the host with any port, in any case); any other entry
        /// is refused at validation.
        hosts: Vec<String> = Vec::new(), Bound::Any;
        /// How long a console login lasts (sessions are kept in memory, at most 1,024: a restart
        /// logs every admin out).
        session_timeout: Duration = secs(8 * 3600), Bound::Duration(minutes(7 * 24 * 60));
    }
}

section! {
    /// Spans, exported over OTLP.
    pub struct TelemetrySettings("telemetry") {
        /// Base URL of an OpenTelemetry collector's OTLP/HTTP receiver, `http://host:4318`: spans
        /// are posted (protobuf) to its `/v1/traces`. Empty: `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`
        /// (the full URL) or `OTEL_EXPORTER_OTLP_ENDPOINT` (a base URL) when set, else no export.
        /// `https://` is refused: run a collector on the machine or its network, which forwards
        /// over TLS. See [Tracing](tracing.md).
        otlp_endpoint: String = String::new(), Bound::Any;
        /// Share of new traces (requests without a caller's context) whose spans are exported, 0 to
        /// 1. A request with a caller's `traceparent` follows its sampled flag (parent-based
        /// sampling).
        sample_ratio: f64 = 1.0, Bound::Any;
    }
}

section! {
    /// What the daemon writes to standard error.
    pub struct LogSettings("log") {
        /// Text for terminals (without ANSI colour codes when stderr is not a terminal); JSON, one
        /// object per line, for journald and log collectors.
        format: LogFormat = LogFormat::Text, Bound::Any;
        /// A tracing filter: `info`, `warn`, or per module, e.g. `retrysafe=debug,info`. The
        /// `RUST_LOG` environment variable, when set, replaces it; an invalid one is refused at
        /// start (the error names `RUST_LOG`), as an invalid `level` is. The AMQP library's own
        /// `lapin::channels`, `lapin::io_loop` and `lapin::returned_messages` logs are off unless
        /// the filter names `lapin`. `tokio_postgres` stays at `info` whatever the level, `trace`
        /// included, unless the filter names it ([Logs](operations.md#logs)).
        level: String = "info".into(), Bound::Any;
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}
