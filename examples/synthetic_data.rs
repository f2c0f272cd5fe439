//! Writes a synthetic classification data set of a chosen size as Parquet, for measuring
//! ingest and bounded memory on data larger than an executor's memory (nothing is committed:
//! generate it where you measure).
//!
//! ```text
//! cargo run --release --example synthetic_data -- OUT_DIR [--gb 2] [--features 256] [--classes 10]
//! cargo run --release -- local examples/synthetic.toml --executors 2 --set data.train=OUT_DIR
//! ```
//!
//! Each row has `features` float32 values in a `FixedSizeList` column `x` (uniform in [-1, 1])
//! and a label `y`: the argmax of a fixed random linear map of `x` (so a linear model can learn
//! it), plus an `id`. Files of about 256 MiB hold row groups of about 64 MiB.

use std::sync::Arc;

use datafusion::arrow::array::{
    ArrayRef, FixedSizeListArray, Float32Array, Int32Array, Int64Array,
};
use datafusion::arrow::datatypes::{DataType, Field, Schema};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::parquet::arrow::ArrowWriter;
use datafusion::parquet::file::properties::WriterProperties;
use rand::{RngExt, SeedableRng};

fn arg<T: std::str::FromStr>(args: &[String], name: &str, default: T) -> T {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let out = args
        .first()
        .filter(|a| !a.starts_with("--"))
        .ok_or_else(|| {
            anyhow::anyhow!(
                "usage: synthetic_data OUT_DIR [--gb 2] [--features 256] [--classes 10]"
            )
        })?;
    let gb: f64 = arg(&args, "--gb", 2.0);
    let features: usize = arg(&args, "--features", 256);
    let classes: usize = arg(&args, "--classes", 10);
    std::fs::create_dir_all(out)?;

    let row_bytes = features * 4 + 12;
    let total_rows = ((gb * (1u64 << 30) as f64) / row_bytes as f64).ceil() as usize;
    let group_rows = (64 << 20) / row_bytes;
    let file_rows = group_rows * 4;
    let mut rng = rand::rngs::StdRng::seed_from_u64(42);
    let weights: Vec<f32> = (0..features * classes)
        .map(|_| rng.random_range(-1.0..1.0))
        .collect();
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new(
            "x",
            DataType::FixedSizeList(
                Arc::new(Field::new("item", DataType::Float32, false)),
                features as i32,
            ),
            false,
        ),
        Field::new("y", DataType::Int32, false),
    ]));
    let props = WriterProperties::builder()
        .set_max_row_group_row_count(Some(group_rows))
        .set_dictionary_enabled(false)
        .build();
    let (mut written, mut file_index) = (0usize, 0usize);
    while written < total_rows {
        let path = std::path::Path::new(out).join(format!("part-{file_index:05}.parquet"));
        let mut writer = ArrowWriter::try_new(
            std::fs::File::create(&path)?,
            schema.clone(),
            Some(props.clone()),
        )?;
        let end = (written + file_rows).min(total_rows);
        while written < end {
            let n = (end - written).min(8192);
            let x: Vec<f32> = (0..n * features)
                .map(|_| rng.random_range(-1.0..1.0))
                .collect();
            let y: Vec<i32> = x
                .chunks_exact(features)
                .map(|row| {
                    let scores = (0..classes).map(|c| {
                        row.iter()
                            .zip(&weights[c * features..(c + 1) * features])
                            .map(|(a, b)| a * b)
                            .sum::<f32>()
                    });
                    scores
                        .enumerate()
                        .fold((0, f32::NEG_INFINITY), |best, (i, s)| {
                            if s > best.1 { (i, s) } else { best }
                        })
                        .0 as i32
                })
                .collect();
            let ids = Int64Array::from_iter_values(written as i64..(written + n) as i64);
            let list = FixedSizeListArray::try_new(
                Arc::new(Field::new("item", DataType::Float32, false)),
                features as i32,
                Arc::new(Float32Array::from(x)) as ArrayRef,
                None,
            )?;
            let batch = RecordBatch::try_new(
                schema.clone(),
                vec![Arc::new(ids), Arc::new(list), Arc::new(Int32Array::from(y))],
            )?;
            writer.write(&batch)?;
            written += n;
        }
        writer.close()?;
        file_index += 1;
    }
    let bytes: u64 = std::fs::read_dir(out)?
        .filter_map(|e| e.ok()?.metadata().ok())
        .map(|m| m.len())
        .sum();
    println!(
        "wrote {total_rows} rows of {features} features in {file_index} files, {:.2} GiB, to {out}",
        bytes as f64 / (1u64 << 30) as f64
    );
    Ok(())
}
