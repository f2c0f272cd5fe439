//! Evaluation metrics whose counts executors compute on their own rows and the driver adds up,
//! so every process reads them the same way.
//!
//! - [`entities`]: entity-level precision, recall and F1 of IOB2 tag sequences (CoNLL's rules).

pub mod entities;
