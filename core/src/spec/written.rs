//! [`SpecAsWritten`]: a job spec as its user wrote it, the TOML text verbatim and the
//! command-line arguments that changed it in the order given, kept beside the spec the driver
//! resolves from it ([`JobSpec`]: checked, its model completed from the data) wherever the job
//! is recorded: the job's checkpoints and its saved model. A hyperparameter trial or a queued
//! job is such a spec plus overrides, resolved when it starts.

use std::io::Read;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::{JobSpec, Override, SpecError};
use crate::pb;
use crate::size::format_bytes;
use crate::wire::MAX_WRITTEN_SPEC_BYTES;

/// A job spec as written: what `ringflow local` or `submit` was given.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SpecAsWritten {
    /// The spec file's name as given on the command line.
    pub file: String,
    /// The file's text, byte for byte.
    pub toml: String,
    /// The arguments that changed it, as given (`--set train.epochs=2`, `--executors 4`,
    /// `--resume runs/x`), in the order they apply.
    pub overrides: Vec<String>,
}

impl SpecAsWritten {
    /// Reads the spec file `file` (at most [`MAX_WRITTEN_SPEC_BYTES`]) and notes `overrides`.
    pub fn read(file: &Path, overrides: &[Override]) -> Result<SpecAsWritten, SpecError> {
        let io = |source| SpecError::Io {
            file: file.to_path_buf(),
            source,
        };
        let mut toml = String::new();
        std::fs::File::open(file)
            .map_err(io)?
            .take(MAX_WRITTEN_SPEC_BYTES as u64 + 1)
            .read_to_string(&mut toml)
            .map_err(io)?;
        if toml.len() > MAX_WRITTEN_SPEC_BYTES {
            return Err(SpecError::Invalid {
                file: file.to_path_buf(),
                key: String::new(),
                message: format!(
                    "the file is larger than the {} a job spec file may have",
                    format_bytes(MAX_WRITTEN_SPEC_BYTES as u64)
                ),
            });
        }
        Ok(SpecAsWritten {
            file: file.display().to_string(),
            toml,
            overrides: overrides.iter().map(|o| o.given().to_string()).collect(),
        })
    }

    /// The spec this text makes with `overrides` (those [`SpecAsWritten::read`] noted) applied
    /// in order, checked.
    pub fn spec(&self, overrides: &[Override]) -> Result<JobSpec, SpecError> {
        JobSpec::parse(&self.toml, Path::new(&self.file), overrides)
    }

    /// Its size on the wire and on disk, in bytes (text and arguments).
    pub fn bytes(&self) -> usize {
        self.file.len() + self.toml.len() + self.overrides.iter().map(String::len).sum::<usize>()
    }
}

impl From<&SpecAsWritten> for pb::SpecAsWritten {
    fn from(w: &SpecAsWritten) -> pb::SpecAsWritten {
        pb::SpecAsWritten {
            file: w.file.clone(),
            toml: w.toml.clone(),
            overrides: w.overrides.clone(),
        }
    }
}

impl From<pb::SpecAsWritten> for SpecAsWritten {
    fn from(w: pb::SpecAsWritten) -> SpecAsWritten {
        SpecAsWritten {
            file: w.file,
            toml: w.toml,
            overrides: w.overrides,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The text is kept byte for byte (comments, spacing and the way numbers are written) and
    /// the overrides as given; together they make the spec the file and overrides make.
    #[test]
    fn the_text_and_the_overrides_are_kept_as_given() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("job.toml");
        let text = "name = \"w\"  # a comment\n[data]\ntrain = \"t.parquet\"\nfeatures = [\"x\"]\n\
                    label = \"y\"\n[model]\nkind = \"mlp\"\nlayers = [1, 2]\n[train]\n\
                    optimizer = { kind = \"sgd\", lr = 0.05 }\n";
        std::fs::write(&file, text).unwrap();
        let overrides: Vec<Override> = vec!["train.epochs=3".parse().unwrap()];
        let written = SpecAsWritten::read(&file, &overrides).unwrap();
        assert_eq!(written.toml, text);
        assert_eq!(written.overrides, ["--set train.epochs=3"]);
        let spec = written.spec(&overrides).unwrap();
        assert_eq!(spec, JobSpec::load(&file, &overrides).unwrap());
        assert_eq!(spec.train.epochs, 3);
        let wire = pb::SpecAsWritten::from(&written);
        assert_eq!(SpecAsWritten::from(wire), written);
    }

    /// A file past the bound is refused by a sentence naming it, before it is read whole.
    #[test]
    fn a_spec_file_past_the_bound_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("huge.toml");
        std::fs::write(&file, "#".repeat(MAX_WRITTEN_SPEC_BYTES + 1)).unwrap();
        let err = SpecAsWritten::read(&file, &[]).unwrap_err().to_string();
        assert!(
            err.contains("huge.toml") && err.contains("larger than"),
            "{err}"
        );
    }
}
