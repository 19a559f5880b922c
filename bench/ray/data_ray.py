"""Ray Data's side of the data-ingest comparison (bench/ray/data_compare.sh).

The same pipelines as Prism's `cargo run --release -p prism-data --example
ingest`: Fashion-MNIST's Parquet files (written by
`scripts/fetch-dataset.sh fashion-mnist --parquet`, 70,000 rows in 11
files) read by `read_parquet`, scaled to float32 by `map_batches` (numpy
batches of 1,024 rows), and consumed in batches of 128, first by the
driver (`iter_batches`), then by two actors through
`streaming_split(2, equal=True)`.

Prints one JSON object per pipeline and run, with the same fields as the
Prism example's `--json` output.
"""

import argparse
import json
import os
import time

import numpy as np
import ray


def scale(batch):
    # A fixed-size-list column arrives as an array of per-row arrays.
    return {
        "image": np.stack(batch["image"]).astype(np.float32) / 255.0,
        "label": batch["label"],
    }


@ray.remote
class Consumer:
    def consume(self, split):
        rows = 0
        for batch in split.iter_batches(batch_size=128, batch_format="numpy"):
            rows += len(batch["label"])
        return rows


def main():
    home = os.environ.get("HOME", ".")
    default = os.path.join(
        os.environ.get("PRISM_DATA_DIR", os.path.join(home, ".cache/prism/datasets")),
        "fashion-mnist-parquet",
    )
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--data", default=default)
    p.add_argument("--runs", type=int, default=5)
    args = p.parse_args()
    files = [args.data + "/train", args.data + "/test"]

    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    ctx = ray.data.DataContext.get_current()
    ctx.enable_progress_bars = False
    consumers = [Consumer.remote() for _ in range(2)]
    for run in range(args.runs):
        ds = ray.data.read_parquet(files).map_batches(scale, batch_size=1024, batch_format="numpy")
        start = time.perf_counter()
        rows = 0
        for batch in ds.iter_batches(batch_size=128, batch_format="numpy"):
            rows += len(batch["label"])
        seconds = time.perf_counter() - start
        print(json.dumps({"system": "ray", "pipeline": "iter_batches", "run": run, "rows": rows,
                          "seconds": round(seconds, 4), "rows_per_second": round(rows / seconds)}), flush=True)

        ds = ray.data.read_parquet(files).map_batches(scale, batch_size=1024, batch_format="numpy")
        start = time.perf_counter()
        splits = ds.streaming_split(2, equal=True)
        rows = sum(ray.get([c.consume.remote(s) for c, s in zip(consumers, splits)]))
        seconds = time.perf_counter() - start
        print(json.dumps({"system": "ray", "pipeline": "streaming_split_2", "run": run, "rows": rows,
                          "seconds": round(seconds, 4), "rows_per_second": round(rows / seconds)}), flush=True)
    ray.shutdown()


if __name__ == "__main__":
    main()
