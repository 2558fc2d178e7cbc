//! The configuration's tests: loading, the keys as declared and documented, validation.

use super::*;

/// What `load` reads, validated.
fn checked(figment: Figment) -> Result<Config, ConfigError> {
    Settings::from_figment(figment)?.validated()
}

#[test]
fn only_well_formed_variables_are_keys() {
    for name in [
        "RETRYSAFE_HTTP__LISTEN",
        "RETRYSAFE_DATABASE__MAX_PENDING_BYTES",
    ] {
        assert!(is_key_variable(name), "{name}");
    }
    for name in [
        "RETRYSAFE_HTTP_LISTEN",
        "RETRYSAFE_HTTP____LISTEN",
        "RETRYSAFE_HTTP__LISTEN__",
        "RETRYSAFE___LISTEN",
        "RETRYSAFE_HTTP__LISTEN__X",
        "RETRYSAFE_CONFIG",
    ] {
        assert!(!is_key_variable(name), "{name}");
    }
}

#[test]
fn durations_and_counts_have_upper_bounds() {
    let mut settings = Settings::default();
    settings.database.statement_timeout = std::time::Duration::from_secs(30 * 24 * 3600);
    let error = settings.validate().unwrap_err().to_string();
    assert!(error.contains("database.statement_timeout"), "{error}");
    let mut settings = Settings::default();
    settings.idempotency.shards = 100_000_000;
    let error = settings.validate().unwrap_err().to_string();
    assert!(error.contains("idempotency.shards"), "{error}");
    let mut settings = Settings::default();
    settings.database.max_pending_bytes = 1000;
    let error = settings.validate().unwrap_err().to_string();
    assert!(error.contains("database.max_pending_bytes"), "{error}");
}

/// docs/configuration.md's tables of keys are the declarations': the same keys, section by
/// section, and each documented default, read as the configuration file would give it,
/// is the declared default.
#[test]
fn the_configuration_reference_documents_every_key_with_its_default() {
    let guide = include_str!("../../docs/configuration.md");
    let declared: std::collections::BTreeSet<&str> = Settings::keys().map(|key| key.name).collect();
    let mut documented = std::collections::BTreeSet::new();
    let mut section = None;
    for line in guide.lines() {
        if let Some(name) = line
            .strip_prefix("### `[")
            .and_then(|rest| rest.strip_suffix("]`"))
        {
            section = Some(name.to_owned());
            continue;
        }
        if line.starts_with("## ") {
            section = None;
        }
        let (Some(section), Some(row)) = (&section, line.strip_prefix("| `")) else {
            continue;
        };
        let cells: Vec<&str> = row.split(" | ").collect();
        let key = cells[0].trim_end_matches('`');
        let name = format!("{section}.{key}");
        let default = cells[2].trim();
        let read = match default {
            "none" | "empty" => None,
            _ => {
                let value = default
                    .split('`')
                    .nth(1)
                    .unwrap_or_else(|| panic!("{name}: no default in `{default}`"));
                Some(format!("[{section}]\n{key} = {value}\n"))
            }
        };
        let declared_default =
            serde_json::to_value(Settings::default()).unwrap()[section][key].clone();
        let documented_default = match read {
            None => serde_json::Value::Null,
            Some(toml) => {
                let settings: Settings = Figment::from(Serialized::defaults(Settings::default()))
                    .merge(Toml::string(&toml))
                    .extract()
                    .unwrap_or_else(|error| panic!("{name}: `{default}`: {error}"));
                serde_json::to_value(settings).unwrap()[section][key].clone()
            }
        };
        let empty = serde_json::Value::Array(Vec::new());
        let documented_default = if default == "empty" {
            empty
        } else {
            documented_default
        };
        assert_eq!(
            documented_default, declared_default,
            "{name}: documented default `{default}`"
        );
        documented.insert(name);
    }
    let declared: std::collections::BTreeSet<String> =
        declared.into_iter().map(str::to_owned).collect();
    assert_eq!(
        documented, declared,
        "the keys documented are the keys declared"
    );
}

#[test]
fn every_key_has_a_doc_line_and_a_bound_fit_for_its_type() {
    for key in Settings::keys() {
        assert!(!key.doc.trim().is_empty(), "{}", key.name);
    }
    Settings::default().check_bounds().unwrap();
}

#[test]
fn defaults_are_valid() {
    Settings::default().validate().unwrap();
}

#[test]
fn anonymous_only_on_loopback() {
    let mut settings = Settings::default();
    settings.http.listen = "0.0.0.0:8080".parse().unwrap();
    let error = settings.validate().unwrap_err().to_string();
    assert!(error.contains("auth.clients"), "{error}");
}

#[test]
fn the_admin_listener_needs_tls_off_loopback_an_address_of_its_own_and_valid_admins() {
    let admin = |id: &str, digest: &str| AdminPrincipal {
        id: id.into(),
        token_sha256: digest.into(),
    };
    let digest = "ab".repeat(32);
    let refused = |change: &dyn Fn(&mut Settings), key: &str| {
        let mut settings = Settings::default();
        settings.auth.admins = vec![admin("ops", &digest)];
        change(&mut settings);
        let error = settings.validate().unwrap_err().to_string();
        assert!(error.contains(key), "{key}: {error}");
    };
    refused(
        &|settings| settings.admin.listen = "0.0.0.0:8081".parse().unwrap(),
        "admin.listen",
    );
    refused(
        &|settings| settings.admin.listen = settings.http.listen,
        "admin.listen",
    );
    refused(
        &|settings| settings.auth.admins.push(admin("ops", &"cd".repeat(32))),
        "auth.admins.id",
    );
    refused(
        &|settings| settings.auth.admins = vec![admin("o ps", &digest)],
        "auth.admins.id",
    );
    refused(
        &|settings| settings.auth.admins = vec![admin("ops", "abc")],
        "auth.admins.token_sha256",
    );
    refused(
        &|settings| {
            settings.auth.clients = vec![ClientSettings {
                id: "jobs".into(),
                token_sha256: digest.to_uppercase(),
                max_concurrent_writes: None,
                max_requests_per_second: None,
            }]
        },
        "auth.admins.token_sha256",
    );
    refused(
        &|settings| settings.admin.tls_cert_file = Some("/etc/retrysafe/admin.pem".into()),
        "admin.tls_key_file",
    );
    for host in ["has space", "name:abc", "[fd00::5", ""] {
        refused(
            &|settings| settings.admin.hosts = vec!["ops.example".into(), host.into()],
            "admin.hosts",
        );
    }
    let mut settings = Settings::default();
    settings.auth.admins = vec![admin("ops", &digest)];
    settings.validate().unwrap();
    settings.admin.listen = "0.0.0.0:8081".parse().unwrap();
    settings.admin.tls_cert_file = Some("/etc/retrysafe/admin.pem".into());
    settings.admin.tls_key_file = Some("/etc/retrysafe/admin.key".into());
    settings.validate().unwrap();
}

#[test]
fn admin_hosts_are_parsed_into_host_names_once() {
    let mut settings = Settings::default();
    settings.admin.hosts = vec!["ops.example:443".into(), "[fd00::5]".into()];
    let hosts: Vec<String> = settings
        .validated()
        .unwrap()
        .admin
        .hosts
        .iter()
        .map(|host| host.as_str().to_owned())
        .collect();
    assert_eq!(hosts, ["ops.example", "[fd00::5]"]);
    // A port that is not digits would leave a name no request could match: refused, not
    // dropped.
    settings.admin.hosts.push("name:abc".into());
    let error = settings.validate().unwrap_err().to_string();
    assert_eq!(
        error,
        "invalid configuration: admin.hosts: \"name:abc\" is not a host name (a name, an IPv4 address or an IPv6 address in brackets, each with an optional port of 1 to 5 digits)"
    );
}

#[test]
fn several_database_hosts_need_read_write_sessions() {
    let mut settings = Settings::default();
    settings.database.url = "postgres://app@db1:5432,db2:5432/x".into();
    let error = settings.validate().unwrap_err().to_string();
    assert!(error.contains("target_session_attrs=read-write"), "{error}");
    settings.database.url =
        "postgres://app@db1:5432,db2:5432/x?target_session_attrs=read-write".into();
    settings.validate().unwrap();
}

#[test]
fn amqp_url_is_one_url_or_a_list() {
    let one = Figment::from(Serialized::defaults(Settings::default())).merge(Toml::string(
        "[amqp]\nurl = \"amqp://a/%2f, amqp://b/%2f\"\n",
    ));
    let settings = checked(one).unwrap();
    assert_eq!(settings.amqp.shown(), "amqp://a/%2f,amqp://b/%2f");
    let many = Figment::from(Serialized::defaults(Settings::default())).merge(Toml::string(
        "[amqp]\nurl = [\"amqp://a/%2f\", \"amqp://b/%2f\", \"amqp://c/%2f\"]\n",
    ));
    assert_eq!(checked(many).unwrap().amqp.brokers.len(), 3);
    let bad = Figment::from(Serialized::defaults(Settings::default())).merge(Toml::string(
        "[amqp]\nurl = [\"amqp://a/%2f\", \"http://b\"]\n",
    ));
    let error = checked(bad).unwrap_err().to_string();
    assert!(
        error.contains("amqp.url") && error.contains("http://b"),
        "{error}"
    );
}

#[test]
fn database_tls_parameters_are_checked_by_name() {
    let mut settings = Settings::default();
    for mode in ["disable", "prefer", "require", "verify-ca", "verify-full"] {
        settings.database.url = format!("postgres://app:pw@db/x?sslmode={mode}").into();
        settings.validate().unwrap();
    }
    settings.database.url = "postgres://app:hunter2@db/x?sslmode=verify-everything".into();
    let error = settings.validate().unwrap_err().to_string();
    assert!(
        error.contains("database.url") && error.contains("\"verify-everything\""),
        "{error}"
    );
    assert!(!error.contains("hunter2"), "{error}");
}

#[test]
fn amqps_urls_and_tls_file_pairs() {
    let figment = Figment::from(Serialized::defaults(Settings::default())).merge(Toml::string(
        "[amqp]\nurl = [\"amqps://a/%2f\", \"amqp://b/%2f\"]\ntls_ca_file = \"/ca.pem\"\n",
    ));
    let settings = checked(figment).unwrap();
    assert!(settings.amqp.uses_tls());
    for (section, given, missing) in [
        ("http", "tls_cert_file", "tls_key_file"),
        ("http", "tls_key_file", "tls_cert_file"),
        ("amqp", "tls_cert_file", "tls_key_file"),
    ] {
        let figment = Figment::from(Serialized::defaults(Settings::default())).merge(Toml::string(
            &format!("[{section}]\n{given} = \"/x.pem\"\n"),
        ));
        let error = checked(figment).unwrap_err().to_string();
        assert!(error.contains(&format!("{section}.{missing}")), "{error}");
    }
}

#[test]
fn unknown_keys_and_bad_values_name_the_key() {
    let figment = Figment::from(Serialized::defaults(Settings::default())).merge(Toml::string(
        "[http]\nlisten = \"127.0.0.1:1\"\nbogus = 1\n",
    ));
    let error = checked(figment).unwrap_err().to_string();
    assert!(error.contains("bogus"), "{error}");

    let figment = Figment::from(Serialized::defaults(Settings::default()))
        .merge(Toml::string("[outbox]\npoll_interval = \"soon\"\n"));
    let error = checked(figment).unwrap_err().to_string();
    assert!(error.contains("outbox.poll_interval"), "{error}");
}

#[test]
fn clients_are_checked_as_admins_are_and_their_digests_and_limits_resolved() {
    let client = |id: &str, digest: &str| ClientSettings {
        id: id.into(),
        token_sha256: digest.into(),
        max_concurrent_writes: None,
        max_requests_per_second: None,
    };
    let digest = "ab".repeat(32);
    let refused = |change: &dyn Fn(&mut Settings), key: &str, says: &str| {
        let mut settings = Settings::default();
        settings.auth.clients = vec![client("jobs", &digest)];
        change(&mut settings);
        let error = settings.validate().unwrap_err().to_string();
        assert!(
            error.contains(key) && error.contains(says),
            "{key}: {error}"
        );
    };
    refused(
        &|settings| settings.auth.clients.push(client("jobs", &"cd".repeat(32))),
        "auth.clients.id",
        "\"jobs\" is configured twice",
    );
    refused(
        &|settings| settings.auth.clients = vec![client("jo bs", &digest)],
        "auth.clients.id",
        "must be 1 to 64 of",
    );
    refused(
        &|settings| settings.auth.clients = vec![client("jobs", &"g".repeat(64))],
        "auth.clients.token_sha256",
        "client \"jobs\": must be 64 hex digits",
    );
    refused(
        &|settings| settings.auth.clients[0].max_concurrent_writes = Some(MAX_CLIENT_LIMIT + 1),
        "auth.max_concurrent_writes",
        "client \"jobs\": must be between 0 (no limit) and 1000000",
    );
    refused(
        &|settings| settings.auth.max_requests_per_second = 1e6 + 1.0,
        "auth.max_requests_per_second",
        "must be between 0 (no limit) and 1000000",
    );
    refused(
        &|settings| settings.auth.max_concurrent_writes = MAX_CLIENT_LIMIT + 1,
        "auth.max_concurrent_writes",
        "must be between 0 and 1000000",
    );

    let mut settings = Settings::default();
    settings.auth.max_requests_per_second = 50.0;
    settings.auth.clients = vec![client("jobs", &digest.to_uppercase())];
    settings.auth.clients[0].max_concurrent_writes = Some(4);
    let auth = settings.validated().unwrap().auth;
    assert_eq!(auth.clients[0].token_sha256.as_bytes(), &[0xab; 32]);
    assert_eq!(
        auth.clients[0].limits,
        Limits {
            max_concurrent_writes: 4,
            max_requests_per_second: 50.0,
        }
    );
    assert_eq!(
        auth.anonymous_limits,
        Limits {
            max_concurrent_writes: 128,
            max_requests_per_second: 50.0,
        }
    );
}

#[test]
fn rust_log_replaces_log_level_and_an_invalid_one_is_refused_by_name() {
    let settings = Settings::default();
    let with_rust_log = |filter: &str| Environment {
        rust_log: Some(filter.into()),
        ..Environment::default()
    };
    let config = settings.validated_in(&Environment::default()).unwrap();
    assert_eq!(format!("{:?}", config.log.filter), "\"info\"");
    let config = settings
        .validated_in(&with_rust_log("retrysafe=debug,warn"))
        .unwrap();
    assert_eq!(
        format!("{:?}", config.log.filter),
        "\"retrysafe=debug,warn\""
    );
    let error = settings
        .validated_in(&with_rust_log("retrysafe=loud"))
        .unwrap_err()
        .to_string();
    assert!(error.contains("RUST_LOG"), "{error}");
    let mut settings = Settings::default();
    settings.log.level = "retrysafe=loud".into();
    let error = settings
        .validated_in(&with_rust_log("info"))
        .unwrap_err()
        .to_string();
    assert!(error.contains("log.level"), "{error}");
}

#[test]
fn citus_node_addresses_are_parsed_once_and_a_bad_entry_is_refused_by_name() {
    let mut settings = Settings::default();
    settings.database.citus_node_addresses = vec![
        "10.0.0.5:5432=w1.example.com:6432".into(),
        "[fd00::7]:5432 = [fd00::8]:6432".into(),
    ];
    let config = settings.validated().unwrap();
    let addresses = &config.database.citus_node_addresses;
    assert_eq!(
        (addresses[0].name.as_str(), addresses[0].port),
        ("10.0.0.5", 5432)
    );
    assert_eq!(
        (addresses[0].reach_host.as_str(), addresses[0].reach_port),
        ("w1.example.com", 6432)
    );
    assert_eq!(
        (addresses[1].name.as_str(), addresses[1].reach_host.as_str()),
        ("fd00::7", "fd00::8")
    );
    for bad in [
        "w1:5432",
        "w1:5432=w2",
        "w1:0=w2:5432",
        "w 1:5432=w2:5432",
        "fd00::7:5432=w2:5432",
    ] {
        let mut settings = Settings::default();
        settings.database.citus_node_addresses = vec![bad.into()];
        let error = settings.validated().unwrap_err().to_string();
        assert!(
            error.contains("database.citus_node_addresses") && error.contains(bad),
            "{bad}: {error}"
        );
    }
}
