//! One Parquet leaf's data pages decoded run by run into `f32`: the direct reader's decoder.
//!
//! Parquet stores levels and dictionary indices in its RLE/bit-packing hybrid: runs of one
//! repeated value, and groups of bit-packed values. A general column reader expands every run
//! into one level and one index per value and then looks each index up; here a run of a
//! repeated index is one fill of the already converted dictionary value (the background of an
//! image is a few such runs per row), bit-packed indices are gathered straight from the
//! converted dictionary, and levels are checked page by page, not value by value: a page is
//! taken only if every value is present and every row holds the same number of values, which
//! is all this reader needs to know of them.
//!
//! Encodings handled: `PLAIN` and dictionary (`PLAIN_DICTIONARY`, `RLE_DICTIONARY`) values,
//! `RLE` levels, data pages v1 and v2, every numeric physical type. Anything else — another
//! encoding, a null, a ragged list, a row split across pages, a malformed page — makes a read
//! answer `false`, and the caller reads the rest through Arrow, which converts or reports it.
//! Every length read from a page is checked against the page before it is used.

use bytes::Bytes;
use datafusion::arrow::datatypes::DataType;
use datafusion::parquet::basic::{Encoding, Type as PhysicalType};
use datafusion::parquet::column::page::{Page, PageReader};

/// The most values a page may claim here: the levels are expanded into a buffer of one byte
/// each, which a page's header must not size without bound (Arrow reads larger pages).
const MAX_PAGE_VALUES: usize = 1 << 26;

/// A leaf's values as Arrow types them, which says how each becomes an `f32`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Kind {
    I8,
    I16,
    U8,
    U16,
    U32,
    I32,
    I64,
    U64,
    F32,
    F64,
}

impl Kind {
    /// The kind of a leaf of `physical` type read as Arrow's `arrow` type; `None` for any
    /// other pairing (a date, a decimal), which Arrow converts.
    pub(super) fn of(physical: PhysicalType, arrow: &DataType) -> Option<Kind> {
        Some(match (physical, arrow) {
            (PhysicalType::INT32, DataType::Int8) => Kind::I8,
            (PhysicalType::INT32, DataType::Int16) => Kind::I16,
            (PhysicalType::INT32, DataType::UInt8) => Kind::U8,
            (PhysicalType::INT32, DataType::UInt16) => Kind::U16,
            (PhysicalType::INT32, DataType::UInt32) => Kind::U32,
            (PhysicalType::INT32, DataType::Int32) => Kind::I32,
            (PhysicalType::INT64, DataType::Int64) => Kind::I64,
            (PhysicalType::INT64, DataType::UInt64) => Kind::U64,
            (PhysicalType::FLOAT, DataType::Float32) => Kind::F32,
            (PhysicalType::DOUBLE, DataType::Float64) => Kind::F64,
            _ => return None,
        })
    }

    /// Bytes of one plain value.
    fn size(self) -> usize {
        match self {
            Kind::I64 | Kind::U64 | Kind::F64 => 8,
            _ => 4,
        }
    }

    /// Converts the plain values in `bytes` (`dst.len()` of them) into `dst`, times `mul`,
    /// narrowing each to its Arrow type as Arrow does.
    fn plain(self, bytes: &[u8], mul: f32, dst: &mut [f32]) {
        let i32s = |dst: &mut [f32], f: fn(i32) -> f32| {
            convert::<4>(bytes, dst, |b| f(i32::from_le_bytes(b)) * mul)
        };
        match self {
            Kind::I8 => i32s(dst, |x| x as i8 as f32),
            Kind::I16 => i32s(dst, |x| x as i16 as f32),
            Kind::U8 => i32s(dst, |x| x as u8 as f32),
            Kind::U16 => i32s(dst, |x| x as u16 as f32),
            Kind::U32 => i32s(dst, |x| x as u32 as f32),
            Kind::I32 => i32s(dst, |x| x as f32),
            Kind::I64 => convert::<8>(bytes, dst, |b| i64::from_le_bytes(b) as f32 * mul),
            Kind::U64 => convert::<8>(bytes, dst, |b| u64::from_le_bytes(b) as f32 * mul),
            Kind::F32 => convert::<4>(bytes, dst, |b| f32::from_le_bytes(b) * mul),
            Kind::F64 => convert::<8>(bytes, dst, |b| f64::from_le_bytes(b) as f32 * mul),
        }
    }
}

/// `dst[i] = f(bytes[N·i..N·i + N])`.
#[inline(always)]
fn convert<const N: usize>(bytes: &[u8], dst: &mut [f32], f: impl Fn([u8; N]) -> f32) {
    for (d, b) in dst.iter_mut().zip(bytes.chunks_exact(N)) {
        let mut a = [0u8; N];
        a.copy_from_slice(b);
        *d = f(a);
    }
}

/// A stream of values in the RLE/bit-packing hybrid, taken a number at a time.
struct Hybrid {
    buf: Bytes,
    pos: usize,
    bit_width: u32,
    run: Run,
}

/// The run being taken from.
enum Run {
    /// `left` more copies of `value`.
    Repeat { value: u32, left: usize },
    /// `left` more bit-packed values, the next at bit `bit` of the buffer.
    Packed { bit: usize, left: usize },
}

/// Part of a run handed to a consumer.
enum Piece<'a> {
    /// `count` copies of a value.
    Repeat(u32, usize),
    /// Bit-packed values.
    Packed(Packed<'a>),
}

/// `count` values packed in `bytes` from bit `bit`, `width` bits each (within `bytes`: the
/// run's length was checked against the buffer).
struct Packed<'a> {
    bytes: &'a [u8],
    bit: usize,
    count: usize,
    width: u32,
}

impl Packed<'_> {
    /// Calls `f(i, value i)` for each value.
    #[inline(always)]
    fn each(&self, f: impl FnMut(usize, u32)) {
        unpack(self.bytes, self.bit, self.count, self.width, f);
    }

    /// The values as bytes, where each is one (8 bits wide, from a whole byte).
    fn bytes(&self) -> Option<&[u8]> {
        let start = self.bit / 8;
        (self.width == 8 && self.bit.is_multiple_of(8))
            .then(|| &self.bytes[start..start + self.count])
    }
}

impl Hybrid {
    /// The values of `buf` (from `pos`), `bit_width` bits each (at most 32).
    fn new(buf: Bytes, pos: usize, bit_width: u32) -> Option<Hybrid> {
        (bit_width <= 32).then_some(Hybrid {
            buf,
            pos,
            bit_width,
            run: Run::Repeat { value: 0, left: 0 },
        })
    }

    /// Reads the next run's header; `None` at the end of the buffer or on a malformed run.
    fn next_run(&mut self) -> Option<()> {
        let header = uleb128(&self.buf, &mut self.pos)?;
        let count = usize::try_from(header >> 1).ok()?;
        if header & 1 == 1 {
            // `count` groups of 8 values, `bit_width` bytes each.
            let bytes = count.checked_mul(self.bit_width as usize)?;
            let end = self.pos.checked_add(bytes)?;
            if end > self.buf.len() {
                return None;
            }
            self.run = Run::Packed {
                bit: self.pos * 8,
                left: count.checked_mul(8)?,
            };
            self.pos = end;
        } else {
            let bytes = self.bit_width.div_ceil(8) as usize;
            let raw = self.buf.get(self.pos..self.pos.checked_add(bytes)?)?;
            let value = raw.iter().rev().fold(0u32, |v, &b| (v << 8) | u32::from(b));
            self.pos += bytes;
            self.run = Run::Repeat { value, left: count };
        }
        Some(())
    }

    /// Hands the next `n` values to `take`, run piece by run piece; false where the stream
    /// ends first, is malformed, or `take` refuses a piece.
    fn take(&mut self, mut n: usize, mut take: impl FnMut(Piece<'_>) -> bool) -> bool {
        while n > 0 {
            let (piece, used) = match &mut self.run {
                Run::Repeat { left: 0, .. } | Run::Packed { left: 0, .. } => {
                    if self.next_run().is_none() {
                        return false;
                    }
                    continue;
                }
                Run::Repeat { value, left } => {
                    let k = n.min(*left);
                    *left -= k;
                    (Piece::Repeat(*value, k), k)
                }
                Run::Packed { bit, left } => {
                    let k = n.min(*left);
                    let piece = Piece::Packed(Packed {
                        bytes: &self.buf,
                        bit: *bit,
                        count: k,
                        width: self.bit_width,
                    });
                    *bit += k * self.bit_width as usize;
                    *left -= k;
                    (piece, k)
                }
            };
            if !take(piece) {
                return false;
            }
            n -= used;
        }
        true
    }
}

/// An unsigned LEB128 number at `pos` (advanced past it); `None` if it runs off the buffer or
/// past 64 bits.
fn uleb128(buf: &[u8], pos: &mut usize) -> Option<u64> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *buf.get(*pos)?;
        *pos += 1;
        value |= u64::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Some(value);
        }
    }
    None
}

/// The `count` values of `width` bits packed in `bytes` from bit `bit`, each passed to `f`.
/// The caller has checked that they lie within `bytes`.
#[inline(always)]
fn unpack(bytes: &[u8], bit: usize, count: usize, width: u32, mut f: impl FnMut(usize, u32)) {
    if width == 0 {
        (0..count).for_each(|i| f(i, 0));
        return;
    }
    if width == 8 && bit.is_multiple_of(8) {
        let start = bit / 8;
        for (i, &b) in bytes[start..start + count].iter().enumerate() {
            f(i, u32::from(b));
        }
        return;
    }
    let mask = if width == 32 {
        u64::from(u32::MAX)
    } else {
        (1u64 << width) - 1
    };
    for i in 0..count {
        let at = bit + i * width as usize;
        let byte = at / 8;
        // Eight bytes hold the value (at most 32 bits from a shift of at most 7); near the
        // end of the buffer they are copied into a zeroed word.
        let mut word = [0u8; 8];
        let tail = bytes.get(byte..).unwrap_or_default();
        let avail = tail.len().min(8);
        word[..avail].copy_from_slice(&tail[..avail]);
        f(i, ((u64::from_le_bytes(word) >> (at % 8)) & mask) as u32);
    }
}

/// Writes `n` levels of the hybrid stream `levels` into `out` (replacing its contents); false
/// where they cannot be read or one exceeds `u8`.
fn read_levels(levels: &mut Hybrid, n: usize, out: &mut Vec<u8>) -> bool {
    out.clear();
    levels.take(n, |piece| match piece {
        Piece::Repeat(v, count) => match u8::try_from(v) {
            Ok(v) => {
                out.resize(out.len() + count, v);
                true
            }
            Err(_) => false,
        },
        Piece::Packed(packed) => {
            if packed.width > 8 {
                return false;
            }
            packed.each(|_, v| out.push(v as u8));
            true
        }
    })
}

/// The bits a level of at most `max` takes.
fn level_width(max: i16) -> u32 {
    16 - (max.max(0) as u16).leading_zeros()
}

/// The values of the current data page.
enum Values {
    /// Plain values from `pos`.
    Plain { buf: Bytes, pos: usize },
    /// Dictionary indices.
    Dictionary(Hybrid),
}

/// One leaf of a row group read page by page; see the module's documentation.
pub(super) struct PageColumn {
    pages: Box<dyn PageReader>,
    kind: Kind,
    mul: f32,
    /// A list column: rows are delimited by repetition levels (at most 1).
    list: bool,
    max_def: i16,
    /// Values per row, known once the first data page is read.
    width: Option<usize>,
    /// The dictionary, converted (times `mul`).
    dictionary: Vec<f32>,
    levels: Vec<u8>,
    values: Option<Values>,
    /// Rows left in the current data page.
    rows_left: usize,
}

impl PageColumn {
    /// A reader of `pages`, values of `kind` times `mul`, with the leaf's level limits.
    pub(super) fn new(
        pages: Box<dyn PageReader>,
        kind: Kind,
        mul: f32,
        max_rep: i16,
        max_def: i16,
    ) -> Option<PageColumn> {
        if !(0..=1).contains(&max_rep) || max_def < 0 {
            return None;
        }
        let mut column = PageColumn {
            pages,
            kind,
            mul,
            list: max_rep == 1,
            max_def,
            width: None,
            dictionary: Vec::new(),
            levels: Vec::new(),
            values: None,
            rows_left: 0,
        };
        column.next_page()?;
        Some(column)
    }

    /// Values per row.
    pub(super) fn width(&self) -> usize {
        self.width.unwrap_or(0)
    }

    /// Decodes the next `dst.len() / width` rows into `dst`; false where they are not all
    /// there or not plain data.
    pub(super) fn read(&mut self, dst: &mut [f32]) -> bool {
        let w = self.width();
        if w == 0 || !dst.len().is_multiple_of(w) {
            return false;
        }
        let mut rows = dst.len() / w;
        let mut at = 0;
        while rows > 0 {
            if self.rows_left == 0 && self.next_page().is_none() {
                return false;
            }
            let k = rows.min(self.rows_left);
            if !self.decode(&mut dst[at..at + k * w]) {
                return false;
            }
            self.rows_left -= k;
            rows -= k;
            at += k * w;
        }
        true
    }

    /// Skips `rows` rows (decoding them into a bounded scratch buffer).
    pub(super) fn skip(&mut self, mut rows: usize) -> Option<()> {
        let w = self.width.filter(|&w| w > 0)?;
        let block = (1 << 16) / w + 1;
        let mut scratch = vec![0f32; block.min(rows) * w];
        while rows > 0 {
            let k = rows.min(block);
            if !self.read(&mut scratch[..k * w]) {
                return None;
            }
            rows -= k;
        }
        Some(())
    }

    /// Decodes the next `dst.len()` values of the current page into `dst`.
    fn decode(&mut self, dst: &mut [f32]) -> bool {
        let (kind, mul) = (self.kind, self.mul);
        match &mut self.values {
            Some(Values::Plain { buf, pos }) => {
                let size = kind.size();
                let Some(end) = dst.len().checked_mul(size).map(|b| b + *pos) else {
                    return false;
                };
                let Some(bytes) = buf.get(*pos..end) else {
                    return false;
                };
                kind.plain(bytes, mul, dst);
                *pos = end;
                true
            }
            Some(Values::Dictionary(indices)) => {
                let dict = &self.dictionary;
                let mut at = 0;
                indices.take(dst.len(), |piece| match piece {
                    Piece::Repeat(i, count) => {
                        let Some(&v) = dict.get(i as usize) else {
                            return false;
                        };
                        dst[at..at + count].fill(v);
                        at += count;
                        true
                    }
                    Piece::Packed(packed) => {
                        let count = packed.count;
                        let gathered = gather(&packed, dict, &mut dst[at..at + count]);
                        at += count;
                        gathered
                    }
                })
            }
            None => false,
        }
    }

    /// Moves to the next data page with rows (reading a dictionary page on the way) and
    /// checks its levels; `None` at the end of the column chunk or where the page is not
    /// plain data.
    fn next_page(&mut self) -> Option<()> {
        loop {
            let page = self.pages.get_next_page().ok()??;
            let (buf, count, encoding, levels) = match page {
                Page::DictionaryPage {
                    buf,
                    num_values,
                    encoding,
                    ..
                } => {
                    self.read_dictionary(&buf, num_values as usize, encoding)?;
                    continue;
                }
                Page::DataPage {
                    buf,
                    num_values,
                    encoding,
                    def_level_encoding,
                    rep_level_encoding,
                    ..
                } => {
                    let rle = |e: Encoding, needed: bool| !needed || e == Encoding::RLE;
                    if !rle(rep_level_encoding, self.list)
                        || !rle(def_level_encoding, self.max_def > 0)
                    {
                        return None;
                    }
                    (buf, num_values as usize, encoding, None)
                }
                Page::DataPageV2 {
                    buf,
                    num_values,
                    encoding,
                    rep_levels_byte_len,
                    def_levels_byte_len,
                    ..
                } => {
                    let lens = (rep_levels_byte_len as usize, def_levels_byte_len as usize);
                    (buf, num_values as usize, encoding, Some(lens))
                }
            };
            if count == 0 {
                continue;
            }
            if count > MAX_PAGE_VALUES {
                return None;
            }
            let pos = self.check_levels(&buf, count, levels)?;
            self.values = Some(match encoding {
                Encoding::PLAIN => Values::Plain { buf, pos },
                Encoding::PLAIN_DICTIONARY | Encoding::RLE_DICTIONARY => {
                    let width = u32::from(*buf.get(pos)?);
                    Values::Dictionary(Hybrid::new(buf, pos + 1, width)?)
                }
                _ => return None,
            });
            return Some(());
        }
    }

    /// Reads the `count` levels of each kind at the start of `buf` (length-prefixed in a v1
    /// page; `v2` gives their lengths) and checks them: every value present, every row
    /// `width` values. Sets the page's rows and answers where its values start.
    fn check_levels(
        &mut self,
        buf: &Bytes,
        count: usize,
        v2: Option<(usize, usize)>,
    ) -> Option<usize> {
        let mut pos = 0;
        let mut section =
            |present: bool, v2_len: Option<usize>| -> Option<Option<(usize, usize)>> {
                if !present {
                    return Some(None);
                }
                let len = match v2_len {
                    Some(len) => len,
                    None => {
                        let prefix = buf.get(pos..pos + 4)?;
                        pos += 4;
                        u32::from_le_bytes([prefix[0], prefix[1], prefix[2], prefix[3]]) as usize
                    }
                };
                let start = pos;
                pos = pos.checked_add(len).filter(|&end| end <= buf.len())?;
                Some(Some((start, pos)))
            };
        let rep = section(self.list, v2.map(|l| l.0))?;
        let def = section(self.max_def > 0, v2.map(|l| l.1))?;
        if let Some((start, end)) = def {
            let mut levels = Hybrid::new(buf.slice(start..end), 0, level_width(self.max_def))?;
            let max = self.max_def as u32;
            let all_present = levels.take(count, |piece| match piece {
                Piece::Repeat(v, _) => v == max,
                Piece::Packed(packed) => {
                    let mut ok = true;
                    packed.each(|_, v| ok &= v == max);
                    ok
                }
            });
            if !all_present {
                return None;
            }
        }
        self.rows_left = match rep {
            None => {
                self.width = Some(1);
                count
            }
            Some((start, end)) => {
                let mut levels = Hybrid::new(buf.slice(start..end), 0, 1)?;
                if !read_levels(&mut levels, count, &mut self.levels) {
                    return None;
                }
                self.rows_of_levels()?
            }
        };
        Some(pos)
    }

    /// The rows of the repetition levels just read, if each starts a row (0) and continues it
    /// (1) for the column's width (learned from the first row of the first page).
    fn rows_of_levels(&mut self) -> Option<usize> {
        let levels = &self.levels;
        let w = match self.width {
            Some(w) => w,
            None => {
                let next = levels.iter().skip(1).position(|&l| l == 0);
                let w = next.map_or(levels.len(), |p| p + 1);
                *self.width.insert(w)
            }
        };
        let regular = w > 0
            && levels.len().is_multiple_of(w)
            && levels
                .chunks_exact(w)
                // Folded rather than stopped early, so that the compiler vectorizes it.
                .fold(true, |ok, row| {
                    ok & (row[0] == 0) & row[1..].iter().fold(true, |ok, &l| ok & (l == 1))
                });
        regular.then_some(levels.len() / w)
    }

    /// Converts the dictionary page's `count` plain values.
    fn read_dictionary(&mut self, buf: &[u8], count: usize, encoding: Encoding) -> Option<()> {
        if !matches!(encoding, Encoding::PLAIN | Encoding::PLAIN_DICTIONARY) {
            return None;
        }
        let bytes = buf.get(..count.checked_mul(self.kind.size())?)?;
        self.dictionary.clear();
        self.dictionary.resize(count, 0.0);
        self.kind.plain(bytes, self.mul, &mut self.dictionary);
        Some(())
    }
}

/// `dst[i] = dict[index i]` for the packed indices; false where one is out of range.
fn gather(packed: &Packed<'_>, dict: &[f32], dst: &mut [f32]) -> bool {
    if let Some(indices) = packed.bytes() {
        return gather_bytes(indices, dict, dst);
    }
    let mut ok = true;
    packed.each(|i, v| match dict.get(v as usize) {
        Some(&x) => dst[i] = x,
        None => ok = false,
    });
    ok
}

/// [`gather`] for indices of a byte each (a dictionary of 129 to 256 values: 8-bit pixels),
/// checked all at once: the lookups then need no check (a full dictionary) or one that never
/// fails, and the loop runs without a branch on its result.
fn gather_bytes(indices: &[u8], dict: &[f32], dst: &mut [f32]) -> bool {
    if let Ok(table) = <&[f32; 256]>::try_from(dict.get(..256).unwrap_or_default()) {
        for (d, &i) in dst.iter_mut().zip(indices) {
            *d = table[usize::from(i)];
        }
        return true;
    }
    if indices
        .iter()
        .max()
        .is_some_and(|&i| usize::from(i) >= dict.len())
    {
        return false;
    }
    for (d, &i) in dst.iter_mut().zip(indices) {
        *d = dict[usize::from(i)];
    }
    true
}

#[cfg(test)]
mod tests;
