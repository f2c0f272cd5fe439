//! The size of the cores' L1 data cache, read once from CPUID: the AVX-512 kernel sizes the
//! depth of its packed blocks to it (`kernel_avx512.rs`), so that a binary built anywhere
//! blocks for the cache of the machine it runs on.

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
        b"GenuineIntel" if vendor.eax >= 4 => intel_l1_data(),
        _ => None,
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn read() -> Option<usize> {
    None
}

/// AMD's L1 cache leaf (0x8000_0005): ECX's top byte is the L1 data cache in KiB.
#[cfg(target_arch = "x86_64")]
fn amd_l1_data() -> Option<usize> {
    use std::arch::x86_64::__cpuid;
    const LEAF: u32 = 0x8000_0005;
    if __cpuid(0x8000_0000).eax < LEAF {
        return None;
    }
    let kib = (__cpuid(LEAF).ecx >> 24) as usize;
    (kib > 0).then_some(kib << 10)
}

/// Intel's deterministic cache parameters (leaf 4): the sub-leaf of the level-1 data cache,
/// whose size is ways × partitions × line size × sets.
#[cfg(target_arch = "x86_64")]
fn intel_l1_data() -> Option<usize> {
    use std::arch::x86_64::__cpuid_count;
    const DATA: u32 = 1;
    (0..16)
        .map(|sub| __cpuid_count(4, sub))
        .take_while(|leaf| leaf.eax & 0x1f != 0)
        .find(|leaf| leaf.eax & 0x1f == DATA && (leaf.eax >> 5) & 0x7 == 1)
        .map(|leaf| {
            let ways = (leaf.ebx >> 22) as usize + 1;
            let partitions = ((leaf.ebx >> 12) & 0x3ff) as usize + 1;
            let line = (leaf.ebx & 0xfff) as usize + 1;
            ways * partitions * line * (leaf.ecx as usize + 1)
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
