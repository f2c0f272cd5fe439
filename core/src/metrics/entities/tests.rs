//! Hand-worked cases of conlleval's chunk rules and of the counts' ratios.

use super::*;

/// Class indices of the scheme `O, B-LOC, I-LOC, B-PSN, I-PSN`.
const O: usize = 0;
const B_LOC: usize = 1;
const I_LOC: usize = 2;
const B_PSN: usize = 3;
const I_PSN: usize = 4;

fn scheme() -> TagScheme {
    TagScheme::parse(&["O", "B-LOC", "I-LOC", "B-PSN", "I-PSN"]).expect("an IOB2 scheme")
}

#[test]
fn classes_are_read_as_tags_with_their_types() {
    let s = scheme();
    assert_eq!(s.types(), ["LOC", "PSN"]);
    assert_eq!(s.tag(O), Some(Tag::Outside));
    assert_eq!(s.tag(B_LOC), Some(Tag::Begin(0)));
    assert_eq!(s.tag(I_PSN), Some(Tag::Inside(1)));
    assert_eq!(s.tag(5), None);
}

#[test]
fn a_class_that_is_not_iob2_is_named() {
    for (classes, index) in [
        (&["O", "X-LOC"][..], 1),
        (&["B-", "O"][..], 0),
        (&["O", "B-LOC", "B"][..], 2),
        (&["o"][..], 0),
    ] {
        let err = TagScheme::parse(classes).expect_err("not IOB2");
        assert_eq!(err.index, index, "{classes:?}");
        assert_eq!(err.name, classes[index]);
        assert!(err.to_string().contains(&format!("tag class {index}")));
    }
}

#[test]
fn entities_follow_conllevals_chunk_rules() {
    let s = scheme();
    let cases: [(&[usize], &[Entity]); 7] = [
        // B-X then its I-X; an entity that ends the sentence.
        (&[B_LOC, I_LOC, O, B_PSN], &[(0..2, 0), (3..4, 1)]),
        // An I-X after O starts an entity.
        (&[O, I_LOC, I_LOC], &[(1..3, 0)]),
        // An I-X after another type starts a new entity.
        (&[B_LOC, I_PSN, I_PSN], &[(0..1, 0), (1..3, 1)]),
        // B-X right after B-X: two entities of one token.
        (&[B_LOC, B_LOC, I_LOC], &[(0..1, 0), (1..3, 0)]),
        // A sentence that opens with I-X.
        (&[I_PSN, O, O], &[(0..1, 1)]),
        (&[O, O], &[]),
        // A class index outside the scheme counts as O.
        (&[B_LOC, 9, I_LOC], &[(0..1, 0), (2..3, 0)]),
    ];
    for (tags, want) in cases {
        assert_eq!(s.entities(tags), want, "{tags:?}");
    }
}

#[test]
fn only_exact_entities_count_as_correct() {
    let s = scheme();
    let same = s.count(&[B_LOC, I_LOC, O, B_PSN], &[B_LOC, I_LOC, O, B_PSN]);
    assert_eq!(
        same,
        EntityCounts {
            correct: 2,
            predicted: 2,
            gold: 2
        }
    );
    assert_eq!(
        (same.precision(), same.recall(), same.f1()),
        (1.0, 1.0, 1.0)
    );
    // Too short, and the wrong type: neither is correct.
    let short = s.count(&[B_LOC, I_LOC], &[B_LOC, O]);
    assert_eq!((short.correct, short.predicted, short.gold), (0, 1, 1));
    let wrong_type = s.count(&[B_LOC, I_LOC], &[B_PSN, I_PSN]);
    assert_eq!((wrong_type.correct, wrong_type.f1()), (0, 0.0));
}

#[test]
fn counts_add_over_sentences_before_the_ratios() {
    let s = scheme();
    // Sentence 1: gold LOC(0..2), PSN(3..4); predicted LOC(0..2) only.
    let mut total = s.count(&[B_LOC, I_LOC, O, B_PSN], &[B_LOC, I_LOC, O, O]);
    // Sentence 2: gold PSN(0..1); predicted PSN(0..1) and a spurious LOC(1..2).
    total += s.count(&[B_PSN, O], &[B_PSN, B_LOC]);
    assert_eq!(
        total,
        EntityCounts {
            correct: 2,
            predicted: 3,
            gold: 3
        }
    );
    let third = 2.0 / 3.0;
    assert!((total.precision() - third).abs() < 1e-12);
    assert!((total.recall() - third).abs() < 1e-12);
    assert!((total.f1() - third).abs() < 1e-12);
    // P = 1, R = 1/4 gives F1 = 2 · 1/4 / (5/4) = 0.4.
    let uneven = EntityCounts {
        correct: 1,
        predicted: 1,
        gold: 4,
    };
    assert!((uneven.f1() - 0.4).abs() < 1e-12);
}

#[test]
fn nothing_predicted_or_nothing_to_find_is_zero_not_nan() {
    let none = EntityCounts::default();
    assert_eq!(
        (none.precision(), none.recall(), none.f1()),
        (0.0, 0.0, 0.0)
    );
    let s = scheme();
    let missed = s.count(&[B_LOC], &[O]);
    assert_eq!(
        (missed.precision(), missed.recall(), missed.f1()),
        (0.0, 0.0, 0.0)
    );
}
