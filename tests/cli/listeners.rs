//! Bounds on connections, with real processes: floods of silent connections to the driver's
//! control plane and web UI and to an executor's ring and health ports make room for clients
//! that speak, are closed at the first-request deadline and are counted in `/metrics`, and
//! connections that completed a request keep their place until they go idle.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::helpers::*;
use crate::security::{driver, write};
use crate::ui::http_get;

const SECRET: &str = "5f2b8e1c9a7d4f3e6b0a1c2d3e4f5a6b";

/// `n` connections to `addr` that never send a byte.
fn silent_connections(addr: &str, n: usize) -> Vec<TcpStream> {
    (0..n).map(|_| TcpStream::connect(addr).unwrap()).collect()
}

/// Asserts that the server closes `conn` within `limit` (whatever it sent before).
fn closed_within(mut conn: TcpStream, limit: Duration) {
    let deadline = Instant::now() + limit;
    let mut buf = [0u8; 1024];
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(
            !left.is_zero(),
            "a connection is still open after {limit:?}"
        );
        conn.set_read_timeout(Some(left)).unwrap();
        match conn.read(&mut buf) {
            Ok(0) => return,
            Ok(_) => continue,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                panic!("a connection is still open after {limit:?}")
            }
            // Reset by the server: closed too.
            Err(_) => return,
        }
    }
}

/// A connection to the HTTP server at `addr` that made one keep-alive request and is open.
fn requested(addr: &str) -> TcpStream {
    let mut conn = TcpStream::connect(addr).unwrap();
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(conn, "GET /healthz HTTP/1.1\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut reply = Vec::new();
    let mut buf = [0u8; 512];
    while !reply.ends_with(b"ok\n") {
        let n = conn.read(&mut buf).expect("the server answers");
        assert!(n > 0, "the server closed a connection that made a request");
        reply.extend_from_slice(&buf[..n]);
    }
    conn
}

/// The value of the sample `series` (name and labels, as written) in a `/metrics` text.
fn sample(metrics: &str, series: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {series} in:\n{metrics}"))
}

fn refused(metrics: &str, listener: &str, reason: &str) -> f64 {
    sample(
        metrics,
        &format!(
            "ringflow_connections_refused_total{{listener=\"{listener}\",reason=\"{reason}\"}}"
        ),
    )
}

#[test]
fn silent_connections_cannot_lock_clients_out_of_the_driver() {
    let dir = tempfile::tempdir().unwrap();
    let secret_file = write(dir.path(), "secret", SECRET);
    let (driver, url, ui) = driver(&[
        "--secret-file",
        &secret_file,
        "--max-connections",
        "4",
        "--ui-max-connections",
        "4",
        "--first-request-timeout",
        "2",
        "--idle-timeout",
        "4",
    ]);
    let grpc = url.strip_prefix("http://").unwrap().to_string();
    let ui_addr = ui
        .strip_prefix("http://")
        .unwrap()
        .trim_end_matches('/')
        .to_string();

    // Far more silent connections than either bound; while they are open, a client with the
    // secret and a browser's request still get in.
    let grpc_flood = silent_connections(&grpc, 30);
    let ui_flood = silent_connections(&ui_addr, 30);
    ringflow(
        &["status", "--driver", &url, "--secret-file", &secret_file],
        Duration::from_secs(30),
    )
    .assert_success();
    assert_eq!(http_get(&format!("{ui}readyz")), (200, "ready\n".into()));
    // Every silent connection is closed: to make room, or at the 2 s first-request deadline.
    for conn in grpc_flood.into_iter().chain(ui_flood) {
        closed_within(conn, Duration::from_secs(20));
    }
    let metrics = http_get(&format!("{ui}metrics")).1;
    for listener in ["grpc", "ui"] {
        assert!(refused(&metrics, listener, "evicted") >= 26.0, "{metrics}");
        assert!(
            refused(&metrics, listener, "first_request_timeout") >= 1.0,
            "{metrics}"
        );
        assert_eq!(refused(&metrics, listener, "limit"), 0.0, "{metrics}");
        let max = format!("ringflow_connections_max{{listener=\"{listener}\"}}");
        assert_eq!(sample(&metrics, &max), 4.0);
    }
    assert_eq!(
        sample(&metrics, "ringflow_connections_open{listener=\"grpc\"}"),
        0.0
    );
    // Counted, not logged one line each: one summary line per listener.
    let log = driver.stderr();
    assert_eq!(
        log.matches("the control plane refused connections").count(),
        1,
        "{log}"
    );
    assert_eq!(
        log.matches("the web UI refused connections").count(),
        1,
        "{log}"
    );

    // Connections that made a request keep their place: at the bound, a new connection is
    // refused at accept, and the held ones are closed once idle for 4 s.
    let held: Vec<TcpStream> = (0..4).map(|_| requested(&ui_addr)).collect();
    closed_within(
        TcpStream::connect(&ui_addr).unwrap(),
        Duration::from_secs(20),
    );
    for conn in held {
        closed_within(conn, Duration::from_secs(20));
    }
    let metrics = http_get(&format!("{ui}metrics")).1;
    assert_eq!(refused(&metrics, "ui", "limit"), 1.0, "{metrics}");
    assert!(refused(&metrics, "ui", "idle_timeout") >= 4.0, "{metrics}");
}

#[test]
fn silent_connections_to_an_executor_are_closed_and_counted() {
    let dir = tempfile::tempdir().unwrap();
    let secret_file = write(dir.path(), "secret", SECRET);
    let (_driver, url, _ui) = driver(&["--secret-file", &secret_file]);
    let health = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .to_string();
    let executor = crate::distributed::executor(
        &url,
        &[
            "--secret-file",
            &secret_file,
            "--health",
            &health,
            "--ring-max-connections",
            "3",
            "--health-max-connections",
            "3",
            "--first-request-timeout",
            "2",
        ],
    );
    let line = executor.wait_for("registered with");
    let ring = line
        .rsplit_once("(ring ")
        .and_then(|(_, r)| r.strip_suffix(')'))
        .unwrap_or_else(|| panic!("no ring address in {line:?}"))
        .to_string();

    let ring_flood = silent_connections(&ring, 20);
    let health_flood = silent_connections(&health, 20);
    assert_eq!(
        http_get(&format!("http://{health}/readyz")),
        (200, "ready\n".into())
    );
    // Garbage on the ring port fails the handshake.
    let mut garbage = TcpStream::connect(&ring).unwrap();
    garbage.write_all(b"GET / HTTP/1.1\r\n\r\n").unwrap();
    closed_within(garbage, Duration::from_secs(20));
    for conn in ring_flood.into_iter().chain(health_flood) {
        closed_within(conn, Duration::from_secs(20));
    }
    let metrics = http_get(&format!("http://{health}/metrics")).1;
    for listener in ["ring", "health"] {
        assert!(refused(&metrics, listener, "evicted") >= 17.0, "{metrics}");
        let max = format!("ringflow_connections_max{{listener=\"{listener}\"}}");
        assert_eq!(sample(&metrics, &max), 3.0);
    }
    assert!(
        refused(&metrics, "ring", "first_request_timeout") >= 1.0,
        "{metrics}"
    );
    assert_eq!(refused(&metrics, "ring", "handshake"), 1.0, "{metrics}");
    assert_eq!(
        sample(&metrics, "ringflow_connections_open{listener=\"ring\"}"),
        0.0
    );
}
