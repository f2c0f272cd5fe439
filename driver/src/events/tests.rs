//! Tests of event records and logs.

use super::*;

fn epoch(e: u64) -> Event {
    Event::EpochEnd {
        epoch: e,
        steps: 10,
        loss: 0.5,
        samples: 640,
        dropped_samples: 0,
        seconds: 1.5,
        samples_per_s: 426.7,
        phases: PhaseTimes {
            data: 0.1,
            forward: 0.4,
            backward: 0.6,
            allreduce: 0.3,
            optimizer: 0.1,
        },
        tokens: None,
        padding: None,
        tokens_per_s: None,
    }
}

#[test]
fn sequence_figures_are_logged_only_for_sequence_jobs() {
    let record = |event| Record {
        job_id: "ner-0001".into(),
        at: "2024-02-29T12:34:56.789Z".into(),
        elapsed_s: 3.25,
        event,
    };
    let plain = record(epoch(0)).to_line();
    assert!(
        !plain.contains("tokens") && !plain.contains("padding"),
        "{plain}"
    );
    let Event::EpochEnd { phases, .. } = epoch(0) else {
        unreachable!()
    };
    let tagged = record(Event::EpochEnd {
        epoch: 0,
        steps: 15,
        loss: 0.4,
        samples: 450,
        dropped_samples: 0,
        seconds: 2.8,
        samples_per_s: 160.7,
        phases,
        tokens: Some(14_356),
        padding: Some(630),
        tokens_per_s: Some(5127.1),
    });
    let line = tagged.to_line();
    for field in [
        r#""tokens":14356,"#,
        r#""padding":630,"#,
        r#""tokens_per_s":5127.1}"#,
    ] {
        assert!(line.contains(field), "{field} in {line}");
    }
    assert_eq!(Record::from_line(&line).unwrap(), tagged);
    let evaluated = |per_token, entities| {
        record(Event::Evaluated {
            epoch: None,
            rows: 1164,
            loss: 0.2,
            accuracy: Some(0.94),
            mse: None,
            per_token,
            entities,
        })
    };
    let rows = evaluated(false, None).to_line();
    assert!(
        rows.ends_with(r#""accuracy":0.94,"loss":0.2,"rows":1164}"#),
        "{rows}"
    );
    let counts = ringflow_core::metrics::entities::EntityCounts {
        correct: 7,
        predicted: 10,
        gold: 10,
    };
    let tagger = evaluated(true, Some(counts.into()));
    let line = tagger.to_line();
    for field in [
        r#""entities":{"correct":7,"f1":0.7,"gold":10,"precision":0.7,"predicted":10,"recall":0.7}"#,
        r#""per_token":true"#,
    ] {
        assert!(line.contains(field), "{field} in {line}");
    }
    assert_eq!(Record::from_line(&line).unwrap(), tagger);
}

#[test]
fn timestamps_are_rfc3339_in_utc() {
    assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
    let t = UNIX_EPOCH + Duration::from_millis(1_709_210_096_789);
    assert_eq!(rfc3339(t), "2024-02-29T12:34:56.789Z");
    let t = UNIX_EPOCH + Duration::from_secs(951_782_400);
    assert_eq!(rfc3339(t), "2000-02-29T00:00:00.000Z");
    assert_eq!(compact_utc(t), "20000229000000");
    let t = UNIX_EPOCH + Duration::from_millis(1_709_210_096_789);
    assert_eq!(compact_utc(t), "20240229123456");
}

#[test]
fn lines_start_with_the_event_and_round_trip() {
    let r = Record {
        job_id: "mnist-0001".into(),
        at: "2024-02-29T12:34:56.789Z".into(),
        elapsed_s: 3.25,
        event: epoch(2),
    };
    let line = r.to_line();
    assert!(
        line.starts_with(
            r#"{"event":"epoch_end","job_id":"mnist-0001","at":"2024-02-29T12:34:56.789Z","elapsed_s":3.25,"#
        ),
        "{line}"
    );
    assert!(!line.contains('\n'));
    assert_eq!(Record::from_line(&line).unwrap(), r);
    let finished = Record {
        event: Event::Finished {
            state: "failed".into(),
            error: Some("rank 1 failed:\nboom".into()),
            summary: Some(serde_json::json!({"epochs": 2})),
        },
        ..r
    };
    assert_eq!(Record::from_line(&finished.to_line()).unwrap(), finished);
}

#[test]
fn unknown_events_are_kept_as_unknown() {
    let line = r#"{"event":"from_the_future","job_id":"j","at":"x","elapsed_s":1,"n":3}"#;
    assert_eq!(Record::from_line(line).unwrap().event, Event::Unknown);
}

#[test]
fn bad_lines_are_named_with_their_number() {
    let good = Record {
        job_id: "j".into(),
        at: "x".into(),
        elapsed_s: 0.0,
        event: epoch(0),
    }
    .to_line();
    let text = format!("{good}\n\n{{\"event\": 3\n");
    let e = parse(&text, "d/events.jsonl").unwrap_err().to_string();
    assert!(
        e.starts_with("d/events.jsonl line 3 is not a ringflow event: "),
        "{e}"
    );
    let e = parse(&format!("{good}\n[1]\n"), "f")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("f line 2 ") && e.contains("not a JSON object"),
        "{e}"
    );
    let e = parse("\n", "f").unwrap_err().to_string();
    assert_eq!(e, "f holds no events");
}

#[test]
fn logs_append_in_order_and_later_runs_follow() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("nested/ckpt");
    let path = log_path(ckpt.to_str().unwrap());
    let mut first = EventLog::open(path.clone(), "job-1".into());
    for e in 0..3 {
        first.write(e as f64, epoch(e));
    }
    first.close(Duration::from_secs(10));
    // Writes after closing are dropped, never an error.
    first.write(9.0, epoch(9));
    let mut second = EventLog::open(path.clone(), "job-2".into());
    second.write(
        0.0,
        Event::Finished {
            state: "succeeded".into(),
            error: None,
            summary: None,
        },
    );
    second.close(Duration::from_secs(10));
    let (read_path, records) = read(ckpt.to_str().unwrap()).unwrap();
    assert_eq!(read_path, path);
    let seen: Vec<(String, &str)> = records
        .iter()
        .map(|r| (r.job_id.clone(), r.event.name()))
        .collect();
    assert_eq!(
        seen,
        [
            ("job-1".to_string(), "epoch_end"),
            ("job-1".to_string(), "epoch_end"),
            ("job-1".to_string(), "epoch_end"),
            ("job-2".to_string(), "finished"),
        ]
    );
    // The file itself can be named too.
    assert_eq!(read(&path).unwrap().1.len(), 4);
}

#[test]
fn an_unwritable_log_never_fails_the_writer() {
    let dir = tempfile::tempdir().unwrap();
    let blocker = dir.path().join("file");
    std::fs::write(&blocker, b"x").unwrap();
    // The checkpoint directory would have to be inside a regular file.
    let path = log_path(blocker.join("ckpt").to_str().unwrap());
    let mut log = EventLog::open(path, "j".into());
    log.write(0.0, epoch(0));
    log.write(1.0, epoch(1));
    log.close(Duration::from_secs(10));
}

#[test]
fn a_missing_log_is_one_sentence_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let e = read(d).unwrap_err().to_string();
    assert!(
        e.starts_with(&format!("there is no event log {d}/events.jsonl")),
        "{e}"
    );
    assert!(!e.contains('\n'), "{e}");
}

/// An object store tells a missing log by the error's kind (the local store stands in for
/// a remote one): appending to a log not written yet starts it, and reading one reports
/// that there is none.
#[test]
fn a_missing_log_object_is_told_by_its_kind() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ckpt/events.jsonl");
    let text = path.to_str().unwrap().to_string();
    let location = Location::parse(&text).unwrap();
    let mut sink = Sink::Store {
        location: location.clone(),
        content: None,
    };
    sink.append(&[r#"{"a":1}"#.to_string()]).unwrap();
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "{\"a\":1}\n");

    let absent = dir.path().join("other/events.jsonl");
    let absent = absent.to_str().unwrap();
    let e = read_object(Location::parse(absent).unwrap(), absent, absent)
        .unwrap_err()
        .to_string();
    assert_eq!(e, format!("there is no event log {absent}"));
    let bytes = read_object(location, &text, &text).unwrap();
    assert_eq!(bytes, b"{\"a\":1}\n");
}
