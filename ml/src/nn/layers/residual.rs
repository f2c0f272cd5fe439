//! Containers: [`Sequential`] (layers one after another) and [`Residual`] (a block whose
//! input is added to its output, ResNet's skip connection).

use crate::error::Result;
use crate::nn::{Forward, Module};
use crate::tensor::Tensor;

/// Layers applied one after another.
#[derive(Default)]
pub struct Sequential {
    layers: Vec<Box<dyn Module>>,
}

impl Sequential {
    /// An empty stack.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends a layer.
    pub fn push(&mut self, layer: impl Module + 'static) {
        self.layers.push(Box::new(layer));
    }

    /// Appends a boxed layer.
    pub fn push_boxed(&mut self, layer: Box<dyn Module>) {
        self.layers.push(layer);
    }

    /// The number of layers.
    pub fn len(&self) -> usize {
        self.layers.len()
    }

    /// True if there are no layers.
    pub fn is_empty(&self) -> bool {
        self.layers.is_empty()
    }
}

impl Module for Sequential {
    fn forward(&self, x: &Tensor, ctx: &mut Forward<'_>) -> Result<Tensor> {
        let mut h = x.clone();
        for layer in &self.layers {
            h = layer.forward(&h, ctx)?;
        }
        Ok(h)
    }
}

/// `body(x) + shortcut(x)`, where the shortcut is the identity unless given (a projection,
/// e.g. a strided 1×1 convolution, when the body changes the shape).
pub struct Residual {
    /// The layers whose output the input (or the shortcut's output) is added to.
    pub body: Box<dyn Module>,
    /// What the input goes through before the addition; `None` adds it unchanged.
    pub shortcut: Option<Box<dyn Module>>,
}

impl Module for Residual {
    fn forward(&self, x: &Tensor, ctx: &mut Forward<'_>) -> Result<Tensor> {
        let out = self.body.forward(x, ctx)?;
        match &self.shortcut {
            Some(shortcut) => out.add(&shortcut.forward(x, ctx)?),
            None => out.add(x),
        }
    }
}
