//! Feature and label columns read from a local Parquet file's pages straight into the `f32`
//! chunk: each column's pages are decoded by [`PageColumn`] into the chunk itself (a column that
//! fills whole rows alone) or into a reused buffer copied into its place in each row, with no
//! Arrow arrays (null bitmaps, list offsets, narrowed copies of the values) in between.
//!
//! Only plain data takes this path: numeric columns and lists of numbers, each one Parquet
//! leaf, every value present, every row of a list column as long as the others. Anything else
//! — a null, a ragged list, a value that is not finite, a label out of range, a column that is
//! not there, an unreadable page — makes [`DirectReader::read`] answer `false`, and the caller
//! reads the rest of the partition through Arrow, which converts it (or reports the problem)
//! exactly as before.

use std::path::Path;

use datafusion::arrow::datatypes::DataType;
use datafusion::parquet::arrow::parquet_to_arrow_schema;
use datafusion::parquet::file::reader::{FileReader, SerializedFileReader};
use ringflow_core::data::local::open_regular;
use ringflow_core::pb::Partition;

use super::Converter;
use super::pages::{Kind, PageColumn};
use super::values::{copy_rows, may_be_non_finite};
use crate::data::converter::DirectRows;

/// One column being read: its pages, and the values of the chunk being read when the column
/// does not fill whole rows alone.
struct Column {
    pages: PageColumn,
    /// A list column.
    list: bool,
    /// Whether its converted values may be NaN or infinite, and so must be checked (floats, or
    /// integers times a huge multiplier).
    check_finite: bool,
    scratch: Vec<f32>,
}

/// A partition's rows read chunk by chunk; see the module's documentation.
pub struct DirectReader {
    features: Vec<Column>,
    label: Option<Column>,
}

impl Converter {
    /// A direct reader of `partition` of the local file at `path`, positioned at its first
    /// row; `None` where this converter's columns or the file do not allow one (the caller
    /// then reads through Arrow).
    pub fn open_direct(&self, path: &Path, partition: &Partition) -> Option<DirectReader> {
        if self.classes.is_some() {
            return None;
        }
        // A regular file, opened without blocking (never a FIFO).
        let file = open_regular(path).ok()?;
        let reader = SerializedFileReader::new(file).ok()?;
        let meta = reader.metadata();
        let group = partition.row_group as usize;
        let rows = meta.row_groups().get(group)?.num_rows() as u64;
        if partition.row_offset.checked_add(partition.row_count)? > rows {
            return None;
        }
        let descr = meta.file_metadata().schema_descr();
        let arrow =
            parquet_to_arrow_schema(descr, meta.file_metadata().key_value_metadata()).ok()?;
        let row_group = reader.get_row_group(group).ok()?;
        let open = |name: &str, mul: f32| -> Option<Column> {
            let root = arrow.index_of(name).ok()?;
            let (values, list) = match arrow.field(root).data_type() {
                DataType::FixedSizeList(f, _) | DataType::List(f) | DataType::LargeList(f) => {
                    (f.data_type().clone(), true)
                }
                t => (t.clone(), false),
            };
            let mut leaves =
                (0..descr.num_columns()).filter(|&i| descr.get_column_root_idx(i) == root);
            let leaf_index = leaves.next()?;
            if leaves.next().is_some() {
                return None;
            }
            let leaf = descr.column(leaf_index);
            if leaf.max_rep_level() != i16::from(list) {
                return None;
            }
            let kind = Kind::of(leaf.physical_type(), &values)?;
            let pages = row_group.get_column_page_reader(leaf_index).ok()?;
            let mut pages =
                PageColumn::new(pages, kind, mul, leaf.max_rep_level(), leaf.max_def_level())?;
            pages.skip(partition.row_offset as usize)?;
            Some(Column {
                pages,
                list,
                check_finite: may_be_non_finite(&values, mul),
                scratch: Vec::new(),
            })
        };
        let features = self
            .features
            .iter()
            .map(|name| open(name, self.multiplier))
            .collect::<Option<Vec<Column>>>()?;
        let label = match &self.label {
            Some(name) => Some(open(name, 1.0).filter(|c| !c.list)?),
            None => None,
        };
        Some(DirectReader { features, label })
    }
}

/// A direct reader with the converter that opened it: the feature kind's [`DirectRows`].
pub(super) struct DirectFeatures<'a> {
    converter: &'a Converter,
    reader: DirectReader,
}

impl<'a> DirectFeatures<'a> {
    /// `reader`, opened by `converter`.
    pub(super) fn new(converter: &'a Converter, reader: DirectReader) -> DirectFeatures<'a> {
        DirectFeatures { converter, reader }
    }
}

impl DirectRows for DirectFeatures<'_> {
    fn read(&mut self, rows: usize, out: &mut super::Rows) -> bool {
        self.reader.read(self.converter, rows, out)
    }
}

impl DirectReader {
    /// Reads the next `rows` rows into `out` with `converter` (the converter that opened
    /// this reader); false, with `out` unspecified, where they are not plain data or cannot
    /// be read (see the module's documentation).
    pub fn read(&mut self, converter: &Converter, rows: usize, out: &mut super::Rows) -> bool {
        let width: usize = self.features.iter().map(|c| c.pages.width()).sum();
        if width != converter.inputs || rows == 0 {
            return false;
        }
        // On success every value below is written (the columns' widths add up to `width`);
        // on failure the caller drops the rows.
        out.reset_to_overwrite(rows * width);
        if let [only] = self.features.as_mut_slice() {
            // One column fills whole rows: decoded in place.
            if !only.pages.read(&mut out.features) || !only.finite(&out.features) {
                return false;
            }
        } else {
            let mut offset = 0;
            for c in &mut self.features {
                if !c.read_into(&mut out.features, rows, width, offset) {
                    return false;
                }
                offset += c.pages.width();
            }
        }
        converter.standardize(&mut out.features, width);
        if let Some(label) = &mut self.label {
            out.labels.resize(rows, 0.0);
            if !label.pages.read(&mut out.labels) || !label.finite(&out.labels) {
                return false;
            }
            if !out.labels.iter().all(|&v| converter.label_ok(f64::from(v))) {
                return false;
            }
        }
        out.rows = rows;
        true
    }
}

impl Column {
    /// Decodes `rows` rows and writes them at `offset` of each `stride`-wide row of `out`;
    /// false where they cannot be read or one is not finite.
    fn read_into(&mut self, out: &mut [f32], rows: usize, stride: usize, offset: usize) -> bool {
        let w = self.pages.width();
        self.scratch.clear();
        self.scratch.resize(rows * w, 0.0);
        if !self.pages.read(&mut self.scratch) || !self.finite(&self.scratch) {
            return false;
        }
        copy_rows(&self.scratch, w, out, stride, offset, 1.0);
        true
    }

    /// Whether `values`, converted from this column, are all finite (checked only where the
    /// column's type and multiplier allow anything else).
    fn finite(&self, values: &[f32]) -> bool {
        !self.check_finite || values.iter().all(|v| v.is_finite())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use datafusion::arrow::array::{
        ArrayRef, FixedSizeListArray, Float32Array, Float64Array, Int8Array, Int16Array,
        Int32Array, Int64Array, ListArray, UInt8Array, UInt16Array, UInt32Array, UInt64Array,
    };
    use datafusion::arrow::datatypes::{Field, Float32Type, Schema};
    use datafusion::arrow::record_batch::RecordBatch;
    use datafusion::parquet::arrow::ArrowWriter;
    use datafusion::parquet::basic::{Compression, Encoding};
    use datafusion::parquet::file::properties::{WriterProperties, WriterVersion};

    use super::*;
    use crate::data::features::LabelKind;
    use crate::data::read_ahead::ReadAhead;
    use crate::data::rows::Rows;

    /// One scalar column of every numeric type, `n` rows, named by its type.
    fn scalar_columns(n: i64) -> Vec<(&'static str, ArrayRef)> {
        let byte = |i: i64| (i * 37 % 256) as u8;
        vec![
            (
                "i8",
                Arc::new(Int8Array::from_iter_values(
                    (0..n).map(|i| (i % 250 - 125) as i8),
                )),
            ),
            (
                "i16",
                Arc::new(Int16Array::from_iter_values(
                    (0..n).map(|i| (i * 300 - 9000) as i16),
                )),
            ),
            (
                "u8",
                Arc::new(UInt8Array::from_iter_values((0..n).map(byte))),
            ),
            (
                "u16",
                Arc::new(UInt16Array::from_iter_values(
                    (0..n).map(|i| (i * 999) as u16),
                )),
            ),
            (
                "u32",
                Arc::new(UInt32Array::from_iter_values(
                    (0..n).map(|i| u32::MAX - i as u32),
                )),
            ),
            (
                "i32",
                Arc::new(Int32Array::from_iter_values(
                    (0..n).map(|i| i as i32 * -70_001),
                )),
            ),
            (
                "i64",
                Arc::new(Int64Array::from_iter_values((0..n).map(|i| i << 40))),
            ),
            (
                "u64",
                Arc::new(UInt64Array::from_iter_values(
                    (0..n).map(|i| u64::MAX - i as u64),
                )),
            ),
            (
                "f32",
                Arc::new(Float32Array::from_iter_values(
                    (0..n).map(|i| i as f32 / 3.0),
                )),
            ),
            (
                "f64",
                Arc::new(Float64Array::from_iter_values(
                    (0..n).map(|i| i as f64 / 7.0),
                )),
            ),
        ]
    }

    /// Scalar columns of every numeric type, a fixed-size list of bytes, a list of floats
    /// (whose item `null_at` is null, if any) and a label `y`, in row groups of 100 rows of
    /// pages of 16 rows, in the writer's `style` (see [`STYLES`]).
    fn write_styled(path: &Path, rows: usize, null_at: Option<usize>, style: Style) {
        let n = rows as i64;
        let byte = |i: i64| (i * 37 % 256) as u8;
        let items: Vec<Option<Vec<Option<f32>>>> = (0..n)
            .map(|i| {
                let item = |k: i64| Some(i as f32 * 0.5 - k as f32);
                let row = vec![
                    item(0),
                    if null_at == Some(i as usize) {
                        None
                    } else {
                        item(1)
                    },
                ];
                Some(row)
            })
            .collect();
        let px: Vec<u8> = (0..3 * n).map(byte).collect();
        let mut columns = scalar_columns(n);
        columns.extend::<Vec<(&str, ArrayRef)>>(vec![
            (
                "px",
                Arc::new(FixedSizeListArray::new(
                    Arc::new(Field::new("item", DataType::UInt8, false)),
                    3,
                    Arc::new(UInt8Array::from(px)),
                    None,
                )),
            ),
            (
                "list",
                Arc::new(ListArray::from_iter_primitive::<Float32Type, _, _>(items)),
            ),
            (
                "y",
                Arc::new(Int64Array::from_iter_values((0..n).map(|i| i % 10))),
            ),
        ]);
        let fields: Vec<Field> = columns
            .iter()
            .map(|(name, a)| Field::new(*name, a.data_type().clone(), true))
            .collect();
        let schema = Arc::new(Schema::new(fields));
        let batch = RecordBatch::try_new(
            schema.clone(),
            columns.into_iter().map(|(_, a)| a).collect(),
        )
        .unwrap();
        let props = WriterProperties::builder()
            .set_max_row_group_row_count(Some(100))
            .set_data_page_row_count_limit(16)
            .set_write_batch_size(16)
            .set_dictionary_enabled(style.dictionary)
            .set_dictionary_page_size_limit(style.dictionary_bytes)
            .set_writer_version(style.version)
            .set_compression(style.compression)
            // Plain where there is no dictionary (the delta encodings of v2 are Arrow's).
            .set_encoding(Encoding::PLAIN)
            .build();
        let file = std::fs::File::create(path).unwrap();
        let mut w = ArrowWriter::try_new(file, schema, Some(props)).unwrap();
        w.write(&batch).unwrap();
        w.close().unwrap();
    }

    /// How a test file's pages are written.
    #[derive(Clone, Copy, Debug)]
    struct Style {
        dictionary: bool,
        /// Past this size a column's dictionary stops growing and its later pages are plain.
        dictionary_bytes: usize,
        version: WriterVersion,
        compression: Compression,
    }

    /// Dictionary pages v1 (as most writers), plain pages v2, and dictionaries that overflow
    /// mid-column into plain pages.
    const STYLES: [Style; 3] = [
        Style {
            dictionary: true,
            dictionary_bytes: 1 << 20,
            version: WriterVersion::PARQUET_1_0,
            compression: Compression::SNAPPY,
        },
        Style {
            dictionary: false,
            dictionary_bytes: 1 << 20,
            version: WriterVersion::PARQUET_2_0,
            compression: Compression::UNCOMPRESSED,
        },
        Style {
            dictionary: true,
            dictionary_bytes: 64,
            version: WriterVersion::PARQUET_2_0,
            compression: Compression::LZ4_RAW,
        },
    ];

    fn write(path: &Path, rows: usize, null_at: Option<usize>) {
        write_styled(path, rows, null_at, STYLES[0]);
    }

    const FEATURES: [&str; 12] = [
        "i8", "i16", "u8", "u16", "u32", "i32", "i64", "u64", "f32", "f64", "px", "list",
    ];

    fn converter() -> Converter {
        let names: Vec<String> = FEATURES.iter().map(|s| s.to_string()).collect();
        Converter::new(&names, Some("y"), LabelKind::Classes(10), Some(255.0), 15)
    }

    /// The rows of `p` through Arrow (as the converter always read them).
    fn through_arrow(c: &Converter, p: &Partition) -> Rows {
        let mut reader =
            ringflow_core::data::partition::PartitionReader::open(p, &c.columns()).unwrap();
        let mut all = Rows::default();
        while let Some((batch, first)) = reader.next_batch().unwrap() {
            let r = c.convert(&batch, &p.path, first).unwrap();
            all.features.extend(r.features);
            all.labels.extend(r.labels);
            all.rows += r.rows;
        }
        all
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    #[test]
    fn direct_rows_are_bit_exact_with_arrow_for_every_numeric_type() {
        for style in STYLES {
            bit_exact_with_arrow(style);
        }
    }

    fn bit_exact_with_arrow(style: Style) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d.parquet");
        write_styled(&path, 250, None, style);
        let c = converter();
        // Part of a row group, read in chunks that cross its pages.
        let p = Partition {
            path: path.display().to_string(),
            row_group: 1,
            row_offset: 13,
            row_count: 77,
            file_row_start: 100,
            query_rows: None,
        };
        let mut direct = c.open_direct(&path, &p).expect("plain data reads directly");
        let (mut got, mut chunk) = (Rows::default(), Rows::default());
        let mut left = 77;
        while left > 0 {
            let n = left.min(9);
            assert!(
                direct.read(&c, n, &mut chunk),
                "{n} rows of {left}, {style:?}"
            );
            assert_eq!((chunk.rows, chunk.features.len()), (n, 15 * n));
            got.features.extend_from_slice(&chunk.features);
            got.labels.extend_from_slice(&chunk.labels);
            left -= n;
        }
        let want = through_arrow(&c, &p);
        assert_eq!(want.rows, 77);
        assert_eq!(bits(&got.features), bits(&want.features), "{style:?}");
        assert_eq!(bits(&got.labels), bits(&want.labels));
        // Nothing is left of the partition's rows in the row group but the rest of it.
        assert!(direct.read(&c, 10, &mut chunk));
        assert!(!direct.read(&c, 11, &mut chunk), "past the row group");
    }

    #[test]
    fn rows_that_are_not_plain_data_are_left_to_arrow() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d.parquet");
        write(&path, 100, Some(40));
        let c = converter();
        let p = Partition {
            path: path.display().to_string(),
            row_group: 0,
            row_offset: 0,
            row_count: 100,
            file_row_start: 0,
            query_rows: None,
        };
        let mut direct = c.open_direct(&path, &p).unwrap();
        let mut chunk = Rows::default();
        // Pages are taken whole: the page of rows 32–47 holds a null at row 40.
        assert!(direct.read(&c, 32, &mut chunk));
        assert!(!direct.read(&c, 10, &mut chunk), "row 40 holds a null");
        // A label out of range, a model of another width, string classes: no direct read.
        let narrow = Converter::new(&["u8".into()], Some("y"), LabelKind::Classes(5), None, 1);
        let mut direct = narrow.open_direct(&path, &p).unwrap();
        assert!(direct.read(&narrow, 5, &mut chunk));
        assert!(!direct.read(&narrow, 1, &mut chunk), "label 5 of 5 classes");
        let wide = Converter::new(&["u8".into()], Some("y"), LabelKind::Classes(10), None, 2);
        assert!(
            !wide
                .open_direct(&path, &p)
                .unwrap()
                .read(&wide, 5, &mut chunk)
        );
        let missing = Converter::new(&["nope".into()], None, LabelKind::Regression, None, 1);
        assert!(missing.open_direct(&path, &p).is_none());
        let beyond = Partition {
            row_count: 101,
            ..p.clone()
        };
        assert!(c.open_direct(&path, &beyond).is_none());
    }

    /// Every row until the end or the first error, as the read-ahead hands them over.
    fn drain(c: &Converter, partitions: &[Partition], direct: bool) -> (Vec<u32>, Option<String>) {
        let read = crate::data::partitions::ReadContext {
            columns: c.columns(),
            direct,
            ..crate::data::batches::tests::read_context()
        };
        drain_with(c, partitions, read)
    }

    /// [`drain`] with the given reading context.
    fn drain_with(
        c: &Converter,
        partitions: &[Partition],
        read: crate::data::partitions::ReadContext,
    ) -> (Vec<u32>, Option<String>) {
        let mut r = ReadAhead::start_in_chunks_of_7(partitions, c, read);
        let mut got = Vec::new();
        loop {
            match r.next_chunk(std::time::Duration::from_secs(60)) {
                Ok(Some(rows)) => got.extend(bits(&rows.features)),
                Ok(None) => return (got, None),
                Err(e) => return (got, Some(e.to_string())),
            }
        }
    }

    /// One whole-row-group partition per row group of a file of `rows` rows written by
    /// [`write`] (row groups of 100).
    fn row_groups(path: &Path, rows: u64) -> Vec<Partition> {
        (0..rows.div_ceil(100))
            .map(|g| Partition {
                path: path.display().to_string(),
                row_group: g as u32,
                row_offset: 0,
                row_count: (rows - 100 * g).min(100),
                file_row_start: 100 * g,
                query_rows: None,
            })
            .collect()
    }

    /// A file of `rows` rows with a null in row 170, and its row groups as partitions.
    fn file_with_a_null(rows: u64) -> (tempfile::TempDir, std::path::PathBuf, Vec<Partition>) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("d.parquet");
        write(&path, rows as usize, Some(170));
        let partitions = row_groups(&path, rows);
        (dir, path, partitions)
    }

    #[test]
    fn plain_row_groups_bypass_the_cache_and_irregular_ones_fill_it() {
        let (_dir, path, partitions) = file_with_a_null(200);
        let c = converter();
        let cache = crate::data::cache::RowGroupCache::new(1 << 30);
        let read = crate::data::partitions::ReadContext {
            columns: c.columns(),
            cache: cache.clone(),
            ..crate::data::batches::tests::read_context()
        };
        let (_, error) = drain_with(&c, &partitions, read);
        assert!(error.is_some_and(|e| e.contains("row 170")));
        // Row group 0 was read from its pages, row group 1 (a null in row 170) through Arrow.
        let file = path.display().to_string();
        assert!(
            cache.get(&file, 0).is_none(),
            "a plain row group is not cached"
        );
        assert!(cache.get(&file, 1).is_some(), "the irregular row group is");
    }

    #[test]
    fn the_read_ahead_gives_what_arrow_gives_up_to_the_same_error() {
        let (_dir, path, partitions) = file_with_a_null(250);
        let c = converter();
        let (want, want_error) = drain(&c, &partitions, false);
        let (got, error) = drain(&c, &partitions, true);
        // The same rows up to the chunk that holds row 170 (chunks end at other rows on the
        // two paths: the direct one cuts them at the plan's batch edges, 168 here).
        assert_eq!((got.len(), want.len()), (168 * 15, 170 * 15));
        assert!(want.starts_with(&got));
        let error = error.expect("row 170 holds a null");
        assert_eq!(Some(&error), want_error.as_ref());
        assert!(error.contains("column `list` row 170"), "{error}");
        // Without the null, every row of both paths.
        write(&path, 250, None);
        let (want, _) = drain(&c, &partitions, false);
        assert_eq!(drain(&c, &partitions, true), (want, None));
    }
}
