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

impl DataSpec {
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
