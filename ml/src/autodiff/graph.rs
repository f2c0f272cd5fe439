//! The recorded graph and the backward pass over it.

use std::collections::{HashMap, HashSet};

use super::grad_store::{GradStore, GradWrite};
use crate::backend::{MatmulOptions, Storage};
use crate::error::{MlError, Result};
use crate::tensor::{Tensor, TensorKey};

/// The derivative of one op.
pub(crate) trait Backward: Send + Sync {
    /// Adds the gradients of `inputs` to `sink`, given the op's `output` and the gradient of the
    /// loss with respect to it.
    fn backward(
        &self,
        inputs: &[Tensor],
        output: &Tensor,
        grad: &Storage,
        sink: &mut GradSink,
    ) -> Result<()>;
}

/// The derivative of an op with several outputs ([`Tensor::from_multi_op`]), run once with the
/// gradients of all of them.
pub(crate) trait MultiBackward: Send + Sync {
    /// Adds the gradients of `inputs` to `sink`, given the gradient of the loss with respect to
    /// each output (`None` for an output that no gradient reached: it counts as zeros).
    fn backward(
        &self,
        inputs: &[Tensor],
        grads: &[Option<Storage>],
        sink: &mut GradSink,
    ) -> Result<()>;
}

/// What a node's backward pass does.
pub(crate) enum Derivative {
    /// An op with one output: this tensor.
    Single(Box<dyn Backward>),
    /// The hidden joint tensor of an op with several outputs (an empty tensor whose inputs are
    /// the op's): its backward runs once, after every output has handed in its gradient.
    Joint(Box<dyn MultiBackward>),
    /// Output `index` of an op with several: its only input is the joint tensor, to which it
    /// hands its gradient unchanged.
    Part { index: usize, of: usize },
}

/// How a non-leaf tensor was computed.
pub(crate) struct Node {
    pub inputs: Vec<Tensor>,
    pub backward: Derivative,
}

impl Drop for Node {
    /// Frees the graph behind this node iteratively: dropping a long chain of recorded ops
    /// field by field would recurse once per op and overflow the stack.
    fn drop(&mut self) {
        let mut stack = std::mem::take(&mut self.inputs);
        while let Some(t) = stack.pop() {
            if let Some(mut node) = t.into_unique_node() {
                stack.append(&mut node.inputs);
            }
        }
    }
}

/// Collects gradients during one backward pass: intermediate tensors' gradients in a map that
/// is drained as the pass goes, leaves' gradients straight into the pass's [`GradStore`].
pub(crate) struct GradSink<'s> {
    pending: HashMap<u64, Storage>,
    /// The outputs' gradients of the joint tensors of multi-output ops, by the joint's id.
    parts: HashMap<u64, Vec<Option<Storage>>>,
    store: &'s mut GradStore,
    /// The learning rate of the store's SGD step inside the pass, and the parameters it may
    /// be applied to: the store's that are used once in the graph, whose gradient is then that
    /// use's.
    sgd: Option<(f32, HashSet<TensorKey>)>,
}

impl GradSink<'_> {
    /// Stores a gradient of `t` through `write`, which is told whether to add to an existing
    /// buffer, overwrite a stale one, or return a new one (see [`GradWrite`]); a returned
    /// storage replaces the buffer.
    pub fn accumulate_with(
        &mut self,
        t: &Tensor,
        write: impl FnOnce(GradWrite<'_>) -> Result<Option<Storage>>,
    ) -> Result<()> {
        if !t.requires_grad() {
            return Ok(());
        }
        if t.is_leaf() {
            return self.store.write(t, write);
        }
        match self.pending.get_mut(&t.id()) {
            Some(existing) => {
                if let Some(r) = write(GradWrite::Add(existing))? {
                    *existing = r;
                }
            }
            None => {
                let fresh = write(GradWrite::New)?.ok_or_else(|| {
                    MlError::Backward("an op produced no gradient for a new buffer".into())
                })?;
                self.pending.insert(t.id(), fresh);
            }
        }
        Ok(())
    }

    /// Adds `g` (of `t`'s shape) to `t`'s gradient.
    pub fn add(&mut self, t: &Tensor, g: Storage) -> Result<()> {
        self.accumulate_with(t, |slot| match slot {
            GradWrite::Add(d) => d.add_assign(&g).map(|_| None),
            GradWrite::Overwrite(_) | GradWrite::New => Ok(Some(g)),
        })
    }

    /// Adds `g`, summed over the dimensions that broadcasting expanded, to `t`'s gradient.
    pub fn add_reduced(&mut self, t: &Tensor, g: Storage) -> Result<()> {
        if g.shape() == t.shape() {
            return self.add(t, g);
        }
        self.add_reduced_ref(t, &g)
    }

    /// [`GradSink::add_reduced`] from a borrowed `g` (an op's output gradient, which a sum and
    /// its operands share): copied only where `t`'s gradient takes it whole (the same shape,
    /// and no buffer to add it to); a bias's gradient is summed straight from it.
    pub fn add_reduced_ref(&mut self, t: &Tensor, g: &Storage) -> Result<()> {
        let whole = g.shape() == t.shape();
        self.accumulate_with(t, |slot| match slot {
            GradWrite::Add(d) if whole => d.add_assign(g).map(|_| None),
            GradWrite::Overwrite(_) | GradWrite::New if whole => g.duplicate().map(Some),
            GradWrite::Add(d) => g.sum_to_shape_into(d, true).map(|_| None),
            GradWrite::Overwrite(d) => g.sum_to_shape_into(d, false).map(|_| None),
            GradWrite::New => {
                let mut fresh = Storage::zeros(t.shape(), t.device())?;
                g.sum_to_shape_into(&mut fresh, false)?;
                Ok(Some(fresh))
            }
        })
    }

    /// Adds `op_a(a) · op_b(b)` to `t`'s gradient, with GEMM writing straight into the
    /// gradient buffer (no temporary of the parameter's size). In a pass that applies a plain
    /// SGD step, a parameter used once is updated with the product instead
    /// ([`Storage::sgd_product_update`]), its gradient never stored.
    pub fn add_matmul(
        &mut self,
        t: &Tensor,
        a: &Storage,
        transpose_a: bool,
        b: &Storage,
        transpose_b: bool,
    ) -> Result<()> {
        if let Some(lr) = self.sgd_lr_for(t) {
            let update = |p: &mut Storage| {
                Storage::sgd_product_update(p, (a, transpose_a), (b, transpose_b), lr)
            };
            if self.store.update_in_backward(t, update)? {
                return Ok(());
            }
        }
        self.add_product(t, |d, accumulate| {
            let opts = MatmulOptions::transposed(transpose_a, transpose_b);
            Storage::matmul_into(d, (a, b), opts.accumulating(accumulate))
        })
    }

    /// Adds the batched product `op_a(a[i]) · op_b(b[i])` to `t`'s gradient (3-D operands), like
    /// [`GradSink::add_matmul`].
    pub fn add_bmm(
        &mut self,
        t: &Tensor,
        a: &Storage,
        transpose_a: bool,
        b: &Storage,
        transpose_b: bool,
    ) -> Result<()> {
        self.add_product(t, |d, accumulate| {
            let opts = MatmulOptions::transposed(transpose_a, transpose_b);
            Storage::bmm_into(d, (a, b), opts.accumulating(accumulate))
        })
    }

    /// Adds a product to `t`'s gradient: `product(dst, accumulate)` writes it into `dst`,
    /// adding to what `dst` holds when `accumulate`.
    fn add_product(
        &mut self,
        t: &Tensor,
        product: impl FnOnce(&mut Storage, bool) -> Result<()>,
    ) -> Result<()> {
        self.accumulate_with(t, |slot| match slot {
            GradWrite::Add(d) => product(d, true).map(|_| None),
            GradWrite::Overwrite(d) => product(d, false).map(|_| None),
            GradWrite::New => {
                let mut d = Storage::zeros(t.shape(), t.device())?;
                product(&mut d, false)?;
                Ok(Some(d))
            }
        })
    }

    /// The learning rate of the pass's SGD step when `t` is a parameter it may update.
    fn sgd_lr_for(&self, t: &Tensor) -> Option<f32> {
        let (lr, once) = self.sgd.as_ref()?;
        once.contains(&t.key()).then_some(*lr)
    }

    /// True if `t` takes part in this backward pass.
    pub fn wants(&self, t: &Tensor) -> bool {
        t.requires_grad()
    }

    /// Hands `g`, the gradient of output `index` of `of` outputs, to the op's `joint` tensor.
    fn add_part(&mut self, joint: &Tensor, (index, of): (usize, usize), g: Storage) -> Result<()> {
        let slots = self
            .parts
            .entry(joint.id())
            .or_insert_with(|| (0..of).map(|_| None).collect());
        match slots.get_mut(index) {
            Some(Some(existing)) => existing.add_assign(&g),
            Some(slot) => {
                *slot = Some(g);
                Ok(())
            }
            None => Err(MlError::Backward(format!(
                "output {index} of an op with {of} outputs"
            ))),
        }
    }
}

/// Reverse-mode pass from `root` (a tensor with one element) with seed gradient 1, adding the
/// parameters' gradients to `store`.
///
/// `on_ready` is called for every parameter (a leaf that requires gradients) as soon as its
/// gradient for this pass is complete, i.e. after the last recorded op that uses it has run its
/// backward. Data-parallel training uses this to start reducing gradients while the rest of the
/// backward pass runs. Where the store carries an SGD step
/// ([`GradStore::set_sgd_in_backward`]), it is applied inside the pass to every one of its
/// parameters used once whose gradient is a matrix product ([`GradSink::add_matmul`]).
pub(crate) fn run_backward(
    root: &Tensor,
    store: &mut GradStore,
    on_ready: &mut dyn FnMut(&Tensor, &GradStore) -> Result<()>,
) -> Result<()> {
    if root.numel() != 1 {
        return Err(MlError::Backward(format!(
            "can only start from a tensor with one element (a loss), not shape {:?}",
            root.shape()
        )));
    }
    if !root.requires_grad() {
        return Err(MlError::Backward(
            "the tensor does not depend on any parameter (or was computed under no_grad)".into(),
        ));
    }
    let order = topological_order(root);
    // How many recorded uses of each parameter are still to run their backward.
    let mut uses = parameter_uses(&order);
    let sgd = store.sgd_in_backward().map(|(lr, params)| {
        let once = |key: &&TensorKey| uses.get(*key) == Some(&1);
        (lr, params.iter().filter(once).copied().collect())
    });
    let mut sink = GradSink {
        pending: HashMap::new(),
        parts: HashMap::new(),
        store,
        sgd,
    };
    let mut seed = Storage::zeros(root.shape(), root.device())?;
    seed.fill(1.0)?;
    if root.is_leaf() {
        sink.add(root, seed)?;
        return on_ready(root, sink.store);
    }
    sink.pending.insert(root.id(), seed);
    for t in order.iter().rev() {
        let node = t.node().expect("the order holds only non-leaf tensors");
        match &node.backward {
            Derivative::Single(backward) => {
                if let Some(grad) = sink.pending.remove(&t.id()) {
                    backward.backward(&node.inputs, t, &grad, &mut sink)?;
                }
            }
            Derivative::Part { index, of } => {
                if let Some(grad) = sink.pending.remove(&t.id()) {
                    sink.add_part(&node.inputs[0], (*index, *of), grad)?;
                }
            }
            Derivative::Joint(backward) => {
                if let Some(grads) = sink.parts.remove(&t.id()) {
                    backward.backward(&node.inputs, &grads, &mut sink)?;
                }
            }
        }
        for input in &node.inputs {
            if let Some(left) = uses.get_mut(&input.key()) {
                *left -= 1;
                if *left == 0 {
                    on_ready(input, sink.store)?;
                }
            }
        }
    }
    Ok(())
}

/// How many recorded ops of `order` use each parameter (a leaf that requires gradients), by
/// its key.
fn parameter_uses(order: &[Tensor]) -> HashMap<TensorKey, usize> {
    let mut uses: HashMap<TensorKey, usize> = HashMap::new();
    for t in order {
        for input in &t.node().expect("non-leaf").inputs {
            if input.is_leaf() && input.requires_grad() {
                *uses.entry(input.key()).or_default() += 1;
            }
        }
    }
    uses
}

/// Non-leaf tensors reachable from `root` through tensors that need gradients, each after all of
/// its inputs (iterative, so deep graphs cannot overflow the stack).
fn topological_order(root: &Tensor) -> Vec<Tensor> {
    let mut order = Vec::new();
    let mut visited = HashSet::new();
    let mut stack: Vec<(Tensor, bool)> = vec![(root.clone(), false)];
    while let Some((t, inputs_done)) = stack.pop() {
        if inputs_done {
            order.push(t);
            continue;
        }
        if t.is_leaf() || !visited.insert(t.id()) {
            continue;
        }
        stack.push((t.clone(), true));
        if let Some(node) = t.node() {
            for input in &node.inputs {
                if input.requires_grad() && !input.is_leaf() && !visited.contains(&input.id()) {
                    stack.push((input.clone(), false));
                }
            }
        }
    }
    order
}
