//! Per-call proof of the shared secret: `v1.<unix seconds>.<nonce>.<HMAC-SHA256>` in the
//! [`AUTH_HEADER`] metadata of every control-plane call.
//!
//! The MAC covers the timestamp and a random 128-bit nonce. The driver accepts a token once
//! (nonces are remembered for as long as their timestamp is acceptable) and only within
//! [`MAX_CLOCK_SKEW`] of its own clock, so a token seen on the wire cannot be replayed and the
//! secret cannot be read from it.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;
use tonic::metadata::MetadataValue;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

use super::Secret;
use crate::data::flight::hex;

/// The gRPC metadata key that carries the token.
pub const AUTH_HEADER: &str = "x-ringflow-auth";

/// How far a token's timestamp may be from the driver's clock.
pub const MAX_CLOCK_SKEW: Duration = Duration::from_secs(300);

/// Domain separation: these MACs are never valid for anything else keyed by the secret.
const CONTEXT: &[u8] = b"ringflow control plane v1\0";

/// Remembered nonces beyond which expired ones are swept.
const SWEEP_AT: usize = 4096;

fn mac(secret: &Secret, timestamp: u64, nonce: &str) -> Hmac<Sha256> {
    let mut m = <Hmac<Sha256> as KeyInit>::new_from_slice(secret.expose()).expect("any key length");
    m.update(CONTEXT);
    m.update(timestamp.to_string().as_bytes());
    m.update(b".");
    m.update(nonce.as_bytes());
    m
}

/// The bytes of `s`, which must be lower-case hex as [`hex`] writes it: any other spelling of
/// the same bytes (upper case, a `+` sign) is not the token that was signed.
fn unhex(s: &str) -> Option<Vec<u8>> {
    let digit = |b: u8| match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        _ => None,
    };
    if !s.len().is_multiple_of(2) {
        return None;
    }
    s.as_bytes()
        .chunks_exact(2)
        .map(|p| Some(digit(p[0])? << 4 | digit(p[1])?))
        .collect()
}

/// A timestamp written as [`Secret::token`] writes it: decimal digits, no sign, no leading
/// zero.
fn timestamp(s: &str) -> Option<u64> {
    let canonical = s.bytes().all(|b| b.is_ascii_digit()) && (s == "0" || !s.starts_with('0'));
    canonical.then(|| s.parse().ok()).flatten()
}

fn unix(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

impl Secret {
    /// A fresh token proving knowledge of the secret at time `now`.
    pub fn token(&self, now: SystemTime) -> String {
        let mut raw = [0u8; 16];
        rand::fill(&mut raw);
        let nonce = hex(&raw);
        let ts = unix(now);
        let tag = mac(self, ts, &nonce).finalize().into_bytes();
        format!("v1.{ts}.{nonce}.{}", hex(&tag))
    }
}

/// Why the driver refused a call. Its `Display` is the sentence both sides show.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Refusal {
    /// The call carried no token.
    Missing,
    /// The token is not of the form this version writes.
    Malformed,
    /// The token's MAC is not made with the driver's secret.
    WrongSecret,
    /// The token's timestamp is too far from the driver's clock.
    Clock {
        /// Seconds by which the caller's clock is ahead (positive) or behind.
        skew_s: i64,
    },
    /// The token was used before.
    Replayed,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Missing => write!(
                f,
                "the driver requires the cluster's shared secret and none was sent \
                 (pass --secret-file PATH or set RINGFLOW_SECRET)"
            ),
            Refusal::Malformed => write!(f, "the request's authentication token is malformed"),
            Refusal::WrongSecret => write!(
                f,
                "the shared secret sent does not match the driver's \
                 (check --secret-file or RINGFLOW_SECRET)"
            ),
            Refusal::Clock { skew_s } => write!(
                f,
                "the caller's clock is {} s {} the driver's, more than the {} s allowed \
                 (synchronise the clocks, e.g. with NTP)",
                skew_s.unsigned_abs(),
                if *skew_s > 0 { "ahead of" } else { "behind" },
                MAX_CLOCK_SKEW.as_secs()
            ),
            Refusal::Replayed => write!(f, "the request's authentication token was used before"),
        }
    }
}

/// The driver's side: checks tokens against its secret and remembers the nonces it accepted.
#[derive(Debug)]
pub struct TokenVerifier {
    secret: Secret,
    /// Accepted nonces and the time (unix seconds) after which they can no longer be valid.
    seen: Mutex<HashMap<String, u64>>,
}

impl TokenVerifier {
    /// A verifier for `secret`.
    pub fn new(secret: Secret) -> TokenVerifier {
        TokenVerifier {
            secret,
            seen: Mutex::new(HashMap::new()),
        }
    }

    /// Accepts `token` (the [`AUTH_HEADER`] value, if any) at time `now`, or says why not.
    pub fn verify(&self, token: Option<&str>, now: SystemTime) -> Result<(), Refusal> {
        let token = token.ok_or(Refusal::Missing)?;
        let mut parts = token.split('.');
        let (Some("v1"), Some(ts), Some(nonce), Some(tag), None) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return Err(Refusal::Malformed);
        };
        let ts = timestamp(ts).ok_or(Refusal::Malformed)?;
        let tag = unhex(tag).ok_or(Refusal::Malformed)?;
        if nonce.len() != 32 || unhex(nonce).is_none() {
            return Err(Refusal::Malformed);
        }
        // The MAC first: a caller without the secret learns nothing about the clock.
        mac(&self.secret, ts, nonce)
            .verify_slice(&tag)
            .map_err(|_| Refusal::WrongSecret)?;
        let now = unix(now);
        if ts.abs_diff(now) > MAX_CLOCK_SKEW.as_secs() {
            let skew = (i128::from(ts) - i128::from(now)).clamp(i64::MIN.into(), i64::MAX.into());
            let skew = skew as i64;
            return Err(Refusal::Clock { skew_s: skew });
        }
        let mut seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        if seen.len() >= SWEEP_AT {
            seen.retain(|_, expires| *expires >= now);
        }
        let expires = ts + MAX_CLOCK_SKEW.as_secs();
        if seen.insert(nonce.to_string(), expires).is_some() {
            return Err(Refusal::Replayed);
        }
        Ok(())
    }
}

/// The client's side: adds a fresh token to every call when a secret is set.
#[derive(Clone, Debug, Default)]
pub struct AuthInterceptor(pub Option<Secret>);

impl tonic::service::Interceptor for AuthInterceptor {
    fn call(&mut self, mut req: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(secret) = &self.0 {
            let value = MetadataValue::try_from(secret.token(SystemTime::now()))
                .map_err(|e| tonic::Status::internal(format!("cannot send the token: {e}")))?;
            req.metadata_mut().insert(AUTH_HEADER, value);
        }
        Ok(req)
    }
}

/// A channel to the driver whose calls carry the token: what every generated client is built on.
pub type AuthenticatedChannel = InterceptedService<Channel, AuthInterceptor>;

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(s: &str) -> Secret {
        Secret::new(s.as_bytes(), "test").unwrap()
    }

    #[test]
    fn a_token_is_accepted_once_and_only_with_the_same_secret() {
        let s = secret("the cluster's shared secret");
        let now = SystemTime::now();
        let v = TokenVerifier::new(s.clone());
        let t = s.token(now);
        assert_eq!(v.verify(Some(&t), now), Ok(()));
        assert_eq!(v.verify(Some(&t), now), Err(Refusal::Replayed));
        assert_eq!(v.verify(Some(&s.token(now)), now), Ok(()));

        let other = secret("another cluster's secret");
        assert_eq!(
            v.verify(Some(&other.token(now)), now),
            Err(Refusal::WrongSecret)
        );
        assert_eq!(v.verify(None, now), Err(Refusal::Missing));
    }

    #[test]
    fn tampered_malformed_and_stale_tokens_are_refused() {
        let s = secret("the cluster's shared secret");
        let now = SystemTime::now();
        let v = TokenVerifier::new(s.clone());
        let t = s.token(now);
        // A later timestamp with the old MAC.
        let mut parts: Vec<String> = t.split('.').map(String::from).collect();
        parts[1] = (parts[1].parse::<u64>().unwrap() + 1).to_string();
        assert_eq!(
            v.verify(Some(&parts.join(".")), now),
            Err(Refusal::WrongSecret)
        );
        for bad in ["", "v1", "v1.x.y.z", "v2.1.00.00", "v1.1.abc.00.extra"] {
            assert_eq!(v.verify(Some(bad), now), Err(Refusal::Malformed), "{bad:?}");
        }
        let old = s.token(now - Duration::from_secs(3600));
        assert_eq!(
            v.verify(Some(&old), now),
            Err(Refusal::Clock { skew_s: -3600 })
        );
        let msg = Refusal::Clock { skew_s: -3600 }.to_string();
        assert!(msg.contains("3600 s behind the driver's"), "{msg}");
        let ahead = s.token(now + Duration::from_secs(400));
        assert_eq!(
            v.verify(Some(&ahead), now),
            Err(Refusal::Clock { skew_s: 400 })
        );
    }

    #[test]
    fn remembered_nonces_are_swept_once_expired() {
        let s = secret("the cluster's shared secret");
        let v = TokenVerifier::new(s.clone());
        let start = SystemTime::now();
        for _ in 0..SWEEP_AT {
            v.verify(Some(&s.token(start)), start).unwrap();
        }
        let later = start + MAX_CLOCK_SKEW * 2 + Duration::from_secs(1);
        v.verify(Some(&s.token(later)), later).unwrap();
        assert_eq!(v.seen.lock().unwrap().len(), 1);
    }

    /// A token with the secret's MAC over `ts` and `nonce`, as only a holder of the secret
    /// could write it.
    fn signed(s: &Secret, ts: &str, nonce: &str) -> String {
        let ts_value: u64 = ts.parse().unwrap_or(0);
        let tag = mac(s, ts_value, nonce).finalize().into_bytes();
        format!("v1.{ts}.{nonce}.{}", hex(&tag))
    }

    /// Regression (fuzz_token_signed_any_timestamp): a token signed with a timestamp of 2^63
    /// or more overflowed the clock-skew subtraction (a panic in debug builds, a wrong skew in
    /// release ones).
    #[test]
    fn a_timestamp_past_i64_is_refused_for_the_clock() {
        let s = secret("the cluster's shared secret");
        let v = TokenVerifier::new(s.clone());
        let now = SystemTime::now();
        let nonce = "0".repeat(32);
        for ts in [1u64 << 63, u64::MAX, (1 << 63) + unix(now)] {
            let t = signed(&s, &ts.to_string(), &nonce);
            assert!(
                matches!(v.verify(Some(&t), now), Err(Refusal::Clock { .. })),
                "{ts}"
            );
        }
    }

    /// Regression (fuzz_token_one_byte_changed): the hex of the MAC and the nonce and the
    /// decimal timestamp were read leniently, so a token with a MAC digit in upper case, or
    /// `+f` for `0f`, or a timestamp written `+17…`, was still accepted: a changed token must
    /// be refused.
    #[test]
    fn only_the_canonical_spelling_of_a_token_is_accepted() {
        let s = secret("the cluster's shared secret");
        let now = SystemTime::now();
        let ts = unix(now).to_string();
        let nonce = "0a".repeat(16);
        let good = signed(&s, &ts, &nonce);
        let (head, tag) = good.rsplit_once('.').unwrap();
        let upper = format!("{head}.{}", tag.to_uppercase());
        let plus = format!("{head}.+{}", &tag[1..]);
        let zero_ts = good.replacen(&format!(".{ts}."), &format!(".0{ts}."), 1);
        let plus_ts = good.replacen(&format!(".{ts}."), &format!(".+{ts}."), 1);
        for bad in [upper, plus, zero_ts, plus_ts] {
            let v = TokenVerifier::new(s.clone());
            assert!(v.verify(Some(&bad), now).is_err(), "{bad}");
        }
        let upper_nonce = signed(&s, &ts, &nonce.to_uppercase());
        let v = TokenVerifier::new(s.clone());
        assert_eq!(v.verify(Some(&upper_nonce), now), Err(Refusal::Malformed));
        assert_eq!(v.verify(Some(&good), now), Ok(()));
    }

    use proptest::prelude::*;

    /// Characters that spell tokens, and their near misses.
    const TOKEN_LIKE: &str = "0123456789abcdefABCDEF+-.v x";

    proptest! {
        #![proptest_config(ringflow_ml::fuzz::config(2048))]

        /// Any text as a token: refused, never accepted, never a panic.
        #[test]
        fn fuzz_token_any_text(token in prop_oneof![
            any::<String>(),
            "v1\\.[0-9]{1,20}\\.[0-9a-f]{32}\\.[0-9a-f]{64}",
            "v1\\.[-+0-9]{0,25}\\.[0-9a-fA-F+-]{0,40}\\.[0-9a-fA-F+-]{0,70}",
        ]) {
            let v = TokenVerifier::new(secret("the cluster's shared secret"));
            prop_assert!(v.verify(Some(&token), SystemTime::now()).is_err());
        }

        /// A token signed with the secret, with any timestamp and nonce: accepted exactly when
        /// the nonce is 32 lower-case hex digits and the timestamp within the allowed skew.
        #[test]
        fn fuzz_token_signed_any_timestamp(
            ts in prop_oneof![
                any::<u64>(),
                (1u64 << 63)..=u64::MAX,
                // Just past `i64::MAX`, where a signed difference from now overflows.
                (1u64 << 63)..(1u64 << 63) + 4_000_000_000,
                0u64..4_000_000_000,
            ],
            nonce in prop_oneof!["[0-9a-f]{32}", "[0-9a-fA-F+-]{0,40}"],
        ) {
            let s = secret("the cluster's shared secret");
            let v = TokenVerifier::new(s.clone());
            let now = SystemTime::now();
            let result = v.verify(Some(&signed(&s, &ts.to_string(), &nonce)), now);
            let well_formed = nonce.len() == 32
                && nonce.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
            let in_time = ts.abs_diff(unix(now)) <= MAX_CLOCK_SKEW.as_secs();
            prop_assert_eq!(result.is_ok(), well_formed && in_time, "{:?}", result);
        }

        /// A valid token with any one byte changed: refused. The new character is any, one
        /// that spells tokens, or (`None`) the one there in the other case: another spelling of
        /// the same hex digit is still a changed token.
        #[test]
        fn fuzz_token_one_byte_changed(
            at in any::<prop::sample::Index>(),
            c in prop_oneof![
                any::<char>().prop_map(Some),
                prop::sample::select(TOKEN_LIKE.chars().collect::<Vec<_>>()).prop_map(Some),
                Just(None),
            ],
        ) {
            let s = secret("the cluster's shared secret");
            let now = SystemTime::now();
            let good = s.token(now);
            let i = at.index(good.len());
            let there = good.as_bytes()[i] as char;
            let c = c.unwrap_or_else(|| there.to_ascii_uppercase());
            // Tokens are ASCII without an 'x': a change to the same character becomes one.
            let c = if c == there { 'x' } else { c };
            let mut bad = good[..i].to_string();
            bad.push(c);
            bad.push_str(&good[i + 1..]);
            let v = TokenVerifier::new(s);
            prop_assert!(v.verify(Some(&bad), now).is_err(), "{} accepted", bad);
        }
    }
}
