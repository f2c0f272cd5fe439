//! TensorBoard event files (`--tensorboard DIR`), written from the job's events.
//!
//! [`TensorBoard`] is an [`Observer`]: it writes the training loss and throughput of every
//! progress report at its global step, each epoch's loss and throughput at the epoch's number,
//! and the test figures after each evaluated epoch and at the end. At the end it also writes a
//! token-sequence job's `train/tokens_per_s` and `train/padding_fraction` at each epoch's
//! number, and an IOB2 tagger's `test/entity_f1`, `test/entity_precision` and
//! `test/entity_recall`, from the job's summary (the events of epochs and tests have no fields
//! for them).
//!
//! An event file is a sequence of TFRecords, each
//! `u64 LE length | u32 LE masked CRC32C of the length | data | u32 LE masked CRC32C of data`,
//! whose data is a serialized `tensorflow.Event`: the first carries `file_version =
//! "brain.Event:2"`, the others a `Summary` of scalar values at a step. The few protobuf
//! messages involved are declared here with prost, field numbers as in TensorFlow's
//! `event.proto` and `summary.proto`.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use prost::Message;
use ringflow_core::pb;

use super::observer::Observer;
use crate::summary::JobSummary;

/// A TensorBoard directory or event file that cannot be written.
#[derive(Debug, thiserror::Error)]
pub enum TensorBoardError {
    /// Event files are written to a local directory only.
    #[error("--tensorboard takes a local directory, not a URL: {0}")]
    NotLocal(String),
    /// The directory cannot be created.
    #[error("cannot create the TensorBoard directory {dir}: {cause}")]
    CreateDir {
        /// The directory.
        dir: String,
        /// Why (in the message, which is the whole sentence).
        cause: std::io::Error,
    },
    /// The event file cannot be created.
    #[error("cannot create the TensorBoard event file {path}: {cause}")]
    CreateFile {
        /// The file.
        path: String,
        /// Why (in the message, which is the whole sentence).
        cause: std::io::Error,
    },
    /// The event file cannot be written.
    #[error("cannot write the TensorBoard event file {path}: {cause}")]
    Write {
        /// The file.
        path: String,
        /// Why (in the message, which is the whole sentence).
        cause: std::io::Error,
    },
}

/// Writes a job's figures as TensorBoard scalars.
pub struct TensorBoard {
    writer: EventWriter,
    /// The last epoch that ended, counted from 1 (the step of the test figures).
    epochs_done: u64,
}

impl TensorBoard {
    /// Creates `dir` if needed and a new event file in it now, so that a bad path fails
    /// before the job starts.
    pub fn create(dir: &Path) -> Result<TensorBoard, TensorBoardError> {
        Ok(TensorBoard {
            writer: EventWriter::create(dir)?,
            epochs_done: 0,
        })
    }
}

impl Observer for TensorBoard {
    fn step(&mut self, s: &pb::StepProgress) {
        let global = (s.epoch * s.steps + s.step) as i64;
        self.writer.scalars(
            global,
            &[
                ("train/loss", s.loss),
                ("train/samples_per_s", s.samples_per_s),
            ],
        );
    }

    fn epoch(&mut self, e: &pb::EpochDone) {
        self.epochs_done = e.epoch + 1;
        self.writer.scalars(
            self.epochs_done as i64,
            &[
                ("epoch/loss", e.loss),
                ("epoch/samples_per_s", e.samples_per_s),
            ],
        );
    }

    fn test(&mut self, t: &pb::EpochTest) {
        self.writer.scalars(
            t.epoch as i64 + 1,
            &test_scalars(t.accuracy, Some(t.loss), t.mse),
        );
    }

    /// The test figures after training; and a sequence job's tokens/s and padding of each
    /// epoch, which the epoch events do not carry (the summary's history does).
    fn summary(&mut self, summary: &JobSummary) {
        for e in &summary.history {
            if let (Some(rate), Some(padding)) = (e.tokens_per_s(), e.padding_fraction()) {
                self.writer.scalars(
                    e.epoch as i64 + 1,
                    &[
                        ("train/tokens_per_s", rate),
                        ("train/padding_fraction", padding),
                    ],
                );
            }
        }
        let step = if self.epochs_done > 0 {
            self.epochs_done
        } else {
            summary.epochs
        } as i64;
        let mut values = test_scalars(summary.test_accuracy, summary.test_loss, summary.test_mse);
        values.extend(
            [
                ("test/entity_f1", summary.test_entity_f1),
                ("test/entity_precision", summary.test_entity_precision),
                ("test/entity_recall", summary.test_entity_recall),
            ]
            .into_iter()
            .filter_map(|(tag, v)| v.map(|v| (tag, v))),
        );
        self.writer.scalars(step, &values);
    }

    /// Every record is flushed as it is written; an event file without scalars is removed
    /// when the observer is dropped.
    fn finish(&mut self) {}
}

/// TensorBoard's test scalars: those of the figures that exist.
fn test_scalars(
    accuracy: Option<f64>,
    loss: Option<f64>,
    mse: Option<f64>,
) -> Vec<(&'static str, f64)> {
    [
        ("test/accuracy", accuracy),
        ("test/loss", loss),
        ("test/mse", mse),
    ]
    .into_iter()
    .filter_map(|(tag, v)| v.map(|v| (tag, v)))
    .collect()
}

/// `tensorflow.Event`, the fields ringflow writes.
#[derive(Clone, PartialEq, prost::Message)]
struct Event {
    /// Seconds since the Unix epoch.
    #[prost(double, tag = "1")]
    wall_time: f64,
    #[prost(int64, tag = "2")]
    step: i64,
    #[prost(string, optional, tag = "3")]
    file_version: Option<String>,
    #[prost(message, optional, tag = "5")]
    summary: Option<Summary>,
}

/// `tensorflow.Summary`.
#[derive(Clone, PartialEq, prost::Message)]
struct Summary {
    #[prost(message, repeated, tag = "1")]
    value: Vec<Value>,
}

/// `tensorflow.Summary.Value` with a scalar (`simple_value` is in a oneof: always present).
#[derive(Clone, PartialEq, prost::Message)]
struct Value {
    #[prost(string, tag = "1")]
    tag: String,
    #[prost(float, optional, tag = "2")]
    simple_value: Option<f32>,
}

/// Writes scalars into one new event file of a directory.
struct EventWriter {
    path: PathBuf,
    file: Option<File>,
    /// Whether any scalar was written (a file with none is removed when the writer is dropped).
    wrote: bool,
}

impl EventWriter {
    /// Creates `dir` if needed and a new event file in it,
    /// `events.out.tfevents.<unix seconds>.<hostname>.ringflow`, starting with the version
    /// record. Errors name the path at fault.
    fn create(dir: &Path) -> Result<EventWriter, TensorBoardError> {
        let shown = dir.display().to_string();
        if shown.contains("://") {
            return Err(TensorBoardError::NotLocal(shown));
        }
        std::fs::create_dir_all(dir)
            .map_err(|cause| TensorBoardError::CreateDir { dir: shown, cause })?;
        let secs = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        // The host's name, made safe as part of a file name.
        let host = ringflow_core::host::hostname().replace(['/', '\\'], "_");
        let name = format!("events.out.tfevents.{secs}.{host}.ringflow");
        let mut path = dir.join(&name);
        let open = |p: &Path| File::options().write(true).create_new(true).open(p);
        let file = match open(&path) {
            // Another run in the same directory in the same second: never overwrite it.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                path = dir.join(format!("{name}.{}", std::process::id()));
                open(&path)
            }
            other => other,
        }
        .map_err(|cause| TensorBoardError::CreateFile {
            path: path.display().to_string(),
            cause,
        })?;
        let mut writer = EventWriter {
            path,
            file: Some(file),
            wrote: false,
        };
        let version = Event {
            wall_time: now(),
            file_version: Some("brain.Event:2".into()),
            ..Default::default()
        };
        writer
            .write(&version)
            .map_err(|cause| TensorBoardError::Write {
                path: writer.path.display().to_string(),
                cause,
            })?;
        Ok(writer)
    }

    /// Writes `values` (tag, value) as one event at `step`. A write error is reported once, as
    /// a warning, and ends the writing: the job goes on.
    fn scalars(&mut self, step: i64, values: &[(&str, f64)]) {
        if self.file.is_none() || values.is_empty() {
            return;
        }
        let event = Event {
            wall_time: now(),
            step,
            summary: Some(Summary {
                value: values
                    .iter()
                    .map(|&(tag, v)| Value {
                        tag: tag.to_string(),
                        simple_value: Some(v as f32),
                    })
                    .collect(),
            }),
            ..Default::default()
        };
        match self.write(&event) {
            Ok(()) => self.wrote = true,
            Err(e) => {
                eprintln!(
                    "warning: cannot write the TensorBoard event file {}: {e}; no more \
                     TensorBoard events are written",
                    self.path.display()
                );
                self.file = None;
            }
        }
    }

    fn write(&mut self, event: &Event) -> std::io::Result<()> {
        let Some(file) = &mut self.file else {
            return Ok(());
        };
        // One write per record, flushed: TensorBoard can follow the file while the job runs.
        file.write_all(&record(&event.encode_to_vec()))?;
        file.flush()
    }
}

impl Drop for EventWriter {
    fn drop(&mut self) {
        // A job that ended before any scalar (e.g. rejected when planned) leaves no empty run.
        if !self.wrote && self.file.take().is_some() {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Seconds since the Unix epoch.
fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// One TFRecord framing `data`.
fn record(data: &[u8]) -> Vec<u8> {
    let len = (data.len() as u64).to_le_bytes();
    let mut out = Vec::with_capacity(data.len() + 16);
    out.extend_from_slice(&len);
    out.extend_from_slice(&masked_crc32c(&len).to_le_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(&masked_crc32c(data).to_le_bytes());
    out
}

/// TFRecord's masked CRC: the CRC32C rotated right by 15 bits plus a constant.
fn masked_crc32c(data: &[u8]) -> u32 {
    let crc = crc32c(data);
    (crc.rotate_right(15)).wrapping_add(0xa282_ead8)
}

/// The lookup table of CRC32C (Castagnoli, reflected polynomial 0x82F63B78).
const CRC32C_TABLE: [u32; 256] = {
    let mut table = [0u32; 256];
    let mut i = 0;
    while i < 256 {
        let mut c = i as u32;
        let mut k = 0;
        while k < 8 {
            c = if c & 1 != 0 {
                (c >> 1) ^ 0x82f6_3b78
            } else {
                c >> 1
            };
            k += 1;
        }
        table[i] = c;
        i += 1;
    }
    table
};

/// CRC32C of `data`.
fn crc32c(data: &[u8]) -> u32 {
    !data.iter().fold(!0u32, |crc, &b| {
        CRC32C_TABLE[((crc ^ b as u32) & 0xff) as usize] ^ (crc >> 8)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// The events of the file at `path`, each record's checksums checked.
    fn read_events(path: &Path) -> Vec<Event> {
        let bytes = std::fs::read(path).unwrap();
        let mut at = 0;
        let mut events = Vec::new();
        while at < bytes.len() {
            let len = u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap()) as usize;
            let data = &bytes[at + 12..at + 12 + len];
            let crc = u32::from_le_bytes(bytes[at + 12 + len..at + 16 + len].try_into().unwrap());
            assert_eq!(crc, masked_crc32c(data));
            events.push(Event::decode(data).unwrap());
            at += 16 + len;
        }
        events
    }

    /// The scalars written: (step, tag, value), the version record left out.
    fn scalars_of(path: &Path) -> Vec<(i64, String, f32)> {
        read_events(path)
            .into_iter()
            .flat_map(|e| {
                let values = e.summary.map(|s| s.value).unwrap_or_default();
                values
                    .into_iter()
                    .map(move |v| (e.step, v.tag, v.simple_value.unwrap()))
            })
            .collect()
    }

    #[test]
    fn a_sequence_jobs_summary_writes_its_tokens_padding_and_entity_scalars() {
        let dir = tempfile::tempdir().unwrap();
        let mut tb = TensorBoard::create(dir.path()).unwrap();
        tb.summary(&crate::summary::tests::trained(true));
        let path = tb.writer.path.clone();
        let tags: Vec<(i64, String, f32)> = scalars_of(&path);
        let scalar = |tag: &str| {
            tags.iter()
                .find(|(_, t, _)| t == tag)
                .map(|(step, _, v)| (*step, *v))
        };
        assert_eq!(scalar("train/tokens_per_s"), Some((1, 3000.0)));
        assert_eq!(scalar("train/padding_fraction"), Some((1, 0.0625)));
        assert_eq!(scalar("test/accuracy"), Some((1, 0.9)));
        for tag in [
            "test/entity_f1",
            "test/entity_precision",
            "test/entity_recall",
        ] {
            assert_eq!(scalar(tag), Some((1, 0.35)), "{tag}");
        }
        // A job that is not a sequence writes none of them.
        let mut tb = TensorBoard::create(&dir.path().join("mlp")).unwrap();
        tb.summary(&crate::summary::tests::trained(false));
        let tags = scalars_of(&tb.writer.path.clone());
        assert!(tags.iter().all(|(_, t, _)| !t.contains("token")
            && !t.contains("padding")
            && !t.contains("entity")));
        assert!(tags.iter().any(|(_, t, _)| t == "test/accuracy"));
    }

    #[test]
    fn crc32c_known_vectors() {
        assert_eq!(crc32c(b""), 0);
        assert_eq!(crc32c(b"123456789"), 0xe306_9283);
        assert_eq!(crc32c(&[0u8; 32]), 0x8a91_36aa);
        assert_eq!(crc32c(&[0xffu8; 32]), 0x62a8_ab43);
    }

    #[test]
    fn masked_crc_matches_tensorflow() {
        // Values of TensorBoard's own `masked_crc32c`.
        assert_eq!(masked_crc32c(b""), 0xa282_ead8);
        assert_eq!(masked_crc32c(b"123456789"), 0xc78a_b0e5);
    }

    /// Byte for byte what TensorBoard's own `RecordWriter` writes for the same events.
    #[test]
    fn records_match_tensorboards_writer() {
        let scalar = Event {
            wall_time: 1.5,
            step: 3,
            summary: Some(Summary {
                value: vec![Value {
                    tag: "train/loss".into(),
                    simple_value: Some(0.25),
                }],
            }),
            ..Default::default()
        };
        assert_eq!(
            hex(&record(&scalar.encode_to_vec())),
            "200000000000000029eda95009000000000000f83f10032a130a110a0a747261696e2f6c6f73731500\
             00803e43301b92"
        );
        let version = Event {
            wall_time: 1.5,
            file_version: Some("brain.Event:2".into()),
            ..Default::default()
        };
        assert_eq!(
            hex(&record(&version.encode_to_vec())),
            "1800000000000000a37f4b2209000000000000f83f1a0d627261696e2e4576656e743a322a28646c"
        );
    }

    #[test]
    fn record_framing() {
        let data = b"some event bytes";
        let r = record(data);
        assert_eq!(r.len(), 8 + 4 + data.len() + 4);
        assert_eq!(u64::from_le_bytes(r[..8].try_into().unwrap()), 16);
        assert_eq!(
            u32::from_le_bytes(r[8..12].try_into().unwrap()),
            masked_crc32c(&r[..8])
        );
        assert_eq!(&r[12..28], data);
        assert_eq!(
            u32::from_le_bytes(r[28..].try_into().unwrap()),
            masked_crc32c(data)
        );
        assert_eq!(record(b"").len(), 16);
    }

    #[test]
    fn writer_creates_the_file_and_removes_it_when_empty() {
        let dir = tempfile::tempdir().unwrap();
        let tb = dir.path().join("a/b");
        let path = {
            let w = EventWriter::create(&tb).unwrap();
            assert!(w.path.is_file());
            w.path.clone()
        };
        assert!(!path.exists(), "an event file without scalars is removed");
        let mut w = EventWriter::create(&tb).unwrap();
        w.scalars(1, &[("train/loss", 0.5), ("train/samples_per_s", 100.0)]);
        let path = w.path.clone();
        drop(w);
        let name = path.file_name().unwrap().to_str().unwrap();
        assert!(name.starts_with("events.out.tfevents."), "{name}");
        assert!(name.ends_with(".ringflow"), "{name}");
        // Two records, each framed and checksummed.
        let events = read_events(&path);
        assert_eq!(events.len(), 2);
        assert_eq!(events[0].file_version.as_deref(), Some("brain.Event:2"));
        let values = &events[1].summary.as_ref().unwrap().value;
        assert_eq!(events[1].step, 1);
        assert_eq!(values[0].tag, "train/loss");
        assert_eq!(values[1].simple_value, Some(100.0));
    }

    #[test]
    fn writer_names_the_directory_it_cannot_create() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("plain-file");
        std::fs::write(&file, b"x").unwrap();
        let err = EventWriter::create(&file.join("tb")).err().unwrap();
        let msg = err.to_string();
        assert!(
            msg.starts_with("cannot create the TensorBoard directory ")
                && msg.contains("plain-file"),
            "{msg}"
        );
    }
}
