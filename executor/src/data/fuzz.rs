//! Fuzz target of the Parquet → tensor conversion: random Arrow schemas (every numeric type,
//! fixed-size and variable lists of them, nullable or not), random nulls, NaNs, infinities,
//! list lengths that differ between rows and random row-group layouts, written to a real
//! Parquet file and read back through the executor's partitions, row-group cache and
//! [`Converter`]: exactly the tensors computed here from the values written, or an error that
//! names the file, the column and a row that really holds what it says.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use datafusion::arrow::array::{
    ArrayRef, FixedSizeListArray, LargeListArray, ListArray, PrimitiveArray,
};
use datafusion::arrow::buffer::{NullBuffer, OffsetBuffer};
use datafusion::arrow::datatypes::{
    ArrowPrimitiveType, DataType, Field, Float16Type, Float32Type, Float64Type, Int8Type,
    Int16Type, Int32Type, Int64Type, Schema, UInt8Type, UInt16Type, UInt32Type, UInt64Type,
};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::parquet::arrow::ArrowWriter;
use datafusion::parquet::file::properties::{WriterProperties, WriterVersion};
use proptest::prelude::*;
use proptest::test_runner::TestRunner;
use ringflow_core::pb::Partition;

use crate::data::cache::RowGroupCache;
use crate::data::features::{Converter, LabelKind};
use crate::data::partitions::ReadContext;
use crate::data::read_ahead::ReadAhead;
use crate::data::rows::Rows;
use crate::fuzz::config;

/// A value as written: the type decides how it is stored.
#[derive(Clone, Copy, Debug)]
enum Val {
    I(i64),
    U(u64),
    F(f64),
}

const TYPES: &[DataType] = &[
    DataType::Int8,
    DataType::Int16,
    DataType::Int32,
    DataType::Int64,
    DataType::UInt8,
    DataType::UInt16,
    DataType::UInt32,
    DataType::UInt64,
    DataType::Float16,
    DataType::Float32,
    DataType::Float64,
];

/// The f32 a feature or label holds for `v` stored as `t`: the stored value, rounded once to
/// f32 (integers and f64) or exactly (f16, f32).
fn expected(t: &DataType, v: Val) -> f32 {
    match (t, v) {
        (DataType::Float16, Val::F(x)) => half::f16::from_f64(x).to_f32(),
        (DataType::Float32 | DataType::Float64, Val::F(x)) => x as f32,
        (_, Val::I(x)) => x as f32,
        (_, Val::U(x)) => x as f32,
        (_, Val::F(_)) => unreachable!("floats are generated for float types only"),
    }
}

/// A value of type `t`, biased to the edges of its range; NaNs and infinities for floats.
fn val(t: &DataType) -> BoxedStrategy<Val> {
    let ints = |lo: i64, hi: i64| {
        let small = (-3i64..10).prop_map(move |x| x.clamp(lo, hi));
        prop_oneof![Just(lo), Just(hi), Just(0), small, lo..=hi]
            .prop_map(Val::I)
            .boxed()
    };
    match t {
        DataType::Int8 => ints(i8::MIN.into(), i8::MAX.into()),
        DataType::Int16 => ints(i16::MIN.into(), i16::MAX.into()),
        DataType::Int32 => ints(i32::MIN.into(), i32::MAX.into()),
        DataType::Int64 => ints(i64::MIN, i64::MAX),
        DataType::UInt8 => ints(0, u8::MAX.into()),
        DataType::UInt16 => ints(0, u16::MAX.into()),
        DataType::UInt32 => ints(0, u32::MAX.into()),
        DataType::UInt64 => prop_oneof![Just(u64::MAX), 0u64..10, any::<u64>()]
            .prop_map(Val::U)
            .boxed(),
        _ => prop_oneof![
            8 => -100.0f64..100.0,
            1 => Just(f64::NAN),
            1 => Just(f64::INFINITY),
            1 => Just(f64::NEG_INFINITY),
            1 => Just(1e39),
            1 => Just(70000.0),
            1 => any::<f64>(),
        ]
        .prop_map(Val::F)
        .boxed(),
    }
}

/// How a feature column holds its values.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Shape {
    Scalar,
    Fixed(usize),
    List(usize),
    LargeList(usize),
}

impl Shape {
    fn width(self) -> usize {
        match self {
            Shape::Scalar => 1,
            Shape::Fixed(w) | Shape::List(w) | Shape::LargeList(w) => w,
        }
    }
}

/// A row of a column: null, or its elements (each perhaps null).
type Cell = Option<Vec<Option<Val>>>;

#[derive(Clone, Debug)]
struct Column {
    name: String,
    shape: Shape,
    element: DataType,
    cells: Vec<Cell>,
}

/// `good`, or with `defects` now and then `bad`.
fn sometimes<T: std::fmt::Debug + 'static>(
    defects: bool,
    good: impl Strategy<Value = T> + 'static,
    bad: impl Strategy<Value = T> + 'static,
) -> BoxedStrategy<T> {
    match defects {
        true => prop_oneof![30 => good, 1 => bad].boxed(),
        false => good.boxed(),
    }
}

/// `rows` cells of `shape`: mostly complete rows of the nominal width, some null rows, null
/// elements, and (for variable lists) rows of another length.
fn cells(shape: Shape, t: &DataType, rows: usize, defects: bool) -> BoxedStrategy<Vec<Cell>> {
    let w = shape.width();
    let variable = matches!(shape, Shape::List(_) | Shape::LargeList(_));
    let element = sometimes(defects, val(t).prop_map(Some), Just(None));
    let len = sometimes(defects && variable, Just(w), 0..w + 3);
    let row = len.prop_flat_map(move |n| prop::collection::vec(element.clone(), n));
    let cell = sometimes(defects, row.prop_map(Some), Just(None));
    prop::collection::vec(cell, rows).boxed()
}

fn column(name: String, rows: usize, defects: bool) -> BoxedStrategy<Column> {
    let shape = prop_oneof![
        3 => Just(Shape::Scalar),
        1 => (0usize..4).prop_map(Shape::Fixed),
        1 => (0usize..4).prop_map(Shape::List),
        1 => (0usize..4).prop_map(Shape::LargeList),
    ];
    (shape, prop::sample::select(TYPES))
        .prop_flat_map(move |(shape, element)| {
            let name = name.clone();
            cells(shape, &element, rows, defects).prop_map(move |cells| Column {
                name: name.clone(),
                shape,
                element: element.clone(),
                cells,
            })
        })
        .boxed()
}

/// One generated data set and how it is read.
#[derive(Clone, Debug)]
struct Case {
    features: Vec<Column>,
    label: Column,
    kind: LabelKind,
    scale: Option<f32>,
    group_rows: usize,
    /// Cut points inside each row group (fractions), making several partitions of one group.
    cuts: Vec<prop::sample::Index>,
    cache: bool,
    /// Read through the read-ahead, whose direct reader decodes the pages itself, instead of
    /// through Arrow alone.
    direct: bool,
    /// How the pages are written: rows per page, dictionary encoding, data pages v2.
    pages: (usize, bool, bool),
}

/// A label column of `kind`: with `defects`, some bad values (mostly just outside the kind's
/// range) and, half the time, nulls (which the converter reports first).
fn label(rows: usize, kind: LabelKind, defects: bool) -> BoxedStrategy<Column> {
    let types = prop::sample::select(vec![
        DataType::Int32,
        DataType::Int64,
        DataType::UInt8,
        DataType::Float32,
        DataType::Float64,
    ]);
    (types, any::<bool>())
        .prop_flat_map(move |(t, nulls)| {
            let good = match (kind, t.is_floating()) {
                (LabelKind::Classes(n), false) => (0..n as i64).prop_map(Val::I).boxed(),
                (LabelKind::Classes(n), true) => (0..n).prop_map(|c| Val::F(c as f64)).boxed(),
                (LabelKind::Binary, false) => (0i64..2).prop_map(Val::I).boxed(),
                (LabelKind::Binary, true) => (0.0f64..=1.0).prop_map(Val::F).boxed(),
                (LabelKind::Regression, _) => val(&t),
            };
            // Labels just outside the kind's range, where an off-by-one would let them in.
            let edge = match (kind, t.is_floating()) {
                (LabelKind::Classes(n), false) => Just(Val::I(n as i64)).boxed(),
                (LabelKind::Classes(n), true) => prop::sample::select(vec![n as f64, -1.0, 0.5])
                    .prop_map(Val::F)
                    .boxed(),
                (LabelKind::Binary, false) => Just(Val::I(2)).boxed(),
                (LabelKind::Binary, true) => prop::sample::select(vec![1.5, -0.5, 1.0 + 1e-6])
                    .prop_map(Val::F)
                    .boxed(),
                (LabelKind::Regression, _) => val(&t),
            };
            let value = sometimes(defects, good, prop_oneof![1 => val(&t), 3 => edge]);
            let cell = value.prop_map(|v| Some(vec![Some(v)]));
            let cell = sometimes(defects && nulls, cell, Just(None));
            prop::collection::vec(cell, rows).prop_map(move |cells| Column {
                name: "y".into(),
                shape: Shape::Scalar,
                element: t.clone(),
                cells,
            })
        })
        .boxed()
}

fn case() -> impl Strategy<Value = Case> {
    let kind = prop_oneof![
        (1usize..12).prop_map(LabelKind::Classes),
        Just(LabelKind::Binary),
        Just(LabelKind::Regression),
    ];
    let scale = prop_oneof![
        Just(None),
        Just(Some(255.0f32)),
        Just(Some(1e-40)),
        (1e-3f32..1e3).prop_map(Some)
    ];
    // Whether each column (the label last) may hold defects: decided per column, so that many
    // cases have one column's defects alone, which the converter must then find.
    let defects = prop::collection::vec(prop::bool::weighted(0.3), 4);
    (0usize..60, 1usize..4, kind, defects).prop_flat_map(move |(rows, n, kind, defects)| {
        let features: Vec<_> = (0..n)
            .map(|i| column(format!("f{i}"), rows, defects[i]))
            .collect();
        (
            features,
            label(rows, kind, defects[3]),
            Just(kind),
            scale.clone(),
            1usize..50,
            prop::collection::vec(any::<prop::sample::Index>(), 0..3),
            any::<bool>(),
            any::<bool>(),
            (1usize..40, any::<bool>(), any::<bool>()),
        )
            .prop_map(
                |(features, label, kind, scale, group_rows, cuts, cache, direct, pages)| Case {
                    features,
                    label,
                    kind,
                    scale,
                    group_rows,
                    cuts,
                    cache,
                    direct,
                    pages,
                },
            )
    })
}

fn int(v: Val) -> i64 {
    match v {
        Val::I(x) => x,
        Val::U(x) => x as i64,
        Val::F(x) => x as i64,
    }
}

fn float(v: Val) -> f64 {
    match v {
        Val::F(x) => x,
        Val::I(x) => x as f64,
        Val::U(x) => x as f64,
    }
}

fn build<T: ArrowPrimitiveType>(values: &[Option<Val>], f: impl Fn(Val) -> T::Native) -> ArrayRef {
    Arc::new(
        values
            .iter()
            .map(|v| v.map(&f))
            .collect::<PrimitiveArray<T>>(),
    )
}

/// The Arrow array of `values` (`None`: null) stored as `t`.
fn primitive(t: &DataType, values: &[Option<Val>]) -> ArrayRef {
    match t {
        DataType::Int8 => build::<Int8Type>(values, |v| int(v) as i8),
        DataType::Int16 => build::<Int16Type>(values, |v| int(v) as i16),
        DataType::Int32 => build::<Int32Type>(values, |v| int(v) as i32),
        DataType::Int64 => build::<Int64Type>(values, int),
        DataType::UInt8 => build::<UInt8Type>(values, |v| int(v) as u8),
        DataType::UInt16 => build::<UInt16Type>(values, |v| int(v) as u16),
        DataType::UInt32 => build::<UInt32Type>(values, |v| int(v) as u32),
        DataType::UInt64 => build::<UInt64Type>(values, |v| match v {
            Val::U(x) => x,
            other => int(other) as u64,
        }),
        DataType::Float16 => build::<Float16Type>(values, |v| half::f16::from_f64(float(v))),
        DataType::Float32 => build::<Float32Type>(values, |v| float(v) as f32),
        _ => build::<Float64Type>(values, float),
    }
}

/// A column's Arrow array: null rows as list-level nulls, null elements as child nulls.
fn array(c: &Column) -> ArrayRef {
    let valid: Vec<bool> = c.cells.iter().map(Option::is_some).collect();
    let nulls = valid.contains(&false).then(|| NullBuffer::from(valid));
    let item = Arc::new(Field::new("item", c.element.clone(), true));
    let w = c.shape.width();
    let elements = |placeholder: usize| -> Vec<Option<Val>> {
        c.cells
            .iter()
            .flat_map(|cell| match cell {
                Some(e) => e.clone(),
                None => vec![Some(Val::I(0)); placeholder],
            })
            .collect()
    };
    let lengths = || c.cells.iter().map(|cell| cell.as_ref().map_or(0, Vec::len));
    match c.shape {
        Shape::Scalar => primitive(
            &c.element,
            &c.cells
                .iter()
                .map(|cell| cell.as_ref().and_then(|e| e[0]))
                .collect::<Vec<_>>(),
        ),
        Shape::Fixed(_) => {
            let child = primitive(&c.element, &elements(w));
            Arc::new(
                FixedSizeListArray::try_new_with_length(
                    item,
                    w as i32,
                    child,
                    nulls,
                    c.cells.len(),
                )
                .unwrap(),
            )
        }
        Shape::List(_) => {
            let child = primitive(&c.element, &elements(0));
            Arc::new(ListArray::new(
                item,
                OffsetBuffer::from_lengths(lengths()),
                child,
                nulls,
            ))
        }
        Shape::LargeList(_) => {
            let child = primitive(&c.element, &elements(0));
            Arc::new(LargeListArray::new(
                item,
                OffsetBuffer::from_lengths(lengths()),
                child,
                nulls,
            ))
        }
    }
}

/// Writes the case's columns into `path` in row groups of `group_rows`; returns the rows of
/// each row group as the file's footer has them.
fn write(case: &Case, path: &std::path::Path) -> Vec<u64> {
    let columns: Vec<&Column> = case.features.iter().chain([&case.label]).collect();
    let arrays: Vec<ArrayRef> = columns.iter().map(|c| array(c)).collect();
    let fields: Vec<Field> = columns
        .iter()
        .zip(&arrays)
        .map(|(c, a)| Field::new(&c.name, a.data_type().clone(), a.null_count() > 0))
        .collect();
    let schema = Arc::new(Schema::new(fields));
    let batch = RecordBatch::try_new(schema.clone(), arrays).unwrap();
    let (page_rows, dictionary, v2) = case.pages;
    let props = WriterProperties::builder()
        .set_max_row_group_row_count(Some(case.group_rows))
        .set_data_page_row_count_limit(page_rows)
        .set_write_batch_size(page_rows)
        .set_dictionary_enabled(dictionary)
        .set_writer_version(if v2 {
            WriterVersion::PARQUET_2_0
        } else {
            WriterVersion::PARQUET_1_0
        })
        .build();
    let file = std::fs::File::create(path).unwrap();
    let mut w = ArrowWriter::try_new(file, schema, Some(props)).unwrap();
    w.write(&batch).unwrap();
    let meta = w.close().unwrap();
    meta.row_groups()
        .iter()
        .map(|g| g.num_rows() as u64)
        .collect()
}

/// Every row group cut into row ranges at the case's cut points, in file order.
fn partitions(case: &Case, path: &str, groups: &[u64]) -> Vec<Partition> {
    let mut out = Vec::new();
    let mut start = 0;
    for (g, &rows) in groups.iter().enumerate() {
        let mut cuts: Vec<u64> = case
            .cuts
            .iter()
            .map(|c| c.index(rows as usize + 1) as u64)
            .collect();
        cuts.extend([0, rows]);
        cuts.sort_unstable();
        cuts.dedup();
        for r in cuts.windows(2) {
            out.push(Partition {
                path: path.to_string(),
                row_group: g as u32,
                row_offset: r[0],
                row_count: r[1] - r[0],
                file_row_start: start,
                query_rows: None,
            });
        }
        start += rows;
    }
    out
}

/// Reads the partitions through the executor's reader, cache and converter.
fn read(case: &Case, parts: &[Partition]) -> crate::error::Result<Rows> {
    let names: Vec<String> = case.features.iter().map(|c| c.name.clone()).collect();
    let inputs = case.features.iter().map(|c| c.shape.width()).sum();
    let conv = Converter::new(&names, Some("y"), case.kind, case.scale, inputs);
    let ctx = ReadContext {
        columns: conv.columns(),
        prep: None,
        cache: RowGroupCache::new(if case.cache { 1 << 30 } else { 0 }),
        driver: None,
        images: None,
        // Small batches, so that rows cross record batch boundaries.
        batch_rows: 7,
        direct: true,
    };
    if case.direct {
        return read_ahead(&conv, ctx, parts);
    }
    let mut all = Rows::default();
    ctx.for_each_batch(parts, &AtomicBool::new(false), |batch, origin| {
        let r = conv.convert(batch, origin.file, origin.first_row)?;
        all.features.extend(r.features);
        all.labels.extend(r.labels);
        all.rows += r.rows;
        Ok(true)
    })?;
    Ok(all)
}

/// Every row of the partitions as the training loop gets them: through the read-ahead, which
/// reads plain row groups straight from their pages and hands the rest to Arrow.
fn read_ahead(
    conv: &Converter,
    ctx: ReadContext,
    parts: &[Partition],
) -> crate::error::Result<Rows> {
    let mut r = ReadAhead::start_in_chunks_of_7(parts, conv, ctx);
    let mut all = Rows::default();
    while let Some(rows) = r.next_chunk(std::time::Duration::from_secs(60))? {
        all.features.extend_from_slice(&rows.features);
        all.labels.extend_from_slice(&rows.labels);
        all.rows += rows.rows;
        r.recycle(rows);
    }
    Ok(all)
}

/// What is wrong with one cell.
#[derive(Clone, Debug, PartialEq)]
enum Defect {
    /// A null row.
    Null,
    /// Element `j` is null.
    NullElement(usize),
    /// Element `j` is not finite once converted and scaled.
    NotFinite(usize),
    /// The row's list has another length than the column's.
    Length(usize),
    /// The label does not fit the label kind.
    Label,
}

/// The tensors the case must give, computed from the values written, and every defect by
/// `(column, row)`.
fn expectation(case: &Case) -> (Rows, BTreeMap<(String, usize), Vec<Defect>>) {
    let mul = case.scale.map_or(1.0, |s| 1.0 / s);
    let mut rows = Rows::default();
    let mut defects: BTreeMap<(String, usize), Vec<Defect>> = BTreeMap::new();
    let n = case.label.cells.len();
    for r in 0..n {
        for c in &case.features {
            let mut found = Vec::new();
            match &c.cells[r] {
                None => found.push(Defect::Null),
                Some(e) => {
                    if e.len() != c.shape.width() {
                        found.push(Defect::Length(e.len()));
                    }
                    for (j, v) in e.iter().enumerate() {
                        match v {
                            None if c.shape == Shape::Scalar => found.push(Defect::Null),
                            None => found.push(Defect::NullElement(j)),
                            Some(v) => {
                                let x = expected(&c.element, *v) * mul;
                                if !x.is_finite() {
                                    found.push(Defect::NotFinite(j));
                                }
                                rows.features.push(x);
                            }
                        }
                    }
                }
            }
            if !found.is_empty() {
                defects.insert((c.name.clone(), r), found);
            }
        }
        let label = case.label.cells[r].as_ref().and_then(|e| e[0]);
        let y = label.map(|v| expected(&case.label.element, v) as f64);
        let ok = y.is_some_and(|y| match case.kind {
            LabelKind::Classes(k) => y.fract() == 0.0 && y >= 0.0 && y < k as f64,
            LabelKind::Binary => (0.0..=1.0).contains(&y),
            LabelKind::Regression => y.is_finite(),
        });
        match (ok, y) {
            (true, Some(y)) => rows.labels.push(y as f32),
            (false, None) => {
                defects.insert(("y".into(), r), vec![Defect::Null]);
            }
            _ => {
                defects.insert(("y".into(), r), vec![Defect::Label]);
            }
        }
    }
    rows.rows = n;
    (rows, defects)
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// The number after `prefix` in `msg`.
fn number_after(msg: &str, prefix: &str) -> Option<usize> {
    let rest = &msg[msg.find(prefix)? + prefix.len()..];
    rest.split(|c: char| !c.is_ascii_digit())
        .next()?
        .parse()
        .ok()
}

/// The result must be the expected tensors, or an error naming the file and a column and row
/// that really hold what the error says.
fn check(case: &Case, path: &str, result: crate::error::Result<Rows>) -> Result<(), TestCaseError> {
    let (want, defects) = expectation(case);
    let e = match result {
        Ok(got) => {
            prop_assert!(
                defects.is_empty(),
                "converted data with defects: {:?}",
                defects
            );
            prop_assert_eq!(got.rows, want.rows);
            for (what, got, want) in [
                ("feature", &got.features, &want.features),
                ("label", &got.labels, &want.labels),
            ] {
                let at = bits(got).iter().zip(bits(want)).position(|(g, w)| *g != w);
                prop_assert!(
                    at.is_none() && got.len() == want.len(),
                    "{} {:?} differs: got {:?}, want {:?} ({} vs {} values)",
                    what,
                    at,
                    at.map(|i| got[i]),
                    at.map(|i| want[i]),
                    got.len(),
                    want.len()
                );
            }
            return Ok(());
        }
        Err(e) => e,
    };
    let msg = e.to_string();
    prop_assert!(!defects.is_empty(), "refused clean data: {}", msg);
    prop_assert!(
        msg.starts_with(&format!("{path}: ")) && !msg.contains('\n'),
        "{}",
        msg
    );
    if let Some(from) = number_after(&msg, "values per row from row ") {
        let deviates = case.features.iter().any(|c| {
            (from..c.cells.len()).any(|r| {
                defects
                    .get(&(c.name.clone(), r))
                    .is_some_and(|d| d.iter().any(|d| matches!(d, Defect::Length(_))))
            })
        });
        prop_assert!(
            deviates,
            "no list of another length from row {}: {}",
            from,
            msg
        );
        return Ok(());
    }
    let name = msg.split('`').nth(1).unwrap_or_default().to_string();
    let row = number_after(&msg, &format!("`{name}` row "));
    let Some(row) = row else {
        return Err(TestCaseError::fail(format!(
            "no column and row named: {msg}"
        )));
    };
    let what = msg.rsplit("(0-based): ").next().unwrap_or_default();
    if let Some(len) = number_after(what, "the list has ") {
        let earlier = number_after(what, "earlier rows have ").unwrap();
        let column = case.features.iter().find(|c| c.name == name).unwrap();
        let len_of = |r: usize| column.cells[r].as_ref().map(Vec::len);
        prop_assert!(len != earlier && len_of(row) == Some(len), "{}", msg);
        prop_assert!((0..row).any(|r| len_of(r) == Some(earlier)), "{}", msg);
        return Ok(());
    }
    let element = number_after(what, "element ").unwrap_or(0);
    let expect = match what {
        w if w.starts_with("the label is null") || w.starts_with("the value is null") => {
            Defect::Null
        }
        w if w.contains("of the list is null") => Defect::NullElement(element),
        w if w.contains("(not finite)") => Defect::NotFinite(element),
        w if w.starts_with("label ") => Defect::Label,
        _ => return Err(TestCaseError::fail(format!("unexpected refusal: {msg}"))),
    };
    let found = defects
        .get(&(name.clone(), row))
        .cloned()
        .unwrap_or_default();
    prop_assert!(
        found.contains(&expect),
        "column {} row {} holds {:?}, not {:?}: {}",
        name,
        row,
        found,
        expect,
        msg
    );
    Ok(())
}

#[test]
fn fuzz_parquet_to_tensors() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("data.parquet");
    let path = file.display().to_string();
    TestRunner::new(config(512))
        .run(&case(), |case| {
            let groups = write(&case, &file);
            let parts = partitions(&case, &path, &groups);
            check(&case, &path, read(&case, &parts))
        })
        .unwrap();
}
