//! Gradient all-reduce between the GPUs of one host through NCCL (cargo feature `nccl`).
//!
//! When every rank of a ring trains on a GPU of the same host, gradients need not leave the
//! devices: NCCL averages them in place over NVLink or PCIe. The TCP ring is still used to set
//! NCCL up: the ranks all-gather a fingerprint of their host and whether `libnccl` loads (NCCL is
//! used only if all agree), then rank 0 broadcasts NCCL's unique id. Rings that span hosts, CPU
//! training and backup workers keep the TCP path.
//!
//! NCCL calls block on the GPU, so every wait here has a deadline: communicator setup runs on a
//! helper thread that is abandoned after `timeout`, and a step's all-reduce is polled through a
//! CUDA event and aborted (`ncclCommAbort`, which unblocks the stream) when it takes longer. The
//! error then fails the step like a broken TCP ring would.
//!
//! Every executor of a cluster must be built with the same features: the setup exchange is part
//! of the ring protocol.

use std::hash::{Hash, Hasher};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use cudarc::driver::CudaStream;
use cudarc::nccl::sys;
use ringflow_ml::nn::ParamStore;
use ringflow_ml::{Device, GradStore};

use crate::collective::Collective;
use crate::error::{CommError, CommOp, Peer, Result};

/// Bytes in NCCL's unique id.
const ID_BYTES: usize = 128;
const SETUP: CommOp = CommOp::NcclSetup;
const REDUCE: CommOp = CommOp::NcclAllReduce;

/// An NCCL communicator over the ranks of one ring, all on this host.
pub struct NcclAllReduce {
    comm: sys::ncclComm_t,
    stream: Arc<CudaStream>,
    world: usize,
    timeout: Duration,
}

// SAFETY: an NCCL communicator may be used from any thread, one call at a time; `&mut self`
// methods guarantee that.
unsafe impl Send for NcclAllReduce {}

/// A communicator handle crossing from the setup thread.
struct RawComm(sys::ncclComm_t);
// SAFETY: see `NcclAllReduce`.
unsafe impl Send for RawComm {}

/// NCCL's failure while doing `what` in `op`: NCCL reports it for the ring as a whole.
fn failure(op: CommOp, what: &str, r: sys::ncclResult_t) -> CommError {
    CommError::new(Peer::Ring, op, format!("NCCL {what} failed ({r:?})"))
}

fn check(op: CommOp, what: &str, r: sys::ncclResult_t) -> std::result::Result<(), CommError> {
    if r == sys::ncclResult_t::ncclSuccess {
        Ok(())
    } else {
        Err(failure(op, what, r))
    }
}

/// CUDA's failure (`cause`) in `op`, on this executor's device.
fn cuda(op: CommOp, context: String, cause: cudarc::driver::DriverError) -> CommError {
    CommError::because(Peer::Local, op, context, cause)
}

/// This host's name as four exact 16-bit floats.
fn host_fingerprint() -> [f32; 4] {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    crate::worker::hostname().hash(&mut h);
    let v = h.finish();
    [0, 16, 32, 48].map(|shift| ((v >> shift) & 0xffff) as f32)
}

impl NcclAllReduce {
    /// Sets NCCL up among the ranks of `ring` if every one trains on a GPU of this host and can
    /// load NCCL; `Ok(None)` when the TCP ring should carry the gradients instead. Every rank of
    /// the ring must call this at the same point.
    pub fn connect(
        ring: &mut dyn Collective,
        device: Device,
        timeout: Duration,
    ) -> Result<Option<NcclAllReduce>> {
        let world = ring.world();
        let ordinal = match device {
            Device::Cuda(ordinal) if world > 1 && ring.backup().is_none() => Some(ordinal),
            _ => None,
        };
        // SAFETY: only tries to load the library.
        let usable = ordinal.is_some() && unsafe { sys::is_culib_present() };
        let [a, b, c, d] = host_fingerprint();
        let everyone = ring.all_gather(&[a, b, c, d, if usable { 1.0 } else { 0.0 }])?;
        let agree = everyone
            .chunks_exact(5)
            .all(|r| r[..4] == [a, b, c, d] && r[4] == 1.0);
        let Some(ordinal) = ordinal.filter(|_| agree) else {
            return Ok(None);
        };

        let mut id = sys::ncclUniqueId {
            internal: [0; ID_BYTES],
        };
        if ring.rank() == 0 {
            // SAFETY: writes one id into `id`.
            check(SETUP, "creating a unique id", unsafe {
                sys::ncclGetUniqueId(&mut id)
            })?;
        }
        let mut packed: Vec<f32> = id.internal.iter().map(|&b| b as u8 as f32).collect();
        ring.broadcast(&mut packed, 0)?;
        for (slot, v) in id.internal.iter_mut().zip(&packed) {
            *slot = *v as u8 as std::ffi::c_char;
        }

        let stream = ringflow_ml::backend::cuda::stream(ordinal)?;
        let rank = ring.rank();
        let (tx, rx) = mpsc::channel();
        let setup_stream = stream.clone();
        std::thread::Builder::new()
            .name("nccl-setup".into())
            .spawn(move || {
                let result = setup_stream
                    .context()
                    .bind_to_thread()
                    .map_err(|e| cuda(SETUP, format!("NCCL setup on cuda:{ordinal}"), e))
                    .and_then(|()| {
                        let mut comm: sys::ncclComm_t = std::ptr::null_mut();
                        // SAFETY: `comm` receives the new communicator; the id is the one every
                        // rank received from rank 0.
                        let r = unsafe {
                            sys::ncclCommInitRank(&mut comm, world as i32, id, rank as i32)
                        };
                        check(SETUP, "connecting the ranks", r).map(|()| RawComm(comm))
                    });
                let _ = tx.send(result);
            })
            .map_err(|e| CommError::because(Peer::Local, SETUP, "cannot start NCCL setup", e))?;
        let comm = match rx.recv_timeout(timeout) {
            Ok(result) => result?.0,
            Err(_) => {
                let why = format!(
                    "NCCL did not connect the {world} ranks within {:.0} s",
                    timeout.as_secs_f64()
                );
                return Err(CommError::new(Peer::Ring, SETUP, why).into());
            }
        };
        tracing::info!("rank {rank} all-reduces gradients with NCCL on cuda:{ordinal}");
        Ok(Some(NcclAllReduce {
            comm,
            stream,
            world,
            timeout,
        }))
    }

    /// Averages every parameter's gradient (in `grads`) across the ranks, in place on the
    /// GPUs, and waits (at most the timeout) for it to finish.
    pub fn all_reduce(&mut self, params: &ParamStore, grads: &mut GradStore) -> Result<()> {
        let buffers = grads.cuda_buffers(&params.tensors())?;
        self.stream
            .context()
            .bind_to_thread()
            .map_err(|e| cuda(REDUCE, "NCCL all-reduce".into(), e))?;
        let stream = self.stream.cu_stream() as sys::cudaStream_t;
        // SAFETY: each (address, length) is a live gradient buffer on this device (the trainer
        // does not touch gradients until this returns); all reductions are queued on the
        // engine's stream, after the backward pass that produced them.
        unsafe {
            check(REDUCE, "starting a group", sys::ncclGroupStart())?;
            for &(ptr, len) in &buffers {
                let buf = ptr as *mut std::ffi::c_void;
                let r = sys::ncclAllReduce(
                    buf,
                    buf,
                    len,
                    sys::ncclDataType_t::ncclFloat32,
                    sys::ncclRedOp_t::ncclAvg,
                    self.comm,
                    stream,
                );
                if r != sys::ncclResult_t::ncclSuccess {
                    let _ = sys::ncclGroupEnd();
                    return Err(failure(REDUCE, "queuing an all-reduce", r).into());
                }
            }
            check(REDUCE, "ending a group", sys::ncclGroupEnd())?;
        }
        let done = self
            .stream
            .record_event(None)
            .map_err(|e| cuda(REDUCE, "NCCL all-reduce".into(), e))?;
        let started = Instant::now();
        loop {
            match done.try_is_complete() {
                Ok(true) => return Ok(()),
                Ok(false) => {}
                Err(e) => return Err(cuda(REDUCE, "NCCL all-reduce".into(), e).into()),
            }
            if started.elapsed() > self.timeout {
                // SAFETY: aborting unblocks the queued operations; the communicator is not used
                // again (a failed step ends this ring).
                unsafe { sys::ncclCommAbort(self.comm) };
                self.comm = std::ptr::null_mut();
                let why = format!(
                    "an NCCL all-reduce among {} ranks did not finish within {:.0} s",
                    self.world,
                    self.timeout.as_secs_f64()
                );
                return Err(CommError::new(Peer::Ring, REDUCE, why).into());
            }
            std::thread::sleep(Duration::from_micros(50));
        }
    }
}

impl Drop for NcclAllReduce {
    fn drop(&mut self) {
        if !self.comm.is_null() {
            // SAFETY: the communicator is live and no operation of ours is pending (each
            // all-reduce is waited for or aborted).
            unsafe { sys::ncclCommAbort(self.comm) };
        }
    }
}
