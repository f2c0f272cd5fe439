//! [`JobWork`]: what a job does, as its summary, its event log and `ringflow history` name it.
//! A leaf: the summary, the events and the scheduler all speak of it.

use serde::{Deserialize, Serialize};

/// What a job does, written `"train"`, `"eval"` or `"predict"`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum JobWork {
    /// Trains a model.
    #[default]
    Train,
    /// Evaluates a saved model on a data set.
    Eval,
    /// Writes a saved model's predictions.
    Predict,
}

impl JobWork {
    /// Evaluation, or prediction when `predicts`.
    pub fn inference(predicts: bool) -> JobWork {
        if predicts {
            JobWork::Predict
        } else {
            JobWork::Eval
        }
    }

    /// The word for it: `"train"`, `"eval"` or `"predict"`.
    pub fn as_str(self) -> &'static str {
        match self {
            JobWork::Train => "train",
            JobWork::Eval => "eval",
            JobWork::Predict => "predict",
        }
    }
}

impl std::fmt::Display for JobWork {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::JobWork;

    /// Each is written as its word, in JSON and in text, and read back.
    #[test]
    fn each_is_written_as_its_word() {
        for work in [JobWork::Train, JobWork::Eval, JobWork::Predict] {
            let json = serde_json::to_string(&work).unwrap();
            assert_eq!(json, format!("\"{work}\""));
            assert_eq!(serde_json::from_str::<JobWork>(&json).unwrap(), work);
        }
        assert!(serde_json::from_str::<JobWork>("\"bench\"").is_err());
    }
}
