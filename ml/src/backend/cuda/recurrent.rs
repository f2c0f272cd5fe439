//! The recurrent gates ([`RecurrentOps`]'s overrides) in one kernel each: one thread per unit of
//! a row reads that unit's gates once and writes every output of it, where the defaults run a
//! dozen kernels and temporaries. The kernels are in `recurrent_kernels.cu`; their arithmetic is
//! the CPU's (`cpu/recurrent.rs`), so the two agree to rounding.

use cudarc::driver::{LaunchConfig, PushKernelArg};

use super::CudaStorage;
use super::device::Gpu;
use super::launch::launch;
use crate::backend::memory::MemoryOps;
use crate::backend::recurrent::{
    GRU_SAVED_BLOCKS, LSTM_SAVED_BLOCKS, RecurrentOps, gru_shapes, lstm_shapes,
};
use crate::error::Result;

/// New buffers of `[rows, width]` on `like`'s GPU, one per width.
fn outputs<const K: usize>(
    like: &CudaStorage,
    rows: usize,
    widths: [usize; K],
) -> Result<[CudaStorage; K]> {
    let mut made = Vec::with_capacity(K);
    for w in widths {
        made.push(like.alloc_like(&[rows, w])?);
    }
    Ok(made
        .try_into()
        .unwrap_or_else(|_| unreachable!("one buffer per width")))
}

/// The unit count `rows · hidden` and the hidden size as kernel arguments, and the launch over
/// the units; `None` when there is nothing to compute.
fn units(rows: usize, hidden: usize) -> Option<(i64, i64, LaunchConfig)> {
    let n = rows * hidden;
    (n > 0).then(|| (n as i64, hidden as i64, Gpu::elementwise(n)))
}

impl RecurrentOps for CudaStorage {
    /// One kernel.
    fn lstm_cell(gates: &Self, c_prev: &Self) -> Result<(Self, Self, Self)> {
        let hidden = lstm_shapes(false, &gates.shape, &[&c_prev.shape])?;
        gates.on_same_gpu("lstm_cell", &[c_prev.device()])?;
        let rows = gates.shape[0];
        let [mut h, mut c, mut saved] =
            outputs(gates, rows, [hidden, hidden, LSTM_SAVED_BLOCKS * hidden])?;
        if let Some((n, hid, cfg)) = units(rows, hidden) {
            let (g, cp) = (gates.view(), c_prev.view());
            let (mut ho, mut co, mut so) = (h.view_mut(), c.view_mut(), saved.view_mut());
            launch!(
                gates.gpu,
                "lstm_cell_fwd",
                cfg,
                &n,
                &hid,
                &g,
                &cp,
                &mut ho,
                &mut co,
                &mut so
            )?;
        }
        Ok((h, c, saved))
    }

    /// One kernel.
    fn lstm_cell_backward(saved: &Self, dh: &Self, dc: &Self) -> Result<(Self, Self)> {
        let hidden = lstm_shapes(true, &saved.shape, &[&dh.shape, &dc.shape])?;
        saved.on_same_gpu("lstm_cell backward", &[dh.device(), dc.device()])?;
        let rows = saved.shape[0];
        let [mut dgates, mut dc_prev] = outputs(saved, rows, [4 * hidden, hidden])?;
        if let Some((n, hid, cfg)) = units(rows, hidden) {
            let (s, dhv, dcv) = (saved.view(), dh.view(), dc.view());
            let (mut dg, mut dcp) = (dgates.view_mut(), dc_prev.view_mut());
            launch!(
                saved.gpu,
                "lstm_cell_bwd",
                cfg,
                &n,
                &hid,
                &s,
                &dhv,
                &dcv,
                &mut dg,
                &mut dcp
            )?;
        }
        Ok((dgates, dc_prev))
    }

    /// One kernel.
    fn gru_cell(x_gates: &Self, h_gates: &Self, h_prev: &Self) -> Result<(Self, Self)> {
        let hidden = gru_shapes(false, &[&x_gates.shape, &h_gates.shape], &h_prev.shape)?;
        x_gates.on_same_gpu("gru_cell", &[h_gates.device(), h_prev.device()])?;
        let rows = x_gates.shape[0];
        let [mut h, mut saved] = outputs(x_gates, rows, [hidden, GRU_SAVED_BLOCKS * hidden])?;
        if let Some((n, hid, cfg)) = units(rows, hidden) {
            let (x, hg, hp) = (x_gates.view(), h_gates.view(), h_prev.view());
            let (mut ho, mut so) = (h.view_mut(), saved.view_mut());
            launch!(
                x_gates.gpu,
                "gru_cell_fwd",
                cfg,
                &n,
                &hid,
                &x,
                &hg,
                &hp,
                &mut ho,
                &mut so
            )?;
        }
        Ok((h, saved))
    }

    /// One kernel.
    fn gru_cell_backward(saved: &Self, dh: &Self) -> Result<(Self, Self, Self)> {
        let hidden = gru_shapes(true, &[&saved.shape], &dh.shape)?;
        saved.on_same_gpu("gru_cell backward", &[dh.device()])?;
        let rows = saved.shape[0];
        let [mut dx, mut dhg, mut dh_prev] =
            outputs(saved, rows, [3 * hidden, 3 * hidden, hidden])?;
        if let Some((n, hid, cfg)) = units(rows, hidden) {
            let (s, dhv) = (saved.view(), dh.view());
            let (mut dxo, mut dgo, mut dpo) = (dx.view_mut(), dhg.view_mut(), dh_prev.view_mut());
            launch!(
                saved.gpu,
                "gru_cell_bwd",
                cfg,
                &n,
                &hid,
                &s,
                &dhv,
                &mut dxo,
                &mut dgo,
                &mut dpo
            )?;
        }
        Ok((dx, dhg, dh_prev))
    }
}
