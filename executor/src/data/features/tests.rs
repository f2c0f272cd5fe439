//! Tests of the converter from record batches to features and labels.

use std::sync::Arc;

use datafusion::arrow::array::{
    FixedSizeListArray, Float16Array, Float32Array, Float64Array, Int8Array, Int32Array,
    Int64Array, ListArray, StringArray, UInt8Array, UInt64Array,
};
use datafusion::arrow::datatypes::{Field, Schema};

use super::*;

fn batch(columns: Vec<(&str, ArrayRef)>) -> RecordBatch {
    let fields: Vec<Field> = columns
        .iter()
        .map(|(n, a)| Field::new(*n, a.data_type().clone(), true))
        .collect();
    RecordBatch::try_new(
        Arc::new(Schema::new(fields)),
        columns.into_iter().map(|(_, a)| a).collect(),
    )
    .unwrap()
}

fn conv(features: &[&str], kind: LabelKind, scale: Option<f32>, inputs: usize) -> Converter {
    let f: Vec<String> = features.iter().map(|s| s.to_string()).collect();
    Converter::new(&f, Some("y"), kind, scale, inputs)
}

fn fixed_u8(rows: &[[u8; 3]]) -> ArrayRef {
    let values: Vec<u8> = rows.iter().flatten().copied().collect();
    Arc::new(FixedSizeListArray::new(
        Arc::new(Field::new("item", DataType::UInt8, false)),
        3,
        Arc::new(UInt8Array::from(values)),
        None,
    ))
}

#[test]
fn columns_of_every_kind_concatenate_in_order_and_scale() {
    let list = ListArray::from_iter_primitive::<Float32Type, _, _>(vec![
        Some(vec![Some(1.0), Some(2.0)]),
        Some(vec![Some(3.0), Some(4.0)]),
    ]);
    let b = batch(vec![
        ("i8", Arc::new(Int8Array::from(vec![-1, 2]))),
        ("u64", Arc::new(UInt64Array::from(vec![10, 20]))),
        (
            "f16",
            Arc::new(Float16Array::from(vec![
                half::f16::from_f32(0.5),
                half::f16::from_f32(1.5),
            ])),
        ),
        ("f64", Arc::new(Float64Array::from(vec![0.25, -0.75]))),
        ("fixed", fixed_u8(&[[1, 2, 3], [4, 5, 6]])),
        ("list", Arc::new(list)),
        ("y", Arc::new(Int64Array::from(vec![0, 2]))),
    ]);
    let c = conv(
        &["fixed", "i8", "u64", "f16", "f64", "list"],
        LabelKind::Classes(3),
        Some(2.0),
        9,
    );
    let rows = c.convert(&b, "t.parquet", 0).unwrap();
    assert_eq!(rows.rows, 2);
    assert_eq!(
        rows.features,
        vec![
            0.5, 1.0, 1.5, -0.5, 5.0, 0.25, 0.125, 0.5, 1.0, //
            2.0, 2.5, 3.0, 1.0, 10.0, 0.75, -0.375, 1.5, 2.0
        ]
    );
    assert_eq!(rows.labels, vec![0.0, 2.0]);
}

fn error(c: &Converter, b: &RecordBatch) -> String {
    c.convert(b, "data/t.parquet", 100).unwrap_err().to_string()
}

#[test]
fn nulls_name_file_column_and_row() {
    let b = batch(vec![
        ("x", Arc::new(Float32Array::from(vec![Some(1.0), None]))),
        ("y", Arc::new(Int32Array::from(vec![0, 1]))),
    ]);
    let msg = error(&conv(&["x"], LabelKind::Classes(2), None, 1), &b);
    assert!(
        msg.contains("data/t.parquet") && msg.contains("`x`") && msg.contains("row 101"),
        "{msg}"
    );
    assert!(msg.contains("null"), "{msg}");

    let list = ListArray::from_iter_primitive::<Float32Type, _, _>(vec![
        Some(vec![Some(1.0), Some(2.0)]),
        Some(vec![Some(3.0), None]),
    ]);
    let b = batch(vec![
        ("v", Arc::new(list)),
        ("y", Arc::new(Int32Array::from(vec![0, 1]))),
    ]);
    let msg = error(&conv(&["v"], LabelKind::Classes(2), None, 2), &b);
    assert!(
        msg.contains("`v` row 101") && msg.contains("element 1"),
        "{msg}"
    );

    let b = batch(vec![
        ("x", Arc::new(Float32Array::from(vec![1.0, 2.0]))),
        ("y", Arc::new(Int32Array::from(vec![Some(0), None]))),
    ]);
    let msg = error(&conv(&["x"], LabelKind::Classes(2), None, 1), &b);
    assert!(
        msg.contains("`y` row 101") && msg.contains("label is null"),
        "{msg}"
    );
}

#[test]
fn non_finite_values_are_refused() {
    let b = batch(vec![
        ("x", Arc::new(Float64Array::from(vec![1.0, f64::NAN, 3.0]))),
        ("y", Arc::new(Int32Array::from(vec![0, 1, 0]))),
    ]);
    let msg = error(&conv(&["x"], LabelKind::Classes(2), None, 1), &b);
    assert!(
        msg.contains("`x` row 101") && msg.contains("not finite"),
        "{msg}"
    );
    let b = batch(vec![
        ("x", Arc::new(Float64Array::from(vec![1.0, 2.0]))),
        ("y", Arc::new(Float64Array::from(vec![0.5, f64::INFINITY]))),
    ]);
    let msg = error(&conv(&["x"], LabelKind::Regression, None, 1), &b);
    assert!(msg.contains("`y` row 101"), "{msg}");
}

#[test]
fn string_labels_map_to_classes_and_features_are_standardized() {
    use ringflow_proto::data::stats::Normalization;
    let b = batch(vec![
        ("x", Arc::new(Float32Array::from(vec![1.0, 3.0, 5.0]))),
        (
            "y",
            Arc::new(datafusion::arrow::array::StringArray::from(vec![
                "b", "a", "b",
            ])),
        ),
    ]);
    let p = Preprocessing {
        normalize: Some(Normalization {
            mean: vec![3.0],
            std: vec![2.0],
        }),
        classes: Some(vec!["a".into(), "b".into()]),
        vocabulary: None,
    };
    let c = conv(&["x"], LabelKind::Classes(2), None, 1)
        .with_preprocessing(&p)
        .unwrap();
    let rows = c.convert(&b, "f.parquet", 0).unwrap();
    assert_eq!(rows.features, [-1.0, 0.0, 1.0]);
    assert_eq!(rows.labels, [1.0, 0.0, 1.0]);
    let raw = c.features_only().convert(&b, "f.parquet", 0).unwrap();
    assert_eq!(raw.features, [1.0, 3.0, 5.0]);
    let other = Preprocessing {
        classes: Some(vec!["a".into(), "c".into()]),
        ..Preprocessing::default()
    };
    let c = conv(&["x"], LabelKind::Classes(2), None, 1)
        .with_preprocessing(&other)
        .unwrap();
    let msg = error(&c, &b);
    assert!(
        msg.contains("row 100")
            && msg.contains("label \"b\" is not one of the classes (\"a\", \"c\")"),
        "{msg}"
    );
    let three = Preprocessing {
        classes: Some(vec!["a".into(), "b".into(), "c".into()]),
        ..Preprocessing::default()
    };
    let e = conv(&["x"], LabelKind::Classes(2), None, 1)
        .with_preprocessing(&three)
        .unwrap_err();
    assert!(e.to_string().contains("3 classes"), "{e}");
    let msg = error(&conv(&["x"], LabelKind::Classes(2), None, 1), &b);
    assert!(msg.contains("holds strings"), "{msg}");
}

#[test]
fn labels_must_fit_the_model() {
    let b = batch(vec![
        ("x", Arc::new(Float32Array::from(vec![1.0, 2.0, 3.0]))),
        ("y", Arc::new(Int64Array::from(vec![0, 9, 10]))),
    ]);
    let msg = error(&conv(&["x"], LabelKind::Classes(10), None, 1), &b);
    assert!(
        msg.contains("`y` row 102") && msg.contains("label 10"),
        "{msg}"
    );
    let b = batch(vec![
        ("x", Arc::new(Float32Array::from(vec![1.0]))),
        ("y", Arc::new(Float32Array::from(vec![1.5]))),
    ]);
    let msg = error(&conv(&["x"], LabelKind::Classes(3), None, 1), &b);
    assert!(msg.contains("label 1.5"), "{msg}");
    let msg = error(&conv(&["x"], LabelKind::Binary, None, 1), &b);
    assert!(msg.contains("[0, 1]"), "{msg}");
}

/// A list column's rows must make `data.shape`: the error names the shape, the file, the
/// row and both counts.
#[test]
fn rows_that_do_not_make_the_shape_are_named() {
    let list = ListArray::from_iter_primitive::<Float32Type, _, _>(vec![
        Some(vec![Some(1.0); 5]),
        Some(vec![Some(2.0); 5]),
    ]);
    let b = batch(vec![
        ("v", Arc::new(list)),
        ("y", Arc::new(Int32Array::from(vec![0, 1]))),
    ]);
    let c = conv(&["v"], LabelKind::Classes(2), None, 6).with_shape(Some(vec![1, 2, 3]));
    assert_eq!(
        error(&c, &b),
        "data/t.parquet: data.shape [1, 2, 3] needs 6 values per row, but row 100 has 5 \
         (`v`: 5)"
    );
    let fits = conv(&["v"], LabelKind::Classes(2), None, 5).with_shape(Some(vec![5]));
    assert_eq!(fits.convert(&b, "t", 0).unwrap().features.len(), 10);
}

#[test]
fn wrong_types_widths_and_missing_columns() {
    let b = batch(vec![
        ("s", Arc::new(StringArray::from(vec!["a"]))),
        ("x", Arc::new(Float32Array::from(vec![1.0]))),
        ("y", Arc::new(Int32Array::from(vec![0]))),
    ]);
    let msg = error(&conv(&["s"], LabelKind::Classes(2), None, 1), &b);
    assert!(msg.contains("`s`") && msg.contains("Utf8"), "{msg}");
    let msg = error(&conv(&["x"], LabelKind::Classes(2), None, 5), &b);
    assert!(
        msg.contains("1 values per row") && msg.contains("5 inputs"),
        "{msg}"
    );
    let msg = error(&conv(&["nope"], LabelKind::Classes(2), None, 1), &b);
    assert!(msg.contains("`nope`") && msg.contains("missing"), "{msg}");
    let list = ListArray::from_iter_primitive::<Float32Type, _, _>(vec![
        Some(vec![Some(1.0), Some(2.0)]),
        Some(vec![Some(3.0)]),
    ]);
    let b = batch(vec![
        ("v", Arc::new(list)),
        ("y", Arc::new(Int32Array::from(vec![0, 1]))),
    ]);
    let msg = error(&conv(&["v"], LabelKind::Classes(2), None, 2), &b);
    assert!(
        msg.contains("row 101") && msg.contains("same length"),
        "{msg}"
    );
}
