//! Which device an executor's model lives on.
//!
//! A job names one device for all its executors (`cluster.device`). For `"cpu"` that is the
//! whole story. For `"cuda"` each executor picks its own GPU: executors that share a host take
//! the GPUs of that host in turn, by their *local rank* — their position among the job's ranks on
//! the same host — modulo the GPUs this process can see (the CUDA driver numbers only the
//! devices left visible by `CUDA_VISIBLE_DEVICES`, so ordinals here are always `0..n`). An
//! explicit `"cuda:N"` with `N > 0` pins every executor to ordinal `N`. (`"cuda:0"` parses to
//! the same [`Device`] as `"cuda"` and so also chooses by local rank.)
//!
//! [`place`] is pure: the caller supplies the ring and the number of visible GPUs
//! ([`Device::cuda_devices`]), and checks the chosen device with [`Device::check_available`].

use std::fmt;

use ringflow_ml::Device;

/// Where one executor runs a task, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    /// The device the model and its batches live on.
    pub device: Device,
    /// This executor's position among the job's ranks on its host (0-based).
    pub local_rank: usize,
    /// How many of the job's ranks share this executor's host.
    pub local_world: usize,
    /// The host those ranks share (the host part of this executor's ring address).
    pub host: String,
}

impl fmt::Display for Placement {
    /// E.g. `cuda:1 (local rank 1 of 2 on host 10.0.0.5)`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} (local rank {} of {} on host {})",
            self.device.full_name(),
            self.local_rank,
            self.local_world,
            self.host
        )
    }
}

/// The host part of a ring address (`host:port`, `[v6]:port`); the whole string if it has no
/// port.
pub fn address_host(address: &str) -> &str {
    address.rsplit_once(':').map_or(address, |(host, port)| {
        if port.chars().all(|c| c.is_ascii_digit()) && !host.is_empty() {
            host
        } else {
            address
        }
    })
}

/// Rank `rank`'s local rank and the number of ranks on its host, given every rank's ring
/// address (index = rank). Ranks share a host when their ring addresses name the same host.
/// A rank outside `ring` is alone on its host: `(0, 1)`.
pub fn local_rank(ring: &[String], rank: usize) -> (usize, usize) {
    let Some(mine) = ring.get(rank).map(|a| address_host(a)) else {
        return (0, 1);
    };
    let same = |a: &&String| address_host(a) == mine;
    let before = ring[..rank].iter().filter(same).count();
    let total = ring.iter().filter(same).count();
    (before, total)
}

/// Chooses the device of rank `rank` for a job that asks for `requested`, given every rank's
/// ring address (index = rank) and the number of CUDA devices this process can see.
///
/// - [`Device::Cpu`] stays on the CPU.
/// - [`Device::Cuda`]`(0)` (`"cuda"`) takes GPU `local_rank % visible`.
/// - [`Device::Cuda`]`(n)` with `n > 0` takes exactly GPU `n`.
///
/// With no visible GPU the requested device is returned unchanged, so that
/// [`Device::check_available`] explains why it cannot be used.
pub fn place(requested: Device, ring: &[String], rank: usize, visible: usize) -> Placement {
    let (local_rank, local_world) = local_rank(ring, rank);
    let device = match requested {
        Device::Cuda(0) if visible > 0 => Device::Cuda(local_rank % visible),
        other => other,
    };
    let host = ring
        .get(rank)
        .map_or_else(|| "localhost".to_string(), |a| address_host(a).to_string());
    Placement {
        device,
        local_rank,
        local_world,
        host,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring(addresses: &[&str]) -> Vec<String> {
        addresses.iter().map(|a| a.to_string()).collect()
    }

    #[test]
    fn hosts_are_read_from_ring_addresses() {
        assert_eq!(address_host("10.0.0.1:7000"), "10.0.0.1");
        assert_eq!(address_host("[::1]:7000"), "[::1]");
        assert_eq!(address_host("node-3"), "node-3");
    }

    #[test]
    fn local_rank_counts_earlier_ranks_on_the_same_host() {
        let r = ring(&["a:1", "a:2", "b:1", "b:2", "b:3"]);
        assert_eq!(local_rank(&r, 0), (0, 2));
        assert_eq!(local_rank(&r, 1), (1, 2));
        assert_eq!(local_rank(&r, 2), (0, 3));
        assert_eq!(local_rank(&r, 4), (2, 3));
        assert_eq!(local_rank(&r, 9), (0, 1));
    }

    #[test]
    fn cpu_jobs_stay_on_the_cpu() {
        let r = ring(&["a:1", "a:2"]);
        assert_eq!(place(Device::Cpu, &r, 1, 4).device, Device::Cpu);
    }

    #[test]
    fn cuda_takes_the_gpu_of_the_local_rank_modulo_visible_gpus() {
        let r = ring(&["a:1", "a:2", "a:3", "b:1"]);
        let on = |rank, visible| place(Device::Cuda(0), &r, rank, visible).device;
        assert_eq!(on(0, 2), Device::Cuda(0));
        assert_eq!(on(1, 2), Device::Cuda(1));
        assert_eq!(on(2, 2), Device::Cuda(0), "wraps around the visible GPUs");
        assert_eq!(on(3, 2), Device::Cuda(0), "first on its own host");
        assert_eq!(on(2, 8), Device::Cuda(2));
    }

    #[test]
    fn an_explicit_ordinal_is_kept() {
        let r = ring(&["a:1", "a:2"]);
        assert_eq!(place(Device::Cuda(3), &r, 0, 4).device, Device::Cuda(3));
        assert_eq!(place(Device::Cuda(3), &r, 1, 4).device, Device::Cuda(3));
    }

    #[test]
    fn without_visible_gpus_the_request_is_left_for_the_availability_check() {
        let r = ring(&["a:1"]);
        assert_eq!(place(Device::Cuda(0), &r, 0, 0).device, Device::Cuda(0));
    }

    #[test]
    fn placements_describe_themselves_for_the_log() {
        let r = ring(&["h:1", "h:2"]);
        let p = place(Device::Cuda(0), &r, 1, 2);
        assert_eq!(p.to_string(), "cuda:1 (local rank 1 of 2 on host h)");
    }
}
