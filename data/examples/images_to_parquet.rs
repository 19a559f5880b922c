//! Converts an image dataset written by `scripts/fetch-dataset.sh` (the
//! `PRISMDS1` file) into Parquet files, once: what the streaming examples
//! and the data-ingest benchmark read.
//!
//! ```text
//! cargo run --release -p prism-data --example images_to_parquet -- \
//!     ~/.cache/prism/datasets/fashion-mnist.bin ~/.cache/prism/datasets/fashion-mnist-parquet
//! ```
//!
//! Output: `train/part-00000.parquet` to `part-00009.parquet` and
//! `test/part-00000.parquet` under the output folder. Each row is one
//! image: `image`, a fixed-size list of 784 `uint8` pixels, and `label`,
//! an `int64` from 0 to 9. As the examples split it, every 7th image of
//! each class is a test image; the training images are shuffled (seed 0)
//! so that every file holds every class. Snappy-compressed, with
//! dictionary encoding (pyarrow's defaults). Existing
//! output is kept; a partial one (from an interrupted run) is replaced.

use arrow_array::{FixedSizeListArray, Int64Array, RecordBatch, UInt8Array};
use arrow_schema::{DataType, Field, Schema};
use parquet::arrow::ArrowWriter;
use parquet::basic::Compression;
use parquet::file::properties::WriterProperties;
use std::path::{Path, PathBuf};
use std::sync::Arc;

type BoxError = Box<dyn std::error::Error>;

const PIXELS: usize = 784;
const TRAIN_FILES: usize = 10;

struct Images {
    labels: Vec<u8>,
    pixels: Vec<u8>,
}

fn load(path: &Path) -> Result<Images, BoxError> {
    let bytes = std::fs::read(path).map_err(|e| {
        format!(
            "{}: {e}; run scripts/fetch-dataset.sh first",
            path.display()
        )
    })?;
    if bytes.len() < 21 || &bytes[..8] != b"PRISMDS1" {
        return Err(format!(
            "{} is not a dataset written by scripts/fetch-dataset.sh",
            path.display()
        )
        .into());
    }
    let n = u32::from_le_bytes(bytes[8..12].try_into()?) as usize;
    if bytes.len() != 21 + n + n * PIXELS {
        return Err(format!("{} is truncated", path.display()).into());
    }
    Ok(Images {
        labels: bytes[21..21 + n].to_vec(),
        pixels: bytes[21 + n..].to_vec(),
    })
}

/// A seeded permutation (SplitMix64 and Fisher-Yates).
fn shuffle(indices: &mut [usize], mut state: u64) {
    let mut next = move || {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    for i in (1..indices.len()).rev() {
        let j = (next() % (i as u64 + 1)) as usize;
        indices.swap(i, j);
    }
}

fn write(path: &Path, images: &Images, rows: &[usize]) -> Result<(), BoxError> {
    let item = Arc::new(Field::new("item", DataType::UInt8, false));
    let schema = Arc::new(Schema::new(vec![
        Field::new(
            "image",
            DataType::FixedSizeList(item.clone(), PIXELS as i32),
            false,
        ),
        Field::new("label", DataType::Int64, false),
    ]));
    let mut pixels = Vec::with_capacity(rows.len() * PIXELS);
    for &r in rows {
        pixels.extend_from_slice(&images.pixels[r * PIXELS..(r + 1) * PIXELS]);
    }
    let image = FixedSizeListArray::try_new(
        item,
        PIXELS as i32,
        Arc::new(UInt8Array::from(pixels)),
        None,
    )?;
    let label = Int64Array::from_iter_values(rows.iter().map(|&r| i64::from(images.labels[r])));
    let batch = RecordBatch::try_new(schema.clone(), vec![Arc::new(image), Arc::new(label)])?;
    let props = WriterProperties::builder()
        .set_compression(Compression::SNAPPY)
        .build();
    let tmp = path.with_extension("partial");
    let mut writer = ArrowWriter::try_new(std::fs::File::create(&tmp)?, schema, Some(props))?;
    writer.write(&batch)?;
    writer.close()?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

fn main() -> Result<(), BoxError> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [input, output] = args.as_slice() else {
        return Err("usage: images_to_parquet DATASET.bin OUTPUT_DIR".into());
    };
    let output = PathBuf::from(output);
    let done = output.join("test").join("part-00000.parquet");
    if done.exists() {
        println!("{}", output.display());
        return Ok(());
    }
    let images = load(Path::new(input))?;
    let (mut train, mut test) = (Vec::new(), Vec::new());
    let mut seen = [0usize; 10];
    for (i, &label) in images.labels.iter().enumerate() {
        let k = &mut seen[usize::from(label) % 10];
        if *k % 7 == 6 {
            test.push(i)
        } else {
            train.push(i)
        }
        *k += 1;
    }
    shuffle(&mut train, 0);
    for dir in ["train", "test"] {
        let d = output.join(dir);
        if d.exists() {
            std::fs::remove_dir_all(&d)?;
        }
        std::fs::create_dir_all(&d)?;
    }
    let per_file = train.len().div_ceil(TRAIN_FILES);
    for (i, rows) in train.chunks(per_file).enumerate() {
        write(
            &output.join("train").join(format!("part-{i:05}.parquet")),
            &images,
            rows,
        )?;
    }
    // Written last: its presence marks a complete conversion.
    write(&done, &images, &test)?;
    eprintln!(
        "images_to_parquet: {} training images in {} files, {} test images",
        train.len(),
        train.len().div_ceil(per_file),
        test.len()
    );
    println!("{}", output.display());
    Ok(())
}
