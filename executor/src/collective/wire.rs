//! Bytes on a ring connection: deadlines on every read and write, f32 payloads without copies.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// Values per pipelined chunk (256 KiB of f32, 128 KiB of 16-bit floats): the unit of every
/// ring read and write.
pub const CHUNK: usize = 64 * 1024;

/// Why a ring read or write failed, in words that name the peer.
pub fn describe(e: &std::io::Error, peer: &str, what: &str, deadline: Duration) -> String {
    match e.kind() {
        ErrorKind::WouldBlock | ErrorKind::TimedOut => format!(
            "{peer} sent nothing for {:.0} s while {what} (it is stuck, or the network is)",
            deadline.as_secs_f64()
        ),
        ErrorKind::UnexpectedEof | ErrorKind::ConnectionReset | ErrorKind::BrokenPipe => {
            format!("{peer} closed the ring connection while {what} (did it exit?)")
        }
        _ => format!("ring connection to {peer} failed while {what}: {e}"),
    }
}

/// Prepares a ring socket: no Nagle delay, and a deadline on every blocking read and write.
pub fn configure(stream: &TcpStream, deadline: Duration) -> std::io::Result<()> {
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(deadline))?;
    stream.set_write_timeout(Some(deadline))?;
    Ok(())
}

/// Reads exactly `buf.len()` floats (little-endian on the wire, as on every supported target).
pub fn read_f32s(stream: &mut TcpStream, buf: &mut [f32]) -> std::io::Result<()> {
    read_values(stream, buf)
}

/// Reads exactly `buf.len()` values of a plain type: f32, or the 16-bit floats of compressed
/// gradients (little-endian on the wire).
pub fn read_values<T: bytemuck::Pod>(stream: &mut TcpStream, buf: &mut [T]) -> std::io::Result<()> {
    stream.read_exact(bytemuck::cast_slice_mut(buf))
}

/// Reads `n` floats that a peer announced, into a vector that grows with what arrives, a
/// chunk at a time: a peer that announces more than it sends costs only what it sent.
pub fn read_f32_vec(stream: &mut TcpStream, n: usize) -> std::io::Result<Vec<f32>> {
    let mut out = Vec::new();
    while out.len() < n {
        let at = out.len();
        out.resize(at + (n - at).min(CHUNK), 0.0);
        read_f32s(stream, &mut out[at..])?;
    }
    Ok(out)
}

/// Writes all of `buf`.
pub fn write_f32s(stream: &mut TcpStream, buf: &[f32]) -> std::io::Result<()> {
    stream.write_all(bytemuck::cast_slice(buf))
}

#[cfg(not(target_endian = "little"))]
compile_error!(
    "ringflow's ring protocol sends f32 in native order and assumes a little-endian host"
);
