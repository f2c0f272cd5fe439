//! What a prediction's end does to its output with `--overwrite`
//! ([`crate::outputs::prediction`]): once every rank has written its part, the parts become
//! the output, replacing what it held; a failed or cancelled run leaves the output as it was
//! (on a file system) or says what it may now mix (on an object store).

use ringflow_core::data::prediction_part;

use super::{Job, JobKind};
use crate::outputs::OutputError;
use crate::outputs::prediction;

impl Job {
    /// The output of a prediction with `--overwrite`.
    fn replaced_output(&self) -> Option<&str> {
        match &self.kind {
            JobKind::Infer {
                predict: Some((output, _)),
                overwrite: true,
                ..
            } => Some(output),
            _ => None,
        }
    }

    /// Makes what every rank wrote the output of a prediction with `--overwrite`; what it
    /// replaced goes to the job's messages.
    pub(super) fn commit_output(&mut self) -> Result<(), OutputError> {
        let Some(output) = self.replaced_output() else {
            return Ok(());
        };
        let written: Vec<String> = self
            .progress
            .reports()
            .outcomes()
            .unwrap_or_default()
            .iter()
            .enumerate()
            .filter(|(_, o)| o.rows_written > 0)
            .map(|(rank, _)| prediction_part(rank))
            .collect();
        let note = prediction::commit(output, &self.id, &written)?;
        self.message(note);
        Ok(())
    }

    /// After a prediction with `--overwrite` failed or was cancelled: removes what it wrote
    /// beside a local output; says that an object store's output may now hold parts of both
    /// runs.
    pub(super) fn abandon_output(&mut self) {
        let Some(output) = self.replaced_output() else {
            return;
        };
        let output = output.to_string();
        if !prediction::abandon(&output, &self.id) {
            self.message(format!(
                "--overwrite: --output {output} may now hold parts of this run beside the \
                 previous output's (an object store cannot swap them in at once); run the \
                 prediction again with --overwrite"
            ));
        }
    }
}
