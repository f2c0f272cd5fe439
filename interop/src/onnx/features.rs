//! The preprocessing of feature columns inside the graph: `data.scale`, then
//! `normalize = "standard"`, computed as the executors compute them.

use super::graph::Graph;
use crate::error::ExportError;
use crate::saved::SavedModelDir;

/// `x` (the features as read from the data, `[batch, width]`) scaled and standardized as the
/// model saw its training data.
pub fn preprocess(
    g: &mut Graph,
    saved: &SavedModelDir,
    x: &str,
    width: usize,
) -> Result<String, ExportError> {
    let data = &saved.saved.spec.data;
    let mut h = x.to_string();
    if let Some(scale) = data.scale {
        // The executors multiply by the reciprocal, so the graph does too.
        let k = g.scalar(1.0 / scale);
        h = g.op("Mul", &[&h, &k], Vec::new());
    }
    if let Some(n) = saved
        .saved
        .preprocessing
        .as_ref()
        .and_then(|p| p.normalize.as_ref())
    {
        let mean = g.constant("mean", &[width], &n.mean);
        let inv: Vec<f32> = n.std.iter().map(|s| 1.0 / s).collect();
        let inv_std = g.constant("inv_std", &[width], &inv);
        let centered = g.op("Sub", &[&h, &mean], Vec::new());
        h = g.op("Mul", &[&centered, &inv_std], Vec::new());
    }
    Ok(h)
}
