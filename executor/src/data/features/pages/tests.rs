//! The page decoder's tests: hybrid streams built by hand, hand-made pages, plain values.

use super::*;

/// `values` bit-packed `width` bits each, least significant bit first, in groups of 8.
fn pack(values: &[u32], width: u32) -> Vec<u8> {
    let groups = values.len().div_ceil(8);
    let mut out = vec![0u8; groups * width as usize];
    for (i, &v) in values.iter().enumerate() {
        for b in 0..width {
            if v >> b & 1 == 1 {
                let at = i * width as usize + b as usize;
                out[at / 8] |= 1 << (at % 8);
            }
        }
    }
    out
}

fn leb(mut v: u64, out: &mut Vec<u8>) {
    loop {
        let byte = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

/// A hybrid stream of a run of `repeat.1` copies of `repeat.0`, then `packed` bit-packed,
/// then the run again.
fn stream(repeat: (u32, usize), packed: &[u32], width: u32) -> Vec<u8> {
    let mut out = Vec::new();
    let run = |out: &mut Vec<u8>| {
        leb((repeat.1 as u64) << 1, out);
        out.extend(&repeat.0.to_le_bytes()[..width.div_ceil(8) as usize]);
    };
    run(&mut out);
    leb((packed.len().div_ceil(8) as u64) << 1 | 1, &mut out);
    out.extend(pack(packed, width));
    run(&mut out);
    out
}

/// Every value of the stream, taken `step` at a time.
fn values(bytes: Vec<u8>, width: u32, n: usize, step: usize) -> Option<Vec<u32>> {
    let mut h = Hybrid::new(Bytes::from(bytes), 0, width)?;
    let mut out = Vec::new();
    let mut left = n;
    while left > 0 {
        let k = left.min(step);
        let ok = h.take(k, |piece| {
            match piece {
                Piece::Repeat(v, c) => out.extend(std::iter::repeat_n(v, c)),
                Piece::Packed(packed) => packed.each(|_, v| out.push(v)),
            }
            true
        });
        if !ok {
            return None;
        }
        left -= k;
    }
    Some(out)
}

#[test]
fn runs_and_packed_groups_decode_for_every_width_and_split() {
    for width in [0, 1, 2, 3, 7, 8, 9, 13, 16, 24, 31, 32] {
        let max = if width == 32 {
            u32::MAX
        } else {
            (1u32 << width) - 1
        };
        let packed: Vec<u32> = (0..21u32)
            .map(|i| i.wrapping_mul(2_654_435_761) & max)
            .collect();
        let repeat = (max / 3, 11);
        // The packed run holds 24 values (3 groups), of which 21 are used; the last run
        // follows the 3 padding values.
        let mut padded = packed.clone();
        padded.resize(24, 0);
        let mut want = vec![repeat.0; 11];
        want.extend(&padded);
        want.extend(vec![repeat.0; 11]);
        for step in [1, 3, 8, 50] {
            let got = values(stream(repeat, &packed, width), width, want.len(), step);
            assert_eq!(got.as_deref(), Some(&want[..]), "width {width} step {step}");
        }
    }
}

#[test]
fn malformed_streams_are_refused_not_read_past() {
    let good = stream((5, 4), &[1, 2, 3], 3);
    assert!(values(good.clone(), 3, 16, 16).is_some());
    // Fewer values than asked for, a cut packed run, a cut run value, a header that
    // never ends, a width over 32.
    assert!(values(good.clone(), 3, 17, 16).is_none());
    assert!(values(good[..good.len() - 3].to_vec(), 3, 12, 16).is_none());
    assert!(values(vec![8], 16, 4, 4).is_none());
    assert!(values(vec![0xff; 12], 3, 1, 1).is_none());
    assert!(values(good, 33, 1, 1).is_none());
    // A packed run claiming more groups than the buffer holds.
    let mut huge = Vec::new();
    leb((u64::MAX >> 1) | 1, &mut huge);
    assert!(values(huge, 8, 1, 1).is_none());
}

/// Pages handed out in order, as a column chunk's page reader would.
struct Pages(std::vec::IntoIter<Page>);

impl Iterator for Pages {
    type Item = datafusion::parquet::errors::Result<Page>;
    fn next(&mut self) -> Option<Self::Item> {
        self.0.next().map(Ok)
    }
}

impl PageReader for Pages {
    fn get_next_page(&mut self) -> datafusion::parquet::errors::Result<Option<Page>> {
        Ok(self.0.next())
    }
    fn peek_next_page(
        &mut self,
    ) -> datafusion::parquet::errors::Result<Option<datafusion::parquet::column::page::PageMetadata>>
    {
        Err(datafusion::parquet::errors::ParquetError::General(
            "no index".into(),
        ))
    }
    fn skip_next_page(&mut self) -> datafusion::parquet::errors::Result<()> {
        self.0.next();
        Ok(())
    }
}

/// A hybrid stream of `levels`, `width` bits each, bit-packed.
fn packed_stream(levels: &[u32], width: u32) -> Vec<u8> {
    let mut out = Vec::new();
    leb((levels.len().div_ceil(8) as u64) << 1 | 1, &mut out);
    out.extend(pack(levels, width));
    out
}

/// A v1 data page of `count` levels: repetition and definition levels (each behind its
/// length, when given) and plain i32 `values`.
fn v1(rep: Option<Vec<u8>>, def: Option<Vec<u8>>, values: &[i32], count: u32) -> Page {
    let mut buf = Vec::new();
    for section in [rep, def].into_iter().flatten() {
        buf.extend((section.len() as u32).to_le_bytes());
        buf.extend(section);
    }
    buf.extend(values.iter().flat_map(|v| v.to_le_bytes()));
    Page::DataPage {
        buf: Bytes::from(buf),
        num_values: count,
        encoding: Encoding::PLAIN,
        def_level_encoding: Encoding::RLE,
        rep_level_encoding: Encoding::RLE,
        statistics: None,
    }
}

fn column(pages: Vec<Page>, max_rep: i16, max_def: i16) -> Option<PageColumn> {
    PageColumn::new(
        Box::new(Pages(pages.into_iter())),
        Kind::I32,
        1.0,
        max_rep,
        max_def,
    )
}

#[test]
fn pages_with_a_null_or_a_ragged_row_are_refused() {
    let values: Vec<i32> = (1..=16).collect();
    // A run of 8 present values, then a run of 8 nulls (their values are there anyway,
    // so that only the levels tell).
    let mut nulls = stream((1, 8), &[], 1);
    nulls.truncate(2);
    nulls.extend(stream((0, 8), &[], 1)[..2].iter());
    assert!(column(vec![v1(None, Some(nulls), &values, 16)], 0, 1).is_none());
    let present = stream((1, 16), &[], 1)[..2].to_vec();
    let mut c = column(vec![v1(None, Some(present), &values, 16)], 0, 1).unwrap();
    let mut got = [0f32; 16];
    assert!(c.read(&mut got) && got[15] == 16.0);
    // Rows of 2 and 4 values: as many levels as 2 rows of 3 (or 3 rows of 2).
    let def = || stream((1, 6), &[], 1)[..2].to_vec();
    let ragged = packed_stream(&[0, 1, 0, 1, 1, 1], 1);
    assert!(column(vec![v1(Some(ragged), Some(def()), &values[..6], 6)], 1, 1).is_none());
    let regular = packed_stream(&[0, 1, 1, 0, 1, 1], 1);
    let mut c = column(vec![v1(Some(regular), Some(def()), &values[..6], 6)], 1, 1).unwrap();
    assert_eq!(c.width(), 3);
    let mut rows = [0f32; 6];
    assert!(c.read(&mut rows) && rows == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    assert!(!c.read(&mut rows[..3]), "past the last page");
}

#[test]
fn dictionary_indices_out_of_range_are_refused() {
    let dictionary = Page::DictionaryPage {
        buf: Bytes::from(
            [7i32, 9]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect::<Vec<u8>>(),
        ),
        num_values: 2,
        encoding: Encoding::PLAIN,
        is_sorted: false,
    };
    // Indices bit-packed, or (`repeat`) one run of the first.
    let page = |indices: &[u32]| {
        let mut buf = vec![2u8];
        match indices {
            [i, repeat @ ..] if repeat.iter().all(|r| r == i) => {
                buf.extend([(indices.len() as u8) << 1, *i as u8])
            }
            _ => buf.extend(packed_stream(indices, 2)),
        }
        Page::DataPage {
            buf: Bytes::from(buf),
            num_values: indices.len() as u32,
            encoding: Encoding::RLE_DICTIONARY,
            def_level_encoding: Encoding::RLE,
            rep_level_encoding: Encoding::RLE,
            statistics: None,
        }
    };
    let mut got = [0f32; 4];
    let mut c = column(vec![dictionary.clone(), page(&[1, 0, 1, 1])], 0, 0).unwrap();
    assert!(c.read(&mut got) && got == [9.0, 7.0, 9.0, 9.0]);
    let mut c = column(vec![dictionary.clone(), page(&[1, 0, 2, 1])], 0, 0).unwrap();
    assert!(!c.read(&mut got), "index 2 of a dictionary of 2");
    let mut c = column(vec![dictionary.clone(), page(&[1; 4])], 0, 0).unwrap();
    assert!(c.read(&mut got) && got == [9.0; 4]);
    let mut c = column(vec![dictionary, page(&[2; 4])], 0, 0).unwrap();
    assert!(!c.read(&mut got), "a run of index 2");
}

/// Indices a byte wide (dictionaries of 129 to 256 values, 8-bit pixels) take their own path:
/// a full dictionary needs no check, a smaller one refuses an index past its end.
#[test]
fn byte_wide_dictionary_indices_are_looked_up_and_checked() {
    let dictionary = |n: i32| Page::DictionaryPage {
        buf: Bytes::from(
            (0..n)
                .flat_map(|v| (3 * v).to_le_bytes())
                .collect::<Vec<u8>>(),
        ),
        num_values: n as u32,
        encoding: Encoding::PLAIN,
        is_sorted: false,
    };
    let page = |indices: &[u32]| {
        let mut buf = vec![8u8];
        buf.extend(packed_stream(indices, 8));
        Page::DataPage {
            buf: Bytes::from(buf),
            num_values: indices.len() as u32,
            encoding: Encoding::RLE_DICTIONARY,
            def_level_encoding: Encoding::RLE,
            rep_level_encoding: Encoding::RLE,
            statistics: None,
        }
    };
    let indices: Vec<u32> = (0..40).map(|i| (i * 37 + 11) % 200).collect();
    let want: Vec<f32> = indices.iter().map(|&i| 3.0 * i as f32).collect();
    for size in [200, 256] {
        let mut got = vec![0f32; 40];
        let mut c = column(vec![dictionary(size), page(&indices)], 0, 0).unwrap();
        assert!(c.read(&mut got), "a dictionary of {size}");
        assert_eq!(got, want, "a dictionary of {size}");
    }
    let mut past = indices.clone();
    past[33] = 200;
    let mut got = vec![0f32; 40];
    let mut c = column(vec![dictionary(200), page(&past)], 0, 0).unwrap();
    assert!(!c.read(&mut got), "index 200 of a dictionary of 200");
    past[33] = 255;
    let mut c = column(vec![dictionary(256), page(&past)], 0, 0).unwrap();
    assert!(c.read(&mut got) && got[33] == 765.0, "index 255 of 256");
}

#[test]
fn plain_values_narrow_as_arrow_does() {
    let ints: Vec<u8> = [-1i32, 300, 70_000]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let mut dst = [0f32; 3];
    Kind::U8.plain(&ints, 1.0, &mut dst);
    assert_eq!(dst, [255.0, 44.0, 112.0]);
    Kind::I16.plain(&ints, 0.5, &mut dst);
    assert_eq!(dst, [-0.5, 150.0, 2_232.0]);
    Kind::U32.plain(&ints, 1.0, &mut dst);
    assert_eq!(dst, [u32::MAX as f32, 300.0, 70_000.0]);
    let doubles: Vec<u8> = [1e300f64, -2.5]
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let mut two = [0f32; 2];
    Kind::F64.plain(&doubles, 2.0, &mut two);
    assert_eq!(two, [f32::INFINITY, -5.0]);
    assert_eq!(level_width(0), 0);
    assert_eq!((level_width(1), level_width(3), level_width(4)), (1, 2, 3));
}
