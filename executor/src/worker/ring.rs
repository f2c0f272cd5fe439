//! [`ring_config`]: the one place where a task's header, the driver's word, becomes the
//! configuration of a ring this executor connects (a task's first ring and every re-formed one);
//! [`connect`] joins it, through shared memory where ranks share hosts.

use std::time::Duration;

use ringflow_core::pb;
use ringflow_core::spec::Compression;

use crate::collective::{Collective, HostConfig, JobSecret, RingConfig, RingListener, host};
use crate::error::{CommError, CommOp, ExecutorError, Peer, Result};

/// Joins the collective a task's `header` describes: the ring, and shared memory among the
/// ranks of each host when the job allows it.
pub fn connect(
    listener: &RingListener,
    header: &pb::TaskHeader,
    driver: &str,
) -> Result<Box<dyn Collective>> {
    let cfg = ring_config(header, driver)?;
    host::connect(listener, cfg, host_config(header))
}

/// Where the ranks of a task's `header` run, and whether they share memory.
pub fn host_config(header: &pb::TaskHeader) -> HostConfig {
    HostConfig {
        hosts: header.hosts.clone(),
        generation: header.generation,
        shared_memory: header.shared_memory,
    }
}

/// The least deadline for ring reads and writes, whatever the task says.
const MIN_RING_TIMEOUT: Duration = Duration::from_secs(1);

/// The ring a task's `header` from the driver at `driver` describes: the one place where the
/// driver's word becomes a [`RingConfig`] (a task's first ring and every re-formed one).
pub fn ring_config(header: &pb::TaskHeader, driver: &str) -> Result<RingConfig> {
    let secret = JobSecret::from_bytes(&header.secret).ok_or_else(|| {
        let why = "the task's ring secret is not 32 bytes";
        CommError::new(Peer::driver(driver), CommOp::FormRing, why)
    })?;
    let compression = match header.compression.as_str() {
        "" => Compression::None,
        word => Compression::from_word(word).ok_or_else(|| {
            ExecutorError::Protocol(format!(
                "gradient compression {word:?}, which this executor does not know (it knows \
                 \"none\", \"fp16\" and \"bf16\"); run executors of the driver's version"
            ))
        })?,
    };
    Ok(RingConfig {
        job_id: header.job_id.clone(),
        rank: header.rank as usize,
        peers: header.ring.clone(),
        secret,
        timeout: Duration::from_millis(header.ring_timeout_ms).max(MIN_RING_TIMEOUT),
        backup_workers: header.backup_workers as usize,
        compression,
    })
}

/// A task header of job `j` for `rank` of a ring at `ring`, for tests.
#[cfg(test)]
pub(super) fn test_header(ring: &[&str], rank: u32) -> pb::TaskHeader {
    pb::TaskHeader {
        job_id: "j".into(),
        rank,
        ring: ring.iter().map(|a| a.to_string()).collect(),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ring_is_configured_from_the_header_alone() {
        let mut h = test_header(&["h:1", "h:2", "h:3"], 2);
        h.secret = vec![7; 32];
        h.ring_timeout_ms = 250;
        h.backup_workers = 1;
        let cfg = ring_config(&h, "http://driver:7077").unwrap();
        assert_eq!((cfg.rank, cfg.peers.len()), (2, 3));
        assert_eq!(cfg.timeout, MIN_RING_TIMEOUT, "the floor applies");
        assert_eq!(cfg.backup_workers, 1);
        assert_eq!(cfg.compression, Compression::None, "an empty word is f32");
        h.compression = "bf16".into();
        let cfg = ring_config(&h, "http://driver:7077").unwrap();
        assert_eq!(cfg.compression, Compression::Bf16);
        h.compression = "fp8".into();
        let err = ring_config(&h, "http://driver:7077").unwrap_err();
        assert!(err.to_string().contains("\"fp8\""), "{err}");
        h.compression.clear();
        h.secret.pop();
        let err = ring_config(&h, "http://driver:7077")
            .unwrap_err()
            .to_string();
        assert_eq!(err, "the task's ring secret is not 32 bytes");
    }
}
