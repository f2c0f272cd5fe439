//! Why images cannot be decoded: [`DecodeError`] for one image, [`ImageColumnError`] for a
//! batch's image column. A leaf of the image decoder; the executor's error type holds the
//! latter.

use datafusion::arrow::datatypes::DataType;
use datafusion::arrow::error::ArrowError;
use image::error::ImageFormatHint;
use image::{ColorType, ImageFormat};
use ringflow_core::spec::{MAX_DECODED_BYTES, MAX_IMAGE_SIDE};

/// What a user can do about an image the decoder refuses.
const FIX: &str = "replace the image, or leave its row out of the data";

/// Why one image cannot be decoded, as the end of a sentence about the image.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The row holds no image.
    #[error("the image is null")]
    Null,
    /// Its first bytes cannot be read.
    #[error("cannot be read: {0}")]
    Unreadable(#[source] std::io::Error),
    /// Its first bytes are no PNG or JPEG signature.
    #[error("is neither a PNG nor a JPEG image (its first bytes are not a PNG or JPEG signature)")]
    NotPngOrJpeg,
    /// Its header declares a side beyond [`MAX_IMAGE_SIDE`].
    #[error("its header declares an image beyond the limit of {MAX_IMAGE_SIDE} pixels on a side")]
    SideBeyondLimit,
    /// Its metadata is beyond what the decoder may allocate for it.
    #[error(
        "holds more than the {mib} MiB of metadata (ancillary chunks such as an ICC profile or \
         text) an image may have; strip its metadata, or leave its row out of the data"
    )]
    MetadataBeyondLimit {
        /// The metadata an image may have, in MiB.
        mib: u64,
    },
    /// It has more pixels than `data.image.max_pixels`.
    #[error(
        "is {width} × {height} pixels, more than data.image.max_pixels ({max}); raise it, or \
         leave the image's row out of the data"
    )]
    TooManyPixels {
        /// Its width.
        width: usize,
        /// Its height.
        height: usize,
        /// `data.image.max_pixels`.
        max: u64,
    },
    /// Decoding it would take more bytes than an image may.
    #[error(
        "is {width} × {height} pixels, {} MiB decoded{}, beyond the limit of {} MiB an image \
         may take (data.image.max_pixels, at most {} MiB); replace the image by a smaller one, \
         or leave its row out of the data",
        decoded >> 20,
        kept(*coefficients),
        limit >> 20,
        MAX_DECODED_BYTES >> 20
    )]
    TooLarge {
        /// Its width.
        width: usize,
        /// Its height.
        height: usize,
        /// Bytes of its decoded pixels.
        decoded: u64,
        /// Bytes of the coefficients a progressive JPEG's decoder keeps (else 0).
        coefficients: u64,
        /// Bytes an image's decoding may take.
        limit: u64,
    },
    /// Its pixels are of a kind the decoder does not narrow to 8 bits.
    #[error("has pixels of a kind ({0:?}) the decoder does not narrow")]
    PixelKind(ColorType),
    /// The decoder failed (the sentence reads its reason without debug forms).
    #[error("{}", decoder_sentence(.0))]
    Decoder(#[source] image::ImageError),
}

/// What [`DecodeError::TooLarge`] says of a progressive JPEG's coefficients.
fn kept(coefficients: u64) -> String {
    match coefficients {
        0 => String::new(),
        c => format!(
            " and {} MiB of coefficients a progressive JPEG keeps",
            c >> 20
        ),
    }
}

/// The decoder's error `e` as the end of a sentence about the image ("is a corrupt PNG
/// image (…); …"). The decoders' own messages can hold their types in debug form (the PNG
/// decoder's `ChunkType { type: IDAT, critical: true, … }`): those read as the chunk's name.
fn decoder_sentence(e: &image::ImageError) -> String {
    let d = match e {
        image::ImageError::Decoding(d) => d,
        image::ImageError::IoError(io) if io.kind() == std::io::ErrorKind::UnexpectedEof => {
            return format!("is cut short (the image's data ends before the image does); {FIX}");
        }
        e => return format!("cannot be decoded ({}); {FIX}", readable(&e.to_string())),
    };
    let format = match d.format_hint() {
        ImageFormatHint::Exact(ImageFormat::Png) => "PNG ",
        ImageFormatHint::Exact(ImageFormat::Jpeg) => "JPEG ",
        _ => "",
    };
    match std::error::Error::source(d) {
        Some(why) => format!(
            "is a corrupt {format}image ({}); {FIX}",
            readable(&why.to_string())
        ),
        None => format!("is a corrupt {format}image; {FIX}"),
    }
}

/// A decoder's message without debug-formatted chunk types and without a final full stop.
pub(super) fn readable(message: &str) -> String {
    const CHUNK: &str = "ChunkType { type: ";
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some(at) = rest.find(CHUNK) {
        out.push_str(&rest[..at]);
        let after = &rest[at + CHUNK.len()..];
        let name_end = after.find([',', ' ', '}']).unwrap_or(after.len());
        out.push_str(&after[..name_end]);
        rest = after.find('}').map_or("", |close| &after[close + 1..]);
    }
    out.push_str(rest);
    out.trim().trim_end_matches('.').to_string()
}

/// Why a batch's image column cannot be decoded, as the end of a sentence about the column
/// ("column `img` (data.image) …").
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ImageColumnError {
    /// The batch has no such column.
    #[error("is missing from the data")]
    Missing,
    /// The column does not hold bytes.
    #[error("has type {0}; an image column must be binary (PNG or JPEG bytes)")]
    NotBinary(DataType),
    /// The batch's decoded images would not fit in memory.
    #[error("cannot be decoded: {rows} images of {per_image} values do not fit in memory")]
    NoMemory {
        /// Rows of the batch.
        rows: usize,
        /// Values of one decoded image.
        per_image: usize,
    },
    /// The image of a row cannot be decoded (the first such row of the batch).
    #[error("row {row} (0-based): {source}")]
    Row {
        /// The row, in its file.
        row: u64,
        /// Why.
        source: DecodeError,
    },
    /// Arrow refused the column of decoded images.
    #[error("cannot hold the decoded images: {0}")]
    Hold(#[source] ArrowError),
}
