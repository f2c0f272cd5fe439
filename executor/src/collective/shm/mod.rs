//! Shared memory among the ranks of one host.
//!
//! Executors that share a host ([`host_identity`]: the machine's boot id and the process's
//! user and network, IPC and PID namespaces, or `ringflow executor --host-identity`)
//! all-reduce through a [`Segment`] in `/dev/shm` instead of TCP ([`ShmGroup`]). The driver
//! sends every rank each rank's identity; [`HostLayout`] groups them into hosts, each led by
//! its lowest rank. The segment's name and key are derived from the job's secret
//! ([`segment_spec`]), so a process without it can neither find nor use the segment.

mod group;
mod segment;

#[cfg(test)]
mod tests;

pub use group::ShmGroup;
pub use segment::{MAX_LOCAL_RANKS, SLOT_FLOATS, Segment, SegmentSpec};

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

use crate::collective::JobSecret;
use crate::error::Peer;

/// This process's host identity: executors with equal identities can share memory. Empty when
/// it cannot be determined (then this executor shares memory with nobody).
pub fn host_identity() -> String {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    let namespaces: Option<Vec<String>> = ["net", "ipc", "pid"]
        .iter()
        .map(|ns| {
            let link = std::fs::read_link(format!("/proc/self/ns/{ns}")).ok()?;
            Some(link.to_string_lossy().into_owned())
        })
        .collect();
    match (boot.trim(), namespaces) {
        ("", _) | (_, None) => String::new(),
        (boot, Some(ns)) => {
            // SAFETY: geteuid has no preconditions.
            let uid = unsafe { libc::geteuid() };
            format!("{boot} uid:{uid} {}", ns.join(" "))
        }
    }
}

/// How a job's ranks fall into hosts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostLayout {
    /// The ranks on this rank's host, ascending (this rank among them).
    pub local: Vec<usize>,
    /// Each host's lowest rank, ascending: the leaders of a hierarchical all-reduce.
    pub leaders: Vec<usize>,
    /// The largest number of ranks on one host.
    pub most_local: usize,
}

impl HostLayout {
    /// The layout seen by `rank` when rank `r` has identity `hosts[r]` (an empty identity, or
    /// a list that does not cover every rank, puts the rank on a host of its own).
    pub fn of(hosts: &[String], rank: usize, world: usize) -> HostLayout {
        let id = |r: usize| match hosts.get(r) {
            Some(h) if !h.is_empty() && hosts.len() == world => h.as_str(),
            _ => "",
        };
        let same = |a: usize, b: usize| a == b || (!id(a).is_empty() && id(a) == id(b));
        let local: Vec<usize> = (0..world).filter(|&r| same(r, rank)).collect();
        let leaders: Vec<usize> = (0..world)
            .filter(|&r| (0..r).all(|q| !same(q, r)))
            .collect();
        let most_local = leaders
            .iter()
            .map(|&l| (0..world).filter(|&r| same(r, l)).count())
            .max()
            .unwrap_or(1);
        HostLayout {
            local,
            leaders,
            most_local,
        }
    }

    /// Whether shared memory has nothing to do: no host has two ranks.
    pub fn is_flat(&self) -> bool {
        self.most_local <= 1
    }

    /// This rank's index among its host's ranks.
    pub fn local_index(&self, rank: usize) -> usize {
        self.local.iter().position(|&r| r == rank).unwrap_or(0)
    }
}

/// The segment of ring `generation` of `job` on the host whose identity is `host`, as seen by
/// local index `me` of `ranks`; `creator` names the host's first rank for errors.
pub fn segment_spec(
    secret: &JobSecret,
    job: &str,
    generation: u32,
    host: &str,
    ranks: usize,
    me: usize,
    creator: Peer,
) -> SegmentSpec {
    let derive = |purpose: &str| -> [u8; 32] {
        let mut m = <Hmac<Sha256> as KeyInit>::new_from_slice(&secret.0).expect("any key length");
        for part in [
            b"ringflow-shm-v1|".as_slice(),
            purpose.as_bytes(),
            b"|",
            job.as_bytes(),
            b"|",
            &generation.to_le_bytes(),
            b"|",
            host.as_bytes(),
        ] {
            m.update(part);
        }
        m.finalize().into_bytes().into()
    };
    let name: String = derive("name")[..16]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    SegmentSpec {
        name: format!("/ringflow-{name}"),
        key: derive("key"),
        ranks,
        me,
        creator,
    }
}
