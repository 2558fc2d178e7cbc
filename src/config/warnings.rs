//! What a valid configuration may still get wrong, and the daemon cannot decide for the
//! operator: said at start (a WARN line each) and by `check-config` (a `warning:` line each),
//! never refused.
//!
//! - `database.url` reaches a server off loopback without checking its certificate
//!   (`sslmode` below `verify-ca`: libpq's default, `prefer`, checks none and falls back to a
//!   plain connection when the server declines TLS), so the connection is not authenticated;
//! - `http.operations_listen` is not a loopback address: the probes and metrics answer whoever
//!   reaches it;
//! - the configuration file may be read by every user of the machine (it may hold passwords),
//!   or be written by others than its owner (who could point the daemon at their own database
//!   or admit their own token).

use std::fmt;
use std::path::Path;

use crate::config::{Config, DatabaseUrl, SslMode};

/// One warning: the key (or file) at fault, and what to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigWarning {
    pub key: String,
    pub message: String,
}

impl fmt::Display for ConfigWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.key, self.message)
    }
}

/// Every warning for `config`, loaded from the file at `file`.
pub fn warnings(config: &Config, file: &Path) -> Vec<ConfigWarning> {
    let mut warnings = Vec::new();
    warnings.extend(unauthenticated_database(&config.database.url));
    if let Some(address) = config.http.operations_listen {
        if !address.ip().is_loopback() {
            warnings.push(ConfigWarning {
                key: "http.operations_listen".into(),
                message: format!(
                    "{address} is not a loopback address: /readyz, /metrics and /openapi.json answer whoever reaches it, without credentials, over plain http (the backlog, the request counts, the version); bind it to 127.0.0.1, or let only the monitoring network reach it"
                ),
            });
        }
    }
    warnings.extend(file_permissions(file));
    warnings
}

/// `database.url` names a host off loopback, and the server's certificate is not checked.
fn unauthenticated_database(url: &DatabaseUrl) -> Option<ConfigWarning> {
    let tls = url.tls();
    if tls.checks_server_certificate() {
        return None;
    }
    let remote: Vec<String> = url
        .hosts()
        .iter()
        .filter(|host| !host.is_loopback())
        .map(|host| host.name())
        .collect();
    if remote.is_empty() {
        return None;
    }
    let what_it_does = match tls.mode {
        SslMode::Disable => "sends everything in clear",
        SslMode::Prefer => "(libpq's default) checks no server certificate and falls back to a plain connection when the server declines tls",
        _ => "checks no server certificate (and no sslrootcert is given)",
    };
    Some(ConfigWarning {
        key: "database.url".into(),
        message: format!(
            "{} is not a loopback address, and sslmode={} {what_it_does}: the connection is not authenticated, and a machine in between can read and change it; set sslmode=verify-full and sslrootcert to the PEM file of the server's CA (sslrootcert=system for a certificate from a public CA)",
            remote.join(", "),
            tls.mode.as_str()
        ),
    })
}

/// The configuration file is readable by every user, or writable by others than its owner.
fn file_permissions(file: &Path) -> Vec<ConfigWarning> {
    use std::os::unix::fs::PermissionsExt;
    // A file that cannot be read was refused when the configuration was loaded.
    let Ok(metadata) = std::fs::metadata(file) else {
        return Vec::new();
    };
    let mode = metadata.permissions().mode() & 0o777;
    let key = file.display().to_string();
    let mut warnings = Vec::new();
    if mode & 0o002 != 0 {
        warnings.push(ConfigWarning {
            key: key.clone(),
            message: format!(
                "every user of the machine may write this file (mode {mode:04o}): whoever does can point the daemon at a database of their own or admit a token of their own; chmod o-w it"
            ),
        });
    } else if mode & 0o020 != 0 {
        warnings.push(ConfigWarning {
            key: key.clone(),
            message: format!(
                "its group may write this file (mode {mode:04o}): with the service's group, the daemon could rewrite its own configuration; chmod g-w it"
            ),
        });
    }
    if mode & 0o004 != 0 {
        warnings.push(ConfigWarning {
            key,
            message: format!(
                "every user of the machine may read this file (mode {mode:04o}), and it may hold passwords (database.url, amqp.url); chmod o-r it (the package installs it 0640, root:retrysafe)"
            ),
        });
    }
    warnings
}

#[cfg(test)]
mod tests {
    use super::*;

    fn database_warning(url: &str) -> Option<String> {
        let url = DatabaseUrl::parse(url).unwrap_or_else(|error| panic!("{url}: {error}"));
        unauthenticated_database(&url).map(|warning| warning.to_string())
    }

    #[test]
    fn a_remote_database_without_a_checked_certificate_is_named() {
        for url in [
            "postgres://app:pw@db.example.internal/x",
            "postgres://app@db.example.internal/x?sslmode=prefer",
            "postgres://app@127.0.0.1:5432,db2.example.internal:5432/x?target_session_attrs=read-write",
            "host=10.1.2.3 dbname=x sslmode=disable",
            "postgres://app@db.example.internal/x?sslmode=require",
        ] {
            let warning = database_warning(url).unwrap_or_else(|| panic!("{url}: no warning"));
            assert!(
                warning.contains("sslmode=verify-full") && warning.contains("sslrootcert"),
                "{url}: {warning}"
            );
            assert!(!warning.contains("pw"), "{warning}");
        }
        let warning = database_warning(
            "postgres://app@127.0.0.1:5432,db2.example.internal:5432/x?target_session_attrs=read-write",
        )
        .unwrap();
        assert!(
            warning.contains("db2.example.internal") && !warning.contains("127.0.0.1"),
            "{warning}"
        );
    }

    #[test]
    fn loopback_sockets_and_checked_certificates_are_fine() {
        for url in [
            "postgres://postgres@127.0.0.1:5432/retrysafe",
            "postgres://postgres@localhost/retrysafe?sslmode=disable",
            "postgres://app@[::1]:5432/x",
            "postgres://%2Fvar%2Frun%2Fpostgresql/x",
            "host=/var/run/postgresql dbname=x",
            "postgres://app@db.example.internal/x?sslmode=verify-full&sslrootcert=/etc/ca.pem",
            "postgres://app@db.example.internal/x?sslmode=verify-ca&sslrootcert=/etc/ca.pem",
            "postgres://app@db.example.internal/x?sslmode=require&sslrootcert=/etc/ca.pem",
            "postgres://app@db.example.internal/x?sslrootcert=system",
        ] {
            assert_eq!(database_warning(url), None, "{url}");
        }
    }

    #[test]
    fn a_file_others_may_read_or_write_is_named() {
        use std::os::unix::fs::PermissionsExt;
        let file = std::env::temp_dir().join(format!("retrysafe-mode-{}.toml", std::process::id()));
        std::fs::write(&file, "").unwrap();
        let warnings_for = |mode: u32| {
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode)).unwrap();
            file_permissions(&file)
                .into_iter()
                .map(|warning| warning.message)
                .collect::<Vec<_>>()
        };
        assert!(warnings_for(0o600).is_empty());
        assert!(warnings_for(0o640).is_empty());
        let readable = warnings_for(0o644);
        assert!(
            readable.len() == 1 && readable[0].contains("may read") && readable[0].contains("0644"),
            "{readable:?}"
        );
        let group_writable = warnings_for(0o660);
        assert!(
            group_writable.len() == 1 && group_writable[0].contains("group may write"),
            "{group_writable:?}"
        );
        assert_eq!(warnings_for(0o666).len(), 2, "writable and readable by all");
        std::fs::remove_file(&file).unwrap();
    }
}
