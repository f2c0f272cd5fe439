//! The parts of `[data]` that give examples a shape: `data.shape` (a feature vector read as an
//! N-d array), `data.image` (a column of encoded PNG or JPEG images) and `data.augment` (random
//! crops and flips of training images).

use serde::{Deserialize, Serialize};

use super::DataSpec;

/// `data.image`: a `binary` column of encoded images (PNG or JPEG bytes) that the executors
/// decode, resize to `size` and lay out as `[channels, height, width]` floats in `[0, 255]`
/// (divide with `data.scale`).
///
/// ```toml
/// [data]
/// image = { column = "png", size = [28, 28], channels = 1 }
/// ```
///
/// Each decoding thread of an executor holds at most [`ImageSpec::decoding_bytes`] for the
/// image it decodes, which the driver counts in its memory estimate.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImageSpec {
    /// The binary column that holds the encoded images.
    pub column: String,
    /// `[height, width]` of every decoded image (images of another size are resized).
    pub size: [usize; 2],
    /// 1 (grey), 3 (RGB) or 4 (RGBA): images are converted to this many channels.
    #[serde(default = "default_channels")]
    pub channels: usize,
    /// The most pixels (height × width) an encoded image may declare (default
    /// [`DEFAULT_MAX_IMAGE_PIXELS`], at least `size[0] × size[1]`): larger images are refused
    /// before any pixel is decoded, and the memory each decoding thread may take scales with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_pixels: Option<u64>,
}

fn default_channels() -> usize {
    3
}

/// `data.augment`: random changes of the training images, drawn from the job's seed (the same
/// seed gives the same crops and flips on every run); evaluation and prediction see the images
/// as they are.
///
/// ```toml
/// [data]
/// augment = { random_crop = 4, horizontal_flip = true }
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AugmentSpec {
    /// Pads each image by this many zero pixels on every side and crops a window of the
    /// original size at a random offset (0: no cropping).
    #[serde(default)]
    pub random_crop: usize,
    /// Mirrors half of the images left to right.
    #[serde(default)]
    pub horizontal_flip: bool,
}

/// The most values one example may hold (the product of `data.shape`, or an image's
/// channels × height × width): 2^28, a GiB of `f32`, far beyond any image model's input.
pub const MAX_EXAMPLE_VALUES: usize = 1 << 28;

/// The most dimensions `data.shape` may have.
pub const MAX_SHAPE_DIMS: usize = 8;

/// The longest side of an image, in pixels: the most `data.image.size` may ask for, and the
/// most an encoded image's header may declare before the executors refuse to decode it.
pub const MAX_IMAGE_SIDE: usize = 16_384;

/// `data.image.max_pixels` when it is not set: every image [`MAX_IMAGE_SIDE`] allows on each
/// side (16384 × 16384).
pub const DEFAULT_MAX_IMAGE_PIXELS: u64 = (MAX_IMAGE_SIDE * MAX_IMAGE_SIDE) as u64;

/// The most bytes one image may take while it is decoded, whatever `data.image.max_pixels`
/// says (256 MiB: an 8192 × 8192 RGBA image): its pixels as decoded, and for a progressive
/// JPEG the coefficients its decoder keeps for the whole image.
pub const MAX_DECODED_BYTES: u64 = 256 << 20;

/// The most bytes per pixel an image's decoder holds for the whole image, over every format
/// the executors decode: a progressive CMYK JPEG keeps four planes of 2-byte coefficients and
/// writes 3 bytes of RGB (11); a 16-bit RGBA PNG takes 8.
pub const DECODING_BYTES_PER_PIXEL: u64 = 11;

/// The most bytes an image's decoder may allocate beyond its pixels (a PNG's ancillary chunks
/// such as an ICC profile or text, decompressed, and its row buffers): 4 MiB.
pub const MAX_IMAGE_METADATA_BYTES: u64 = 4 << 20;

/// Bytes per value of the resizer's intermediate image (RGBA `f32` whatever the channels).
const RESIZE_BYTES_PER_PIXEL: u64 = 16;

impl ImageSpec {
    /// `data.image.max_pixels`, or its default [`DEFAULT_MAX_IMAGE_PIXELS`].
    pub fn max_pixels(&self) -> u64 {
        self.max_pixels.unwrap_or(DEFAULT_MAX_IMAGE_PIXELS)
    }

    /// The most bytes one image may take while it is decoded (its pixels and the decoder's
    /// whole-image working memory): [`DECODING_BYTES_PER_PIXEL`] per pixel of
    /// [`max_pixels`](Self::max_pixels), at most [`MAX_DECODED_BYTES`]. Executors refuse an
    /// image that would take more.
    pub fn max_decoded_bytes(&self) -> u64 {
        self.max_pixels()
            .saturating_mul(DECODING_BYTES_PER_PIXEL)
            .min(MAX_DECODED_BYTES)
    }

    /// The most bytes one decoding thread holds at once: an image as it is decoded
    /// ([`max_decoded_bytes`](Self::max_decoded_bytes)), the decoder's metadata and row buffers
    /// ([`MAX_IMAGE_METADATA_BYTES`]), and resizing it to `size` (an intermediate of the
    /// widest source image allowed × `size[0]` RGBA `f32` pixels, and the resized image).
    pub fn decoding_bytes(&self) -> u64 {
        let [h, w] = self.size.map(|s| s as u64);
        let widest = self.max_pixels().min(MAX_IMAGE_SIDE as u64);
        let resize = (widest * h * RESIZE_BYTES_PER_PIXEL).saturating_add(h * w * 4);
        self.max_decoded_bytes()
            .saturating_add(MAX_IMAGE_METADATA_BYTES)
            .saturating_add(resize)
    }
}

/// A `[data]` key at fault and what is wrong with it.
pub(super) type KeyError = (&'static str, String);

impl DataSpec {
    /// The columns whose values make each row's features: the `data.image` column when there
    /// is one, else `data.features`.
    pub fn feature_columns(&self) -> Vec<String> {
        match &self.image {
            Some(image) => vec![image.column.clone()],
            None => self.features.clone(),
        }
    }

    /// Checks `data.features` against `data.image` (exactly one of them gives the features),
    /// and `data.shape`, `data.image` and `data.augment` on their own.
    pub(super) fn check_examples(&self) -> Result<(), KeyError> {
        match &self.image {
            None if self.features.is_empty() => {
                return Err((
                    "data.features",
                    "must list at least one column (or set data.image for a column of \
                     encoded images)"
                        .into(),
                ));
            }
            None => {}
            Some(image) => self.check_image(image)?,
        }
        if let Some(shape) = &self.shape {
            check_shape(shape)?;
        }
        if let Some(augment) = &self.augment {
            self.check_augment(augment)?;
        }
        Ok(())
    }

    /// `data.image`: a column of its own, a channel count the decoder makes, a bounded size.
    fn check_image(&self, image: &ImageSpec) -> Result<(), KeyError> {
        if !self.features.is_empty() {
            return Err((
                "data.features",
                format!(
                    "must be empty with data.image: the image column `{}` gives the features",
                    image.column
                ),
            ));
        }
        if image.column.trim().is_empty() {
            return Err(("data.image.column", "must name the column of images".into()));
        }
        if image.column == self.label {
            return Err((
                "data.image.column",
                format!("is the label column `{}`", self.label),
            ));
        }
        if ![1, 3, 4].contains(&image.channels) {
            return Err((
                "data.image.channels",
                format!(
                    "must be 1 (grey), 3 (RGB) or 4 (RGBA), not {}",
                    image.channels
                ),
            ));
        }
        if let Some(side) = image
            .size
            .iter()
            .find(|s| !(1..=MAX_IMAGE_SIDE).contains(*s))
        {
            return Err((
                "data.image.size",
                format!(
                    "must be [height, width] with each between 1 and {MAX_IMAGE_SIDE}, not \
                     {side}"
                ),
            ));
        }
        let values = image.channels * image.size[0] * image.size[1];
        if values > MAX_EXAMPLE_VALUES {
            return Err((
                "data.image.size",
                format!(
                    "{:?} with {} channels makes {values} values per image, over the limit of \
                     {MAX_EXAMPLE_VALUES}",
                    image.size, image.channels
                ),
            ));
        }
        self.check_max_pixels(image)?;
        if self.shape.is_some() {
            return Err((
                "data.shape",
                format!(
                    "cannot be set with data.image, whose channels and size give each example \
                     the shape [{}, {}, {}]",
                    image.channels, image.size[0], image.size[1]
                ),
            ));
        }
        Ok(())
    }

    /// `data.image.max_pixels`: at least the pixels of `size`, at most what the side limit
    /// allows.
    fn check_max_pixels(&self, image: &ImageSpec) -> Result<(), KeyError> {
        let Some(max) = image.max_pixels else {
            return Ok(());
        };
        let least = (image.size[0] * image.size[1]) as u64;
        if !(least..=DEFAULT_MAX_IMAGE_PIXELS).contains(&max) {
            return Err((
                "data.image.max_pixels",
                format!(
                    "must be between the {least} pixels of data.image.size {:?} and \
                     {DEFAULT_MAX_IMAGE_PIXELS} ({MAX_IMAGE_SIDE} × {MAX_IMAGE_SIDE}), not {max}",
                    image.size
                ),
            ));
        }
        Ok(())
    }

    /// `data.augment`: images to augment, and a crop no larger than they are.
    fn check_augment(&self, augment: &AugmentSpec) -> Result<(), KeyError> {
        let shape = self.example_shape().unwrap_or_default();
        let &[_, height, width] = shape.as_slice() else {
            return Err((
                "data.augment",
                format!(
                    "needs images: examples of shape [channels, height, width] from data.image \
                     or data.shape, but {}",
                    match &self.shape {
                        Some(s) => format!("data.shape is {s:?}"),
                        None => "neither is set".into(),
                    }
                ),
            ));
        };
        let side = height.min(width);
        if augment.random_crop > side {
            return Err((
                "data.augment.random_crop",
                format!(
                    "must be at most the images' smaller side ({side} pixels), not {}",
                    augment.random_crop
                ),
            ));
        }
        Ok(())
    }

    /// The shape of one example as the model sees it: `data.shape`, else `[channels, height,
    /// width]` of `data.image`, else `None` (a flat feature vector).
    pub fn example_shape(&self) -> Option<Vec<usize>> {
        if let Some(shape) = &self.shape {
            return Some(shape.clone());
        }
        self.image
            .as_ref()
            .map(|i| vec![i.channels, i.size[0], i.size[1]])
    }
}

/// `data.shape`: one to [`MAX_SHAPE_DIMS`] dimensions, each at least 1, whose product is at
/// most [`MAX_EXAMPLE_VALUES`].
fn check_shape(shape: &[usize]) -> Result<(), KeyError> {
    if shape.is_empty() || shape.len() > MAX_SHAPE_DIMS {
        return Err((
            "data.shape",
            format!(
                "must list 1 to {MAX_SHAPE_DIMS} dimensions, e.g. [1, 28, 28] (channels, \
                 height, width), not {}",
                shape.len()
            ),
        ));
    }
    if let Some(i) = shape.iter().position(|&d| d == 0) {
        return Err((
            "data.shape",
            format!("dimension {i} of {shape:?} is 0; every dimension must be at least 1"),
        ));
    }
    let product = shape
        .iter()
        .try_fold(1usize, |p, &d| p.checked_mul(d))
        .filter(|&p| p <= MAX_EXAMPLE_VALUES);
    if product.is_none() {
        return Err((
            "data.shape",
            format!("{shape:?} holds more than {MAX_EXAMPLE_VALUES} values per example"),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::spec::{JobSpec, Override, SpecError};

    /// A job on PNG images, changed by `--set` arguments.
    fn parse(sets: &[&str]) -> Result<JobSpec, SpecError> {
        let text = r#"
[data]
train = "train.parquet"
label = "label"
image = { column = "png", size = [28, 28], channels = 1 }
[model]
kind = "mlp"
layers = [784, 10]
"#;
        let sets: Vec<Override> = sets.iter().map(|s| s.parse().unwrap()).collect();
        JobSpec::parse(text, Path::new("job.toml"), &sets)
    }

    fn refused(sets: &[&str], says: &str) {
        let msg = parse(sets).unwrap_err().to_string();
        assert!(msg.contains(says), "{sets:?}: {msg}");
    }

    #[test]
    fn an_image_column_replaces_the_features() {
        let spec = parse(&[]).unwrap();
        assert!(spec.data.features.is_empty());
        assert_eq!(spec.data.feature_columns(), ["png"]);
        assert_eq!(spec.data.example_shape(), Some(vec![1, 28, 28]));
        refused(
            &["data.features=[\"x\"]"],
            "data.features: must be empty with data.image: the image column `png` gives the \
             features",
        );
        refused(&["data.image={}"], "data.image.column: is required");
        refused(
            &["data.image.column=\"label\""],
            "data.image.column: is the label column `label`",
        );
        let no_image = ["data.image.column=\"\""];
        refused(
            &no_image,
            "data.image.column: must name the column of images",
        );
        let default_rgb = parse(&["data.image={ column = \"jpg\", size = [8, 9] }"]).unwrap();
        assert_eq!(default_rgb.data.example_shape(), Some(vec![3, 8, 9]));
    }

    #[test]
    fn without_an_image_the_features_are_required() {
        let msg = parse(&["data.image.column=\"x\""])
            .err()
            .map(|e| e.to_string());
        assert!(msg.is_none(), "{msg:?}");
        let text = "[data]\ntrain = \"t\"\nlabel = \"y\"\n[model]\nkind = \"mlp\"\n";
        let msg = JobSpec::parse(text, Path::new("job.toml"), &[])
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("data.features: must list at least one column (or set data.image"),
            "{msg}"
        );
    }

    #[test]
    fn image_channels_and_sizes_are_bounded() {
        for c in [0, 2, 5] {
            refused(
                &[&format!("data.image.channels={c}")],
                &format!("data.image.channels: must be 1 (grey), 3 (RGB) or 4 (RGBA), not {c}"),
            );
        }
        for ok in [1, 3, 4] {
            parse(&[&format!("data.image.channels={ok}")]).unwrap();
        }
        refused(
            &["data.image.size=[0, 28]"],
            "data.image.size: must be [height, width] with each between 1 and 16384, not 0",
        );
        refused(&["data.image.size=[28, 16385]"], "not 16385");
        refused(
            &["data.image.size=[16384, 16384]", "data.image.channels=3"],
            "with 3 channels makes 805306368 values per image, over the limit of 268435456",
        );
        refused(&["data.image.size=[28]"], "data.image.size");
    }

    #[test]
    fn max_pixels_is_bounded_by_the_size_and_the_side_limit() {
        let spec = parse(&[]).unwrap();
        let image = spec.data.image.unwrap();
        assert_eq!(image.max_pixels(), 16384 * 16384);
        assert_eq!(image.max_decoded_bytes(), 256 << 20);
        let spec = parse(&["data.image.max_pixels=1000000"]).unwrap();
        let image = spec.data.image.unwrap();
        assert_eq!(image.max_pixels(), 1_000_000);
        assert_eq!(image.max_decoded_bytes(), 11_000_000);
        // 11 MB of pixels and coefficients, 4 MiB of metadata, 16384 × 28 RGBA floats and the
        // 28 × 28 grey image resized (4 bytes per pixel counted).
        assert_eq!(
            image.decoding_bytes(),
            11_000_000 + (4 << 20) + 16384 * 28 * 16 + 28 * 28 * 4
        );
        parse(&["data.image.max_pixels=784"]).unwrap();
        refused(
            &["data.image.max_pixels=783"],
            "data.image.max_pixels: must be between the 784 pixels of data.image.size [28, 28] \
             and 268435456 (16384 × 16384), not 783",
        );
        refused(&["data.image.max_pixels=268435457"], "not 268435457");
        refused(&["data.image.max_pixels=-1"], "data.image.max_pixels");
    }

    #[test]
    fn shapes_are_checked_and_exclusive_with_images() {
        let without_image = |sets: &[&str]| {
            let text = "[data]\ntrain = \"t\"\nlabel = \"y\"\nfeatures = [\"x\"]\n[model]\n\
                        kind = \"mlp\"\n";
            let sets: Vec<Override> = sets.iter().map(|s| s.parse().unwrap()).collect();
            JobSpec::parse(text, Path::new("job.toml"), &sets).map_err(|e| e.to_string())
        };
        let spec = without_image(&["data.shape=[1, 28, 28]"]).unwrap();
        assert_eq!(spec.data.example_shape(), Some(vec![1, 28, 28]));
        assert_eq!(spec.data.feature_columns(), ["x"]);
        for (set, says) in [
            ("data.shape=[]", "data.shape: must list 1 to 8 dimensions"),
            ("data.shape=[1,1,1,1,1,1,1,1,1]", "not 9"),
            (
                "data.shape=[1, 0, 28]",
                "data.shape: dimension 1 of [1, 0, 28] is 0; every dimension must be at least 1",
            ),
            (
                "data.shape=[65536, 65536, 65536, 65536, 65536]",
                "holds more than 268435456 values per example",
            ),
            ("data.shape=[16384, 16385]", "more than 268435456"),
            ("data.shape=[-1, 28]", "data.shape"),
        ] {
            let msg = without_image(&[set]).unwrap_err();
            assert!(msg.contains(says), "{set}: {msg}");
        }
        refused(
            &["data.shape=[784]"],
            "data.shape: cannot be set with data.image, whose channels and size give each \
             example the shape [1, 28, 28]",
        );
    }

    #[test]
    fn augmentation_needs_images_and_a_crop_that_fits() {
        let spec = parse(&["data.augment={ random_crop = 4, horizontal_flip = true }"]).unwrap();
        let augment = spec.data.augment.unwrap();
        assert_eq!((augment.random_crop, augment.horizontal_flip), (4, true));
        let defaults = parse(&["data.augment={}"]).unwrap().data.augment.unwrap();
        assert_eq!((defaults.random_crop, defaults.horizontal_flip), (0, false));
        refused(
            &["data.augment.random_crop=29"],
            "data.augment.random_crop: must be at most the images' smaller side (28 pixels), \
             not 29",
        );
        parse(&["data.augment.random_crop=28"]).unwrap();
        refused(
            &["data.augment.rotate=3"],
            "unknown key `data.augment.rotate`",
        );
        let text = "[data]\ntrain = \"t\"\nlabel = \"y\"\nfeatures = [\"x\"]\n\
                    augment = { horizontal_flip = true }\n[model]\nkind = \"mlp\"\n";
        let msg = JobSpec::parse(text, Path::new("job.toml"), &[])
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains(
                "data.augment: needs images: examples of shape [channels, height, width] from \
                 data.image or data.shape, but neither is set"
            ),
            "{msg}"
        );
        let flat = text.replace("features", "shape = [784]\nfeatures");
        let msg = JobSpec::parse(&flat, Path::new("job.toml"), &[])
            .unwrap_err()
            .to_string();
        assert!(msg.contains("but data.shape is [784]"), "{msg}");
    }
}
