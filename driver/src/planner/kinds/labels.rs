//! The label pass: the classes of a job whose labels the footers cannot tell, read from the
//! data when the job is planned, so that every model kind's outputs are known before any
//! executor starts.
//!
//! The footers' statistics give the largest class index of an integer label column. They say
//! nothing of a string label's class names, nor of a label `data.sql` makes. For those (with
//! `cross_entropy` and no `data.label_classes`) the planner reads the label of every row group
//! of the training split on every core of the driver, through the query where there is one
//! (the query's distinct labels, reading only the columns they depend on), and of the test
//! split too: class names become the resolved spec's `data.label_classes` (sorted, as the
//! executors' statistics would order them), integer classes the model's outputs. A class name
//! of the test split that training never sees is refused by name; so are more than
//! [`MAX_CLASSES`] classes and a name longer than [`MAX_CLASS_NAME_BYTES`].

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Instant;

use datafusion::arrow::array::{Array, ArrayRef, AsArray};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Int64Type, SchemaRef};
use ringflow_core::data::is_string;
use ringflow_core::data::partition::PartitionReader;
use ringflow_core::data::sql;
use ringflow_core::data::stats::MAX_CLASSES;
use ringflow_core::spec::JobSpec;
use ringflow_core::wire::MAX_CLASS_NAME_BYTES;
use ringflow_ml::loss::LossKind;

use super::KindInput;
pub use super::label_error::LabelError;
use crate::error::Result;
use crate::planner::count_error::CountError;
use crate::planner::counting::RowCounter;
use crate::planner::parallel::{each_group, lock};
use crate::planner::split::{RowGroup, Split};

/// What the label pass found over the training split (and checked of the test split).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct CountedLabels {
    /// The classes.
    pub classes: Classes,
    /// The line the job's messages show.
    pub described: String,
}

impl CountedLabels {
    /// The outputs the classes call for.
    pub fn outputs(&self) -> usize {
        match &self.classes {
            Classes::Names(names) => names.len(),
            Classes::Indices(n) => *n,
        }
    }

    /// The class names, sorted (`None`: the label holds class indices).
    pub fn names(&self) -> Option<&[String]> {
        match &self.classes {
            Classes::Names(names) => Some(names),
            Classes::Indices(_) => None,
        }
    }
}

/// The label pass of `input`'s job, when its labels need one (see the module docs).
pub(crate) fn pass(input: &KindInput<'_>) -> Result<Option<CountedLabels>> {
    let spec = input.spec;
    if spec.train.loss != LossKind::CrossEntropy || spec.data.label_classes.is_some() {
        return Ok(None);
    }
    let label = &spec.data.label;
    let string_label = input.train.schemas.first().is_some_and(|(_, schema)| {
        schema
            .field_with_name(label)
            .is_ok_and(|f| is_string(f.data_type()))
    });
    if spec.data.sql.is_none() && !string_label {
        return Ok(None);
    }
    // A query that fails to plan, or makes no label, is refused by the schema check, which
    // names what is wrong.
    if let (Some(prep), Some((_, schema))) = (input.prep, input.train.schemas.first()) {
        match prep.plan(schema.clone()) {
            Ok(planned) if planned.output.field_with_name(label).is_ok() => {}
            _ => return Ok(None),
        }
    }
    let started = Instant::now();
    let reader = LabelReader::new(spec, input)?;
    let train = reader.read("data.train", input.train)?;
    let test = match input.test {
        Some(test) => Some(reader.read("data.test", test)?),
        None => None,
    };
    let classes = decide(label, train, test)?;
    let what = match spec.data.sql.is_some() {
        true => "of the labels data.sql makes",
        false => "in the label column",
    };
    let took = started.elapsed().as_secs_f64();
    let described = match &classes {
        Classes::Names(names) => {
            let shown: Vec<&str> = names.iter().take(8).map(String::as_str).collect();
            let more = match names.len().saturating_sub(8) {
                0 => String::new(),
                n => format!(" and {n} more"),
            };
            format!(
                "data.label: {} classes {what}, counted on the driver in {took:.1} s: {}{more}",
                names.len(),
                shown.join(", ")
            )
        }
        Classes::Indices(outputs) => format!(
            "data.label: {outputs} outputs (the largest class index + 1) {what}, counted on \
             the driver in {took:.1} s"
        ),
    };
    Ok(Some(CountedLabels { classes, described }))
}

/// The classes the label pass decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Classes {
    /// Class names, sorted.
    Names(Vec<String>),
    /// Outputs for class indices `0..n`.
    Indices(usize),
}

/// The classes of `train`, checked against `test`.
fn decide(
    column: &str,
    train: Found,
    test: Option<Found>,
) -> std::result::Result<Classes, LabelError> {
    let column = column.to_string();
    if !train.names.is_empty() {
        if let Some(test) = &test
            && let Some((class, site)) = test
                .names
                .iter()
                .find(|(c, _)| !train.names.contains_key(*c))
        {
            let (class, site) = (class.clone(), site.clone());
            return Err(LabelError::Unseen {
                column,
                class,
                site,
            });
        }
        return Ok(Classes::Names(train.names.into_keys().collect()));
    }
    let max = train.max.max(test.and_then(|t| t.max));
    let Some(max) = max else {
        return Err(LabelError::NoLabels { column });
    };
    match usize::try_from(max).ok().and_then(|m| m.checked_add(1)) {
        Some(n) if n <= MAX_CLASSES => Ok(Classes::Indices(n)),
        _ => Err(LabelError::TooMany {
            column,
            site: format!("the class index {max}"),
        }),
    }
}

/// The labels found in some row groups.
#[derive(Default)]
struct Found {
    /// Class names, each with the first row group that holds it (named in the test split's
    /// check).
    names: BTreeMap<String, String>,
    /// The largest class index.
    max: Option<i64>,
}

/// How the pass reads the labels of a row group: the label column itself, or the distinct
/// labels of the job's query.
struct LabelReader<'a> {
    spec: &'a JobSpec,
    query: Option<(
        RowCounter,
        &'a crate::planner::sql_planner::SqlPlanner,
        String,
    )>,
}

impl<'a> LabelReader<'a> {
    fn new(spec: &'a JobSpec, input: &KindInput<'a>) -> Result<LabelReader<'a>> {
        let query = match (&spec.data.sql, input.prep) {
            (Some(q), Some(prep)) => {
                let distinct = sql::distinct_query(q, &spec.data.label);
                Some((RowCounter::new(spec, &distinct)?, prep, distinct))
            }
            _ => None,
        };
        Ok(LabelReader { spec, query })
    }

    /// The labels of every row group of split `key`.
    fn read(&self, key: &str, split: &Split) -> std::result::Result<Found, LabelError> {
        let columns = self.columns(split)?;
        let found = Mutex::new(Found::default());
        let column = &self.spec.data.label;
        let site = |g: &RowGroup| format!("{key}: {} (row group {})", g.path, g.index);
        each_group(&split.groups, |group| {
            let mut each = |array: &ArrayRef| add(column, array, &site(group), &mut lock(&found));
            self.read_group(group, &columns, &split.schemas, &mut each)
        })
        .map_err(|(e, _)| e)?;
        Ok(found.into_inner().unwrap_or_else(|p| p.into_inner()))
    }

    /// For each file of `split`: the columns a row group's read takes.
    fn columns(
        &self,
        split: &Split,
    ) -> std::result::Result<Vec<(String, Vec<String>)>, LabelError> {
        let Some((_, prep, distinct)) = &self.query else {
            let label = vec![self.spec.data.label.clone()];
            return Ok(split
                .schemas
                .iter()
                .map(|(f, _)| (f.clone(), label.clone()))
                .collect());
        };
        let mut out = Vec::new();
        for (file, schema) in &split.schemas {
            let planned = prep.with_query(distinct).plan(schema.clone());
            let planned = planned.map_err(|source| LabelError::Plan {
                file: file.clone(),
                source,
            })?;
            out.push((file.clone(), planned.input_columns));
        }
        Ok(out)
    }

    /// Hands the labels of `group` to `each`, a batch's column at a time.
    fn read_group(
        &self,
        group: &RowGroup,
        columns: &[(String, Vec<String>)],
        schemas: &[(String, SchemaRef)],
        each: &mut dyn FnMut(&ArrayRef) -> std::result::Result<(), LabelError>,
    ) -> std::result::Result<(), LabelError> {
        let site = || format!("{} (row group {})", group.path, group.index);
        let read_failed = |source: CountError| LabelError::Read {
            site: site(),
            source,
        };
        let wanted = columns
            .iter()
            .find(|(f, _)| *f == group.path)
            .map(|(_, c)| c.as_slice())
            .ok_or_else(|| read_failed(CountError::NoSchema))?;
        match &self.query {
            Some((counter, _, _)) => {
                let limit = MAX_CLASSES + 1;
                let columns = counter
                    .first_column(group, (wanted, schemas), limit)
                    .map_err(read_failed)?;
                columns.iter().try_for_each(&mut *each)
            }
            None => {
                let mut reader = PartitionReader::open(&group.file_rows(), wanted)
                    .map_err(|e| read_failed(e.into()))?;
                while let Some((batch, _)) =
                    reader.next_batch().map_err(|e| read_failed(e.into()))?
                {
                    each(batch.column(0))?;
                }
                Ok(())
            }
        }
    }
}

/// Adds the labels of `array` (read at `site`) to `found`.
fn add(
    column: &str,
    array: &ArrayRef,
    site: &str,
    found: &mut Found,
) -> std::result::Result<(), LabelError> {
    let data_type = array.data_type();
    let not_a_class = || LabelError::NotAClass {
        column: column.into(),
        site: site.into(),
        data_type: data_type.clone(),
    };
    if is_string(data_type) {
        let names = cast(array, &DataType::Utf8).map_err(|_| not_a_class())?;
        for name in names.as_string::<i32>().iter().flatten() {
            if name.len() > MAX_CLASS_NAME_BYTES {
                let (column, site, bytes) = (column.into(), site.into(), name.len());
                return Err(LabelError::NameTooLong {
                    column,
                    site,
                    bytes,
                });
            }
            if !found.names.contains_key(name) {
                found.names.insert(name.to_string(), site.to_string());
                if found.names.len() > MAX_CLASSES {
                    let (column, site) = (column.into(), site.into());
                    return Err(LabelError::TooMany { column, site });
                }
            }
        }
        return Ok(());
    }
    if data_type.is_integer() {
        let values = cast(array, &DataType::Int64).map_err(|_| not_a_class())?;
        let max = values.as_primitive::<Int64Type>().iter().flatten().max();
        found.max = found.max.max(max);
        return Ok(());
    }
    Err(not_a_class())
}
