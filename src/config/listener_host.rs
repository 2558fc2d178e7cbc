//! A host as a request names it in `Host` (`name[:port]`, `address[:port]`, `[v6][:port]`),
//! and the host names a listener answers (`admin.hosts`), parsed once, when the configuration
//! is validated.

use std::fmt;
use std::net::{IpAddr, Ipv6Addr};

/// A host a listener answers, without a port: a name, an IPv4 address, or an IPv6 address in
/// brackets. A request names it whatever its port, and in any case.
#[derive(Clone, PartialEq, Eq)]
pub struct ListenerHost(String);

impl ListenerHost {
    /// One entry of `admin.hosts`: a host, optionally with a port (which is not compared). The
    /// error quotes the entry.
    pub fn parse(text: &str) -> Result<Self, String> {
        let host = (text.len() <= 255)
            .then(|| host_without_port(text))
            .flatten()
            .filter(|host| match host.strip_prefix('[') {
                Some(inside) => inside
                    .strip_suffix(']')
                    .is_some_and(|address| address.parse::<Ipv6Addr>().is_ok()),
                None => host
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_')),
            });
        match host {
            Some(host) => Ok(Self(host.to_owned())),
            None => Err(format!(
                "{text:?} is not a host name (a name, an IPv4 address or an IPv6 address in brackets, each with an optional port of 1 to 5 digits)"
            )),
        }
    }

    /// A listener's own address, as a request names it.
    pub fn of_address(address: IpAddr) -> Self {
        Self(match address {
            IpAddr::V4(v4) => v4.to_string(),
            IpAddr::V6(v6) => format!("[{v6}]"),
        })
    }

    /// Whether `value`, the host a request names (`Host`, with or without a port), is this one.
    pub fn is_named_by(&self, value: &str) -> bool {
        host_without_port(value).is_some_and(|host| host.eq_ignore_ascii_case(&self.0))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for ListenerHost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// The host part of `host[:port]` (`[v6][:port]` for IPv6); None when the host is empty or the
/// port is not 1 to 5 digits.
pub fn host_without_port(value: &str) -> Option<&str> {
    let (host, port) = if value.starts_with('[') {
        let end = value.find(']')? + 1;
        let (host, rest) = value.split_at(end);
        let port = match rest {
            "" => None,
            _ => Some(rest.strip_prefix(':')?),
        };
        (host, port)
    } else {
        match value.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (value, None),
        }
    };
    let port_is_digits = port.is_none_or(|port| {
        (1..=5).contains(&port.len()) && port.bytes().all(|b| b.is_ascii_digit())
    });
    (!host.is_empty() && port_is_digits).then_some(host)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_names_are_parsed_without_their_port() {
        for (text, host) in [
            ("ops.example.com", "ops.example.com"),
            ("ops.example:443", "ops.example"),
            ("10.0.0.5", "10.0.0.5"),
            ("10.0.0.5:8081", "10.0.0.5"),
            ("[fd00::5]", "[fd00::5]"),
            ("[fd00::5]:8081", "[fd00::5]"),
            ("console_1.internal", "console_1.internal"),
        ] {
            assert_eq!(ListenerHost::parse(text).unwrap().as_str(), host, "{text}");
        }
    }

    #[test]
    fn what_no_request_could_name_is_refused() {
        for text in [
            "name:abc",
            "name:",
            "name:123456",
            ":8081",
            "",
            "has space",
            "fd00::5",
            "[fd00::5",
            "[fd00::5]x",
            "[not-an-address]",
            "ops.example/console",
            "admin@ops.example",
            &"a".repeat(256),
        ] {
            let error = ListenerHost::parse(text).unwrap_err();
            assert!(error.contains("is not a host name"), "{text}: {error}");
        }
    }

    #[test]
    fn a_request_names_a_host_with_any_port_and_in_any_case() {
        let host = ListenerHost::parse("ops.example:443").unwrap();
        for value in ["ops.example", "OPS.Example:8081", "ops.example:443"] {
            assert!(host.is_named_by(value), "{value}");
        }
        for value in ["ops.example.attacker", "ops.example:http", "", "ops"] {
            assert!(!host.is_named_by(value), "{value}");
        }
        let own = ListenerHost::of_address("::1".parse().unwrap());
        assert!(own.is_named_by("[::1]:8081"));
    }
}
