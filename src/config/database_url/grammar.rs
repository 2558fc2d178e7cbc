//! How `database.url` is read: libpq's two forms, each to the same [`Parts`], and how it is
//! shown again ([`Form::show`]).
//!
//! # The grammar
//!
//! Two forms, as libpq reads them:
//!
//! - a URL, `postgres://` or `postgresql://`: the user info runs to the **first** `@` (user and
//!   password split at the first `:`), so a password may hold `?`, `/`, `#` or `:` unencoded
//!   (libpq also ends the user info at a `/`; tokio-postgres, which the daemon read URLs with
//!   before, does not, and the documentation has always allowed a `/` in the password);
//!   then the host part, to the next `/` or `?`: hosts separated by `,`, each `name[:port]` or
//!   `[IPv6][:port]` (a percent-encoded path, `%2Fvar%2Frun%2Fpostgresql`, is a socket
//!   directory); then `/dbname`, to the `?`; then the query, `key=value` parameters separated by
//!   `&`. Every part is percent-decoded (a `%` not followed by two hex digits stays as it is, as
//!   tokio-postgres reads it);
//! - libpq's `key=value` pairs, separated by spaces, a value quoted with `'...'` or bare, `\`
//!   escaping the next character in both.
//!
//! A parameter given again replaces the value given before (libpq's rule: the query's after
//! the URL's parts, so `?host=` replaces the host part's hosts). The TLS parameters (`sslmode`,
//! `sslrootcert`, `sslcert`, `sslkey`) are libpq's, which tokio-postgres does not know: they
//! become a [`PgTls`](super::PgTls). The other parameters go to `tokio_postgres::Config` as
//! `key='value'` pairs written here with every value quoted, so that tokio-postgres reads no
//! text of the URL itself: one grammar, this one.
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

use std::net::IpAddr;
use std::path::PathBuf;
use std::str::FromStr;

use super::{DatabaseHost, HostName};

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

/// The scheme and the rest of a `postgres://` or `postgresql://` URL.
pub(super) fn url_body(text: &str) -> Option<(&'static str, &str)> {
    ["postgresql", "postgres"].into_iter().find_map(|scheme| {
        text.strip_prefix(scheme)
            .and_then(|rest| rest.strip_prefix("://"))
            .map(|body| (scheme, body))
    })
}

/// The parameters of `database.url`, decoded: the last value given of each.
#[derive(Default)]
pub(super) struct Parts {
    pub(super) user: Option<String>,
    pub(super) password: Option<Vec<u8>>,
    pub(super) dbname: Option<String>,
    /// `host`, split at its commas.
    host: Option<Vec<String>>,
    hostaddr: Option<Vec<String>>,
    /// `port`, split at its commas; an empty one is the default port.
    port: Option<Vec<String>>,
    /// libpq's TLS parameters, for [`PgTls::from_parameters`].
    pub(super) tls: Vec<(&'static str, String)>,
    /// The others, for tokio-postgres.
    passed_on: Vec<(&'static str, String)>,
}

impl Parts {
    /// `user[:password]@host[:port][,...][/dbname][?key=value&...]`, after the scheme.
    pub(super) fn from_url(body: &str) -> Result<Self, String> {
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
    pub(super) fn from_key_values(text: &str) -> Result<Self, String> {
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
    pub(super) fn hosts(&self) -> Result<Vec<DatabaseHost>, String> {
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
    pub(super) fn passed_on(&self) -> Result<tokio_postgres::Config, String> {
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
pub(super) enum Form {
    Url { scheme: &'static str },
    KeyValues,
}

impl Form {
    /// The URL rebuilt from its parts: the user, `***` for a password, the hosts with their
    /// ports, the database; no query (it may carry a password, and TLS file paths).
    pub(super) fn show(self, parts: &Parts, hosts: &[DatabaseHost]) -> String {
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
