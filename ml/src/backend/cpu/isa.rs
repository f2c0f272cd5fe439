//! The CPU settings a user may force through the environment, read once per process: the most
//! the CPU kernels may use of the instruction sets the CPU has (`RINGFLOW_MAX_CPU_ISA`, after
//! oneDNN's `ONEDNN_MAX_CPU_ISA`) and the L1 data cache size the AVX-512 GEMM blocks its depth
//! by (`RINGFLOW_L1D_KIB`). They let one machine run, and tests check, every kernel and
//! blocking that another CPU would pick, and results be reproduced across machines.
//!
//! A cap never raises: a kernel runs only where the CPU was seen to support it. A value that is
//! not valid is reported by [`cpu_settings`] as one sentence naming the variable and the values
//! it takes; the kernels meanwhile follow the default for that variable ([`in_force`]) and say
//! so once in the log, so that no product fails on a setting.

use std::ffi::OsStr;
use std::sync::OnceLock;

/// The variable that caps the instruction sets of the CPU kernels ([`MaxCpuIsa`]).
pub const MAX_ISA_VAR: &str = "RINGFLOW_MAX_CPU_ISA";
/// The variable that replaces the L1 data cache size the AVX-512 GEMM blocks its depth by.
pub const L1D_VAR: &str = "RINGFLOW_L1D_KIB";
/// The largest L1 data cache size [`L1D_VAR`] accepts, in KiB (cores have 32 to 64).
pub const MAX_L1D_KIB: usize = 4096;

/// The most the CPU kernels may use of what the CPU has, from the least to the most.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord)]
pub enum MaxCpuIsa {
    /// None of the engine's own SIMD kernels: matrix products through the `gemm` crate (which
    /// picks its own SIMD), convolution passes in their portable builds. What a CPU without
    /// AVX2 and FMA runs.
    Portable,
    /// AVX2 and FMA: the 6 × 16 packed f32 kernel, bf16 products emulated on it.
    Avx2,
    /// AVX-512F besides: the 8 × 32 packed kernel and the unpacked kernels for few rows or
    /// columns; bf16 products still emulated. What a CPU with AVX-512 but no AVX512_BF16
    /// (Skylake-SP, Ice Lake) runs.
    Avx512,
    /// AVX512_BF16 besides: native bf16 products. Everything this CPU has (the default).
    #[default]
    Avx512Bf16,
}

impl MaxCpuIsa {
    /// Every cap, from the least to the most.
    pub const ALL: [MaxCpuIsa; 4] = [
        MaxCpuIsa::Portable,
        MaxCpuIsa::Avx2,
        MaxCpuIsa::Avx512,
        MaxCpuIsa::Avx512Bf16,
    ];

    /// The variable's word for it (`portable`, `avx2`, `avx512`, `avx512_bf16`).
    pub fn as_str(self) -> &'static str {
        match self {
            MaxCpuIsa::Portable => "portable",
            MaxCpuIsa::Avx2 => "avx2",
            MaxCpuIsa::Avx512 => "avx512",
            MaxCpuIsa::Avx512Bf16 => "avx512_bf16",
        }
    }

    /// The cap a word names, in any case.
    fn from_word(word: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|isa| isa.as_str().eq_ignore_ascii_case(word))
    }
}

/// The CPU settings of this process, as the environment gives them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuSettings {
    /// The cap on the kernels' instruction sets ([`MAX_ISA_VAR`]; everything by default).
    pub max_isa: MaxCpuIsa,
    /// The L1 data cache size to block for, in KiB ([`L1D_VAR`]; None: the size CPUID reports).
    pub l1d_kib: Option<usize>,
}

/// A CPU setting whose value cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CpuSettingError {
    /// [`MAX_ISA_VAR`] names no cap.
    #[error(
        "{MAX_ISA_VAR} is `{value}`, which names no instruction set: set it to `avx512_bf16`, \
         `avx512`, `avx2` or `portable`, or unset it to use everything this CPU has"
    )]
    UnknownIsa {
        /// The value as set.
        value: String,
    },
    /// [`L1D_VAR`] is not a whole number of KiB in range.
    #[error(
        "{L1D_VAR} is `{value}`, which is not a cache size: set it to one core's L1 data cache \
         in KiB, a whole number from 1 to {MAX_L1D_KIB} (32 or 48, say), or unset it to use \
         the size this CPU reports"
    )]
    NotACacheSize {
        /// The value as set.
        value: String,
    },
}

impl CpuSettings {
    /// The settings the two variables' values give (None or empty: unset), or the first value
    /// that cannot be used.
    pub fn from_values(
        max_isa: Option<&OsStr>,
        l1d_kib: Option<&OsStr>,
    ) -> Result<Self, CpuSettingError> {
        Ok(CpuSettings {
            max_isa: parse_max_isa(max_isa)?,
            l1d_kib: parse_l1d_kib(l1d_kib)?,
        })
    }
}

/// The cap a value of [`MAX_ISA_VAR`] names.
fn parse_max_isa(value: Option<&OsStr>) -> Result<MaxCpuIsa, CpuSettingError> {
    let Some(value) = value.filter(|v| !v.is_empty()) else {
        return Ok(MaxCpuIsa::default());
    };
    let word = value.to_string_lossy();
    MaxCpuIsa::from_word(word.trim()).ok_or_else(|| CpuSettingError::UnknownIsa {
        value: word.into_owned(),
    })
}

/// The size in KiB a value of [`L1D_VAR`] gives.
fn parse_l1d_kib(value: Option<&OsStr>) -> Result<Option<usize>, CpuSettingError> {
    let Some(value) = value.filter(|v| !v.is_empty()) else {
        return Ok(None);
    };
    let text = value.to_string_lossy();
    match text.trim().parse::<usize>() {
        Ok(kib) if (1..=MAX_L1D_KIB).contains(&kib) => Ok(Some(kib)),
        _ => Err(CpuSettingError::NotACacheSize {
            value: text.into_owned(),
        }),
    }
}

/// Each variable's value as read: the cap, and the L1 data cache size.
type Values = (
    Result<MaxCpuIsa, CpuSettingError>,
    Result<Option<usize>, CpuSettingError>,
);

/// Each variable's value as this process started with it, read once.
fn values() -> &'static Values {
    static VALUES: OnceLock<Values> = OnceLock::new();
    VALUES.get_or_init(|| {
        let (isa, l1) = (std::env::var_os(MAX_ISA_VAR), std::env::var_os(L1D_VAR));
        (parse_max_isa(isa.as_deref()), parse_l1d_kib(l1.as_deref()))
    })
}

/// This process's CPU settings (the environment read once), or the first variable whose value
/// cannot be used. A program calls it at startup to refuse a bad value before any work.
pub fn cpu_settings() -> Result<CpuSettings, CpuSettingError> {
    let (isa, l1) = values();
    Ok(CpuSettings {
        max_isa: isa.clone()?,
        l1d_kib: l1.clone()?,
    })
}

/// The settings the kernels follow: [`cpu_settings`], with the default in place of a variable
/// whose value cannot be used (said once in the log).
pub fn in_force() -> CpuSettings {
    static IN_FORCE: OnceLock<CpuSettings> = OnceLock::new();
    *IN_FORCE.get_or_init(|| {
        let (isa, l1) = values();
        for error in [isa.as_ref().err(), l1.as_ref().err()]
            .into_iter()
            .flatten()
        {
            tracing::warn!("{error}; the CPU kernels use the default instead");
        }
        CpuSettings {
            max_isa: isa.clone().unwrap_or_default(),
            l1d_kib: l1.clone().unwrap_or_default(),
        }
    })
}

/// Whether the settings in force let the CPU kernels use `isa` (where the CPU has it: the
/// caller checks that).
pub fn allows(isa: MaxCpuIsa) -> bool {
    in_force().max_isa >= isa
}

#[cfg(test)]
mod tests {
    use std::ffi::OsStr;

    use super::*;

    fn settings(isa: Option<&str>, l1: Option<&str>) -> Result<CpuSettings, CpuSettingError> {
        CpuSettings::from_values(isa.map(OsStr::new), l1.map(OsStr::new))
    }

    /// Unset or empty variables mean everything and the detected cache; every word names its
    /// cap in any case, and sizes are whole KiB.
    #[test]
    fn the_variables_name_a_cap_and_a_size() {
        assert_eq!(settings(None, None), Ok(CpuSettings::default()));
        assert_eq!(settings(Some(""), Some("")), Ok(CpuSettings::default()));
        for isa in MaxCpuIsa::ALL {
            for word in [isa.as_str().to_string(), isa.as_str().to_uppercase()] {
                let got = settings(Some(&word), Some("32")).unwrap();
                assert_eq!(got.max_isa, isa, "{word}");
                assert_eq!(got.l1d_kib, Some(32));
            }
        }
        assert_eq!(MaxCpuIsa::default(), MaxCpuIsa::Avx512Bf16);
        assert!(MaxCpuIsa::Portable < MaxCpuIsa::Avx2 && MaxCpuIsa::Avx2 < MaxCpuIsa::Avx512);
    }

    /// A value that cannot be used is one sentence naming the variable, the value and what it
    /// takes.
    #[test]
    fn bad_values_are_refused_by_name() {
        let err = settings(Some("avx-512"), None).unwrap_err();
        let text = err.to_string();
        assert_eq!(
            err,
            CpuSettingError::UnknownIsa {
                value: "avx-512".into()
            }
        );
        for part in [
            MAX_ISA_VAR,
            "`avx-512`",
            "`avx2`",
            "`portable`",
            "`avx512_bf16`",
        ] {
            assert!(text.contains(part), "{text}");
        }
        for bad in ["0", "-32", "32K", "4097", "lots"] {
            let err = settings(None, Some(bad)).unwrap_err();
            let text = err.to_string();
            assert!(
                text.contains(L1D_VAR) && text.contains(&format!("`{bad}`")),
                "{text}"
            );
        }
        assert_eq!(settings(None, Some("4096")).unwrap().l1d_kib, Some(4096));
    }
}
