//! Record batches to feature matrices and label vectors.

use std::collections::HashMap;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, FixedSizeListArray, GenericListArray, OffsetSizeTrait,
};
use datafusion::arrow::datatypes::{
    DataType, Float16Type, Float32Type, Float64Type, Int8Type, Int16Type, Int32Type, Int64Type,
    UInt8Type, UInt16Type, UInt32Type, UInt64Type,
};
use datafusion::arrow::record_batch::RecordBatch;
use ringflow_core::data::{Preprocessing, is_string};
use ringflow_core::spec::JobSpec;

use crate::data::converter::{BatchConverter, RowLayout};
use crate::data::error::NotStrings;
use crate::data::rows::Rows;
use crate::error::{ExecutorError, Result, Unrunnable};
use values::{AsF32, copy_rows, may_be_non_finite};

/// What the label column must hold.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum LabelKind {
    /// An integer class index in `0..classes` (cross-entropy).
    Classes(usize),
    /// A number in [0, 1] (binary cross-entropy).
    Binary,
    /// Any finite number (regression).
    Regression,
}

/// Converts record batches with the configured feature and label columns.
#[derive(Clone, Debug)]
pub struct Converter {
    features: Vec<String>,
    label: Option<String>,
    label_kind: LabelKind,
    multiplier: f32,
    inputs: usize,
    /// Class index of each string label.
    classes: Option<HashMap<String, usize>>,
    /// Per-feature `(mean, 1 / std)` of `normalize = "standard"`.
    normalize: Option<(Vec<f32>, Vec<f32>)>,
    /// `data.shape`, when the spec gives one (named in width errors).
    shape: Option<Vec<usize>>,
}

impl BatchConverter for Converter {
    fn columns(&self) -> Vec<String> {
        Converter::columns(self)
    }

    fn convert_into(
        &self,
        batch: &RecordBatch,
        file: &str,
        first_row: u64,
        out: &mut Rows,
    ) -> Result<()> {
        Converter::convert_into(self, batch, file, first_row, out)
    }

    fn layout(&self) -> RowLayout {
        RowLayout::Fixed
    }

    fn with_preprocessing(&self, p: &Preprocessing) -> Result<Box<dyn BatchConverter>> {
        Ok(Box::new(Converter::with_preprocessing(self.clone(), p)?))
    }

    fn features_only(&self) -> Box<dyn BatchConverter> {
        Box::new(Converter::features_only(self))
    }

    fn direct_rows(
        &self,
        path: &std::path::Path,
        partition: &ringflow_core::pb::Partition,
    ) -> Option<Box<dyn crate::data::converter::DirectRows + '_>> {
        let reader = self.open_direct(path, partition)?;
        Some(Box::new(direct::DirectFeatures::new(self, reader)))
    }
}

/// The values of a string column (nulls as `None`).
pub fn string_values(col: &ArrayRef) -> std::result::Result<Vec<Option<String>>, NotStrings> {
    let utf8 = datafusion::arrow::compute::cast(col, &DataType::Utf8)?;
    let strings = utf8.as_string::<i32>();
    Ok(strings.iter().map(|v| v.map(str::to_string)).collect())
}

/// Calls `$body` with `$arr` bound to the concrete primitive array for a numeric data type.
macro_rules! with_numeric {
    ($array:expr, $arr:ident => $body:expr, $other:expr) => {
        match $array.data_type() {
            DataType::Int8 => {
                let $arr = $array.as_primitive::<Int8Type>();
                $body
            }
            DataType::Int16 => {
                let $arr = $array.as_primitive::<Int16Type>();
                $body
            }
            DataType::Int32 => {
                let $arr = $array.as_primitive::<Int32Type>();
                $body
            }
            DataType::Int64 => {
                let $arr = $array.as_primitive::<Int64Type>();
                $body
            }
            DataType::UInt8 => {
                let $arr = $array.as_primitive::<UInt8Type>();
                $body
            }
            DataType::UInt16 => {
                let $arr = $array.as_primitive::<UInt16Type>();
                $body
            }
            DataType::UInt32 => {
                let $arr = $array.as_primitive::<UInt32Type>();
                $body
            }
            DataType::UInt64 => {
                let $arr = $array.as_primitive::<UInt64Type>();
                $body
            }
            DataType::Float16 => {
                let $arr = $array.as_primitive::<Float16Type>();
                $body
            }
            DataType::Float32 => {
                let $arr = $array.as_primitive::<Float32Type>();
                $body
            }
            DataType::Float64 => {
                let $arr = $array.as_primitive::<Float64Type>();
                $body
            }
            _ => $other,
        }
    };
}

fn is_numeric(t: &DataType) -> bool {
    matches!(
        t,
        DataType::Int8
            | DataType::Int16
            | DataType::Int32
            | DataType::Int64
            | DataType::UInt8
            | DataType::UInt16
            | DataType::UInt32
            | DataType::UInt64
            | DataType::Float16
            | DataType::Float32
            | DataType::Float64
    )
}

/// Where the error happened, for messages.
struct Site<'a> {
    file: &'a str,
    column: &'a str,
    first_row: u64,
}

impl Site<'_> {
    fn error(&self, row: usize, what: impl std::fmt::Display) -> ExecutorError {
        ExecutorError::data(
            self.file,
            format!(
                "column `{}` row {} (0-based): {what}",
                self.column,
                self.first_row + row as u64
            ),
        )
    }

    fn column_error(&self, what: impl std::fmt::Display) -> ExecutorError {
        ExecutorError::data(self.file, format!("column `{}` {what}", self.column))
    }
}

/// The shape of one feature column in one batch.
enum ColumnShape<'a> {
    Scalar(&'a ArrayRef),
    Fixed(&'a FixedSizeListArray, usize),
    List32(&'a GenericListArray<i32>, usize),
    List64(&'a GenericListArray<i64>, usize),
}

impl ColumnShape<'_> {
    /// Values per row.
    fn width(&self) -> usize {
        match self {
            ColumnShape::Scalar(_) => 1,
            ColumnShape::Fixed(_, w) | ColumnShape::List32(_, w) | ColumnShape::List64(_, w) => *w,
        }
    }
}

impl Converter {
    /// A converter for `features` and `label` (`None`: features only, as prediction reads),
    /// scaling features by `1 / scale`, for a model with `inputs` inputs.
    pub fn new(
        features: &[String],
        label: Option<&str>,
        label_kind: LabelKind,
        scale: Option<f32>,
        inputs: usize,
    ) -> Converter {
        Converter {
            features: features.to_vec(),
            label: label.map(str::to_string),
            label_kind,
            multiplier: scale.map(|s| 1.0 / s).unwrap_or(1.0),
            inputs,
            classes: None,
            normalize: None,
            shape: None,
        }
    }

    /// The converter of `spec`'s feature columns (or its image column, once decoded) and
    /// `label` (`None`: prediction reads none) holding `label_kind`, for a model with `inputs`
    /// inputs: scaled by `data.scale`, read in the shape `data.shape`.
    pub fn for_job(
        spec: &JobSpec,
        label: Option<&str>,
        label_kind: LabelKind,
        inputs: usize,
    ) -> Converter {
        let data = &spec.data;
        Converter::new(
            &data.feature_columns(),
            label,
            label_kind,
            data.scale,
            inputs,
        )
        .with_shape(data.shape.clone())
    }

    /// The same converter, naming `data.shape` (the shape each row's values make) in the
    /// error for a row of another width.
    pub fn with_shape(mut self, shape: Option<Vec<usize>>) -> Converter {
        self.shape = shape;
        self
    }

    /// Applies the whole-data preprocessing: string label classes and standardization.
    pub fn with_preprocessing(mut self, p: &Preprocessing) -> Result<Converter> {
        if let Some(classes) = &p.classes {
            if let LabelKind::Classes(n) = self.label_kind
                && n != classes.len()
            {
                return Err(Unrunnable::ClassesNotOutputs {
                    classes: classes.len(),
                    names: preview(classes),
                    outputs: n,
                }
                .into());
            }
            self.classes = Some(classes.iter().cloned().zip(0..).collect());
        }
        if let Some(n) = &p.normalize {
            if n.mean.len() != self.inputs || n.std.len() != self.inputs {
                return Err(Unrunnable::NormalizationWidth {
                    features: n.mean.len(),
                    inputs: self.inputs,
                }
                .into());
            }
            let inv = n.std.iter().map(|s| 1.0 / s).collect();
            self.normalize = Some((n.mean.clone(), inv));
        }
        Ok(self)
    }

    /// The columns a reader must provide.
    pub fn columns(&self) -> Vec<String> {
        let mut c = self.features.clone();
        c.extend(self.label.clone());
        c
    }

    /// A converter of the same features that reads no label and does not normalize (scaled
    /// features, for statistics).
    pub fn features_only(&self) -> Converter {
        Converter {
            label: None,
            classes: None,
            normalize: None,
            ..self.clone()
        }
    }

    /// Converts `batch`, whose first row is row `first_row` of `file`.
    pub fn convert(&self, batch: &RecordBatch, file: &str, first_row: u64) -> Result<Rows> {
        let mut rows = Rows::default();
        self.convert_into(batch, file, first_row, &mut rows)?;
        Ok(rows)
    }

    /// Converts `batch` as [`Converter::convert`] does into `out`, whose buffers are reused
    /// (what it held is replaced), so that a reader cycling a few chunks allocates nothing
    /// once they have grown.
    pub fn convert_into(
        &self,
        batch: &RecordBatch,
        file: &str,
        first_row: u64,
        out: &mut Rows,
    ) -> Result<()> {
        let rows = batch.num_rows();
        let (shapes, width) = self.shapes(batch, file, first_row)?;
        if width != self.inputs {
            return Err(self.width_error(&shapes, width, file, first_row));
        }
        out.reset(rows * width);
        let mut offset = 0;
        for (name, shape) in self.features.iter().zip(&shapes) {
            let site = Site {
                file,
                column: name,
                first_row,
            };
            offset += self.write_column(shape, &mut out.features, width, offset, &site)?;
        }
        self.standardize(&mut out.features, width);
        if let Some(label) = &self.label {
            let label_site = Site {
                file,
                column: label,
                first_row,
            };
            let label_col = batch
                .column_by_name(label)
                .ok_or_else(|| label_site.column_error("(data.label) is missing from the data"))?;
            self.labels(label_col, &label_site, &mut out.labels)?;
        }
        out.rows = rows;
        Ok(())
    }

    /// The values each row of `batch` gives with this converter's feature columns (for a
    /// reader that learns the width from the data, as `bench ingest` does).
    pub fn width_of(&self, batch: &RecordBatch, file: &str, first_row: u64) -> Result<usize> {
        Ok(self.shapes(batch, file, first_row)?.1)
    }

    /// Applies `normalize = "standard"` (if set) to `features`, rows of `width` values.
    fn standardize(&self, features: &mut [f32], width: usize) {
        if let Some((mean, inv_std)) = &self.normalize {
            for row in features.chunks_exact_mut(width) {
                for ((v, m), s) in row.iter_mut().zip(mean).zip(inv_std) {
                    *v = (*v - m) * s;
                }
            }
        }
    }

    /// Each feature column's shape in `batch`, and the values a row gives in all.
    fn shapes<'a>(
        &self,
        batch: &'a RecordBatch,
        file: &str,
        first_row: u64,
    ) -> Result<(Vec<ColumnShape<'a>>, usize)> {
        let mut shapes = Vec::with_capacity(self.features.len());
        let mut width = 0;
        for name in &self.features {
            let site = Site {
                file,
                column: name,
                first_row,
            };
            let col = batch
                .column_by_name(name)
                .ok_or_else(|| site.column_error("is missing from the data"))?;
            let shape = column_shape(col, &site)?;
            width += shape.width();
            shapes.push(shape);
        }
        Ok((shapes, width))
    }

    /// The error for rows of `width` values where the model takes another number.
    fn width_error(
        &self,
        shapes: &[ColumnShape<'_>],
        width: usize,
        file: &str,
        first_row: u64,
    ) -> ExecutorError {
        let detail: Vec<String> = self
            .features
            .iter()
            .zip(shapes)
            .map(|(n, s)| format!("`{n}`: {}", s.width()))
            .collect();
        let message = match &self.shape {
            Some(shape) => format!(
                "data.shape {shape:?} needs {} values per row, but row {first_row} has \
                 {width} ({})",
                self.inputs,
                detail.join(", ")
            ),
            None => format!(
                "data.features give {width} values per row from row {first_row} ({}), but \
                 the model takes {} inputs",
                detail.join(", "),
                self.inputs
            ),
        };
        ExecutorError::data(file, message)
    }

    /// Writes one column's values at `offset` of each row; returns its width.
    fn write_column(
        &self,
        shape: &ColumnShape<'_>,
        out: &mut [f32],
        stride: usize,
        offset: usize,
        site: &Site<'_>,
    ) -> Result<usize> {
        let mul = self.multiplier;
        match shape {
            ColumnShape::Scalar(col) => {
                with_numeric!(col, arr => {
                    copy_rows(arr.values(), 1, out, stride, offset, mul);
                }, unreachable!("checked numeric"));
                if may_be_non_finite(col.data_type(), mul) {
                    check_finite(out, stride, offset, 1, site)?;
                }
                Ok(1)
            }
            ColumnShape::Fixed(list, w) => {
                let child = list.values();
                let start = list.offset() * w;
                with_numeric!(child, arr => {
                    let values = &arr.values()[start..start + list.len() * w];
                    copy_rows(values, *w, out, stride, offset, mul);
                }, unreachable!("checked numeric"));
                if may_be_non_finite(child.data_type(), mul) {
                    check_finite(out, stride, offset, *w, site)?;
                }
                Ok(*w)
            }
            ColumnShape::List32(list, w) => write_list(list, *w, out, stride, offset, mul, site),
            ColumnShape::List64(list, w) => write_list(list, *w, out, stride, offset, mul, site),
        }
    }

    /// Appends the label of every row of `col` to `out`, checked against the label kind.
    fn labels(&self, col: &ArrayRef, site: &Site<'_>, out: &mut Vec<f32>) -> Result<()> {
        if let Some(i) = first_null(col.as_ref()) {
            return Err(site.error(i, "the label is null"));
        }
        if is_string(col.data_type()) {
            return self.string_labels(col, site, out);
        }
        out.reserve(col.len());
        with_numeric!(col, arr => {
            for (r, v) in arr.values().iter().enumerate() {
                let v = v.as_f32() as f64;
                if !self.label_ok(v) {
                    return Err(site.error(r, self.label_error(v)));
                }
                out.push(v as f32);
            }
        }, {
            return Err(site.column_error(format!(
                "(data.label) has type {}, but a label must be a number",
                col.data_type()
            )));
        });
        Ok(())
    }

    /// Whether `v` is a label of this converter's kind.
    fn label_ok(&self, v: f64) -> bool {
        match self.label_kind {
            LabelKind::Classes(n) => v.fract() == 0.0 && v >= 0.0 && v < n as f64,
            LabelKind::Binary => (0.0..=1.0).contains(&v),
            LabelKind::Regression => v.is_finite(),
        }
    }

    /// Why `v` is not a label of this converter's kind.
    fn label_error(&self, v: f64) -> String {
        match self.label_kind {
            LabelKind::Classes(n) => format!(
                "label {v} is not one of the model's {n} classes (integers 0..={})",
                n.saturating_sub(1)
            ),
            LabelKind::Binary => format!("label {v} is outside [0, 1] (binary cross-entropy)"),
            LabelKind::Regression => format!("label {v} is not a finite number"),
        }
    }

    /// Appends the class index of every string label of `col` to `out`.
    fn string_labels(&self, col: &ArrayRef, site: &Site<'_>, out: &mut Vec<f32>) -> Result<()> {
        let Some(classes) = &self.classes else {
            return Err(site.column_error(
                "(data.label) holds strings, but no classes were found for it \
                 (string labels need train.loss = \"cross_entropy\")",
            ));
        };
        let values = string_values(col).map_err(|m| site.column_error(m))?;
        out.reserve(values.len());
        for (r, v) in values.iter().enumerate() {
            let v = v.as_deref().unwrap_or_default();
            match classes.get(v) {
                Some(&i) => out.push(i as f32),
                None => {
                    let mut names: Vec<(&String, &usize)> = classes.iter().collect();
                    names.sort_by_key(|(_, i)| **i);
                    let names: Vec<String> = names.into_iter().map(|(n, _)| n.clone()).collect();
                    return Err(site.error(
                        r,
                        format!(
                            "label {v:?} is not one of the classes ({})",
                            preview(&names)
                        ),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// At most the first eight names, quoted, and how many more there are.
fn preview(names: &[String]) -> String {
    let mut s: Vec<String> = names.iter().take(8).map(|n| format!("{n:?}")).collect();
    if names.len() > 8 {
        s.push(format!("and {} more", names.len() - 8));
    }
    s.join(", ")
}

fn column_shape<'a>(col: &'a ArrayRef, site: &Site<'_>) -> Result<ColumnShape<'a>> {
    if let Some(i) = first_null(col.as_ref()) {
        return Err(site.error(i, "the value is null"));
    }
    let not_numeric = |t: &DataType| {
        site.column_error(format!(
            "has type {t}; a feature must be a number or a list of numbers"
        ))
    };
    match col.data_type() {
        t if is_numeric(t) => Ok(ColumnShape::Scalar(col)),
        DataType::FixedSizeList(field, w) if is_numeric(field.data_type()) => {
            let list = col.as_fixed_size_list();
            check_child_nulls(
                list.values().as_ref(),
                list.offset() * *w as usize,
                *w as usize,
                list.len(),
                site,
            )?;
            Ok(ColumnShape::Fixed(list, *w as usize))
        }
        DataType::List(field) if is_numeric(field.data_type()) => {
            let list = col.as_list::<i32>();
            Ok(ColumnShape::List32(list, list_width(list, site)?))
        }
        DataType::LargeList(field) if is_numeric(field.data_type()) => {
            let list = col.as_list::<i64>();
            Ok(ColumnShape::List64(list, list_width(list, site)?))
        }
        t => Err(not_numeric(t)),
    }
}

fn first_null(a: &dyn Array) -> Option<usize> {
    if a.null_count() == 0 {
        return None;
    }
    (0..a.len()).find(|&i| a.is_null(i))
}

fn check_child_nulls(
    child: &dyn Array,
    start: usize,
    width: usize,
    rows: usize,
    site: &Site<'_>,
) -> Result<()> {
    if child.null_count() == 0 {
        return Ok(());
    }
    for i in start..start + rows * width {
        if child.is_null(i) {
            return Err(site.error(
                (i - start) / width.max(1),
                format!("element {} of the list is null", (i - start) % width.max(1)),
            ));
        }
    }
    Ok(())
}

/// The common length of every row of a variable-length list column.
fn list_width<O: OffsetSizeTrait>(list: &GenericListArray<O>, site: &Site<'_>) -> Result<usize> {
    let offsets = list.value_offsets();
    let width = if list.is_empty() {
        0
    } else {
        (offsets[1] - offsets[0]).as_usize()
    };
    for r in 0..list.len() {
        let len = (offsets[r + 1] - offsets[r]).as_usize();
        if len != width {
            return Err(site.error(
                r,
                format!("the list has {len} values, but earlier rows have {width}; every row needs the same length"),
            ));
        }
    }
    Ok(width)
}

fn write_list<O: OffsetSizeTrait>(
    list: &GenericListArray<O>,
    w: usize,
    out: &mut [f32],
    stride: usize,
    offset: usize,
    mul: f32,
    site: &Site<'_>,
) -> Result<usize> {
    let child = list.values();
    let start = list.value_offsets()[0].as_usize();
    check_child_nulls(child.as_ref(), start, w, list.len(), site)?;
    with_numeric!(child, arr => {
        let values = &arr.values()[start..start + list.len() * w];
        copy_rows(values, w, out, stride, offset, mul);
    }, unreachable!("checked numeric"));
    if may_be_non_finite(child.data_type(), mul) {
        check_finite(out, stride, offset, w, site)?;
    }
    Ok(w)
}

/// Fails on the first NaN or infinity among this column's values.
fn check_finite(
    out: &[f32],
    stride: usize,
    offset: usize,
    w: usize,
    site: &Site<'_>,
) -> Result<()> {
    if stride == 0 || w == 0 {
        return Ok(());
    }
    for (r, row) in out.chunks_exact(stride).enumerate() {
        if let Some(j) = row[offset..offset + w].iter().position(|v| !v.is_finite()) {
            let at = if w > 1 {
                format!(
                    "element {j} of the list is {} (not finite)",
                    row[offset + j]
                )
            } else {
                format!("the value is {} (not finite)", row[offset + j])
            };
            return Err(site.error(r, at));
        }
    }
    Ok(())
}

mod direct;
mod pages;
#[cfg(test)]
mod tests;
mod values;

pub use direct::DirectReader;
