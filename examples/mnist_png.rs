//! Converts the shipped MNIST (`image` as 784 raw bytes per row) into Parquet with a `png`
//! binary column of 28 × 28 grey PNG files, the way image data sets usually come (Spark's image
//! data source, Petastorm, Hugging Face): for jobs with `data.image`.
//!
//! ```text
//! cargo run --release --example mnist_png -- examples/data/mnist/train.parquet examples/data/mnist_png/train.parquet
//! cargo run --release --example mnist_png -- examples/data/mnist/test.parquet examples/data/mnist_png/test.parquet
//! ```
//!
//! The output keeps `id` and `label`, one row group per row group of the input, and every
//! pixel unchanged (PNG is lossless). Nothing of it is committed: the PNG files are larger
//! than the original's zstd-compressed bytes, so make them where you need them.

use std::fs::File;
use std::io::Cursor;
use std::sync::Arc;

use anyhow::{Context, bail};
use datafusion::arrow::array::{Array, ArrayRef, AsArray, BinaryBuilder, RecordBatch};
use datafusion::arrow::datatypes::{DataType, Field, Schema, UInt8Type};
use datafusion::parquet::arrow::ArrowWriter;
use datafusion::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use datafusion::parquet::basic::{Compression, ZstdLevel};
use datafusion::parquet::file::properties::WriterProperties;
use image::ImageEncoder;
use image::codecs::png::{CompressionType, FilterType, PngEncoder};

/// MNIST's side in pixels.
const SIDE: u32 = 28;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [input, output] = args.as_slice() else {
        bail!("usage: mnist_png INPUT.parquet OUTPUT.parquet (MNIST with an `image` column)");
    };
    if let Some(dir) = std::path::Path::new(output).parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    }
    let open = || File::open(input).with_context(|| format!("cannot open {input}"));
    let groups = ParquetRecordBatchReaderBuilder::try_new(open()?)?
        .metadata()
        .num_row_groups();
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("label", DataType::Int64, false),
        Field::new("png", DataType::Binary, false),
    ]));
    let props = WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::default()))
        .set_max_row_group_row_count(None)
        .build();
    let file = File::create(output).with_context(|| format!("cannot create {output}"))?;
    let mut writer = ArrowWriter::try_new(file, schema.clone(), Some(props))?;
    let mut rows = 0;
    for group in 0..groups {
        let reader = ParquetRecordBatchReaderBuilder::try_new(open()?)?
            .with_row_groups(vec![group])
            .build()?;
        for batch in reader {
            let batch = batch?;
            rows += batch.num_rows();
            writer.write(&as_png(&batch, &schema)?)?;
        }
        // One output row group per input row group.
        writer.flush()?;
    }
    writer.close()?;
    println!("{output}: {rows} rows in {groups} row groups");
    Ok(())
}

/// The `id`, `label` and PNG-encoded `image` of a batch of MNIST rows.
fn as_png(batch: &RecordBatch, schema: &Arc<Schema>) -> anyhow::Result<RecordBatch> {
    let column = |name: &str| {
        batch
            .column_by_name(name)
            .with_context(|| format!("the input has no column `{name}`"))
    };
    let images = column("image")?.as_fixed_size_list();
    if images.value_length() != (SIDE * SIDE) as i32 {
        bail!(
            "`image` holds {} values per row, not 784",
            images.value_length()
        );
    }
    let mut png = BinaryBuilder::new();
    for row in 0..images.len() {
        let pixels = images.value(row);
        let pixels = pixels.as_primitive::<UInt8Type>().values();
        let mut bytes = Vec::new();
        PngEncoder::new_with_quality(
            Cursor::new(&mut bytes),
            CompressionType::Best,
            FilterType::Adaptive,
        )
        .write_image(pixels, SIDE, SIDE, image::ExtendedColorType::L8)?;
        png.append_value(&bytes);
    }
    let columns: Vec<ArrayRef> = vec![
        column("id")?.clone(),
        column("label")?.clone(),
        Arc::new(png.finish()),
    ];
    Ok(RecordBatch::try_new(schema.clone(), columns)?)
}
