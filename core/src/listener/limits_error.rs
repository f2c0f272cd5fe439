//! [`LimitsError`]: limits under which a listener would admit no connection. A leaf: the
//! listeners' limits use it.

/// Limits under which a listener would admit no connection; the sentence names the listener.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LimitsError {
    /// A bound of 0 connections.
    #[error("the {listener} must admit at least 1 connection at once, not 0")]
    NoConnections {
        /// The listener's name ("web UI").
        listener: &'static str,
    },
    /// A first-request deadline or idle timeout of 0.
    #[error("the {listener}'s first-request deadline and idle timeout must be positive")]
    NoTime {
        /// The listener's name ("web UI").
        listener: &'static str,
    },
}
