//! Network faults for the soak, with `tc` on the loopback interface: packets sent to one
//! executor are delayed or dropped (`netem`) or, where the kernel has no netem, squeezed
//! through a slow link (`htb` at a few hundred kbit/s, which delays them and drops what
//! overflows its queue). Every executor the soak starts binds its ring to a loopback address of
//! its own in 127.77.0.0/16, which nothing else on the machine uses, so a filter on that
//! destination impairs its traffic only (its ring neighbour's data and whatever else is sent to
//! it). They need `tc` and the right to change `lo`'s queueing (CAP_NET_ADMIN); without them
//! the soak says why once and injects the other faults.

use std::net::Ipv4Addr;
use std::process::Command;
use std::time::Duration;

/// What a network fault does to the packets sent to its executor.
#[derive(Clone, Copy, Debug)]
pub(in crate::chaos) enum Impairment {
    /// Each packet waits this long.
    Delay(Duration),
    /// This percentage of packets is dropped.
    Loss(u32),
    /// The packets pass at most this many kbit/s.
    Throttle(u32),
}

/// What this machine's kernel lets the soak do to packets.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(in crate::chaos) enum Capability {
    /// Delays and drops (`netem`).
    Netem,
    /// A slow link only (`htb`; the kernel has no netem).
    Throttle,
}

impl Impairment {
    /// The impairment in words: `netem delay 800 ms`, `netem loss 20%`, `htb 300 kbit/s`.
    pub fn describe(&self) -> String {
        match self {
            Impairment::Delay(d) => format!("netem delay {} ms", d.as_millis()),
            Impairment::Loss(p) => format!("netem loss {p}%"),
            Impairment::Throttle(k) => format!("htb {k} kbit/s"),
        }
    }

    /// The queueing discipline that holds the impaired packets: `tc qdisc add` arguments after
    /// `parent`.
    fn leaf(&self) -> Vec<String> {
        let args = match self {
            Impairment::Delay(d) => format!("netem delay {}ms", d.as_millis()),
            Impairment::Loss(p) => format!("netem loss {p}%"),
            // A short queue: what overflows it is dropped, as on a congested link.
            Impairment::Throttle(_) => "pfifo limit 20".into(),
        };
        args.split(' ').map(String::from).collect()
    }
}

/// The loopback address of the `n`-th executor the soak starts (from 0).
pub(in crate::chaos) fn executor_address(n: usize) -> Ipv4Addr {
    Ipv4Addr::new(127, 77, (n / 250) as u8, (n % 250 + 2) as u8)
}

/// Which network faults can be injected here, or why none can. `lo` must have no queueing
/// discipline of its own (one is added only while a fault lasts), and adding one must be
/// allowed.
pub(in crate::chaos) fn available() -> Result<Capability, String> {
    let shown = tc(&["qdisc", "show", "dev", "lo"])?;
    if !shown.contains("noqueue") {
        return Err(format!(
            "lo already has a queueing discipline ({})",
            shown.trim()
        ));
    }
    let to = executor_address(0);
    if Impaired::install(to, Impairment::Delay(Duration::ZERO)).is_ok() {
        return Ok(Capability::Netem);
    }
    Impaired::install(to, Impairment::Throttle(1_000_000))
        .map(|_| Capability::Throttle)
        .map_err(|e| format!("neither netem nor htb can be used: {e}"))
}

/// Packets to one address impaired until this is dropped.
pub(in crate::chaos) struct Impaired;

impl Impaired {
    /// Impairs the packets sent to `to`: a root queueing discipline on `lo` with a class that
    /// only a filter on `to` reaches (every other packet goes through untouched), holding the
    /// impairment's leaf.
    pub fn install(to: Ipv4Addr, how: Impairment) -> Result<Impaired, String> {
        let (root, class) = match how {
            // A priority queue whose fourth band no packet priority maps to.
            Impairment::Delay(_) | Impairment::Loss(_) => (
                "prio bands 4 priomap 1 2 2 2 1 2 0 0 1 1 1 1 1 1 1 1".to_string(),
                "1:4",
            ),
            // Token buckets: everything else at 100 Gbit/s, `to` at its rate.
            Impairment::Throttle(_) => ("htb default 1".to_string(), "1:2"),
        };
        tc_line(&format!("qdisc add dev lo root handle 1: {root}"))?;
        // From here on, dropping the guard removes whatever was added.
        let guard = Impaired;
        if let Impairment::Throttle(kbit) = how {
            tc_line("class add dev lo parent 1: classid 1:1 htb rate 100gbit")?;
            tc_line(&format!(
                "class add dev lo parent 1: classid 1:2 htb rate {kbit}kbit"
            ))?;
        }
        let mut leaf = vec!["qdisc", "add", "dev", "lo", "parent", class];
        let args = how.leaf();
        leaf.extend(args.iter().map(String::as_str));
        tc(&leaf)?;
        tc_line(&format!(
            "filter add dev lo parent 1: protocol ip prio 1 u32 match ip dst {to}/32 flowid {class}"
        ))?;
        Ok(guard)
    }
}

impl Drop for Impaired {
    fn drop(&mut self) {
        let _ = tc(&["qdisc", "del", "dev", "lo", "root"]);
    }
}

/// Runs `tc` with the space-separated arguments of `line`.
fn tc_line(line: &str) -> Result<String, String> {
    tc(&line.split(' ').collect::<Vec<_>>())
}

/// Runs `tc ARGS`; its output, or why it failed.
fn tc(args: &[&str]) -> Result<String, String> {
    let out = Command::new("tc")
        .args(args)
        .output()
        .map_err(|e| format!("cannot run tc: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        Err(format!(
            "tc {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}
