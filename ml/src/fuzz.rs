//! Settings shared by the workspace's property tests (the fuzz targets of `docs/testing.md`),
//! compiled only with the `fuzz` feature, which only the crates' dev-dependencies enable.

use proptest::test_runner::Config;

/// Proptest settings for a fuzz target: `ci` cases, unless `PROPTEST_CASES` says how many
/// (`testing/fuzz-long.sh` sets it to run millions). Failures are not persisted to files:
/// every failure found becomes a plain regression test beside the property instead.
pub fn config(ci: u32) -> Config {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(ci);
    Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    }
}
