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
    use ringflow_core::data::stats::Normalization;
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
        singletons_from: None,
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

/// A column of each numeric type with the values of `ints` (as that type), alone — the
/// contiguous path — and beside a scalar column — the strided path — as a scalar, a fixed-size
/// list and a list of 3: every value converts exactly as Arrow's cast to f32 times `1 / scale`.
#[test]
fn every_numeric_type_converts_bit_exactly_alone_and_beside_others() {
    use datafusion::arrow::array::{Int16Array, LargeListArray, UInt16Array, UInt32Array};
    use datafusion::arrow::buffer::OffsetBuffer;
    use datafusion::arrow::compute::cast;
    let ints: Vec<i64> = vec![0, 1, 7, 100, 127, 255];
    let values: Vec<ArrayRef> = vec![
        Arc::new(UInt8Array::from_iter_values(ints.iter().map(|&v| v as u8))),
        Arc::new(Int8Array::from_iter_values(ints.iter().map(|&v| v as i8))),
        Arc::new(Int16Array::from_iter_values(
            ints.iter().map(|&v| -v as i16),
        )),
        Arc::new(UInt16Array::from_iter_values(
            ints.iter().map(|&v| v as u16 * 257),
        )),
        Arc::new(Int32Array::from_iter_values(
            ints.iter().map(|&v| v as i32 * 8_388_609),
        )),
        Arc::new(UInt32Array::from_iter_values(
            ints.iter().map(|&v| v as u32 * 16_777_219),
        )),
        Arc::new(Int64Array::from_iter_values(
            ints.iter().map(|&v| (1 << 53) + v),
        )),
        Arc::new(UInt64Array::from_iter_values(
            ints.iter().map(|&v| u64::MAX - v as u64),
        )),
        Arc::new(Float16Array::from_iter_values(
            ints.iter().map(|&v| half::f16::from_f32(v as f32 / 3.0)),
        )),
        Arc::new(Float32Array::from_iter_values(
            ints.iter().map(|&v| v as f32 / 3.0),
        )),
        Arc::new(Float64Array::from_iter_values(
            ints.iter().map(|&v| v as f64 / 3.0 + 1e-9),
        )),
    ];
    for scale in [None, Some(255.0f32), Some(3.0)] {
        let mul = scale.map_or(1.0, |s| 1.0 / s);
        for v in &values {
            let t = v.data_type().clone();
            let want: Vec<f32> = cast(v, &DataType::Float32)
                .unwrap()
                .as_primitive::<Float32Type>()
                .values()
                .iter()
                .map(|x| x * mul)
                .collect();
            let item = Arc::new(Field::new("item", t.clone(), false));
            let fixed: ArrayRef =
                Arc::new(FixedSizeListArray::new(item.clone(), 3, v.clone(), None));
            let list: ArrayRef = Arc::new(ListArray::new(
                item.clone(),
                OffsetBuffer::from_lengths([3, 3]),
                v.clone(),
                None,
            ));
            let large: ArrayRef = Arc::new(LargeListArray::new(
                item,
                OffsetBuffer::from_lengths([3, 3]),
                v.clone(),
                None,
            ));
            let bits = |x: &[f32]| x.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            // Alone: a scalar of 6 rows, then lists of 2 rows of 3.
            let b = batch(vec![
                ("x", v.clone()),
                ("y", Arc::new(Int64Array::from(vec![0; 6]))),
            ]);
            let got = conv(&["x"], LabelKind::Regression, scale, 1).convert(&b, "t", 0);
            assert_eq!(
                bits(&got.unwrap().features),
                bits(&want),
                "{t} scalar, {scale:?}"
            );
            for (kind, col) in [("fixed", &fixed), ("list", &list), ("large list", &large)] {
                let b = batch(vec![
                    ("x", col.clone()),
                    ("s", Arc::new(Float32Array::from(vec![-1.0, -2.0]))),
                    ("y", Arc::new(Int64Array::from(vec![0, 0]))),
                ]);
                let alone = conv(&["x"], LabelKind::Regression, scale, 3).convert(&b, "t", 0);
                assert_eq!(bits(&alone.unwrap().features), bits(&want), "{t} {kind}");
                let beside = conv(&["s", "x"], LabelKind::Regression, scale, 4);
                let mut expect = vec![-mul];
                expect.extend(&want[..3]);
                expect.push(-2.0 * mul);
                expect.extend(&want[3..]);
                let got = beside.convert(&b, "t", 0).unwrap().features;
                assert_eq!(bits(&got), bits(&expect), "{t} {kind} beside a scalar");
            }
        }
    }
}

/// Integers are not checked for infinities, unless the scale is small enough to overflow f32.
#[test]
fn integers_scaled_past_f32_are_refused() {
    let b = batch(vec![
        ("x", Arc::new(UInt8Array::from(vec![1, 200]))),
        ("y", Arc::new(Int32Array::from(vec![0, 1]))),
    ]);
    let ok = conv(&["x"], LabelKind::Regression, Some(1e-36), 1).convert(&b, "t", 0);
    assert_eq!(ok.unwrap().features, vec![1e36, 200.0 * 1e36]);
    let msg = error(&conv(&["x"], LabelKind::Regression, Some(1e-38), 1), &b);
    assert!(
        msg.contains("data/t.parquet") && msg.contains("`x` row 101") && msg.contains("not finite"),
        "{msg}"
    );
    let fixed = fixed_u8(&[[1, 2, 3], [4, 250, 6]]);
    let b = batch(vec![
        ("p", fixed),
        ("y", Arc::new(Int32Array::from(vec![0, 1]))),
    ]);
    let msg = error(&conv(&["p"], LabelKind::Regression, Some(1e-37), 3), &b);
    assert!(
        msg.contains("`p` row 101") && msg.contains("element 1"),
        "{msg}"
    );
}

/// A null in a fixed-size list of bytes, or a null row of one, names the file, column and row.
#[test]
fn nulls_in_byte_lists_name_file_column_and_row() {
    use datafusion::arrow::buffer::NullBuffer;
    let item = Arc::new(Field::new("item", DataType::UInt8, true));
    let pixels = UInt8Array::from(vec![Some(1), Some(2), Some(3), Some(4), None, Some(6)]);
    let b = batch(vec![
        (
            "p",
            Arc::new(FixedSizeListArray::new(
                item.clone(),
                3,
                Arc::new(pixels),
                None,
            )),
        ),
        ("y", Arc::new(Int32Array::from(vec![0, 1]))),
    ]);
    let msg = error(&conv(&["p"], LabelKind::Regression, None, 3), &b);
    assert!(
        msg.contains("data/t.parquet") && msg.contains("`p` row 101") && msg.contains("element 1"),
        "{msg}"
    );
    let rows = FixedSizeListArray::new(
        item,
        3,
        Arc::new(UInt8Array::from(vec![1, 2, 3, 4, 5, 6])),
        Some(NullBuffer::from(vec![true, false])),
    );
    let b = batch(vec![
        ("p", Arc::new(rows)),
        ("y", Arc::new(Int32Array::from(vec![0, 1]))),
    ]);
    let msg = error(&conv(&["p"], LabelKind::Regression, None, 3), &b);
    assert!(msg.contains("`p` row 101") && msg.contains("null"), "{msg}");
}
