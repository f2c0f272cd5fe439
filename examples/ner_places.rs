//! Derives a sequence-classification data set from the shipped named-entity corpus: for each
//! sentence, its tokens and whether it mentions a place (a `B-LOC` tag), as the string label
//! `place` or `none`.
//!
//! ```text
//! cargo run --example ner_places -- examples/data/hironsan-ner/train.parquet examples/data/hironsan-ner/places_train.parquet
//! cargo run --example ner_places -- examples/data/hironsan-ner/test.parquet examples/data/hironsan-ner/places_test.parquet
//! ```
//!
//! The outputs are committed next to the corpus (they are small); `examples/ner_places.toml`
//! trains on them.

use std::fs::File;
use std::sync::Arc;

use anyhow::{Context, bail};
use datafusion::arrow::array::{Array, ArrayRef, AsArray, RecordBatch, StringArray};
use datafusion::arrow::datatypes::{Field, Schema};
use datafusion::parquet::arrow::ArrowWriter;
use datafusion::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [input, output] = args.as_slice() else {
        bail!("usage: ner_places INPUT.parquet OUTPUT.parquet (the corpus with `tokens`, `tags`)");
    };
    let file = File::open(input).with_context(|| format!("cannot open {input}"))?;
    let reader = ParquetRecordBatchReaderBuilder::try_new(file)?.build()?;
    let mut writer: Option<ArrowWriter<File>> = None;
    for batch in reader {
        let batch = batch?;
        let column = |name: &str| {
            batch
                .column_by_name(name)
                .with_context(|| format!("{input} has no column `{name}`"))
        };
        let tags = column("tags")?.as_list::<i32>();
        let labels: StringArray = (0..tags.len())
            .map(|i| {
                let row = tags.value(i);
                let place = row.as_string::<i32>().iter().any(|t| t == Some("B-LOC"));
                Some(if place { "place" } else { "none" })
            })
            .collect();
        let columns: Vec<(&str, ArrayRef)> = vec![
            ("id", column("id")?.clone()),
            ("tokens", column("tokens")?.clone()),
            ("mentions", Arc::new(labels)),
        ];
        let fields: Vec<Field> = columns
            .iter()
            .map(|(n, a)| Field::new(*n, a.data_type().clone(), false))
            .collect();
        let schema = Arc::new(Schema::new(fields));
        let out = RecordBatch::try_new(schema.clone(), columns.into_iter().map(|c| c.1).collect())?;
        if writer.is_none() {
            let file = File::create(output).with_context(|| format!("cannot create {output}"))?;
            writer = Some(ArrowWriter::try_new(file, schema, None)?);
        }
        writer.as_mut().expect("created").write(&out)?;
    }
    match writer {
        Some(w) => w.close().map(|_| ()).context("cannot finish the output"),
        None => bail!("{input} has no rows"),
    }
}
