//! The size of the cores' L1 data cache, read once from CPUID: the AVX-512 kernel sizes the
//! depth of its packed blocks to it (`kernel_avx512.rs`), so that a binary built anywhere
//! blocks for the cache of the machine it runs on, unless `RINGFLOW_L1D_KIB` names another size
//! (`features.rs`).

use std::sync::OnceLock;

/// Bytes of the L1 data cache of this CPU's cores, or `None` where CPUID does not say (other
/// architectures, vendors other than AMD, Hygon and Intel).
pub fn l1_data_bytes() -> Option<usize> {
    static BYTES: OnceLock<Option<usize>> = OnceLock::new();
    *BYTES.get_or_init(read)
}

#[cfg(target_arch = "x86_64")]
fn read() -> Option<usize> {
    use std::arch::x86_64::__cpuid;
    let vendor = __cpuid(0);
    let id = [vendor.ebx, vendor.edx, vendor.ecx].map(u32::to_le_bytes);
    match &id.concat()[..] {
        b"AuthenticAMD" | b"HygonGenuine" => amd_l1_data(),
        b"GenuineIntel" if vendor.eax >= 4 => cache_parameters_l1_data(4),
        _ => None,
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn read() -> Option<usize> {
    None
}

/// AMD's cache parameters: leaf 0x8000_001D (the format of Intel's leaf 4) where the CPU has
/// topology extensions, as Linux reads them; else the L1 cache leaf (0x8000_0005), whose ECX
/// top byte is the L1 data cache in KiB.
#[cfg(target_arch = "x86_64")]
fn amd_l1_data() -> Option<usize> {
    use std::arch::x86_64::__cpuid;
    const L1_LEAF: u32 = 0x8000_0005;
    const CACHE_LEAF: u32 = 0x8000_001D;
    const TOPOLOGY_EXTENSIONS: u32 = 1 << 22;
    let max = __cpuid(0x8000_0000).eax;
    if max >= CACHE_LEAF && __cpuid(0x8000_0001).ecx & TOPOLOGY_EXTENSIONS != 0 {
        return cache_parameters_l1_data(CACHE_LEAF);
    }
    if max < L1_LEAF {
        return None;
    }
    let kib = (__cpuid(L1_LEAF).ecx >> 24) as usize;
    (kib > 0).then_some(kib << 10)
}

/// The level-1 data cache among the sub-leaves of a deterministic cache parameters leaf
/// (Intel's 4, AMD's 0x8000_001D): ways × partitions × line size × sets.
#[cfg(target_arch = "x86_64")]
fn cache_parameters_l1_data(leaf: u32) -> Option<usize> {
    use std::arch::x86_64::__cpuid_count;
    const DATA: u32 = 1;
    (0..16)
        .map(|sub| __cpuid_count(leaf, sub))
        .take_while(|params| params.eax & 0x1f != 0)
        .find(|params| params.eax & 0x1f == DATA && (params.eax >> 5) & 0x7 == 1)
        .map(|params| {
            let ways = (params.ebx >> 22) as usize + 1;
            let partitions = ((params.ebx >> 12) & 0x3ff) as usize + 1;
            let line = (params.ebx & 0xfff) as usize + 1;
            ways * partitions * line * (params.ecx as usize + 1)
        })
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    /// CPUID tells the size Linux reports for cpu0's level-1 data cache, where Linux reports
    /// one (and CPUID is read for this vendor).
    #[test]
    fn the_l1_data_cache_is_the_size_linux_reports() {
        let Some(bytes) = super::l1_data_bytes() else {
            return;
        };
        let dir = std::path::Path::new("/sys/devices/system/cpu/cpu0/cache");
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        let read = |p: &std::path::Path, f: &str| {
            std::fs::read_to_string(p.join(f)).map_or(String::new(), |s| s.trim().to_string())
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if read(&path, "level") == "1" && read(&path, "type") == "Data" {
                let size = read(&path, "size");
                let kib: usize = size.trim_end_matches('K').parse().expect("a size in KiB");
                assert_eq!(bytes, kib << 10, "CPUID against {}", path.display());
                return;
            }
        }
    }
}
