//! Tests of folding event logs into histories.

use super::*;

fn rec(job: &str, elapsed_s: f64, event: Event) -> Record {
    Record {
        job_id: job.into(),
        at: format!("2025-01-01T00:00:{:06.3}Z", elapsed_s),
        elapsed_s,
        event,
    }
}

fn epoch(e: u64) -> Event {
    Event::EpochEnd {
        epoch: e,
        steps: 10,
        loss: 1.0 / (e + 1) as f64,
        samples: 640,
        dropped_samples: 0,
        seconds: 2.0,
        samples_per_s: 320.0,
        phases: PhaseTimes {
            data: 0.5,
            forward: 0.5,
            backward: 0.5,
            allreduce: 0.25,
            optimizer: 0.25,
        },
        tokens: None,
        padding: None,
        tokens_per_s: None,
    }
}

fn submitted(resumed_from: Option<ResumedFrom>) -> Event {
    Event::Submitted {
        name: "m".into(),
        kind: crate::work::JobWork::Train,
        executors: 2,
        epochs: Some(2),
        steps_per_epoch: Some(10),
        rows: Some(1280),
        batch_size: Some(64),
        model: Some("mlp".into()),
        device: Some("cpu".into()),
        resumed_from,
        memory: None,
    }
}

fn sample() -> Vec<Record> {
    vec![
        rec("m-0001", 0.0, submitted(None)),
        rec(
            "m-0001",
            0.5,
            Event::Started {
                ranks: vec![
                    RankInfo {
                        rank: 0,
                        executor_id: "e1".into(),
                        host: "h".into(),
                    },
                    RankInfo {
                        rank: 1,
                        executor_id: "e2".into(),
                        host: "h".into(),
                    },
                ],
            },
        ),
        rec("m-0001", 2.5, epoch(0)),
        rec(
            "m-0001",
            2.6,
            Event::Checkpoint {
                epochs_done: 1,
                step: 10,
                path: "runs/m/checkpoint".into(),
                seconds: 0.1,
            },
        ),
        rec(
            "m-0001",
            2.7,
            Event::Evaluated {
                epoch: Some(0),
                rows: 100,
                loss: 0.5,
                accuracy: Some(0.8),
                mse: None,
                per_token: false,
                entities: None,
            },
        ),
        rec("m-0001", 4.5, epoch(1)),
        rec(
            "m-0001",
            5.0,
            Event::Evaluated {
                epoch: None,
                rows: 100,
                loss: 0.3,
                accuracy: Some(0.9),
                mse: None,
                per_token: false,
                entities: None,
            },
        ),
        rec(
            "m-0001",
            5.5,
            Event::Finished {
                state: "succeeded".into(),
                error: None,
                summary: Some(serde_json::json!({"model_path": "runs/m/model"})),
            },
        ),
        rec(
            "m-0001",
            0.0,
            submitted(Some(ResumedFrom {
                epochs_done: 1,
                step: 10,
            })),
        ),
        rec(
            "m-0002",
            0.0,
            Event::Finished {
                state: "failed".into(),
                error: Some("rank 1 failed: boom".into()),
                summary: None,
            },
        ),
    ]
}

#[test]
fn jobs_are_summarized_in_the_order_they_ran() {
    let h = History::from_records("f".into(), sample());
    assert_eq!(h.jobs.len(), 3);
    // A resumed job under a new driver, with the same id: a job of its own.
    let resumed = &h.jobs[1];
    assert_eq!(
        (resumed.job_id.as_str(), resumed.state.as_str()),
        ("m-0001", "unfinished")
    );
    assert!(resumed.epochs.is_empty());
    assert!(resumed.render().contains("resumed after epoch 1 (step 10)"));
    let j = &h.jobs[0];
    assert_eq!((j.state.as_str(), j.epochs.len()), ("succeeded", 2));
    assert_eq!(j.duration_s, 5.5);
    assert_eq!(j.epochs[1].phase_percent.allreduce, 12.5);
    assert_eq!(j.model_path.as_deref(), Some("runs/m/model"));
    assert_eq!(h.jobs[2].error.as_deref(), Some("rank 1 failed: boom"));

    let text = j.render();
    assert!(
        text.starts_with("job m-0001 (m, train): succeeded\n"),
        "{text}"
    );
    assert!(text.contains("rank 0 e1 on h, rank 1 e2 on h"), "{text}");
    assert!(text.contains("\n  2/2    0.5000"), "{text}");
    assert!(
        text.contains("checkpoints: 1, the last after 1 epochs"),
        "{text}"
    );
    assert!(
        text.contains("test: accuracy 0.9000, loss 0.3000 (100 rows)"),
        "{text}"
    );
    let failed = h.jobs[2].render();
    assert!(failed.contains("  error: rank 1 failed: boom"), "{failed}");
    assert!(failed.contains("never started"), "{failed}");

    // Each epoch's row has its test figure: after epoch 1 while training, after epoch 2
    // the final evaluation.
    let row = |n: &str| {
        text.lines()
            .find(|l| l.trim_start().starts_with(n))
            .unwrap_or_else(|| panic!("no row {n}: {text}"))
            .to_string()
    };
    assert!(row("1/2").ends_with("acc 0.8000"), "{text}");
    assert!(row("2/2").ends_with("acc 0.9000"), "{text}");

    let json = serde_json::to_value(&h).unwrap();
    assert_eq!(json["jobs"][0]["epochs"].as_array().unwrap().len(), 2);
    assert_eq!(json["jobs"][0]["epochs"][0]["test"]["accuracy"], 0.8);
    assert_eq!(json["jobs"][0]["executors"][1]["executor_id"], "e2");
}

#[test]
fn keeping_one_job_names_the_log_when_it_has_none() {
    let mut h = History::from_records("d/events.jsonl".into(), sample());
    h.keep_job("m-0001").unwrap();
    assert_eq!(h.jobs.len(), 2, "both runs of a resumed job");
    let e = h.keep_job("m-0009").unwrap_err();
    assert_eq!(e.to_string(), "d/events.jsonl has no events of job m-0009");
}

/// A tagger's log: two epochs with tokens, tested after the first and after training.
fn tagger() -> Vec<Record> {
    let sequence = |e: u64, tokens: u64| {
        let Event::EpochEnd { phases, .. } = epoch(e) else {
            unreachable!()
        };
        Event::EpochEnd {
            epoch: e,
            steps: 15,
            loss: 0.5,
            samples: 450,
            dropped_samples: 0,
            seconds: 2.0,
            samples_per_s: 225.0,
            phases,
            tokens: Some(tokens),
            padding: Some(tokens / 4),
            tokens_per_s: Some(tokens as f64 / 2.0),
        }
    };
    let tested = |epoch, entities: Option<(u64, u64, u64)>| Event::Evaluated {
        epoch,
        rows: 1164,
        loss: 0.25,
        accuracy: Some(0.94123),
        mse: None,
        per_token: true,
        entities: entities.map(|(correct, predicted, gold)| {
            ringflow_core::metrics::entities::EntityCounts {
                correct,
                predicted,
                gold,
            }
            .into()
        }),
    };
    vec![
        rec("ner-0001", 0.0, submitted(None)),
        rec("ner-0001", 2.5, sequence(0, 14_356)),
        rec("ner-0001", 2.7, tested(Some(0), Some((50, 100, 100)))),
        rec("ner-0001", 4.5, sequence(1, 14_400)),
        rec("ner-0001", 5.0, tested(None, Some((70, 100, 97)))),
    ]
}

#[test]
fn a_sequence_jobs_epochs_have_tokens_padding_and_entity_f1() {
    let h = History::from_records("f".into(), tagger());
    let j = &h.jobs[0];
    assert_eq!(j.epochs[0].tokens, Some(14_356));
    assert_eq!(j.epochs[0].padding_fraction, Some(0.2), "3589 of 17945");
    let text = j.render();
    let lines: Vec<&str> = text.lines().collect();
    let header = lines.iter().find(|l| l.contains("epoch ")).unwrap();
    assert!(
        header.contains("samples/s  tokens  tokens/s  padding  seconds"),
        "{text}"
    );
    assert!(header.ends_with("test  entity F1"), "{text}");
    let row = lines
        .iter()
        .find(|l| l.trim_start().starts_with("1/2"))
        .unwrap();
    assert!(row.contains(" 225   14356      7178    20.0% "), "{text}");
    assert!(row.ends_with("acc 0.9412     0.5000"), "{text}");
    assert!(
        text.contains(
            "  test: token accuracy 0.9412, entity F1 0.7107 (precision 0.70, recall 0.72), loss \
             0.2500 (1164 tokens)\n"
        ),
        "{text}"
    );
    let json = serde_json::to_value(&h).unwrap();
    let epoch = &json["jobs"][0]["epochs"][0];
    assert_eq!(epoch["tokens_per_s"], 7178.0);
    assert_eq!(epoch["test"]["per_token"], true);
    assert_eq!(epoch["test"]["entities"]["f1"], 0.5);

    // A job that is not a sequence: no token columns or fields.
    let h = History::from_records("f".into(), sample());
    let text = h.jobs[0].render();
    assert!(
        !text.contains("tokens") && !text.contains("entity"),
        "{text}"
    );
    let json = serde_json::to_string(&h).unwrap();
    for field in ["tokens", "padding", "per_token", "entities"] {
        assert!(!json.contains(field), "{field} in {json}");
    }
}
