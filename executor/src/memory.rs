//! How much memory this executor's tasks may use: the smaller of the machine's memory and the
//! limit of the cgroup the process runs in (cgroup v2 `memory.max` or v1
//! `memory.limit_in_bytes`, the tightest along the path to the root), unless
//! `ringflow executor --memory` says otherwise. The executor advertises it when it registers,
//! and the driver refuses jobs whose memory estimate exceeds it.

use std::fs;
use std::path::Path;

use ringflow_core::size::format_bytes;

/// Where an executor's memory limit comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LimitSource {
    /// `ringflow executor --memory SIZE`.
    Configured,
    /// The cgroup the process runs in (a container's or a job scheduler's limit).
    Cgroup,
    /// The machine's total memory.
    Machine,
}

impl LimitSource {
    /// The words `ExecutorInfo.memory_source` carries.
    pub fn as_str(self) -> &'static str {
        match self {
            LimitSource::Configured => "--memory",
            LimitSource::Cgroup => "cgroup memory limit",
            LimitSource::Machine => "machine memory",
        }
    }
}

/// The memory an executor's tasks may use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryLimit {
    /// Bytes.
    pub bytes: u64,
    /// Where the figure comes from.
    pub source: LimitSource,
}

impl std::fmt::Display for MemoryLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", format_bytes(self.bytes), self.source.as_str())
    }
}

impl MemoryLimit {
    /// `configured` when given, else what this process may use (`None` where neither the
    /// machine's memory nor a cgroup limit can be read, e.g. off Linux).
    pub fn resolve(configured: Option<u64>) -> Option<MemoryLimit> {
        match configured {
            Some(bytes) => Some(MemoryLimit {
                bytes,
                source: LimitSource::Configured,
            }),
            None => detect_in(Path::new("/proc"), Path::new("/sys/fs/cgroup")),
        }
    }
}

/// The limit read from a `/proc` and a `/sys/fs/cgroup` tree (parameters so tests can give
/// their own).
pub fn detect_in(proc_root: &Path, cgroup_root: &Path) -> Option<MemoryLimit> {
    let machine = machine_memory(&proc_root.join("meminfo"));
    let cgroup = fs::read_to_string(proc_root.join("self/cgroup"))
        .ok()
        .and_then(|text| cgroup_limit(&text, cgroup_root));
    match (machine, cgroup) {
        (Some(m), Some(c)) if c < m => Some(MemoryLimit {
            bytes: c,
            source: LimitSource::Cgroup,
        }),
        (Some(m), _) => Some(MemoryLimit {
            bytes: m,
            source: LimitSource::Machine,
        }),
        (None, Some(c)) => Some(MemoryLimit {
            bytes: c,
            source: LimitSource::Cgroup,
        }),
        (None, None) => None,
    }
}

/// `MemTotal` of a `/proc/meminfo`, in bytes.
fn machine_memory(meminfo: &Path) -> Option<u64> {
    let text = fs::read_to_string(meminfo).ok()?;
    let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line
        .trim_start_matches("MemTotal:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    kib.checked_mul(1024)
}

/// The tightest memory limit on the way from the process's cgroup (as `/proc/self/cgroup`
/// lists it) up to the root, in v2 or v1 layout; `None` when there is none.
fn cgroup_limit(proc_self_cgroup: &str, root: &Path) -> Option<u64> {
    let mut tightest: Option<u64> = None;
    for line in proc_self_cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let (dir, file) = if controllers.is_empty() {
            (root.to_path_buf(), "memory.max")
        } else if controllers.split(',').any(|c| c == "memory") {
            (root.join("memory"), "memory.limit_in_bytes")
        } else {
            continue;
        };
        // The process's cgroup and each of its ancestors; inside a container whose cgroup
        // namespace makes its own cgroup the root, the root's file holds the limit.
        let mut path = Path::new(path.trim()).to_path_buf();
        loop {
            let relative = path.strip_prefix("/").unwrap_or(path.as_path());
            if let Some(limit) = read_limit(&dir.join(relative).join(file)) {
                tightest = Some(tightest.map_or(limit, |t| t.min(limit)));
            }
            if !path.pop() {
                break;
            }
        }
    }
    tightest
}

/// A limit file's value; `None` for "max", unreadable files and v1's "unlimited" (a number near
/// 2^63).
fn read_limit(file: &Path) -> Option<u64> {
    let text = fs::read_to_string(file).ok()?;
    let value: u64 = text.trim().parse().ok()?;
    (value < 1 << 60).then_some(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (path, text) in files {
            let p = dir.path().join(path);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(p, text).unwrap();
        }
        dir
    }

    const MEMINFO: &str = "MemTotal:       16318480 kB\nMemFree:         1000 kB\n";

    fn detect(dir: &tempfile::TempDir) -> Option<MemoryLimit> {
        detect_in(&dir.path().join("proc"), &dir.path().join("cgroup"))
    }

    #[test]
    fn the_machine_counts_when_no_cgroup_limits_the_process() {
        let dir = tree(&[
            ("proc/meminfo", MEMINFO),
            ("proc/self/cgroup", "0::/user.slice/session-1.scope\n"),
            ("cgroup/user.slice/session-1.scope/memory.max", "max\n"),
            ("cgroup/user.slice/memory.max", "max\n"),
        ]);
        let limit = detect(&dir).unwrap();
        assert_eq!(limit.bytes, 16318480 * 1024);
        assert_eq!(limit.source, LimitSource::Machine);
    }

    #[test]
    fn the_tightest_cgroup_v2_limit_on_the_path_counts() {
        let dir = tree(&[
            ("proc/meminfo", MEMINFO),
            ("proc/self/cgroup", "0::/kubepods/pod1/ctr\n"),
            ("cgroup/kubepods/pod1/ctr/memory.max", "max\n"),
            ("cgroup/kubepods/pod1/memory.max", "2147483648\n"),
            ("cgroup/kubepods/memory.max", "8589934592\n"),
        ]);
        let limit = detect(&dir).unwrap();
        assert_eq!(limit.bytes, 2 << 30);
        assert_eq!(limit.source, LimitSource::Cgroup);
        assert_eq!(limit.to_string(), "2.0 GiB (cgroup memory limit)");
    }

    #[test]
    fn a_container_sees_its_limit_at_the_root() {
        let dir = tree(&[
            ("proc/meminfo", MEMINFO),
            ("proc/self/cgroup", "0::/\n"),
            ("cgroup/memory.max", "536870912\n"),
        ]);
        assert_eq!(detect(&dir).unwrap().bytes, 512 << 20);
    }

    #[test]
    fn cgroup_v1_limits_count_and_unlimited_is_ignored() {
        let dir = tree(&[
            ("proc/meminfo", MEMINFO),
            (
                "proc/self/cgroup",
                "12:cpu,cpuacct:/slurm/job7\n4:memory:/slurm/job7\n",
            ),
            (
                "cgroup/memory/slurm/job7/memory.limit_in_bytes",
                "1073741824\n",
            ),
            (
                "cgroup/memory/memory.limit_in_bytes",
                "9223372036854771712\n",
            ),
        ]);
        let limit = detect(&dir).unwrap();
        assert_eq!((limit.bytes, limit.source), (1 << 30, LimitSource::Cgroup));
    }

    #[test]
    fn a_limit_above_the_machine_leaves_the_machine() {
        let dir = tree(&[
            ("proc/meminfo", MEMINFO),
            ("proc/self/cgroup", "0::/big\n"),
            ("cgroup/big/memory.max", "1099511627776\n"),
        ]);
        assert_eq!(detect(&dir).unwrap().source, LimitSource::Machine);
    }

    #[test]
    fn nothing_readable_is_unknown_and_configured_wins() {
        let dir = tree(&[]);
        assert_eq!(detect(&dir), None);
        let set = MemoryLimit::resolve(Some(64 << 20)).unwrap();
        assert_eq!(set.to_string(), "64.0 MiB (--memory)");
    }
}
