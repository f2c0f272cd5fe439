//! The stock layers, by concept: [`dense`] (linear, activations, dropout, embeddings),
//! [`conv`] (2-D convolution), [`pool`] (pooling and flattening), [`norm`] (layer and batch
//! normalization), [`recurrent`] (LSTMs and GRUs over sequences of different lengths),
//! [`attention`] (multi-head self-attention, Transformer encoder blocks and position
//! embeddings over sequences of different lengths), [`sequence`] (pooling a sequence's real
//! steps) and [`residual`] (sequential stacks and skip connections). Each is a
//! [`Module`](crate::nn::Module) that custom Rust models can use as they are.

pub mod attention;
pub mod conv;
pub mod dense;
pub mod norm;
pub mod pool;
pub mod recurrent;
pub mod residual;
pub mod sequence;

pub use attention::{MultiHeadAttention, PositionEmbedding, PositionKind, TransformerEncoder};
pub use conv::{Conv2d, Conv2dConfig};
pub use dense::{Activation, ActivationKind, Dropout, Embedding, Init, Linear};
pub use norm::{BatchNorm, LayerNorm};
pub use pool::{AvgPool2d, Flatten, GlobalAvgPool2d, MaxPool2d};
pub use recurrent::{BiGru, BiLstm, Bidirectional, Gru, Lstm, Recurrent};
pub use residual::{Residual, Sequential};
pub use sequence::{SequencePool, SequencePoolKind};
