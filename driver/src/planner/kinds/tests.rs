//! The schema checks of the file kinds: image columns and example shapes against the model.

use std::sync::Arc;

use datafusion::arrow::datatypes::{DataType, Field};

use super::*;

/// A file with a PNG column, a fixed list of 784 bytes, a variable list and a label.
fn schema() -> Schema {
    let item = |t: DataType| Arc::new(Field::new_list_field(t, false));
    Schema::new(vec![
        Field::new("png", DataType::Binary, false),
        Field::new("name", DataType::Utf8, false),
        Field::new(
            "pixels",
            DataType::FixedSizeList(item(DataType::UInt8), 784),
            false,
        ),
        Field::new("v", DataType::List(item(DataType::Float32)), false),
        Field::new("label", DataType::Int64, false),
    ])
}

/// Checks `schema()` against a spec with `data` lines, for `model`.
fn check(data: &str, model: ModelShape) -> Result<LabelType> {
    let text =
        format!("[data]\ntrain = \"t\"\nlabel = \"label\"\n{data}\n[model]\nkind = \"mlp\"\n");
    let spec = JobSpec::parse(&text, "j.toml".as_ref(), &[]).unwrap();
    check_schema("data.train: f.parquet", &schema(), &spec, &model, true)
}

fn image(input: Vec<usize>) -> ModelShape {
    ModelShape {
        input,
        outputs: 10,
        sequence: None,
    }
}

#[test]
fn image_columns_must_hold_bytes_and_fit_the_model() {
    let png = "image = { column = \"png\", size = [28, 28], channels = 1 }";
    assert_eq!(
        check(png, ModelShape::flat(784, 10)).unwrap(),
        LabelType::Number
    );
    assert_eq!(
        check(png, image(vec![1, 28, 28])).unwrap(),
        LabelType::Number
    );
    let msg = check(
        &png.replace("\"png\"", "\"name\""),
        ModelShape::flat(784, 10),
    );
    assert_eq!(
        msg.unwrap_err().to_string(),
        "data.train: f.parquet: column `name` (data.image.column) has type Utf8; an image \
         column must be binary (the bytes of PNG or JPEG files)"
    );
    let msg = check(
        &png.replace("\"png\"", "\"jpg\""),
        ModelShape::flat(784, 10),
    );
    assert!(msg.unwrap_err().to_string().contains(
        "has no column `jpg` (data.image.column); its columns: png, name, pixels, v, \
             label"
    ));
    let msg = check(png, ModelShape::flat(100, 10))
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains(
            "data.image gives examples of shape [1, 28, 28] (784 values), but the model \
             takes 100 inputs"
        ),
        "{msg}"
    );
    let msg = check(png, image(vec![28, 28, 1])).unwrap_err().to_string();
    assert!(
        msg.contains(
            "data.image gives examples of shape [1, 28, 28], but the model takes examples \
             of shape [28, 28, 1]"
        ),
        "{msg}"
    );
}

#[test]
fn a_shape_must_match_the_fixed_width_and_the_model() {
    let fixed = "features = [\"pixels\"]\nshape = [1, 28, 28]";
    assert_eq!(
        check(fixed, ModelShape::flat(784, 10)).unwrap(),
        LabelType::Number
    );
    assert_eq!(
        check(fixed, image(vec![1, 28, 28])).unwrap(),
        LabelType::Number
    );
    let msg = check(&fixed.replace("28]", "27]"), image(vec![1, 28, 27]))
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("data.shape [1, 28, 27] needs 756 values per row, but data.features give 784"),
        "{msg}"
    );
    let msg = check(fixed, ModelShape::flat(100, 10))
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains(
            "data.shape gives examples of shape [1, 28, 28] (784 values), but the \
                      model takes 100 inputs"
        ),
        "{msg}"
    );
    // A variable list's width is checked by executors as they read; the model still is.
    let listed = "features = [\"v\"]\nshape = [2, 3]";
    assert_eq!(check(listed, image(vec![2, 3])).unwrap(), LabelType::Number);
    let msg = check(listed, image(vec![3, 2])).unwrap_err().to_string();
    assert!(
        msg.contains("but the model takes examples of shape [3, 2]"),
        "{msg}"
    );
    // Without a shape, as before.
    let msg = check("features = [\"pixels\"]", ModelShape::flat(100, 10))
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("data.features give 784 values per row, but the model takes 100 inputs"),
        "{msg}"
    );
}
