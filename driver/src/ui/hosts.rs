//! Which `Host` the web UI answers for, so that a web page cannot read a UI it reaches through
//! DNS rebinding (a name of the attacker's that first resolves to the attacker and then to the
//! UI's address; the browser then sends that name as `Host`). As Jupyter does, the UI answers
//! a request whose `Host` is an IP address (v4, or v6 in brackets), `localhost`, or one of the
//! names given with `--ui-host`, with any port, and refuses any other with 403.
//!
//! A request without a `Host` (HTTP/1.0) is answered: browsers always send one, and the
//! rebinding attack needs a browser. The probes (`/healthz`, `/readyz`) answer any `Host`: they
//! say only whether the driver serves, and orchestrators often probe it by a name of theirs.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

/// The host names the web UI answers for besides IP addresses and `localhost` (the driver's
/// `--ui-host`): compared without case and without a final dot.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UiHosts {
    names: Vec<String>,
}

/// A `--ui-host` value that is not a host name.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "{name:?} is not a host name: {why}; give a DNS name such as ringflow.example.com (IP \
     addresses and localhost are always answered)"
)]
pub struct InvalidUiHost {
    /// The value given.
    pub name: String,
    /// What is wrong with it.
    pub why: &'static str,
}

impl UiHosts {
    /// The names in `names` (each a DNS name, without scheme, port or path), checked.
    pub fn new<S: AsRef<str>>(
        names: impl IntoIterator<Item = S>,
    ) -> Result<UiHosts, InvalidUiHost> {
        let mut out = UiHosts::default();
        for name in names {
            let name = name.as_ref();
            let invalid = |why| InvalidUiHost {
                name: name.to_string(),
                why,
            };
            let normal = normalized(name);
            if normal.is_empty() {
                return Err(invalid("it is empty"));
            }
            if name.contains("://") || name.contains('/') {
                return Err(invalid("it has a scheme or a path"));
            }
            if name.contains(':') {
                return Err(invalid(
                    "it has a port (every port of the name is answered)",
                ));
            }
            if !normal.split('.').all(is_label) {
                return Err(invalid(
                    "a name is made of dot-separated labels of letters, digits and hyphens",
                ));
            }
            if !out.names.contains(&normal) {
                out.names.push(normal);
            }
        }
        Ok(out)
    }

    /// Whether the UI answers a request whose `Host` header (or request-target authority) is
    /// `host`, with or without a port.
    pub fn allows(&self, host: &str) -> bool {
        match parse(host) {
            Some(Host::Ip(_)) => true,
            Some(Host::Name(name)) => name == "localhost" || self.names.contains(&name),
            None => false,
        }
    }
}

/// `name` in lower case without one final dot (`Example.COM.` and `example.com` are one name).
fn normalized(name: &str) -> String {
    let name = name.trim();
    name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase()
}

/// One DNS label: 1 to 63 letters, digits and hyphens, not starting or ending with a hyphen
/// (underscores are let through, as some internal names have them).
fn is_label(label: &str) -> bool {
    (1..=63).contains(&label.len())
        && label
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        && !label.starts_with('-')
        && !label.ends_with('-')
}

/// The host part of a `Host` value.
#[derive(Debug, PartialEq, Eq)]
enum Host {
    /// An IP address.
    Ip(IpAddr),
    /// A name, normalized ([`normalized`]).
    Name(String),
}

/// Parses `value` as `host` or `host:port` (`[v6]` or `[v6]:port` for IPv6); `None` for
/// anything else.
fn parse(value: &str) -> Option<Host> {
    let value = value.trim();
    if let Some(rest) = value.strip_prefix('[') {
        let (inside, after) = rest.split_once(']')?;
        let ip: Ipv6Addr = inside.parse().ok()?;
        return (after.is_empty() || is_port(after.strip_prefix(':')?))
            .then_some(Host::Ip(IpAddr::V6(ip)));
    }
    let host = match value.rsplit_once(':') {
        Some((host, port)) if is_port(port) => host,
        Some(_) => return None,
        None => value,
    };
    if host.is_empty() || host.contains(':') {
        return None;
    }
    if let Ok(ip) = host.parse::<Ipv4Addr>() {
        return Some(Host::Ip(IpAddr::V4(ip)));
    }
    let name = normalized(host);
    (!name.is_empty() && name.split('.').all(is_label)).then_some(Host::Name(name))
}

fn is_port(port: &str) -> bool {
    (1..=5).contains(&port.len()) && port.bytes().all(|b| b.is_ascii_digit())
}

/// The first host of `request` (its request-target's authority, then each `Host` header) that
/// `hosts` does not allow, as sent; `None` when every one is allowed or none was sent.
fn refused_host(hosts: &UiHosts, request: &Request) -> Option<String> {
    let authority = request.uri().authority().map(|a| a.as_str().to_string());
    let headers = request
        .headers()
        .get_all(header::HOST)
        .iter()
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    authority
        .into_iter()
        .chain(headers)
        .find(|h| !h.trim().is_empty() && !hosts.allows(h))
}

/// The middleware that refuses a request whose `Host` the UI does not answer for.
pub(super) async fn check_host(
    State(hosts): State<Arc<UiHosts>>,
    request: Request,
    next: Next,
) -> Response {
    let Some(host) = refused_host(&hosts, &request) else {
        return next.run(request).await;
    };
    tracing::warn!(
        "the web UI refused a request for {} with the Host {host:?}: not an IP address, \
         localhost or a --ui-host name",
        request.uri().path()
    );
    (StatusCode::FORBIDDEN, refusal(&host)).into_response()
}

/// The body of a refusal of `host`: one sentence naming the setting.
fn refusal(host: &str) -> String {
    let name = match parse(host) {
        Some(Host::Name(name)) => name,
        _ => "NAME".into(),
    };
    format!(
        "this web UI answers only requests for an IP address, localhost or a name given with \
         --ui-host, not for the Host {host:?}; if that is the driver's own name, start it with \
         --ui-host {name}\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ip_addresses_and_localhost_are_answered_with_any_port() {
        let none = UiHosts::default();
        for host in [
            "127.0.0.1",
            "127.0.0.1:4040",
            "10.1.2.3:80",
            "[::1]",
            "[::1]:4040",
            "[2001:db8::7]:9",
            "localhost",
            "LocalHost:4040",
            "localhost.:4040",
        ] {
            assert!(none.allows(host), "{host}");
        }
    }

    #[test]
    fn other_names_and_malformed_hosts_are_refused() {
        let none = UiHosts::default();
        for host in [
            "rebind.attacker.example",
            "rebind.attacker.example:4040",
            "evil.localhost",
            "localhost.attacker.example",
            "127.0.0.1.attacker.example",
            "::1",
            "[::1",
            "[::1]x",
            "[not-v6]:80",
            "host:port",
            "host:123456",
            ":4040",
            "a b",
            "exa_mple..com",
        ] {
            assert!(!none.allows(host), "{host}");
        }
    }

    #[test]
    fn names_given_are_answered_without_case_or_final_dot() {
        let hosts =
            UiHosts::new(["RingFlow.example.com", "driver-0.", "ringflow.example.com"]).unwrap();
        assert_eq!(hosts.names, ["ringflow.example.com", "driver-0"]);
        for host in [
            "ringflow.example.com:4040",
            "RINGFLOW.EXAMPLE.COM.",
            "driver-0",
        ] {
            assert!(hosts.allows(host), "{host}");
        }
        assert!(!hosts.allows("example.com"));
        assert!(!hosts.allows("x.ringflow.example.com"));
    }

    #[test]
    fn a_name_with_a_port_scheme_or_odd_characters_is_not_a_ui_host() {
        for (name, why) in [
            ("", "empty"),
            ("ringflow:4040", "port"),
            ("http://ringflow", "scheme"),
            ("ringflow/ui", "path"),
            ("ring flow", "labels"),
            ("-ringflow", "labels"),
            ("a..b", "labels"),
        ] {
            let e = UiHosts::new([name]).unwrap_err();
            assert!(e.to_string().contains(why), "{name:?}: {e}");
        }
    }

    #[test]
    fn the_refusal_names_the_setting_and_the_host() {
        let body = refusal("rebind.attacker.example:4040");
        assert!(
            body.contains("--ui-host rebind.attacker.example\n")
                && body.contains("\"rebind.attacker.example:4040\""),
            "{body}"
        );
        assert!(refusal("[zz]").contains("--ui-host NAME"));
    }
}
