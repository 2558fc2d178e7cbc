//! `database.url`, parsed once: what tokio-postgres connects with, libpq's TLS parameters, the
//! hosts, and the text logs show. Every consumer (the pool's connector, `migrate`, the warnings,
//! the startup line, connect errors) takes this value; none reads the text again.
//!
//! # The grammar
//!
//! Two forms, as libpq reads them:
//!
//! - a URL, `postgres://` or `postgresql://`: the user info runs to the **first** `@` (user and
//!   password split at the first `:`), so a password may hold `?`, `/`, `#` or `:` unencoded
//!   (libpq also ends the user info at a `/`; tokio-postgres, which the daemon read URLs with
//!   before, does not, and operations.md has always allowed a `/` in the password);
//!   then the host part, to the next `/` or `?`: hosts separated by `,`, each `name[:port]` or
//!   `[IPv6][:port]` (a percent-encoded path, `%2Fvar%2Frun%2Fpostgresql`, is a socket
//!   directory); then `/dbname`, to the `?`; then the query, `key=value` parameters separated by
//!   `&`. Every part is percent-decoded (a `%` not followed by two hex digits stays as it is, as
//!   tokio-postgres reads it);
//! - libpq's `key=value` pairs, separated by spaces, a value quoted with `'...'` or bare, `\`
//!   escaping the next character in both.
//!
//! A parameter given again replaces the value given before (libpq's rule: the query's after
//! the URL's parts, so `?host=` replaces the host part's hosts). The TLS
//! parameters (`sslmode`, `sslrootcert`, `sslcert`, `sslkey`) are libpq's, which tokio-postgres
//! does not know: they become a [`PgTls`]. The other parameters go to `tokio_postgres::Config`
//! as `key='value'` pairs written here with every value quoted, so that tokio-postgres reads
//! no text of the URL itself: one grammar, this one.
//!
//! # What is refused, and never quoted
//!
//! A URL that only parses if a password typed unencoded is read as something else is refused:
//! an `@` after the one that ends the user info (`postgres://u:hunter2@prod@db/x` would read
//! as the host `prod@db`), and a user info that is the rest of a URL, its first `@` being in a
//! query value: a user name holding `/`, `?`, `=` or `&` (`postgres://db/x?password=a@b` would
//! read as the user `db/x?password=a`), or a parameter after a `?` or `&` (`postgres://db:5432/
//! x?password=a@b`, as the user `db` with the password `5432/x?password=a`, at the host `b`).
//! So are a host name with a character no host name has, an empty host, no host, a port that is
//! not a number from 1 to 65535, and a parameter the daemon does not know. No message quotes any
//! text of the URL (a known parameter's name and an `sslmode` value aside): any of it may be a
//! piece of a password.
//!
//! # TLS, with libpq's meaning
//!
//! | sslmode | TLS | server certificate |
//! |---|---|---|
//! | `disable` | never | - |
//! | `prefer` (default) | when the server offers it, else a plain connection | not checked |
//! | `require` | always; a server without TLS is refused | not checked; with a root certificate file, checked as in `verify-ca` (libpq's rule) |
//! | `verify-ca` | always | chain up to a root of `sslrootcert`, and its dates |
//! | `verify-full` | always | as `verify-ca`, and the host name (each host's own, with several hosts) |
//!
//! `sslrootcert` is a PEM file of CA certificates, by default `~/.postgresql/root.crt` when that
//! file exists; `verify-ca` and `verify-full` need one. `sslrootcert=system` trusts the
//! platform's roots; with it `sslmode` defaults to `verify-full` and a weaker mode is an error
//! (libpq 16's rule: anyone can get a certificate from a public CA for a name they control).
//! `sslcert` and `sslkey` are the client certificate and its key (PEM), sent to a server that
//! asks for one; by default `~/.postgresql/postgresql.crt` and `.key` when both exist.
//! With `sslmode=disable` none of the files is read. `db::tls` builds the rustls connector.

use std::fmt;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::str::FromStr;

/// What stands for a password when the URL is shown.
const MASK: &str = "***";

/// libpq's default port.
const DEFAULT_PORT: u16 = 5432;

/// The parameters the daemon knows: libpq's that tokio-postgres reads, and libpq's TLS ones.
const KNOWN_PARAMETERS: [&str; 22] = [
    "user",
    "password",
    "dbname",
    "host",
    "hostaddr",
    "port",
    "options",
    "application_name",
    "sslmode",
    "sslrootcert",
    "sslcert",
    "sslkey",
    "sslnegotiation",
    "connect_timeout",
    "tcp_user_timeout",
    "keepalives",
    "keepalives_idle",
    "keepalives_interval",
    "keepalives_retries",
    "target_session_attrs",
    "channel_binding",
    "load_balance_hosts",
];

/// libpq's other parameters, which the daemon does not support: named when given, since these
/// names are libpq's words, not text of the URL.
const LIBPQ_ONLY_PARAMETERS: [&str; 26] = [
    "passfile",
    "require_auth",
    "client_encoding",
    "fallback_application_name",
    "keepalives_count",
    "replication",
    "gssencmode",
    "requiressl",
    "sslcompression",
    "sslkeylogfile",
    "sslpassword",
    "sslcertmode",
    "sslcrl",
    "sslcrldir",
    "sslsni",
    "requirepeer",
    "ssl_min_protocol_version",
    "ssl_max_protocol_version",
    "min_protocol_version",
    "max_protocol_version",
    "krbsrvname",
    "gsslib",
    "gssdelegation",
    "service",
    "scram_client_key",
    "scram_server_key",
];

const RAW_AT: &str = "an `@` follows the one that ends the user info: a password holding `@` must write it as %40 (and so must any other part of the URL), or the rest of the password is read as the host; nothing of the URL is quoted here, since any of it may be a piece of the password";

const USER_WITH_URL_CHARACTERS: &str = "the user info (the text before the first `@`) holds `/`, `?`, `=` or `&`: an `@` further on, in the query (a password there?), made the rest of the URL read as a user name; write that `@` as %40. Nothing of the URL is quoted here, since any of it may be a piece of the password";

const UNKNOWN_PARAMETER: &str = "a parameter is not one the daemon knows (it is not quoted here: it could be a piece of a password holding an unencoded `&` or space; write `&` as %26 in a URL, and quote a key=value value holding a space). The parameters known are user, password, dbname, host, hostaddr, port, options, application_name, sslmode, sslrootcert, sslcert, sslkey, sslnegotiation, connect_timeout, tcp_user_timeout, keepalives, keepalives_idle, keepalives_interval, keepalives_retries, target_session_attrs, channel_binding, load_balance_hosts";

/// `database.url`, parsed ([`DatabaseUrl::parse`]).
#[derive(Clone)]
pub struct DatabaseUrl {
    /// What tokio-postgres connects with: the hosts, the login, every other parameter, and the
    /// TLS mode it knows (`require` for the verify modes; the checks are in the connector).
    connection: tokio_postgres::Config,
    tls: PgTls,
    /// In the order the URL lists them; never empty.
    hosts: Vec<DatabaseHost>,
    /// The URL as logs show it: rebuilt from the parts, the password as `***`, no query.
    display: String,
}

/// One host of `database.url`: where a connection goes, and how messages name it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DatabaseHost {
    /// `host`: a name or an IP address, or a socket directory; `None` when only `hostaddr` is
    /// given.
    pub host: Option<HostName>,
    /// `hostaddr`: the address connected to instead of resolving `host` (whose name is still the
    /// one `verify-full` checks).
    pub address: Option<IpAddr>,
    pub port: u16,
}

/// A host as `database.url` names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostName {
    /// A host name or an IP address, reached over TCP.
    Tcp(String),
    /// The directory of the server's Unix socket.
    Socket(PathBuf),
}

impl DatabaseUrl {
    /// Parses `database.url`, a `postgres://` (or `postgresql://`) URL or `key=value` pairs, and
    /// checks its TLS parameters (without reading any file). Errors never quote the text.
    pub fn parse(text: &str) -> Result<Self, String> {
        let (form, parts) = match url_body(text) {
            Some((scheme, body)) => (Form::Url { scheme }, Parts::from_url(body)?),
            None => (Form::KeyValues, Parts::from_key_values(text)?),
        };
        let tls = PgTls::from_parameters(&parts.tls)?;
        let hosts = parts.hosts()?;
        let mut connection = parts.passed_on()?;
        if let Some(user) = &parts.user {
            connection.user(user);
        }
        if let Some(password) = &parts.password {
            connection.password(password);
        }
        if let Some(dbname) = &parts.dbname {
            connection.dbname(dbname);
        }
        for host in &hosts {
            match &host.host {
                Some(HostName::Tcp(name)) => connection.host(name),
                Some(HostName::Socket(directory)) => connection.host_path(directory),
                None => &mut connection,
            };
            if let Some(address) = host.address {
                connection.hostaddr(address);
            }
            connection.port(host.port);
        }
        connection.ssl_mode(tls.mode.for_tokio_postgres());
        let display = form.show(&parts, &hosts);
        Ok(Self {
            connection,
            tls,
            hosts,
            display,
        })
    }

    /// What tokio-postgres connects with (every host; `db::connect` tries them one by one).
    pub fn connection(&self) -> &tokio_postgres::Config {
        &self.connection
    }

    /// libpq's TLS parameters.
    pub fn tls(&self) -> &PgTls {
        &self.tls
    }

    /// The hosts, in the order the URL lists them (at least one).
    pub fn hosts(&self) -> &[DatabaseHost] {
        &self.hosts
    }
}

/// The URL without its password and query: what logs show.
impl fmt::Display for DatabaseUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.display)
    }
}

impl fmt::Debug for DatabaseUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DatabaseUrl")
            .field("display", &self.display)
            .field("tls", &self.tls)
            .finish_non_exhaustive()
    }
}

impl DatabaseHost {
    /// The host as messages name it, without its port: its name, socket directory or address.
    pub fn name(&self) -> String {
        match (&self.host, self.address) {
            (Some(HostName::Tcp(name)), _) => name.clone(),
            (Some(HostName::Socket(directory)), _) => directory.display().to_string(),
            (None, Some(address)) => address.to_string(),
            (None, None) => "localhost".to_owned(),
        }
    }

    /// Whether it names this machine: a socket, a loopback address, or `localhost`. A host is
    /// judged by its name (the one the operator reads, and `verify-full` checks), `hostaddr`
    /// only when there is no name.
    pub fn is_loopback(&self) -> bool {
        match (&self.host, self.address) {
            (Some(HostName::Socket(_)), _) => true,
            (Some(HostName::Tcp(name)), _) => {
                name.eq_ignore_ascii_case("localhost")
                    || name.eq_ignore_ascii_case("localhost.")
                    || name
                        .parse::<IpAddr>()
                        .is_ok_and(|address| address.is_loopback())
            }
            (None, Some(address)) => address.is_loopback(),
            (None, None) => false,
        }
    }
}

/// `host:port`, an IPv6 address in brackets: how connect errors name the host.
impl fmt::Display for DatabaseHost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = self.name();
        if name.contains(':') && !name.starts_with('/') {
            write!(f, "[{name}]:{}", self.port)
        } else {
            write!(f, "{name}:{}", self.port)
        }
    }
}

/// The scheme and the rest of a `postgres://` or `postgresql://` URL.
fn url_body(text: &str) -> Option<(&'static str, &str)> {
    ["postgresql", "postgres"].into_iter().find_map(|scheme| {
        text.strip_prefix(scheme)
            .and_then(|rest| rest.strip_prefix("://"))
            .map(|body| (scheme, body))
    })
}

/// The parameters of `database.url`, decoded: the last value given of each.
#[derive(Default)]
struct Parts {
    user: Option<String>,
    password: Option<Vec<u8>>,
    dbname: Option<String>,
    /// `host`, split at its commas.
    host: Option<Vec<String>>,
    hostaddr: Option<Vec<String>>,
    /// `port`, split at its commas; an empty one is the default port.
    port: Option<Vec<String>>,
    /// libpq's TLS parameters, for [`PgTls::from_parameters`].
    tls: Vec<(&'static str, String)>,
    /// The others, for tokio-postgres.
    passed_on: Vec<(&'static str, String)>,
}

impl Parts {
    /// `user[:password]@host[:port][,...][/dbname][?key=value&...]`, after the scheme.
    fn from_url(body: &str) -> Result<Self, String> {
        let mut parts = Self::default();
        let (user_info, rest) = match body.split_once('@') {
            Some((user_info, rest)) => (Some(user_info), rest),
            None => (None, body),
        };
        if rest.contains('@') {
            return Err(RAW_AT.into());
        }
        if let Some(user_info) = user_info {
            let (user, password) = match user_info.split_once(':') {
                Some((user, password)) => (user, Some(password)),
                None => (user_info, None),
            };
            if user.contains(['/', '?', '=', '&']) || holds_a_query(user_info) {
                return Err(USER_WITH_URL_CHARACTERS.into());
            }
            parts.give("user", decoded_text(user, "the user name")?)?;
            // Bytes: percent-decoding may give any.
            parts.password = password
                .map(percent_decode)
                .filter(|password| !password.is_empty());
        }
        let host_end = rest.find(['/', '?']).unwrap_or(rest.len());
        let (host_part, rest) = rest.split_at(host_end);
        if !host_part.is_empty() {
            let mut hosts = Vec::new();
            let mut ports = Vec::new();
            for chunk in host_part.split(',') {
                let (host, port) = split_host_and_port(chunk)?;
                hosts.push(decoded_text(host, "a host")?);
                ports.push(decoded_text(port.unwrap_or(""), "a port")?);
            }
            parts.host = Some(hosts);
            parts.port = Some(ports);
        }
        let (path, query) = match rest.split_once('?') {
            Some((path, query)) => (path, Some(query)),
            None => (rest, None),
        };
        if let Some(dbname) = path.strip_prefix('/') {
            parts.give("dbname", decoded_text(dbname, "the database name")?)?;
        }
        for pair in query
            .unwrap_or("")
            .split('&')
            .filter(|pair| !pair.is_empty())
        {
            let Some((key, value)) = pair.split_once('=') else {
                return Err("a parameter of the query has no `=` (write key=value, and a `&` or `=` inside a value as %26 or %3D); it is not quoted here, since it may be a piece of a password".into());
            };
            let key = decoded_text(key, "a parameter's name")?;
            let value = decoded_text(value, "a parameter's value")?;
            parts.give(&key, value)?;
        }
        Ok(parts)
    }

    /// `host=... sslmode=...`: libpq's `keyword = value` pairs.
    fn from_key_values(text: &str) -> Result<Self, String> {
        let mut parts = Self::default();
        let mut characters = text.chars().peekable();
        loop {
            while characters.next_if(|c| c.is_whitespace()).is_some() {}
            if characters.peek().is_none() {
                break;
            }
            let mut key = String::new();
            while let Some(c) = characters.next_if(|c| *c != '=' && !c.is_whitespace()) {
                key.push(c);
            }
            while characters.next_if(|c| c.is_whitespace()).is_some() {}
            if characters.next() != Some('=') {
                return Err("is neither a postgres:// URL nor key=value pairs: a word has no `=` (it is not quoted here, since it may be a piece of a password: quote a value holding a space)".into());
            }
            while characters.next_if(|c| c.is_whitespace()).is_some() {}
            let mut value = String::new();
            if characters.next_if_eq(&'\'').is_some() {
                loop {
                    match characters.next() {
                        Some('\'') => break,
                        Some('\\') => value.extend(characters.next()),
                        Some(c) => value.push(c),
                        None => return Err("a quoted value has no closing quote".into()),
                    }
                }
            } else {
                while let Some(c) = characters.next_if(|c| !c.is_whitespace()) {
                    if c == '\\' {
                        value.extend(characters.next());
                    } else {
                        value.push(c);
                    }
                }
            }
            parts.give(&key, value)?;
        }
        Ok(parts)
    }

    /// Takes one parameter, refusing an unknown one. One given again replaces the value given
    /// before (libpq's rule: the query's after the URL's parts, a later pair after an earlier).
    fn give(&mut self, key: &str, value: String) -> Result<(), String> {
        let Some(key) = KNOWN_PARAMETERS.into_iter().find(|known| *known == key) else {
            if let Some(libpq) = LIBPQ_ONLY_PARAMETERS.into_iter().find(|name| *name == key) {
                return Err(format!(
                    "{libpq} is a libpq parameter that the daemon does not support; it knows {}",
                    KNOWN_PARAMETERS.join(", ")
                ));
            }
            return Err(UNKNOWN_PARAMETER.into());
        };
        // libpq: an empty value is the parameter left out.
        let value = Some(value).filter(|value| !value.is_empty());
        let list = |value: Option<String>| {
            value.map(|value| value.split(',').map(str::to_owned).collect())
        };
        match key {
            "user" => self.user = value,
            "password" => self.password = value.map(String::into_bytes),
            "dbname" => self.dbname = value,
            "host" => self.host = list(value),
            "hostaddr" => self.hostaddr = list(value),
            "port" => self.port = list(value),
            "sslmode" | "sslrootcert" | "sslcert" | "sslkey" => {
                self.tls.retain(|(given, _)| *given != key);
                self.tls.push((key, value.unwrap_or_default()));
            }
            _ => {
                self.passed_on.retain(|(given, _)| *given != key);
                self.passed_on.extend(value.map(|value| (key, value)));
            }
        }
        Ok(())
    }

    /// The hosts, each with its address and port (libpq: one port for every host, or one
    /// each).
    fn hosts(&self) -> Result<Vec<DatabaseHost>, String> {
        let names = self.host.clone().unwrap_or_default();
        let addresses = self.hostaddr.clone().unwrap_or_default();
        let ports = self.port.clone().unwrap_or_default();
        if names.is_empty() && addresses.is_empty() {
            return Err("names no host: give one (a name, an address, or a socket directory such as %2Fvar%2Frun%2Fpostgresql), or host= in key=value pairs".into());
        }
        if !names.is_empty() && !addresses.is_empty() && names.len() != addresses.len() {
            return Err(format!(
                "gives {} hosts and {} hostaddrs: give one address per host, or none",
                names.len(),
                addresses.len()
            ));
        }
        let count = names.len().max(addresses.len());
        if ports.len() > 1 && ports.len() != count {
            return Err(format!(
                "gives {} ports for {count} hosts: give one port for every host, or one each",
                ports.len()
            ));
        }
        let names = names
            .iter()
            .map(|name| host_name(name).map(Some))
            .collect::<Result<Vec<_>, _>>()?;
        let addresses = addresses
            .iter()
            .map(|address| {
                address.parse::<IpAddr>().map(Some).map_err(|_| {
                    "a hostaddr is not an IP address (it is not quoted here, since it may be a piece of a password)".to_owned()
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        let ports = ports
            .iter()
            .map(|port| parse_port(port))
            .collect::<Result<Vec<_>, _>>()?;
        Ok((0..count)
            .map(|index| DatabaseHost {
                host: names.get(index).cloned().flatten(),
                address: addresses.get(index).copied().flatten(),
                port: match ports.as_slice() {
                    [] => DEFAULT_PORT,
                    [port] => *port,
                    ports => ports[index],
                },
            })
            .collect())
    }

    /// A `tokio_postgres::Config` with the parameters passed on, read from `key='value'` pairs
    /// written here, every value quoted.
    fn passed_on(&self) -> Result<tokio_postgres::Config, String> {
        let pairs: Vec<String> = self
            .passed_on
            .iter()
            .map(|(key, value)| format!("{key}='{}'", escaped(value)))
            .collect();
        tokio_postgres::Config::from_str(&pairs.join(" ")).map_err(|error| {
            // The pairs are well formed, so the cause is a value it refuses, and names only the
            // parameter (`invalid value for option `target_session_attrs``).
            match std::error::Error::source(&error) {
                Some(cause) => format!("{error}: {cause}"),
                None => error.to_string(),
            }
        })
    }
}

/// Whether `user_info` holds `?key=` or `&key=` with a parameter's name: the rest of a URL
/// read as user info, because its first `@` is in a query value (`postgres://db:5432/x?
/// password=a@b` reads as the user `db` with the password `5432/x?password=a`, at the host `b`).
fn holds_a_query(user_info: &str) -> bool {
    user_info.match_indices(['?', '&']).any(|(index, _)| {
        let after = &user_info[index + 1..];
        KNOWN_PARAMETERS
            .iter()
            .chain(&LIBPQ_ONLY_PARAMETERS)
            .any(|name| {
                after
                    .strip_prefix(name)
                    .is_some_and(|rest| rest.starts_with('='))
            })
    })
}

/// `name[:port]` or `[IPv6][:port]`, one host of the URL's host part.
fn split_host_and_port(chunk: &str) -> Result<(&str, Option<&str>), String> {
    if let Some(bracketed) = chunk.strip_prefix('[') {
        let Some((address, rest)) = bracketed.split_once(']') else {
            return Err("an IPv6 address in `[` has no closing `]`".into());
        };
        return match rest {
            "" => Ok((address, None)),
            _ => match rest.strip_prefix(':') {
                Some(port) => Ok((address, Some(port))),
                None => Err(
                    "an IPv6 address in brackets is followed by something else than `:port`".into(),
                ),
            },
        };
    }
    Ok(match chunk.split_once(':') {
        Some((host, port)) => (host, Some(port)),
        None => (chunk, None),
    })
}

/// A host as given: a socket directory (starting with `/`), or a host name or IP address made of
/// the characters those have.
fn host_name(host: &str) -> Result<HostName, String> {
    if host.starts_with('/') {
        return Ok(HostName::Socket(PathBuf::from(host)));
    }
    if host.is_empty() {
        return Err("a host is empty (two commas in a row, or a port without a host)".into());
    }
    if !host
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-._:%".contains(&b))
    {
        return Err("a host holds a character that no host name or address has (it is not quoted here, since it may be a piece of a password)".into());
    }
    Ok(HostName::Tcp(host.to_owned()))
}

fn parse_port(port: &str) -> Result<u16, String> {
    if port.is_empty() {
        return Ok(DEFAULT_PORT);
    }
    port.parse::<u16>()
        .ok()
        .filter(|port| *port != 0)
        .ok_or_else(|| "a port is not a number from 1 to 65535 (it is not quoted here, since it may be a piece of a password)".into())
}

/// Percent-decoding as tokio-postgres (and the `percent-encoding` crate) does it: a `%` not
/// followed by two hex digits stays as it is.
fn percent_decode(text: &str) -> Vec<u8> {
    let bytes = text.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        let hex = (bytes[index] == b'%')
            .then(|| text.get(index + 1..index + 3))
            .flatten()
            .and_then(|digits| u8::from_str_radix(digits, 16).ok());
        match hex {
            Some(byte) => {
                decoded.push(byte);
                index += 3;
            }
            None => {
                decoded.push(bytes[index]);
                index += 1;
            }
        }
    }
    decoded
}

/// `text` percent-decoded, which must be UTF-8; `what` names the part in the error.
fn decoded_text(text: &str, what: &str) -> Result<String, String> {
    String::from_utf8(percent_decode(text))
        .map_err(|_| format!("{what} is not UTF-8 once percent-decoded"))
}

/// Every byte but the unreserved ones of a URL percent-encoded.
fn percent_encoded(text: &str) -> String {
    text.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                char::from(b).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// A value inside libpq's `'...'`.
fn escaped(value: &str) -> String {
    value.replace('\\', "\\\\").replace('\'', "\\'")
}

/// A `key=value` value as libpq reads it back: quoted when it holds a space or a quote.
fn quoted(value: &str) -> String {
    if value.is_empty() || value.contains([' ', '\'', '\\']) {
        format!("'{}'", escaped(value))
    } else {
        value.to_owned()
    }
}

/// How `database.url` was written, and so how it is shown.
#[derive(Clone, Copy)]
enum Form {
    Url { scheme: &'static str },
    KeyValues,
}

impl Form {
    /// The URL rebuilt from its parts: the user, `***` for a password, the hosts with their
    /// ports, the database; no query (it may carry a password, and TLS file paths).
    fn show(self, parts: &Parts, hosts: &[DatabaseHost]) -> String {
        let password = parts.password.is_some();
        match self {
            Form::Url { scheme } => {
                let mut shown = format!("{scheme}://");
                if let Some(user) = &parts.user {
                    shown.push_str(&percent_encoded(user));
                }
                if password {
                    shown.push(':');
                    shown.push_str(MASK);
                }
                if parts.user.is_some() || password {
                    shown.push('@');
                }
                let hosts: Vec<String> = hosts
                    .iter()
                    .map(|host| {
                        let name = match (&host.host, host.address) {
                            (Some(HostName::Socket(directory)), _) => {
                                percent_encoded(&directory.display().to_string())
                            }
                            (Some(HostName::Tcp(name)), _) => name.replace('%', "%25"),
                            (None, Some(address)) => address.to_string(),
                            (None, None) => String::new(),
                        };
                        if name.contains(':') {
                            format!("[{name}]:{}", host.port)
                        } else {
                            format!("{name}:{}", host.port)
                        }
                    })
                    .collect();
                shown.push_str(&hosts.join(","));
                if let Some(dbname) = &parts.dbname {
                    shown.push('/');
                    shown.push_str(&percent_encoded(dbname));
                }
                shown
            }
            Form::KeyValues => {
                let mut pairs = Vec::new();
                if let Some(names) = &parts.host {
                    pairs.push(format!("host={}", quoted(&names.join(","))));
                }
                if let Some(addresses) = &parts.hostaddr {
                    pairs.push(format!("hostaddr={}", quoted(&addresses.join(","))));
                }
                if let Some(ports) = &parts.port {
                    // As given: one port for every host, or one each.
                    let shown = match ports.len() {
                        1 => &hosts[..1],
                        _ => hosts,
                    };
                    let ports: Vec<String> =
                        shown.iter().map(|host| host.port.to_string()).collect();
                    pairs.push(format!("port={}", ports.join(",")));
                }
                if let Some(user) = &parts.user {
                    pairs.push(format!("user={}", quoted(user)));
                }
                if password {
                    pairs.push(format!("password={MASK}"));
                }
                if let Some(dbname) = &parts.dbname {
                    pairs.push(format!("dbname={}", quoted(dbname)));
                }
                pairs.join(" ")
            }
        }
    }
}

/// libpq's `sslmode`, less `allow` (a plain connection first), which tokio-postgres lacks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    fn parse(value: &str) -> Result<Self, String> {
        match value {
            "disable" => Ok(Self::Disable),
            "prefer" => Ok(Self::Prefer),
            "require" => Ok(Self::Require),
            "verify-ca" => Ok(Self::VerifyCa),
            "verify-full" => Ok(Self::VerifyFull),
            "allow" => Err("sslmode=allow is not supported; use prefer or a stronger mode".into()),
            other => Err(format!(
                "sslmode={other:?} is not one of disable, prefer, require, verify-ca, verify-full"
            )),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Disable => "disable",
            Self::Prefer => "prefer",
            Self::Require => "require",
            Self::VerifyCa => "verify-ca",
            Self::VerifyFull => "verify-full",
        }
    }

    /// What tokio-postgres is told: whether to try TLS, and whether it is required.
    fn for_tokio_postgres(self) -> tokio_postgres::config::SslMode {
        use tokio_postgres::config::SslMode as Tokio;
        match self {
            Self::Disable => Tokio::Disable,
            Self::Prefer => Tokio::Prefer,
            Self::Require | Self::VerifyCa | Self::VerifyFull => Tokio::Require,
        }
    }
}

/// `sslrootcert`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RootCertificates {
    File(PathBuf),
    /// `sslrootcert=system`: the platform's roots.
    System,
}

/// The TLS parameters of `database.url`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgTls {
    pub mode: SslMode,
    /// `sslrootcert` as given; `None` means libpq's default file, when it exists.
    pub root_certificates: Option<RootCertificates>,
    pub client_certificate: Option<PathBuf>,
    pub client_key: Option<PathBuf>,
}

impl PgTls {
    /// Checks libpq's TLS parameters, the last value given of each (without reading any file).
    fn from_parameters(parameters: &[(&'static str, String)]) -> Result<Self, String> {
        let mut mode = None;
        let mut root_certificates = None;
        let mut client_certificate = None;
        let mut client_key = None;
        for (name, value) in parameters {
            match *name {
                "sslmode" => mode = Some(SslMode::parse(value)?),
                "sslrootcert" if value == "system" => {
                    root_certificates = Some(RootCertificates::System)
                }
                "sslrootcert" => {
                    root_certificates = Some(RootCertificates::File(non_empty(name, value)?))
                }
                "sslcert" => client_certificate = Some(non_empty(name, value)?),
                "sslkey" => client_key = Some(non_empty(name, value)?),
                _ => unreachable!("only TLS parameters are taken out"),
            }
        }
        let mode = match (mode, &root_certificates) {
            (None, Some(RootCertificates::System)) => SslMode::VerifyFull,
            (Some(mode), Some(RootCertificates::System)) if mode != SslMode::VerifyFull => {
                return Err(format!(
                    "sslrootcert=system needs sslmode=verify-full (or no sslmode), not sslmode={}: a public CA issues certificates to anyone for a name they control, so only the host name check makes these roots meaningful",
                    mode.as_str()
                ))
            }
            (mode, _) => mode.unwrap_or(SslMode::Prefer),
        };
        if client_certificate.is_some() != client_key.is_some() {
            return Err("sslcert and sslkey go together: set both, or neither".into());
        }
        Ok(Self {
            mode,
            root_certificates,
            client_certificate,
            client_key,
        })
    }

    /// Whether the server's certificate is checked against a CA, which is what authenticates
    /// the server: `verify-ca` and `verify-full`, and `require` with a root certificate file
    /// (libpq's rule).
    pub fn checks_server_certificate(&self) -> bool {
        match self.mode {
            SslMode::VerifyCa | SslMode::VerifyFull => true,
            SslMode::Require => {
                self.root_certificates.is_some() || default_file("root.crt").is_some()
            }
            SslMode::Disable | SslMode::Prefer => false,
        }
    }

    /// The PEM file of CA certificates to check the server against: `sslrootcert`, or libpq's
    /// default `~/.postgresql/root.crt` when it exists; `None` with `sslrootcert=system`.
    pub fn root_certificate_file(&self) -> Option<PathBuf> {
        match &self.root_certificates {
            Some(RootCertificates::File(path)) => Some(path.clone()),
            Some(RootCertificates::System) => None,
            None => default_file("root.crt"),
        }
    }

    /// The client certificate and its key: `sslcert` and `sslkey`, or libpq's defaults
    /// `~/.postgresql/postgresql.crt` and `.key` when both exist.
    pub fn client_identity_files(&self) -> Option<(PathBuf, PathBuf)> {
        match (&self.client_certificate, &self.client_key) {
            (Some(certificate), Some(key)) => Some((certificate.clone(), key.clone())),
            _ => Some((
                default_file("postgresql.crt")?,
                default_file("postgresql.key")?,
            )),
        }
    }
}

fn non_empty(name: &str, value: &str) -> Result<PathBuf, String> {
    if value.is_empty() {
        return Err(format!("{name} is empty: give the path of a PEM file"));
    }
    Ok(PathBuf::from(value))
}

/// libpq's default files, under `~/.postgresql`.
fn default_file(name: &str) -> Option<PathBuf> {
    let home = std::env::var_os("HOME")?;
    let path = Path::new(&home).join(".postgresql").join(name);
    path.is_file().then_some(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    use tokio_postgres::config::{Host, TargetSessionAttrs};

    fn parsed(text: &str) -> DatabaseUrl {
        DatabaseUrl::parse(text).unwrap_or_else(|error| panic!("{text}: {error}"))
    }

    fn refusal(text: &str) -> String {
        match DatabaseUrl::parse(text) {
            Ok(url) => panic!("{text}: taken as {url}"),
            Err(error) => error,
        }
    }

    fn tcp(name: &str, port: u16) -> DatabaseHost {
        DatabaseHost {
            host: Some(HostName::Tcp(name.into())),
            address: None,
            port,
        }
    }

    #[test]
    fn the_user_info_runs_to_the_first_at_and_the_query_follows_the_host_part() {
        // The password holds `?`, `/`, `#` and `:`: the query's TLS parameters are still read.
        let url = parsed(
            "postgres://app:se?c/r#e:t@db1:5433,db2/billing?sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem&target_session_attrs=read-write&application_name=x",
        );
        let connection = url.connection();
        assert_eq!(connection.get_user(), Some("app"));
        assert_eq!(connection.get_password(), Some(&b"se?c/r#e:t"[..]));
        assert_eq!(connection.get_dbname(), Some("billing"));
        assert_eq!(connection.get_application_name(), Some("x"));
        assert_eq!(
            connection.get_target_session_attrs(),
            TargetSessionAttrs::ReadWrite
        );
        assert_eq!(
            connection.get_ssl_mode(),
            tokio_postgres::config::SslMode::Require
        );
        assert_eq!(
            url.tls(),
            &PgTls {
                mode: SslMode::VerifyFull,
                root_certificates: Some(RootCertificates::File("/etc/ca.pem".into())),
                client_certificate: None,
                client_key: None,
            }
        );
        assert_eq!(url.hosts(), [tcp("db1", 5433), tcp("db2", 5432)]);
        assert_eq!(
            connection.get_hosts(),
            [Host::Tcp("db1".into()), Host::Tcp("db2".into())]
        );
        assert_eq!(connection.get_ports(), [5433, 5432]);
        assert_eq!(
            url.to_string(),
            "postgres://app:***@db1:5433,db2:5432/billing"
        );
    }

    #[test]
    fn a_question_mark_in_the_password_keeps_sslmode_require() {
        // Cut at the first `?`, this URL lost its sslmode and connected with prefer, which
        // falls back to a plain connection: the password went in clear.
        let url = parsed("postgres://app:pa?ss@127.0.0.1:5432/x?sslmode=require");
        assert_eq!(url.tls().mode, SslMode::Require);
        assert_eq!(
            url.connection().get_ssl_mode(),
            tokio_postgres::config::SslMode::Require
        );
        assert_eq!(url.connection().get_password(), Some(&b"pa?ss"[..]));
    }

    #[test]
    fn every_part_is_percent_decoded() {
        let url = parsed(
            "postgresql://us%65r:p%40ss%2fw%25rd%zz@[::1]:5433,%2Fvar%2Frun%2Fpostgresql/my%20db?application_name=a%26b&options=-c%20x%3Dy",
        );
        let connection = url.connection();
        assert_eq!(connection.get_user(), Some("user"));
        // A `%` without two hex digits after it stays as it is.
        assert_eq!(connection.get_password(), Some(&b"p@ss/w%rd%zz"[..]));
        assert_eq!(connection.get_dbname(), Some("my db"));
        assert_eq!(connection.get_application_name(), Some("a&b"));
        assert_eq!(connection.get_options(), Some("-c x=y"));
        assert_eq!(
            url.hosts(),
            [
                tcp("::1", 5433),
                DatabaseHost {
                    host: Some(HostName::Socket("/var/run/postgresql".into())),
                    address: None,
                    port: 5432,
                },
            ]
        );
        assert_eq!(
            connection.get_hosts(),
            [
                Host::Tcp("::1".into()),
                Host::Unix("/var/run/postgresql".into())
            ]
        );
        assert_eq!(url.hosts()[0].to_string(), "[::1]:5433");
        assert_eq!(
            url.to_string(),
            "postgresql://user:***@[::1]:5433,%2Fvar%2Frun%2Fpostgresql:5432/my%20db"
        );
    }

    #[test]
    fn key_value_pairs_are_read_as_libpq_reads_them() {
        let url = parsed(
            r"host=db1,db2 port=5433 user=app password='it\'s a secret' dbname = x sslmode=verify-ca sslrootcert='/etc/my ca.pem' target_session_attrs=read-write",
        );
        let connection = url.connection();
        assert_eq!(connection.get_password(), Some(&b"it's a secret"[..]));
        assert_eq!(connection.get_dbname(), Some("x"));
        assert_eq!(url.hosts(), [tcp("db1", 5433), tcp("db2", 5433)]);
        assert_eq!(url.tls().mode, SslMode::VerifyCa);
        assert_eq!(
            url.tls().root_certificates,
            Some(RootCertificates::File("/etc/my ca.pem".into()))
        );
        assert_eq!(
            url.to_string(),
            "host=db1,db2 port=5433 user=app password=*** dbname=x"
        );
        let addresses = parsed("hostaddr=10.1.2.3 dbname=x");
        assert_eq!(
            addresses.hosts(),
            [DatabaseHost {
                host: None,
                address: Some("10.1.2.3".parse().unwrap()),
                port: 5432,
            }]
        );
        assert_eq!(addresses.hosts()[0].to_string(), "10.1.2.3:5432");
        let socket = parsed("host=/var/run/postgresql dbname=x");
        assert!(socket.hosts()[0].is_loopback());
    }

    #[test]
    fn a_parameter_given_again_replaces_the_first() {
        let url = parsed(
            "postgres://app:first@db1/x?password=second&user=other&host=db2&sslmode=disable&sslmode=require",
        );
        assert_eq!(url.connection().get_user(), Some("other"));
        assert_eq!(url.connection().get_password(), Some(&b"second"[..]));
        assert_eq!(url.hosts(), [tcp("db2", 5432)]);
        assert_eq!(url.tls().mode, SslMode::Require);
        assert_eq!(url.to_string(), "postgres://other:***@db2:5432/x");
    }

    #[test]
    fn a_url_with_only_a_socket_in_its_query_has_that_host() {
        let url = parsed("postgres:///x?host=%2Ftmp&port=5433");
        assert_eq!(
            url.hosts(),
            [DatabaseHost {
                host: Some(HostName::Socket("/tmp".into())),
                address: None,
                port: 5433,
            }]
        );
        assert_eq!(url.to_string(), "postgres://%2Ftmp:5433/x");
    }

    #[test]
    fn loopback_hosts() {
        for (text, loopback) in [
            ("postgres://127.0.0.1/x", true),
            ("postgres://[::1]/x", true),
            ("postgres://localhost/x", true),
            ("postgres://LOCALHOST./x", true),
            ("postgres://%2Fvar%2Frun%2Fpostgresql/x", true),
            ("postgres://db.example.internal/x", false),
            ("postgres://10.0.0.1/x", false),
            ("hostaddr=127.0.0.1 dbname=x", true),
            ("hostaddr=10.0.0.1 dbname=x", false),
            // Judged by the name when there is one, as the warning always was.
            ("host=db hostaddr=127.0.0.1 dbname=x", false),
            ("host=localhost hostaddr=10.0.0.1 dbname=x", true),
        ] {
            assert_eq!(parsed(text).hosts()[0].is_loopback(), loopback, "{text}");
        }
    }

    #[test]
    fn a_raw_at_after_the_user_info_is_refused_without_quoting_anything() {
        for text in [
            "postgres://postgres:hunter2@prodpw@127.0.0.1/db",
            "postgres://app:hunter2@prodpw@127.0.0.1/db?sslmode=require",
            "postgres://app:hunter2@prod/pw@127.0.0.1/db",
            "postgres://app:hunter2@prod?pw@127.0.0.1/db",
            "postgres://u:P@Q?application_name=Z@db/x",
        ] {
            let error = refusal(text);
            assert!(error.contains("%40"), "{text}: {error}");
            for piece in ["hunter2", "prod", "pw", "127.0.0.1", "Z@db", "Q?"] {
                assert!(!error.contains(piece), "{text}: {error}");
            }
        }
    }

    #[test]
    fn a_user_that_is_the_rest_of_a_url_is_refused() {
        // The first `@` is in the query's password: the user info would be `db/x?password=a`.
        for text in [
            "postgres://db/x?password=hunter@2",
            "postgres://db?password=hunter@2",
            "postgres://db/x?sslmode=require&password=hunter@2",
            // With a port, the user info splits at its `:` into the user `db` and a password.
            "postgres://db:5432/x?password=hunter@2",
            "postgres://app@db:5432/x?application_name=a&password=hunter@2",
        ] {
            let error = refusal(text);
            assert!(error.contains("%40"), "{text}: {error}");
            assert!(!error.contains("hunter"), "{text}: {error}");
        }
        // A password may still hold `?`, `&` and `=`, short of a parameter after `?` or `&`.
        let url = parsed("postgres://app:a?b=c&d@db/x");
        assert_eq!(url.connection().get_password(), Some(&b"a?b=c&d"[..]));
        // Encoded, it is a password.
        let url = parsed("postgres://db/x?password=hunter%402");
        assert_eq!(url.connection().get_password(), Some(&b"hunter@2"[..]));
        assert_eq!(url.to_string(), "postgres://:***@db:5432/x");
    }

    #[test]
    fn the_other_refusals_quote_nothing_either() {
        for (text, expected) in [
            ("postgres://app:pw/hunter2/x", "port"),
            ("postgres://app@db:hunter2/x", "port"),
            ("postgres://app@db:0/x", "port"),
            ("postgres://app@db:70000/x", "port"),
            ("postgres://app@[::1/x", "`]`"),
            ("postgres://app@[::1]hunter2/x", ":port"),
            ("postgres://app@db1,,db2/x", "empty"),
            ("postgres://app@db%20hunter2/x", "character"),
            ("postgres://app@/x", "no host"),
            ("postgres://app@db/x?hunter2", "`=`"),
            (
                "postgres://app@db/x?password=a&hunter2=b",
                "not one the daemon knows",
            ),
            (
                "postgres://app:hunter2@db/x?sslcrl=/crl.pem",
                "sslcrl is a libpq parameter",
            ),
            ("host=db1,db2 port=1,2,3", "3 ports for 2 hosts"),
            ("host=db password=hunter 2", "no `=`"),
            ("host=db password='hunter2", "no closing quote"),
            ("host=db hostaddr=hunter2", "not an IP address"),
            ("host=db,db2 hostaddr=10.0.0.1", "1 hostaddrs"),
            ("postgres://app:hunter2@db/x?sslmode=allow", "sslmode=allow"),
            (
                "postgres://app:hunter2@db/x?sslcert=/c.pem",
                "sslcert and sslkey",
            ),
            (
                "postgres://app:hunter2@db/x?target_session_attrs=hunter2",
                "target_session_attrs",
            ),
            (
                "postgres://app:hunter2@db/x?sslrootcert=",
                "sslrootcert is empty",
            ),
            ("postgres:/app:hunter2@db/x", "no `=`"),
            ("", "no host"),
        ] {
            let error = refusal(text);
            assert!(error.contains(expected), "{text}: {error}");
            assert!(!error.contains("hunter"), "{text}: {error}");
        }
    }

    #[test]
    fn an_unknown_sslmode_is_named() {
        let error = refusal("postgres://app:hunter2@db/x?sslmode=verify_full");
        assert!(error.contains("\"verify_full\""), "{error}");
        assert!(!error.contains("hunter2"), "{error}");
    }

    #[test]
    fn system_roots_mean_verify_full() {
        let url = parsed("postgres://db/x?sslrootcert=system");
        assert_eq!(url.tls().mode, SslMode::VerifyFull);
        assert_eq!(url.tls().root_certificates, Some(RootCertificates::System));
        assert!(url.tls().checks_server_certificate());
        let error = refusal("postgres://db/x?sslrootcert=system&sslmode=verify-ca");
        assert!(error.contains("verify-full"), "{error}");
    }

    #[test]
    fn client_certificates_and_roots_are_taken_as_given() {
        let url = parsed(
            "postgres://db/x?sslmode=require&sslrootcert=/r.pem&sslcert=/c.pem&sslkey=/k.pem",
        );
        assert!(url.tls().checks_server_certificate());
        assert_eq!(url.tls().root_certificate_file(), Some("/r.pem".into()));
        assert_eq!(
            url.tls().client_identity_files(),
            Some(("/c.pem".into(), "/k.pem".into()))
        );
    }
}
