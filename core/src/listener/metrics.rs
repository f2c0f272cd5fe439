//! The listeners' figures in the Prometheus text format, for a process's `/metrics`.

use std::fmt::Write;

use super::gate::ListenerStats;

/// The connection families for `listeners`: open connections and the bound per listener,
/// connections accepted, and connections refused or closed by reason.
pub fn render_prometheus(listeners: &[ListenerStats]) -> String {
    let mut out = String::new();
    let mut family =
        |name: &str, kind: &str, help: &str, samples: &mut dyn Iterator<Item = (String, f64)>| {
            let _ = writeln!(out, "# HELP {name} {help}");
            let _ = writeln!(out, "# TYPE {name} {kind}");
            for (labels, value) in samples {
                let _ = writeln!(out, "{name}{{{labels}}} {value}");
            }
        };
    let listener = |s: &ListenerStats| format!("listener=\"{}\"", s.kind.label());
    family(
        "ringflow_connections_open",
        "gauge",
        "Connections open now, per listener.",
        &mut listeners.iter().map(|s| (listener(s), s.open as f64)),
    );
    family(
        "ringflow_connections_max",
        "gauge",
        "The bound on concurrent connections of each listener.",
        &mut listeners
            .iter()
            .map(|s| (listener(s), s.max_connections as f64)),
    );
    family(
        "ringflow_connections_accepted_total",
        "counter",
        "Connections admitted by each listener.",
        &mut listeners.iter().map(|s| (listener(s), s.accepted as f64)),
    );
    family(
        "ringflow_connections_refused_total",
        "counter",
        "Connections a listener refused at accept (limit), closed to make room (evicted), \
         closed for a missing first request or handshake (first_request_timeout), for \
         idleness (idle_timeout) or a failed handshake (handshake).",
        &mut listeners.iter().flat_map(|s| {
            s.refused.iter().map(move |(reason, n)| {
                (
                    format!("{},reason=\"{}\"", listener(s), reason.label()),
                    *n as f64,
                )
            })
        }),
    );
    out
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use super::super::{ConnectionGate, ListenerKind, ListenerLimits, RefusalReason};
    use super::*;

    #[test]
    fn every_listener_and_reason_is_exposed() {
        let ui = ConnectionGate::new(
            ListenerKind::Ui,
            ListenerLimits {
                max_connections: 1,
                ..ListenerLimits::UI
            },
        );
        let peer = SocketAddr::from(([127, 0, 0, 1], 1));
        let first = ui.admit(peer).unwrap();
        first.establish();
        assert!(ui.admit(peer).is_none());
        ui.count(RefusalReason::Handshake);
        let ring = ConnectionGate::new(ListenerKind::Ring, ListenerLimits::RING);
        let text = render_prometheus(&[ui.stats(), ring.stats()]);
        for line in [
            "# TYPE ringflow_connections_open gauge",
            "ringflow_connections_open{listener=\"ui\"} 1",
            "ringflow_connections_open{listener=\"ring\"} 0",
            "ringflow_connections_max{listener=\"ui\"} 1",
            "ringflow_connections_max{listener=\"ring\"} 256",
            "ringflow_connections_accepted_total{listener=\"ui\"} 1",
            "# TYPE ringflow_connections_refused_total counter",
            "ringflow_connections_refused_total{listener=\"ui\",reason=\"limit\"} 1",
            "ringflow_connections_refused_total{listener=\"ui\",reason=\"handshake\"} 1",
            "ringflow_connections_refused_total{listener=\"ui\",reason=\"idle_timeout\"} 0",
            "ringflow_connections_refused_total{listener=\"ring\",reason=\"first_request_timeout\"} 0",
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "{line:?} missing from:\n{text}"
            );
        }
    }
}
