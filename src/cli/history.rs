//! `ringflow history DIR`: what happened to the jobs of a checkpoint directory, from their event
//! log (`DIR/events.jsonl`, see [`ringflow_driver::events`]), in one command, like Spark's
//! history server.
//!
//! For each job in the log (a resumed job adds a run to the same log) it prints the job's id,
//! name and state, when it was submitted and finished, its executors (and those lost or joined),
//! one line per epoch (loss, rows, samples/s, seconds and where the steps' time went; a
//! token-sequence job's tokens, tokens/s and padding, and an IOB2 tagger's entity F1),
//! checkpoints, recoveries, the test figures (a tagger's per token) and the error of a failed
//! job ([`History`]). `--json` prints the same as one JSON object.

use std::process::ExitCode;

use clap::Args;
use ringflow_driver::events::{self, history::History};

#[derive(Args)]
pub struct HistoryArgs {
    /// The job's checkpoint directory (`cluster.checkpoint_dir`, default `runs/<name>`; a local
    /// path or an object-store URL), or its `events.jsonl`.
    dir: String,

    /// Print the history as one JSON object instead.
    #[arg(long)]
    json: bool,

    /// Only this job (a checkpoint directory holds every run of a resumed job).
    #[arg(long, value_name = "JOB_ID")]
    job: Option<String>,
}

pub fn run(args: HistoryArgs) -> anyhow::Result<ExitCode> {
    let (path, records) = events::read(&args.dir).map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut history = History::from_records(path, records);
    if let Some(id) = &args.job {
        history.keep_job(id)?;
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&history)?);
    } else {
        let text: Vec<String> = history.jobs.iter().map(|j| j.render()).collect();
        print!("{}", text.join("\n"));
    }
    Ok(ExitCode::SUCCESS)
}
