//! Convolutions as im2col and cuBLAS SGEMM: the convolution half of [`ConvOps`] (pooling is in
//! `pool.rs`).
//!
//! Images go through in chunks. `im2col` lays a chunk's input out as one column matrix (a row
//! per input channel and kernel tap, a column per output cell, the chunk's images side by side),
//! and strided-batched SGEMMs multiply each group's weights by it straight into the output's
//! NCHW layout, with no permutation: one SGEMM per group batched over the chunk's images, or one
//! per image batched over the groups, whichever is fewer (one in all for an ungrouped
//! convolution).
//!
//! The input's gradient is the transposed product into a column matrix, folded back onto the
//! input by `col2im`, a gather (one thread per input cell, no atomics), so that it sums in the
//! same order on every run and replicas stay identical. The weight's gradient is one
//! strided-batched SGEMM over the groups per chunk, the output's gradient permuted to
//! `[out_channels, images · cells]` first so that the chunk's images are summed inside the
//! product; every chunk after the first accumulates.
//!
//! A chunk's column matrix holds at most [`WORKSPACE_FLOATS`] floats (one image at least), and
//! it, like every temporary, comes from the device's caching allocator. Convolutions with one
//! input channel per group (depthwise ones) skip all this for direct kernels
//! (`conv_direct.rs`).

use cudarc::driver::{CudaView, CudaViewMut, PushKernelArg};

use super::CudaStorage;
use super::conv_direct::Direct;
use super::device::Gpu;
use super::kernels::SlidingWindow;
use super::launch::{expect_shape, int, launch};
use super::layout::strided;
use super::matmul::{Operand, Product};
use crate::backend::conv::{Conv2dGeometry, ConvOps, Pool2dGeometry};
use crate::backend::elementwise::ElementwiseOps;
use crate::backend::memory::MemoryOps;
use crate::error::{MlError, Result};

/// The most floats of column matrix one chunk of images uses (64 MiB).
pub const WORKSPACE_FLOATS: usize = 1 << 24;

/// The rest of `view` from element `at` on.
fn tail<'a>(view: &'a CudaView<'_, f32>, at: usize) -> Result<CudaView<'a, f32>> {
    view.try_slice(at..)
        .ok_or_else(|| out_of_bounds(at, view.len()))
}

/// The rest of `view` from element `at` on, to write.
fn tail_mut<'a>(view: &'a mut CudaViewMut<'_, f32>, at: usize) -> Result<CudaViewMut<'a, f32>> {
    let len = view.len();
    view.try_slice_mut(at..)
        .ok_or_else(|| out_of_bounds(at, len))
}

/// The error of an offset past the end of a buffer (a bug, never the user's input).
fn out_of_bounds(at: usize, len: usize) -> MlError {
    MlError::invalid(
        "conv2d",
        format!("offset {at} lies past a buffer of {len} floats (a bug in the CUDA backend)"),
    )
}

/// Where the matrices of a chunk's products lie in one operand: image `i`'s, group `g`'s
/// starts `at + i·image + g·group` floats in, its stored rows `ld` floats apart.
#[derive(Clone, Copy, Debug)]
struct Layout {
    at: usize,
    image: usize,
    group: usize,
    ld: usize,
    transposed: bool,
}

impl Layout {
    /// Matrices `image` floats apart per image and `group` per group, from `at`.
    fn new(at: usize, image: usize, group: usize, ld: usize) -> Layout {
        Layout {
            at,
            image,
            group,
            ld,
            transposed: false,
        }
    }

    /// The same matrices, read transposed.
    fn transposed(self) -> Layout {
        Layout {
            transposed: true,
            ..self
        }
    }

    /// Image `i`'s, group `g`'s matrix, as an operand whose batch entries follow `by_images`.
    fn operand(&self, by_images: bool) -> Operand {
        let stride = if by_images { self.image } else { self.group };
        Operand::dense(self.ld, self.transposed).every(stride)
    }

    /// Where image `i`'s, group `g`'s matrix starts.
    fn offset(&self, i: usize, g: usize) -> usize {
        self.at + i * self.image + g * self.group
    }
}

/// Images `first..first + images` of a batch, taken through together.
#[derive(Clone, Copy, Debug)]
struct Chunk {
    first: usize,
    images: usize,
}

/// The products `C[i, g] (=|+=) op(A[i, g]) · op(B[i, g])`, `m × n` summing over `k`, for every
/// image `i < images` of a chunk and every group `g`.
#[derive(Clone, Copy, Debug)]
struct Products {
    m: usize,
    n: usize,
    k: usize,
    images: usize,
    accumulate: bool,
}

/// The sizes one convolution's kernels and products work with.
struct ConvPlan {
    geometry: Conv2dGeometry,
    win: SlidingWindow,
    batch: usize,
    groups: usize,
    /// Output channels per group.
    group_out: usize,
    /// Rows of the column matrix per group: `in_channels / groups · kernel_h · kernel_w`.
    taps: usize,
    /// Output cells per image.
    plane: usize,
    /// Input floats per image.
    in_image: usize,
    /// Output floats per image.
    out_image: usize,
    /// Images per chunk.
    chunk: usize,
    /// The direct kernels, for one input channel per group (`conv_direct.rs`).
    direct: Option<Direct>,
}

impl ConvPlan {
    /// The plan of convolution `g`, its chunks' column matrices at most `workspace` floats
    /// (one image at least).
    fn new(op: &'static str, g: &Conv2dGeometry, workspace: usize) -> Result<ConvPlan> {
        g.check(op)?;
        let [oh, ow] = g.out_size();
        let win = SlidingWindow {
            channels: int(op, g.in_channels)?,
            in_h: int(op, g.in_size[0])?,
            in_w: int(op, g.in_size[1])?,
            out_h: int(op, oh)?,
            out_w: int(op, ow)?,
            kernel_h: int(op, g.kernel[0])?,
            kernel_w: int(op, g.kernel[1])?,
            stride_h: int(op, g.stride[0])?,
            stride_w: int(op, g.stride[1])?,
            pad_h: int(op, g.padding[0])?,
            pad_w: int(op, g.padding[1])?,
            dil_h: int(op, g.dilation[0])?,
            dil_w: int(op, g.dilation[1])?,
        };
        let taps = g.in_channels / g.groups * g.kernel[0] * g.kernel[1];
        let plane = oh * ow;
        let image_col = g.in_channels * g.kernel[0] * g.kernel[1] * plane;
        Ok(ConvPlan {
            geometry: *g,
            win,
            batch: g.batch,
            groups: g.groups,
            group_out: g.out_channels / g.groups,
            taps,
            plane,
            in_image: g.in_channels * g.in_size[0] * g.in_size[1],
            out_image: g.out_channels * plane,
            chunk: (workspace / image_col.max(1)).clamp(1, g.batch.max(1)),
            direct: (g.in_channels == g.groups).then_some(Direct {
                win,
                batch: g.batch as i64,
                mult: int(op, g.out_channels / g.groups)?,
            }),
        })
    }

    /// The batch's chunks, in order.
    fn chunks(&self) -> impl Iterator<Item = Chunk> + '_ {
        (0..self.batch).step_by(self.chunk).map(|first| Chunk {
            first,
            images: self.chunk.min(self.batch - first),
        })
    }

    /// The column matrix's floats for `images` images.
    fn col_len(&self, images: usize) -> usize {
        self.groups * self.taps * images * self.plane
    }

    /// A column matrix for the largest chunk, from the caching allocator.
    fn workspace(&self, like: &CudaStorage) -> Result<CudaStorage> {
        like.alloc_like(&[self.col_len(self.chunk)])
    }

    /// Fills `col` with the column matrix of `chunk`'s images of `x`.
    fn im2col(&self, x: &CudaStorage, chunk: Chunk, col: &mut CudaStorage) -> Result<()> {
        let cfg = Gpu::elementwise(self.col_len(chunk.images));
        let (images, win, gpu) = (chunk.images as i64, self.win, col.gpu.clone());
        let x = x.view();
        let src = tail(&x, chunk.first * self.in_image)?;
        let mut cols = col.view_mut();
        launch!(gpu, "im2col", cfg, &images, &win, &src, &mut cols)
    }

    /// `chunk`'s images of the input's gradient `dx`, from their column matrix `col`.
    fn col2im(&self, col: &CudaStorage, chunk: Chunk, dx: &mut CudaStorage) -> Result<()> {
        let cfg = Gpu::elementwise(chunk.images * self.in_image);
        let (images, win, gpu) = (chunk.images as i64, self.win, dx.gpu.clone());
        let cols = col.view();
        let mut out = dx.view_mut();
        let mut dst = tail_mut(&mut out, chunk.first * self.in_image)?;
        launch!(gpu, "col2im", cfg, &images, &win, &cols, &mut dst)
    }

    /// Queues `p`: one strided-batched SGEMM per group over the images, or per image over the
    /// groups, whichever makes fewer calls.
    fn products(
        &self,
        p: Products,
        (a, al): (&CudaView<'_, f32>, Layout),
        (b, bl): (&CudaView<'_, f32>, Layout),
        (c, cl): (&mut CudaStorage, Layout),
    ) -> Result<()> {
        let by_images = self.groups <= p.images;
        let (outer, batch) = if by_images {
            (self.groups, p.images)
        } else {
            (p.images, self.groups)
        };
        let gpu = c.gpu.clone();
        let mut out = c.view_mut();
        for o in 0..outer {
            let (i, g) = if by_images { (0, o) } else { (o, 0) };
            let product = Product {
                m: p.m,
                n: p.n,
                k: p.k,
                a: al.operand(by_images),
                b: bl.operand(by_images),
                c: cl.operand(by_images),
                batch,
                accumulate: p.accumulate,
            };
            let (a, b) = (tail(a, al.offset(i, g))?, tail(b, bl.offset(i, g))?);
            gpu.product(&product, &a, &b, &mut tail_mut(&mut out, cl.offset(i, g))?)?;
        }
        Ok(())
    }

    /// Where group `g`'s weights `[group_out, taps]` lie in the weight tensor.
    fn weights(&self) -> Layout {
        Layout::new(0, 0, self.group_out * self.taps, self.taps)
    }

    /// Where image `i`'s, group `g`'s block `[taps, plane]` lies in a column matrix of
    /// `images` images.
    fn columns(&self, images: usize) -> Layout {
        let cols = images * self.plane;
        Layout::new(0, self.plane, self.taps * cols, cols)
    }

    /// Where image `chunk.first + i`'s, group `g`'s block `[group_out, plane]` lies in an
    /// output-shaped tensor.
    fn outputs(&self, chunk: Chunk) -> Layout {
        let at = chunk.first * self.out_image;
        Layout::new(at, self.out_image, self.group_out * self.plane, self.plane)
    }

    /// The output of `chunk`'s images, from their column matrix `col`.
    fn forward_chunk(
        &self,
        w: &CudaStorage,
        col: &CudaStorage,
        chunk: Chunk,
        y: &mut CudaStorage,
    ) -> Result<()> {
        let p = Products {
            m: self.group_out,
            n: self.plane,
            k: self.taps,
            images: chunk.images,
            accumulate: false,
        };
        let (w, col) = (w.view(), col.view());
        let (a, b) = ((&w, self.weights()), (&col, self.columns(chunk.images)));
        self.products(p, a, b, (y, self.outputs(chunk)))
    }

    /// The column matrix `col` of the input's gradient of `chunk`'s images, from the output's.
    fn backward_input_chunk(
        &self,
        w: &CudaStorage,
        grad: &CudaStorage,
        chunk: Chunk,
        col: &mut CudaStorage,
    ) -> Result<()> {
        let p = Products {
            m: self.taps,
            n: self.plane,
            k: self.group_out,
            images: chunk.images,
            accumulate: false,
        };
        let (w, grad) = (w.view(), grad.view());
        let a = (&w, self.weights().transposed());
        let b = (&grad, self.outputs(chunk));
        self.products(p, a, b, (col, self.columns(chunk.images)))
    }

    /// `dw (=|+=)` the weight's gradient from `chunk`'s images: their column matrix `col` and
    /// the output's gradient, permuted into `permuted` (unless the chunk is one image) so that
    /// one product per group sums over the chunk's images.
    fn backward_weight_chunk(
        &self,
        (grad, col, permuted): (&CudaStorage, &CudaStorage, &mut CudaStorage),
        chunk: Chunk,
        dw: &mut CudaStorage,
        accumulate: bool,
    ) -> Result<()> {
        let cols = chunk.images * self.plane;
        let p = Products {
            m: self.group_out,
            n: self.taps,
            k: cols,
            images: 1,
            accumulate,
        };
        let gradients = if chunk.images == 1 {
            let at = chunk.first * self.out_image;
            (grad.view(), Layout::new(at, 0, self.group_out * cols, cols))
        } else {
            self.gather_outputs(grad, chunk, permuted)?;
            (
                permuted.view(),
                Layout::new(0, 0, self.group_out * cols, cols),
            )
        };
        let col = col.view();
        let b = (&col, Layout::new(0, 0, self.taps * cols, cols).transposed());
        self.products(p, (&gradients.0, gradients.1), b, (dw, self.weights()))
    }

    /// Copies `chunk`'s images of an output-shaped tensor (`[images, out_channels, plane]`)
    /// into `dst` as `[out_channels, images, plane]`.
    fn gather_outputs(&self, src: &CudaStorage, chunk: Chunk, dst: &mut CudaStorage) -> Result<()> {
        let channels = self.groups * self.group_out;
        let dims = [channels, chunk.images, self.plane];
        let (p, c, i) = (self.plane as i64, channels as i64, chunk.images as i64);
        let s = strided("conv2d backward", &dims, &[p, c * p, 1], &[i * p, p, 1])?;
        let n = channels * chunk.images * self.plane;
        let (cfg, n, gpu) = (Gpu::elementwise(n), n as i64, src.gpu.clone());
        let all = src.view();
        let from = tail(&all, chunk.first * self.out_image)?;
        let mut to = dst.view_mut();
        launch!(gpu, "strided_copy", cfg, &n, &s, &from, &mut to)
    }
}

impl ConvPlan {
    /// `conv(x, w) + bias`: the products, then the bias added in place.
    fn forward(
        &self,
        x: &CudaStorage,
        w: &CudaStorage,
        bias: Option<&CudaStorage>,
    ) -> Result<CudaStorage> {
        const OP: &str = "conv2d";
        expect_shape(OP, &x.shape, &self.geometry.input_shape())?;
        expect_shape(OP, &w.shape, &self.geometry.weight_shape())?;
        if let Some(b) = bias {
            x.on_same_gpu(OP, &[b.device()])?;
            expect_shape(OP, &b.shape, &[self.geometry.out_channels])?;
        }
        x.launch_new(OP, &[w.device()], &self.geometry.output_shape(), |_, y| {
            if let Some(direct) = &self.direct {
                direct.forward(x, w, y)?;
            } else {
                let mut col = self.workspace(x)?;
                for chunk in self.chunks() {
                    self.im2col(x, chunk, &mut col)?;
                    self.forward_chunk(w, &col, chunk, y)?;
                }
            }
            bias.map_or(Ok(()), |b| self.add_bias(b, y))
        })
    }

    /// `y += bias` per output channel.
    fn add_bias(&self, bias: &CudaStorage, y: &mut CudaStorage) -> Result<()> {
        let channels = self.geometry.out_channels as i64;
        let rest = (self.plane as i64).max(1);
        let (n, cfg, gpu) = (y.n(), Gpu::elementwise(y.len), y.gpu.clone());
        let (b, mut y) = (bias.view(), y.view_mut());
        launch!(
            gpu,
            "channel_bias_add",
            cfg,
            &n,
            &channels,
            &rest,
            &b,
            &mut y
        )
    }

    /// The input's gradient from the output's, `grad`.
    fn backward_input(&self, grad: &CudaStorage, w: &CudaStorage) -> Result<CudaStorage> {
        const OP: &str = "conv2d backward";
        expect_shape(OP, &grad.shape, &self.geometry.output_shape())?;
        expect_shape(OP, &w.shape, &self.geometry.weight_shape())?;
        grad.launch_new(OP, &[w.device()], &self.geometry.input_shape(), |_, dx| {
            if let Some(direct) = &self.direct {
                return direct.backward_input(grad, w, dx);
            }
            let mut col = self.workspace(grad)?;
            for chunk in self.chunks() {
                self.backward_input_chunk(w, grad, chunk, &mut col)?;
                self.col2im(&col, chunk, dx)?;
            }
            Ok(())
        })
    }

    /// `dw (=|+=)` the weight's gradient from the input `x` and the output's gradient `grad`.
    fn backward_weight(
        &self,
        dw: &mut CudaStorage,
        x: &CudaStorage,
        grad: &CudaStorage,
        accumulate: bool,
    ) -> Result<()> {
        const OP: &str = "conv2d backward";
        dw.on_same_gpu(OP, &[x.device(), grad.device()])?;
        expect_shape(OP, &dw.shape, &self.geometry.weight_shape())?;
        expect_shape(OP, &x.shape, &self.geometry.input_shape())?;
        expect_shape(OP, &grad.shape, &self.geometry.output_shape())?;
        if self.batch == 0 {
            return if accumulate { Ok(()) } else { dw.fill(0.0) };
        }
        if let Some(direct) = &self.direct {
            return direct.backward_weight(x, grad, dw, accumulate);
        }
        let mut col = self.workspace(x)?;
        // The output's gradient, permuted per chunk (not needed for chunks of one image).
        let permuted_len = if self.chunk > 1 {
            self.out_image * self.chunk
        } else {
            0
        };
        let mut permuted = x.alloc_like(&[permuted_len])?;
        for (k, chunk) in self.chunks().enumerate() {
            self.im2col(x, chunk, &mut col)?;
            let operands = (grad, &col, &mut permuted);
            self.backward_weight_chunk(operands, chunk, dw, accumulate || k > 0)?;
        }
        Ok(())
    }
}

impl ConvOps for CudaStorage {
    fn conv2d(x: &Self, w: &Self, bias: Option<&Self>, g: &Conv2dGeometry) -> Result<Self> {
        ConvPlan::new("conv2d", g, WORKSPACE_FLOATS)?.forward(x, w, bias)
    }

    fn conv2d_backward_input(grad: &Self, w: &Self, g: &Conv2dGeometry) -> Result<Self> {
        ConvPlan::new("conv2d backward", g, WORKSPACE_FLOATS)?.backward_input(grad, w)
    }

    fn conv2d_backward_weight(
        dst: &mut Self,
        x: &Self,
        grad: &Self,
        g: &Conv2dGeometry,
        accumulate: bool,
    ) -> Result<()> {
        ConvPlan::new("conv2d backward", g, WORKSPACE_FLOATS)?
            .backward_weight(dst, x, grad, accumulate)
    }

    fn max_pool2d(x: &Self, p: &Pool2dGeometry) -> Result<(Self, Self)> {
        super::pool::max_pool2d(x, p)
    }

    fn max_pool2d_backward(grad: &Self, argmax: &Self, p: &Pool2dGeometry) -> Result<Self> {
        super::pool::max_pool2d_backward(grad, argmax, p)
    }

    fn avg_pool2d(x: &Self, p: &Pool2dGeometry) -> Result<Self> {
        super::pool::avg_pool2d(x, p)
    }

    fn avg_pool2d_backward(grad: &Self, p: &Pool2dGeometry) -> Result<Self> {
        super::pool::avg_pool2d_backward(grad, p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shape::numel;

    /// Device 0 where a GPU (or the CUDA emulator) can be used, else `None` with a note on
    /// stderr; where `RINGFLOW_REQUIRE_GPU` is set, an unusable GPU fails instead.
    fn gpu() -> Option<usize> {
        match super::super::check_available(0) {
            Ok(()) => Some(0),
            Err(e) if std::env::var_os("RINGFLOW_REQUIRE_GPU").is_some() => {
                panic!("RINGFLOW_REQUIRE_GPU is set, but cuda:0 cannot be used: {e}")
            }
            Err(e) => {
                eprintln!("skipping: {e}");
                None
            }
        }
    }

    fn upload(shape: [usize; 4], seed: f32, ordinal: usize) -> CudaStorage {
        let values = (0..numel(&shape))
            .map(|i| (i as f32 * 0.618 + seed).sin())
            .collect();
        let host = ndarray::ArrayD::from_shape_vec(shape.to_vec(), values).expect("shape");
        CudaStorage::from_host(host, ordinal).expect("upload")
    }

    fn download(s: &CudaStorage) -> Vec<f32> {
        let mut out = vec![0.0; s.len()];
        s.copy_to_slice(&mut out).expect("download");
        out
    }

    fn assert_close(got: &[f32], want: &[f32], what: &str) {
        assert_eq!(got.len(), want.len(), "{what}: length");
        for (i, (g, w)) in got.iter().zip(want).enumerate() {
            assert!(
                (g - w).abs() <= 1e-5 * (1.0 + w.abs()),
                "{what}, element {i}: {g} in chunks, {w} in one pass"
            );
        }
    }

    /// Everything a plan computes: the output, the input's gradient, the weight's gradient, and
    /// the weight's gradient accumulated a second time.
    fn run(plan: &ConvPlan, x: &CudaStorage, w: &CudaStorage, grad: &CudaStorage) -> Vec<Vec<f32>> {
        let y = plan.forward(x, w, None).expect("forward");
        let dx = plan.backward_input(grad, w).expect("input gradient");
        let mut dw = w.duplicate().expect("copy");
        plan.backward_weight(&mut dw, x, grad, false)
            .expect("weight gradient");
        let once = download(&dw);
        plan.backward_weight(&mut dw, x, grad, true)
            .expect("weight gradient");
        vec![download(&y), download(&dx), once, download(&dw)]
    }

    /// A batch too large for the workspace goes through in chunks (of two images and one here)
    /// and gives what one pass over the whole batch gives.
    #[test]
    fn chunked_batches_match_one_pass() {
        let Some(ordinal) = gpu() else { return };
        let g = Conv2dGeometry {
            batch: 5,
            in_channels: 4,
            in_size: [6, 5],
            out_channels: 6,
            kernel: [3, 3],
            stride: [1, 2],
            padding: [1, 1],
            dilation: [1, 1],
            groups: 2,
        };
        let x = upload(g.input_shape(), 0.1, ordinal);
        let w = upload(g.weight_shape(), 0.2, ordinal);
        let grad = upload(g.output_shape(), 0.3, ordinal);
        let whole = ConvPlan::new("conv2d", &g, WORKSPACE_FLOATS).expect("plan");
        assert_eq!(whole.chunk, 5);
        let want = run(&whole, &x, &w, &grad);
        let image_col = g.in_channels * 9 * whole.plane;
        for (workspace, chunk) in [(image_col, 1), (2 * image_col + 1, 2)] {
            let plan = ConvPlan::new("conv2d", &g, workspace).expect("plan");
            assert_eq!(plan.chunk, chunk);
            let got = run(&plan, &x, &w, &grad);
            for (k, what) in ["output", "input gradient", "weight gradient", "accumulated"]
                .into_iter()
                .enumerate()
            {
                assert_close(&got[k], &want[k], &format!("{what}, chunks of {chunk}"));
            }
        }
    }
}
