//! A gradient connection between a rank and rank 0's aggregator: the markers its frames use,
//! the common gradient they carry, reading a frame's head, and the threads at either end.

use std::io::{ErrorKind, Read};
use std::net::TcpStream;
use std::sync::Arc;

use crate::error::{CommError, CommOp, Peer, Result};

/// A common gradient, or why there is none.
pub(super) type Delivery = std::result::Result<StepResult, CommError>;

/// The `step` of a frame that carries an error message instead of a gradient.
pub(super) const ERROR_FRAME: u64 = u64::MAX;
/// The `step` of a rank's last frame when it finished training (any other end is a failure).
pub(super) const GOODBYE_FRAME: u64 = u64::MAX - 1;
/// Largest gradient a frame may announce (floats); anything larger is garbage.
pub(super) const MAX_FLOATS: u64 = 1 << 32;

/// One step's common gradient.
#[derive(Clone, Debug)]
pub struct StepResult {
    /// The global step.
    pub step: u64,
    /// The average of the contributing ranks' gradients.
    pub gradient: Arc<[f32]>,
    /// How many ranks contributed (the quorum).
    pub contributors: usize,
    /// Whether this rank's gradient is among them (false: it arrived late and was dropped).
    pub included: bool,
}

/// A failure of the gradient exchange concerning `peer`.
pub(super) fn failed(peer: Peer, why: impl Into<String>) -> CommError {
    CommError::new(peer, CommOp::BackupGradient, why)
}

pub(super) fn socket_error(e: std::io::Error) -> CommError {
    CommError::because(
        Peer::Local,
        CommOp::FormRing,
        "cannot use a gradient connection",
        e,
    )
}

pub(super) fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> Result<()> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(f)
        .map(|_| ())
        .map_err(|e| CommError::thread(CommOp::BackupGradient, e).into())
}

/// Reads frames until `want` is filled; `Ok(false)` on a clean end of stream before any byte.
/// Waiting between frames has no deadline (a rank may evaluate or checkpoint between steps);
/// a frame that stops halfway is an error.
pub(super) fn read_frame_head(stream: &mut TcpStream, want: &mut [u8]) -> std::io::Result<bool> {
    let mut filled = 0;
    while filled < want.len() {
        match stream.read(&mut want[filled..]) {
            Ok(0) if filled == 0 => return Ok(false),
            Ok(0) => return Err(ErrorKind::UnexpectedEof.into()),
            Ok(n) => filled += n,
            Err(e)
                if filled == 0
                    && matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) =>
            {
                continue;
            }
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}
