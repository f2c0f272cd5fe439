//! Sizes in bytes as people write and read them: `--memory 64MiB` and "about 3.1 GiB".

/// A size that cannot be read, with the text it was given.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{text:?} is not a size: write a number of bytes with an optional unit, such as 512MiB, \
     2GiB, 1.5G or 4000000000 (K, M, G, T and KiB…TiB count in 1024s; KB, MB, GB, TB in 1000s)"
)]
pub struct SizeError {
    /// What was given.
    pub text: String,
}

/// Reads a size such as `64MiB`, `2G`, `1.5GB` or `4096`. `KiB`…`TiB` (and `K`…`T`, `Ki`…`Ti`,
/// as Docker and Kubernetes write them) count in 1024s; `KB`…`TB` in 1000s; `B` or no unit is
/// bytes. Case is ignored; a space may separate the number from the unit.
pub fn parse_size(text: &str) -> Result<u64, SizeError> {
    let fail = || SizeError {
        text: text.to_string(),
    };
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let number: f64 = number.parse().map_err(|_| fail())?;
    let unit = unit.trim().to_ascii_lowercase();
    let multiplier: f64 = match unit.as_str() {
        "" | "b" => 1.0,
        "k" | "ki" | "kib" => 1024.0,
        "m" | "mi" | "mib" => 1024.0 * 1024.0,
        "g" | "gi" | "gib" => 1024.0 * 1024.0 * 1024.0,
        "t" | "ti" | "tib" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        "kb" => 1e3,
        "mb" => 1e6,
        "gb" => 1e9,
        "tb" => 1e12,
        _ => return Err(fail()),
    };
    let bytes = (number * multiplier).round();
    if !bytes.is_finite() || bytes < 1.0 || bytes >= u64::MAX as f64 {
        return Err(fail());
    }
    Ok(bytes as u64)
}

/// `bytes` for people: `512 B`, `47.9 MiB`, `3.1 GiB`, `16.0 TiB`.
pub fn format_bytes(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_in_binary_and_decimal_units() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("64MiB").unwrap(), 64 << 20);
        assert_eq!(parse_size("64mi").unwrap(), 64 << 20);
        assert_eq!(parse_size("64M").unwrap(), 64 << 20);
        assert_eq!(parse_size("2 GiB").unwrap(), 2 << 30);
        assert_eq!(parse_size("1.5G").unwrap(), 3 << 29);
        assert_eq!(parse_size("1GB").unwrap(), 1_000_000_000);
        assert_eq!(parse_size("3tb").unwrap(), 3_000_000_000_000);
        assert_eq!(parse_size("10k").unwrap(), 10_240);
    }

    #[test]
    fn nonsense_is_refused_with_the_text() {
        for bad in [
            "",
            "MiB",
            "-5M",
            "12 parsecs",
            "0",
            "1e30",
            "99999999999999T",
            "1.2.3G",
        ] {
            let err = parse_size(bad).unwrap_err();
            assert_eq!(err.text, bad);
            assert!(err.to_string().contains("is not a size"), "{err}");
        }
    }

    #[test]
    fn bytes_print_in_the_largest_fitting_unit() {
        assert_eq!(format_bytes(512), "512 B");
        assert_eq!(format_bytes(64 << 20), "64.0 MiB");
        assert_eq!(format_bytes(3 << 29), "1.5 GiB");
        assert_eq!(format_bytes(16 << 40), "16.0 TiB");
        assert_eq!(format_bytes(u64::MAX), "16.0 EiB");
    }
}
