//! The bounds of control-plane messages, and the fuzz targets of what an executor decodes from
//! the driver: tasks (any size, damaged), preprocessing (damaged JSON), and the chunks of a
//! fetched preprocessing (any announced length, any chunking, lost or extra bytes).

use proptest::prelude::*;
use prost::Message;

use super::*;
use crate::data::Preprocessing;
use crate::wire::payload;

/// A training task whose spec and preprocessing are the given texts, listing `files`.
fn task(job: String, preprocessing: String, files: Vec<String>) -> pb::Task {
    pb::Task {
        header: Some(pb::TaskHeader {
            job_id: "tagger-20250101000000-a1b2-0001".into(),
            rank: 1,
            ring: vec!["127.0.0.1:4000".into(), "127.0.0.1:4001".into()],
            secret: vec![7; 32],
            job,
            ..Default::default()
        }),
        work: Some(pb::task::Work::Train(pb::TrainWork {
            data: Some(pb::DataAccess {
                input_columns: vec!["tokens".into(), "tags".into()],
                preprocessing,
                files,
                ..Default::default()
            }),
            steps_per_epoch: 10,
            ..Default::default()
        })),
    }
}

#[test]
fn an_oversized_task_names_its_largest_part() {
    let t = task("{}".into(), "x".repeat(5000), vec!["a.parquet".into()]);
    assert_eq!(check_task_within(&t, 1 << 20), Ok(()));
    let e = check_task_within(&t, 1000).unwrap_err();
    assert_eq!(e.part_bytes, 5000);
    assert_eq!(
        e.to_string(),
        format!(
            "its task is {}, more than the 1000 B a control-plane message may have; its \
             largest part is the preprocessing (the vocabulary, the label classes, the \
             normalization) (4.9 KiB)",
            format_bytes(t.encoded_len() as u64)
        )
    );
    let files = vec!["f".repeat(3000), "g".repeat(3000)];
    let e = check_task_within(&task("{}".into(), String::new(), files), 1000).unwrap_err();
    assert_eq!(e.part, "the files listed for data.source = \"auto\"");
}

#[test]
fn a_document_travels_in_chunks_and_reads_back() {
    let doc = "語".repeat(CHUNK_BYTES); // 3 MiB, cut inside characters
    let mut r = Reassembly::new(doc.len() as u64).unwrap();
    let mut n = 0;
    for c in chunks(&doc) {
        assert!(c.len() <= CHUNK_BYTES);
        r.push(c).unwrap();
        n += 1;
    }
    assert_eq!(n, 3);
    assert_eq!(r.finish().unwrap(), doc);
    assert_eq!(chunks("").count(), 0);
    assert_eq!(Reassembly::new(0).unwrap().finish().unwrap(), "");
    assert!(travels_inline(INLINE_PREPROCESSING_BYTES));
    assert!(!travels_inline(INLINE_PREPROCESSING_BYTES + 1));
}

#[test]
fn an_announced_length_over_the_bound_is_refused_before_anything_is_read() {
    let e = Reassembly::new(MAX_PREPROCESSING_BYTES + 1).unwrap_err();
    assert_eq!(
        e.to_string(),
        "the driver announced 1.0 GiB of preprocessing, more than the 1.0 GiB a job's \
         preprocessing may have"
    );
    assert!(Reassembly::new(u64::MAX).is_err());
}

/// A document, the length announced for it (right, or off by a delta, or anything), and its
/// chunks: cut anywhere (within or past the chunk limit), some dropped, some repeated.
fn transfer() -> impl Strategy<Value = (String, u64, Vec<Vec<u8>>)> {
    (
        ".{0,200}",
        prop_oneof![Just(0i64), -3i64..3, Just(i64::MIN)],
        prop::collection::vec(1usize..40, 0..12),
        prop::collection::vec((any::<prop::sample::Index>(), 0u8..3), 0..3),
    )
        .prop_map(|(doc, delta, cuts, edits)| {
            let bytes = doc.as_bytes();
            let mut pieces = Vec::new();
            let mut at = 0;
            for c in cuts {
                if at >= bytes.len() {
                    break;
                }
                let end = (at + c).min(bytes.len());
                pieces.push(bytes[at..end].to_vec());
                at = end;
            }
            if at < bytes.len() {
                pieces.push(bytes[at..].to_vec());
            }
            for (i, kind) in edits {
                if pieces.is_empty() {
                    break;
                }
                let i = i.index(pieces.len());
                match kind {
                    0 => {
                        pieces.remove(i);
                    }
                    1 => pieces.insert(i, pieces[i].clone()),
                    _ => pieces[i].push(0xff),
                }
            }
            let announced = if delta == i64::MIN {
                u64::MAX
            } else {
                (doc.len() as i64 + delta).max(0) as u64
            };
            (doc, announced, pieces)
        })
}

proptest! {
    #![proptest_config(ringflow_ml::fuzz::config(1024))]

    /// Any chunks under any announced length: the chunks' bytes, in order, when they are as
    /// many as announced, each within the chunk limit, and text; otherwise an error sentence,
    /// with never more bytes held than announced. (The stream delivers chunks in order, so a
    /// transfer of the announced length is the document sent; the document itself when no
    /// chunk was dropped, repeated or changed.)
    #[test]
    fn fuzz_preprocessing_chunks((doc, announced, pieces) in transfer()) {
        let (limit, chunk_limit) = (1000u64, 16usize);
        let mut held = 0u64;
        let got = Reassembly::with_limits(announced, limit, chunk_limit).and_then(|mut r| {
            for p in &pieces {
                r.push(p)?;
                held = held.max(r.bytes.len() as u64);
            }
            r.finish()
        });
        prop_assert!(held <= announced);
        let joined: Vec<u8> = pieces.concat();
        let whole = announced == joined.len() as u64
            && announced <= limit
            && pieces.iter().all(|p| p.len() <= chunk_limit)
            && std::str::from_utf8(&joined).is_ok();
        match got {
            Ok(text) => {
                prop_assert!(whole, "accepted a damaged transfer as {:?}", text);
                prop_assert_eq!(text.as_bytes(), &joined[..]);
                if joined == doc.as_bytes() {
                    prop_assert_eq!(text, doc);
                }
            }
            Err(e) => {
                prop_assert!(!whole, "refused an intact transfer: {}", e);
                let sentence = e.to_string();
                prop_assert!(!sentence.is_empty() && !sentence.contains('\n'));
            }
        }
    }

    /// A task with any spec and preprocessing text and file list, encoded and then damaged
    /// (bytes changed, cut or added): it decodes to a task that encodes back to itself, or to
    /// an error, never a panic; the size check accepts exactly the tasks within its limit and
    /// otherwise names a part that really is the largest.
    #[test]
    fn fuzz_task_messages(
        spec in ".{0,300}",
        pre in ".{0,300}",
        files in prop::collection::vec(".{0,40}", 0..6),
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..4),
        cut in any::<prop::sample::Index>(),
        cut_it in any::<bool>(),
        limit in 0usize..2000,
    ) {
        let original = task(spec, pre, files);
        let mut bytes = original.encode_to_vec();
        for (at, v) in edits {
            let i = at.index(bytes.len());
            bytes[i] = v;
        }
        if cut_it {
            bytes.truncate(cut.index(bytes.len() + 1));
        }
        if let Ok(decoded) = pb::Task::decode(bytes.as_slice()) {
            let again = pb::Task::decode(decoded.encode_to_vec().as_slice());
            prop_assert_eq!(again.as_ref(), Ok(&decoded));
            let fits = decoded.encoded_len() <= limit;
            match check_task_within(&decoded, limit) {
                Ok(()) => prop_assert!(fits),
                Err(e) => {
                    prop_assert!(!fits);
                    let largest = task_parts(&decoded)[0].1;
                    prop_assert_eq!(e.part_bytes, largest);
                }
            }
        }
    }

    /// A task's preprocessing, valid or damaged: read back equal, or refused by one sentence
    /// naming the field.
    #[test]
    fn fuzz_preprocessing_json(
        tokens in prop::collection::vec("[a-z語]{1,6}", 0..8),
        classes in prop::collection::vec(".{0,8}", 0..4),
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<char>()), 0..3),
    ) {
        let mut all = vec!["<pad>".to_string(), "<unk>".to_string()];
        for t in tokens {
            if !all.contains(&t) {
                all.push(t);
            }
        }
        let p = Preprocessing {
            classes: (!classes.is_empty()).then_some(classes),
            vocabulary: Some(crate::data::vocab::Vocabulary::from_tokens(all).unwrap()),
            normalize: None,
            singletons_from: None,
        };
        let mut text: Vec<char> = payload::encode(&p).chars().collect();
        let damaged = !edits.is_empty();
        for (at, c) in edits {
            let i = at.index(text.len());
            text[i] = c;
        }
        let text: String = text.into_iter().collect();
        match payload::decode_optional::<Preprocessing>("DataAccess.preprocessing", &text) {
            Ok(Some(back)) => {
                if !damaged {
                    prop_assert_eq!(back, p);
                }
            }
            Ok(None) => prop_assert!(text.is_empty()),
            Err(e) => {
                prop_assert!(damaged);
                let e = e.to_string();
                prop_assert!(e.starts_with("DataAccess.preprocessing "), "{}", e);
                prop_assert!(!e.contains('\n'));
            }
        }
    }
}
