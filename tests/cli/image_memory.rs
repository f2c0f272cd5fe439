//! Decoding images stays within the driver's memory estimate: Parquet files of decompression
//! bombs (PNGs of a few KB that declare millions of pixels, a progressive JPEG whose decoder
//! keeps every coefficient) train through real executors, and the executor's peak resident
//! memory (`VmHWM`, in the summary) stays under the estimate the job was submitted with (in
//! its event log), whose "image decoding" part counts every decoding thread. What decoding
//! adds to the peak (over the same job on small images) stays within that part.
//!
//! The CI case is small (tens of MiB); the multi-GiB ones (16 bombs of 16384 × 16384 on 8
//! threads, a 9440 × 9440 progressive JPEG) run behind the long-fuzz switch
//! (`RINGFLOW_LONG_FUZZ=1`, which `testing/fuzz-long.sh` sets).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use datafusion::arrow::array::{ArrayRef, BinaryArray, Int64Array};
use image::ImageEncoder;
use image::codecs::png::{CompressionType, FilterType, PngEncoder};

use crate::helpers::{job, ringflow, s, summary, write_parquet};

const LONG: Duration = Duration::from_secs(600);

/// A grey 8-bit PNG of `side × side` zeros: a few KB that decode to `side²` bytes.
fn png_bomb(side: u32) -> Vec<u8> {
    let pixels = vec![0u8; side as usize * side as usize];
    let mut bytes = Vec::new();
    PngEncoder::new_with_quality(&mut bytes, CompressionType::Best, FilterType::NoFilter)
        .write_image(&pixels, side, side, image::ExtendedColorType::L8)
        .unwrap();
    bytes
}

/// A grey progressive JPEG of `side × side` (a multiple of 8) flat pixels: a frame header
/// (SOF2), one Huffman table whose only code (`0`, one bit) is a DC difference of 0, and one
/// DC scan of a bit per block. Its decoder keeps 128 bytes of coefficients per block.
fn progressive_jpeg_bomb(side: u16) -> Vec<u8> {
    let mut jpeg = vec![0xFF, 0xD8];
    let mut segment = |marker: u8, body: &[u8]| {
        jpeg.extend([0xFF, marker]);
        jpeg.extend((body.len() as u16 + 2).to_be_bytes());
        jpeg.extend(body);
    };
    segment(0xDB, &[[0u8].as_slice(), &[1; 64]].concat());
    let [h0, h1] = side.to_be_bytes();
    segment(0xC2, &[8, h0, h1, h0, h1, 1, 1, 0x11, 0]);
    let mut dht = vec![0x00, 1];
    dht.extend([0; 15]);
    dht.push(0);
    segment(0xC4, &dht);
    segment(0xDA, &[1, 1, 0x00, 0, 0, 0]);
    let blocks = (side as usize / 8).pow(2);
    jpeg.extend(vec![0u8; blocks / 8]);
    if !blocks.is_multiple_of(8) {
        jpeg.push(0xFF >> (blocks % 8));
    }
    jpeg.extend([0xFF, 0xD9]);
    jpeg
}

/// [`run`] on `images`, and on as many 28 × 28 images with the same settings: the estimate,
/// its image decoding part, the peak RSS on `images` and what they add to the peak, in MiB.
fn measure(images: Vec<Vec<u8>>, threads: usize, max_pixels: u64) -> (f64, f64, f64, f64) {
    let small = vec![png_bomb(28); images.len()];
    let dir = tempfile::tempdir().unwrap();
    let (_, _, baseline) = run(dir.path(), small, threads, max_pixels);
    let dir = tempfile::tempdir().unwrap();
    let (estimate, decoding, rss) = run(dir.path(), images, threads, max_pixels);
    eprintln!(
        "estimate {estimate:.1} MiB (image decoding {decoding:.1} MiB), peak {rss:.1} MiB \
         ({baseline:.1} MiB on 28 × 28 images)"
    );
    (estimate, decoding, rss, rss - baseline)
}

/// Trains a 784-10 MLP for one epoch on 28 × 28 grey examples decoded from `images`, with
/// `threads` compute threads on one executor and `data.image.max_pixels = max_pixels`.
/// Returns (the estimate's bytes, its image decoding part, the executor's peak RSS), in MiB.
fn run(dir: &Path, images: Vec<Vec<u8>>, threads: usize, max_pixels: u64) -> (f64, f64, f64) {
    let data = dir.join("bombs.parquet");
    let rows = images.len();
    let png = BinaryArray::from_iter_values(images.iter());
    let label = Int64Array::from_iter_values((0..rows as i64).map(|i| i % 10));
    write_parquet(
        &data,
        vec![
            ("png", Arc::new(png) as ArrayRef),
            ("label", Arc::new(label) as ArrayRef),
        ],
        rows,
    );
    let ckpt = dir.join("run");
    let spec = job(
        dir,
        "bombs",
        &format!(
            r#"name = "bombs"
[data]
train = "{data}"
label = "label"
image = {{ column = "png", size = [28, 28], channels = 1, max_pixels = {max_pixels} }}
[model]
kind = "mlp"
layers = [784, 10]
[train]
epochs = 1
batch_size = {rows}
optimizer = {{ kind = "sgd", lr = 0.1 }}
[cluster]
executors = 1
threads = {threads}
checkpoint_dir = "{ckpt}"
"#,
            data = s(&data),
            ckpt = s(&ckpt),
        ),
    );
    let out = dir.join("summary.json");
    ringflow(&["local", &spec, "--summary-json", &s(&out)], LONG).assert_success();
    let sm = summary(&out);
    let rss = sm["peak_rss_mib"][0].as_f64().expect("a peak RSS");
    let log = std::fs::read_to_string(ckpt.join("events.jsonl")).expect("an event log");
    let first: serde_json::Value =
        serde_json::from_str(log.lines().next().unwrap()).expect("JSON lines");
    let memory = &first["memory"];
    let mib = |b: &serde_json::Value| b.as_f64().unwrap() / (1 << 20) as f64;
    let decoding = memory["parts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["what"] == "image decoding")
        .map_or(0.0, |p| mib(&p["bytes"]));
    (mib(&memory["bytes"]), decoding, rss)
}

/// Six 4096 × 4096 PNG bombs (16 MiB decoded each, 16 KB encoded) and a 4096 × 4096
/// progressive JPEG (16 MiB of pixels, 32 MiB of coefficients, 32 KB encoded), decoded on 2
/// threads: the executor's peak stays under the estimate, whose image decoding part (2 ×
/// 182 MiB) is most of it.
#[test]
fn image_bombs_stay_within_the_memory_estimate() {
    let mut images: Vec<Vec<u8>> = (0..6).map(|_| png_bomb(4096)).collect();
    images.push(progressive_jpeg_bomb(4096));
    assert!(images.iter().all(|i| i.len() < 64 << 10), "bombs are small");
    let (estimate, decoding, rss, added) = measure(images, 2, 4096 * 4096);
    assert!(
        rss < estimate,
        "peak {rss} MiB over the estimate of {estimate} MiB"
    );
    assert!(
        added < decoding,
        "decoding added {added} MiB, over its {decoding} MiB"
    );
    assert!(decoding > 2.0 * 176.0, "two threads of 176 MiB: {decoding}");
}

/// The multi-GiB cases of issue 39, behind the long-fuzz switch: 16 PNG bombs of
/// 16384 × 16384 on 8 threads, and a 9440 × 9440 progressive JPEG (256 MiB of pixels and
/// coefficients, the most one image may take): what decoding adds to the executor's peak
/// stays within the estimate's image decoding part.
#[test]
fn fuzz_long_gigabyte_image_bombs_stay_within_the_memory_estimate() {
    if std::env::var_os("RINGFLOW_LONG_FUZZ").is_none() {
        eprintln!("skipped: set RINGFLOW_LONG_FUZZ=1 (testing/fuzz-long.sh) to run it");
        return;
    }
    let cases = [
        (vec![png_bomb(16384); 16], 16384 * 16384),
        (vec![progressive_jpeg_bomb(9440)], 9440 * 9440),
    ];
    for (images, max_pixels) in cases {
        // The whole peak is printed, not checked: at 2 GiB of decoding it meets the estimate
        // within the difference between the estimate's runtime part (24 MiB) and a debug
        // build's idle executor (about 60 MiB).
        let (_, decoding, _, added) = measure(images, 8, max_pixels);
        assert!(
            added < decoding,
            "decoding added {added} MiB, over its {decoding} MiB"
        );
    }
}
