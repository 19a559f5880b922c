//! Fashion-MNIST as the training examples read it: the file written by
//! `scripts/fetch-dataset.sh`, split into train and test images, and the
//! whole set moved to the training device once.

use crate::common::BoxError;
use std::path::Path;
use tch::{Device, Kind, Tensor};

/// Images as bytes and their labels, split into train and test.
pub struct Images {
    pub pixels: Vec<u8>,
    pub labels: Vec<u8>,
    pub peak: f32,
    pub train: Vec<usize>,
    pub test: Vec<usize>,
}

/// Pixels per image.
pub const PIXELS: usize = 784;

/// Reads the dataset file, splitting every 7th image of each class off
/// for testing.
pub fn load(path: &Path) -> Result<Images, BoxError> {
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
    let peak = f32::from(bytes[20]);
    let labels = bytes[21..21 + n].to_vec();
    let pixels = bytes[21 + n..].to_vec();
    if pixels.len() != n * PIXELS {
        return Err(format!(
            "{} is truncated: {} pixel bytes for {n} images",
            path.display(),
            pixels.len()
        )
        .into());
    }
    let (mut train, mut test) = (Vec::new(), Vec::new());
    let mut seen = [0usize; 10];
    for (i, &label) in labels.iter().enumerate() {
        let k = &mut seen[usize::from(label) % 10];
        if *k % 7 == 6 {
            test.push(i)
        } else {
            train.push(i)
        }
        *k += 1;
    }
    Ok(Images {
        pixels,
        labels,
        peak,
        train,
        test,
    })
}

/// The whole dataset on the training device: pixels as bytes, labels.
pub struct OnDevice {
    pixels: Tensor,
    labels: Tensor,
    peak: f64,
    device: Device,
}

impl OnDevice {
    pub fn new(images: &Images, device: Device) -> OnDevice {
        let n = images.labels.len() as i64;
        OnDevice {
            pixels: Tensor::from_slice(&images.pixels)
                .view([n, PIXELS as i64])
                .to_device(device),
            labels: Tensor::from_slice(&images.labels)
                .to_kind(Kind::Int64)
                .to_device(device),
            peak: f64::from(images.peak),
            device,
        }
    }

    /// A batch of images (as floats in 0..1) and labels, by index: the
    /// indices go to the device, the gather and conversion run there.
    pub fn batch(&self, indices: &[usize]) -> (Tensor, Tensor) {
        self.gather(&self.indices(indices))
    }

    /// `indices` on the device, for [`gather`](Self::gather). A copy from
    /// host memory waits for the device's queued work, so a training loop
    /// sends an epoch's indices once and slices them per batch.
    pub fn indices(&self, indices: &[usize]) -> Tensor {
        let idx: Vec<i64> = indices.iter().map(|&i| i as i64).collect();
        Tensor::from_slice(&idx).to_device(self.device)
    }

    /// The images and labels at `idx`, indices already on the device.
    pub fn gather(&self, idx: &Tensor) -> (Tensor, Tensor) {
        let x = self.pixels.index_select(0, idx).to_kind(Kind::Float) / self.peak;
        (x, self.labels.index_select(0, idx))
    }
}
