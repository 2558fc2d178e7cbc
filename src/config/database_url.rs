//! `database.url`, parsed once: what tokio-postgres connects with, libpq's TLS parameters, the
//! hosts, and the text logs show. Every consumer (the pool's connector, `migrate`, the warnings,
//! the startup line, connect errors) takes this value; none reads the text again.
//!
//! The grammar, what it refuses and why no message quotes the URL: [`grammar`]. libpq's TLS
//! parameters and what each `sslmode` means: [`tls`].

mod grammar;
mod tls;

use std::fmt;
use std::net::IpAddr;
use std::path::PathBuf;

use grammar::{url_body, Form, Parts};
pub use tls::{PgTls, RootCertificates, SslMode};

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
