//! The `Host` check of anonymous mode.
//!
//! With no `[[auth.clients]]` every request is the client `anonymous`, which the configuration
//! allows only on a loopback address: any process of the machine may write, by design. A web
//! page may too, through the browser of someone on that machine, by DNS rebinding: the page's
//! own name is made to resolve to 127.0.0.1 once it has loaded, and the browser then sends the
//! page's requests to the daemon as same-origin ones, whose answers the page can read. Those
//! requests carry the page's name in `Host`. So in anonymous mode a listener on a loopback
//! address answers only requests that name a loopback host: `localhost` (or `localhost.`), an
//! address of 127.0.0.0/8, or `[::1]`, each with or without a port. Any other is refused with
//! 421 `misdirected-request` before routing, on every route, and nothing is written. A request
//! without `Host` is accepted from HTTP/1.0 clients only (HTTP/1.1 requires the header).
//!
//! With clients configured, requests need a token a page cannot have, and `Host` is not checked.
//!
//! The admin listener (`admin.listen`) always checks: its console is driven by a browser, with a
//! session cookie that a rebinding page would have the browser send. It answers loopback hosts,
//! its own address, and the names in `admin.hosts`.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;

use actix_web::body::{EitherBody, MessageBody};
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::{header, Version};
use actix_web::middleware::Next;
use actix_web::Error;

use crate::config::{host_without_port, ListenerHost};
use crate::http::problem::ApiError;

/// Whether a listener checks `Host`: set per listener, as app data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPolicy {
    /// Only loopback hosts are answered (and, on the admin listener, [`Self::admin_hosts`]).
    pub loopback_only: bool,
    /// The admin listener: the hosts it answers besides loopback ones.
    pub admin_hosts: Option<Arc<[ListenerHost]>>,
}

impl HostPolicy {
    /// The policy of a listener on `address`: loopback hosts only for a loopback listener in
    /// anonymous mode. (A listener on another address, which only the operations listener may
    /// be in anonymous mode, is reached by names and addresses this cannot know.)
    pub fn for_listener(anonymous: bool, address: IpAddr) -> Self {
        Self {
            loopback_only: anonymous && address.is_loopback(),
            admin_hosts: None,
        }
    }

    /// The admin listener's: loopback hosts, its own address, and `admin.hosts`.
    pub fn for_admin(address: SocketAddr, hosts: &[ListenerHost]) -> Self {
        let own = (!address.ip().is_unspecified()).then(|| ListenerHost::of_address(address.ip()));
        let hosts = hosts.iter().cloned().chain(own).collect();
        Self {
            loopback_only: true,
            admin_hosts: Some(hosts),
        }
    }

    fn answers(&self, host: &str) -> bool {
        is_loopback_host(host)
            || self
                .admin_hosts
                .as_deref()
                .is_some_and(|hosts| hosts.iter().any(|answered| answered.is_named_by(host)))
    }

    fn refusal(&self) -> &'static str {
        match self.admin_hosts {
            Some(_) => "the admin listener answers only requests to a loopback host (localhost, 127.0.0.1 or [::1]), its own address, or a name in admin.hosts",
            None => "this daemon serves clients without credentials (no [[auth.clients]]), so it answers only requests to a loopback host: localhost, 127.0.0.1 or [::1]",
        }
    }
}

/// The middleware: refuses a request whose host is not a loopback one where [`HostPolicy`]
/// says so; runs before routing.
pub async fn check_host(
    request: ServiceRequest,
    next: Next<impl MessageBody + 'static>,
) -> Result<ServiceResponse<EitherBody<impl MessageBody>>, Error> {
    let policy = request
        .app_data::<HostPolicy>()
        .filter(|policy| policy.loopback_only);
    if let Some(policy) = policy {
        if let Err(detail) = names_an_answered_host(&request, policy) {
            let error = ApiError::MisdirectedRequest(detail);
            return Ok(request.error_response(error).map_into_right_body());
        }
    }
    Ok(next.call(request).await?.map_into_left_body())
}

/// Whether the request's `Host` (and the authority of an absolute-form target, if any) is a
/// host `policy` answers; otherwise what the client is told.
fn names_an_answered_host(request: &ServiceRequest, policy: &HostPolicy) -> Result<(), String> {
    let refusal = policy.refusal();
    let mut hosts = request.headers().get_all(header::HOST);
    match (hosts.next(), hosts.next()) {
        (Some(_), Some(_)) => return Err(format!("more than one Host header; {refusal}")),
        (Some(host), None) => {
            let host = host.to_str().unwrap_or_default();
            if !policy.answers(host) {
                return Err(format!("Host {host:?} is not a host it answers; {refusal}"));
            }
        }
        (None, _) if request.version() <= Version::HTTP_10 => {}
        (None, _) => return Err(format!("no Host header; {refusal}")),
    }
    if let Some(authority) = request.uri().authority() {
        if !policy.answers(authority.as_str()) {
            return Err(format!(
                "the request target names {:?}, not a host it answers; {refusal}",
                authority.as_str()
            ));
        }
    }
    Ok(())
}

/// `localhost`, `localhost.`, an IPv4 address of 127.0.0.0/8 or `[::1]` (an IPv6 loopback in
/// brackets), each with or without a port.
pub fn is_loopback_host(value: &str) -> bool {
    let Some(host) = host_without_port(value) else {
        return false;
    };
    if let Some(inside) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        return inside
            .parse::<Ipv6Addr>()
            .is_ok_and(|address| IpAddr::V6(address).to_canonical().is_loopback());
    }
    host.eq_ignore_ascii_case("localhost")
        || host.eq_ignore_ascii_case("localhost.")
        || host
            .parse::<Ipv4Addr>()
            .is_ok_and(|address| address.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_hosts_are_told_from_others() {
        for host in [
            "localhost",
            "LocalHost:8080",
            "localhost.",
            "localhost.:80",
            "127.0.0.1",
            "127.0.0.1:8080",
            "127.1.2.3:1",
            "[::1]",
            "[::1]:8080",
            "[::ffff:127.0.0.1]:8080",
        ] {
            assert!(is_loopback_host(host), "{host}");
        }
        for host in [
            "attacker.example",
            "attacker.example:8080",
            "localhost.attacker.example",
            "127.0.0.1.attacker.example",
            "10.0.0.1:8080",
            "0.0.0.0",
            "[::2]:8080",
            "::1",
            "localhost:http",
            "localhost:",
            "127.0.0.1:8080:80",
            "",
            ":8080",
            "[::1",
            "[::1]x",
        ] {
            assert!(!is_loopback_host(host), "{host}");
        }
    }

    #[test]
    fn only_anonymous_loopback_listeners_check() {
        let loopback: IpAddr = "127.0.0.1".parse().unwrap();
        let other: IpAddr = "10.0.0.5".parse().unwrap();
        assert!(HostPolicy::for_listener(true, loopback).loopback_only);
        assert!(!HostPolicy::for_listener(true, other).loopback_only);
        assert!(!HostPolicy::for_listener(false, loopback).loopback_only);
    }

    #[test]
    fn the_admin_listener_answers_loopback_its_address_and_its_names() {
        let names = ["ops.example:443", "console.internal"].map(|name| {
            ListenerHost::parse(name).expect("a host name, and one with a port, are valid")
        });
        let admin = HostPolicy::for_admin("10.0.0.5:8081".parse().unwrap(), &names);
        assert!(admin.loopback_only);
        for host in [
            "localhost:8081",
            "10.0.0.5:8081",
            "OPS.example",
            "console.internal:8081",
        ] {
            assert!(admin.answers(host), "{host}");
        }
        for host in [
            "attacker.example",
            "10.0.0.6:8081",
            "ops.example.attacker",
            "ops.example:https",
            "",
        ] {
            assert!(!admin.answers(host), "{host}");
        }
    }

    #[test]
    fn an_admin_listener_on_every_address_answers_only_loopback_and_its_names() {
        let names = [ListenerHost::parse("[fd00::5]").expect("an IPv6 address in brackets")];
        let everywhere = HostPolicy::for_admin("[::]:8081".parse().unwrap(), &names);
        for host in ["[::1]:8081", "[FD00::5]:8081"] {
            assert!(everywhere.answers(host), "{host}");
        }
        for host in ["[::]:8081", "0.0.0.0:8081", "fd00::5", "10.0.0.5:8081"] {
            assert!(!everywhere.answers(host), "{host}");
        }
        let v6 = HostPolicy::for_admin("[fd00::6]:8081".parse().unwrap(), &[]);
        assert!(v6.answers("[fd00::6]:8081"));
        assert!(!v6.answers("[fd00::5]:8081"));
    }
}
