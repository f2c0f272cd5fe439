//! [`ModelSummary`]: a model's layers, their output shapes and parameter counts, printed as
//! Keras' `model.summary()` prints them.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::nn::ParamStore;

/// One row of a [`ModelSummary`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SummaryRow {
    /// The layer's parameter-name prefix (`layers.4.layers.0`), or `input` for the input row.
    pub name: String,
    /// Its type (`conv2d`), empty when not known.
    pub kind: String,
    /// The shape of one example's output (without the batch axis), when known.
    pub output: Option<Vec<usize>>,
    /// Its values: trainable parameters and buffers together, as Keras' `Param #` counts them.
    pub params: u64,
    /// Nesting depth (layers inside a residual block are one deeper).
    pub depth: usize,
}

/// A model's layers in order with their output shapes and parameter counts, and its totals.
///
/// `Display` prints the table:
///
/// ```text
/// Layer (type)                  Output shape              Param #
/// ================================================================
/// input                         [n, 1, 28, 28]                  0
/// layers.0 (conv2d)             [n, 32, 28, 28]               320
/// ...
/// ================================================================
/// Total params: 421,834
/// Trainable params: 421,770
/// Non-trainable params: 64
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelSummary {
    /// The layers, depth first.
    pub rows: Vec<SummaryRow>,
    /// Values the optimizer trains.
    pub trainable: u64,
    /// Values saved with the model but not trained (buffers such as batch norm's running
    /// statistics).
    pub non_trainable: u64,
}

impl ModelSummary {
    /// All values: trainable and not.
    pub fn total(&self) -> u64 {
        self.trainable.saturating_add(self.non_trainable)
    }

    /// A summary of a built model known only by its parameters and buffers: one row per
    /// module (the names' prefix before the last dot), in creation order, without shapes.
    pub fn from_params(store: &ParamStore) -> ModelSummary {
        let mut rows: Vec<SummaryRow> = Vec::new();
        for (_, p) in store.named() {
            let module = p.name.rsplit_once('.').map_or("", |(m, _)| m).to_string();
            let n = p.tensor.numel() as u64;
            match rows.iter_mut().find(|r| r.name == module) {
                Some(row) => row.params += n,
                None => rows.push(SummaryRow {
                    name: module,
                    kind: String::new(),
                    output: None,
                    params: n,
                    depth: 0,
                }),
            }
        }
        ModelSummary {
            rows,
            trainable: store.numel() as u64,
            non_trainable: store.buffer_numel() as u64,
        }
    }

    /// The table's lines, without line ends (what a job prints at its start, line by line).
    pub fn lines(&self) -> Vec<String> {
        self.to_string().lines().map(str::to_string).collect()
    }
}

/// `421,834`.
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

fn shape_text(shape: &Option<Vec<usize>>) -> String {
    match shape {
        Some(s) => crate::nn::sequential::batch_shape(s),
        None => "?".into(),
    }
}

impl fmt::Display for ModelSummary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let layer = |r: &SummaryRow| {
            let indent = "  ".repeat(r.depth);
            match (r.name.is_empty(), r.kind.is_empty()) {
                (_, true) => format!("{indent}{}", r.name),
                (true, false) => format!("{indent}({})", r.kind),
                (false, false) => format!("{indent}{} ({})", r.name, r.kind),
            }
        };
        let cells: Vec<(String, String, String)> = self
            .rows
            .iter()
            .map(|r| (layer(r), shape_text(&r.output), thousands(r.params)))
            .collect();
        let w0 = cells
            .iter()
            .map(|c| c.0.len())
            .chain([12])
            .max()
            .unwrap_or(12)
            + 2;
        let w1 = cells
            .iter()
            .map(|c| c.1.len())
            .chain([12])
            .max()
            .unwrap_or(12)
            + 2;
        let w2 = cells
            .iter()
            .map(|c| c.2.len())
            .chain([7])
            .max()
            .unwrap_or(7);
        let rule = "=".repeat(w0 + w1 + w2);
        writeln!(
            f,
            "{:<w0$}{:<w1$}{:>w2$}",
            "Layer (type)", "Output shape", "Param #"
        )?;
        writeln!(f, "{rule}")?;
        for (a, b, c) in &cells {
            writeln!(f, "{a:<w0$}{b:<w1$}{c:>w2$}")?;
        }
        writeln!(f, "{rule}")?;
        writeln!(f, "Total params: {}", thousands(self.total()))?;
        writeln!(f, "Trainable params: {}", thousands(self.trainable))?;
        write!(f, "Non-trainable params: {}", thousands(self.non_trainable))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thousands_are_grouped_by_three() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(421_834), "421,834");
        assert_eq!(thousands(12_345_678), "12,345,678");
    }
}
