//! Streaming pipelines on a real embedded cluster (this binary doubles as
//! its workers): Parquet files written and read back, lazy transformations,
//! backpressure, bad input, and streaming splits read by several consumers
//! at once.

use prism_train::data::{
    Batch, BatchMapper, Column, DataError, Dataset, ExecutionOptions, LazyDataset, MapperError,
};
use serde::{Deserialize, Serialize};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

fn cluster() {
    static STARTED: OnceLock<()> = OnceLock::new();
    STARTED.get_or_init(|| {
        prism::init(
            prism::Config::default()
                .num_cpus(2)
                .ignore_reinit_error(true),
        )
        .expect("the embedded cluster must start");
    });
}

/// A directory under the temp dir that no other run uses; removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn new(name: &str) -> TempDir {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path = std::env::temp_dir().join(format!(
            "prism-pipeline-test-{}-{n}-{name}",
            std::process::id()
        ));
        std::fs::create_dir_all(&path).expect("the temp dir must be writable");
        TempDir(path)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `rows` rows of every column type, ids from `first`.
fn table(first: i64, rows: usize) -> Batch {
    let ids: Vec<i64> = (first..first + rows as i64).collect();
    Batch::new(vec![
        ("id".into(), Column::I64(ids.clone())),
        (
            "x".into(),
            Column::F32(ids.iter().map(|i| *i as f32 * 0.5).collect()),
        ),
        (
            "y".into(),
            Column::F64(ids.iter().map(|i| *i as f64 / 3.0).collect()),
        ),
        (
            "name".into(),
            Column::Str(ids.iter().map(|i| format!("row-{i}")).collect()),
        ),
        (
            "pixels".into(),
            Column::tensor(
                ids.iter()
                    .flat_map(|i| [*i as f32, -(*i as f32), 1.0])
                    .collect(),
                3,
            )
            .unwrap(),
        ),
    ])
    .unwrap()
}

fn ids_of(batches: impl IntoIterator<Item = Result<Batch, DataError>>) -> Vec<i64> {
    let mut out = Vec::new();
    for b in batches {
        let b = b.unwrap_or_else(|e| panic!("{e}"));
        out.extend_from_slice(b.i64("id").unwrap());
    }
    out
}

/// Writes three files of 40, 25 and 35 rows into `dir`.
fn write_files(dir: &Path) -> Vec<PathBuf> {
    let ds = Dataset::from_batches(vec![table(0, 40), table(40, 25), table(65, 35)]).unwrap();
    ds.lazy().write_parquet(dir).unwrap()
}

#[test]
fn parquet_files_round_trip_with_every_column_type_and_read_by_projection() {
    cluster();
    let dir = TempDir::new("roundtrip");
    let files = write_files(dir.path());
    assert_eq!(files.len(), 3, "one file per block");
    let ds = LazyDataset::read_parquet([dir.path()]).unwrap();
    assert_eq!(ds.count().unwrap(), 100, "from the footers");
    assert_eq!(
        ds.schema().unwrap().to_string(),
        "id: i64, x: f32, y: f64, name: str, pixels: tensor<f32>[3]"
    );
    let back = ds.materialize().unwrap();
    assert_eq!(back.num_blocks(), 3);
    assert_eq!(back.take_batch(100), table(0, 100));

    let projected = LazyDataset::read_parquet_columns(&files, ["pixels", "id"]).unwrap();
    assert_eq!(
        projected.schema().unwrap().to_string(),
        "pixels: tensor<f32>[3], id: i64"
    );
    let batch = projected.take_batch(3).unwrap();
    assert_eq!(batch.i64("id").unwrap(), [0, 1, 2]);
    assert_eq!(
        batch.tensor("pixels").unwrap().row(2),
        Some(&[2.0f32, -2.0, 1.0][..])
    );
}

fn scale(batch: Batch) -> Result<Batch, DataError> {
    let x: Vec<f32> = batch.f32("x")?.iter().map(|v| v * 2.0).collect();
    batch.with_column("x2", Column::F32(x))
}

#[derive(Serialize, Deserialize)]
struct Row {
    id: i64,
}

#[derive(Serialize, Deserialize)]
struct Squared {
    id: i64,
    square: i64,
}

fn even(r: Row) -> bool {
    r.id % 2 == 0
}

fn square(r: Row) -> Squared {
    Squared {
        id: r.id,
        square: r.id * r.id,
    }
}

#[test]
fn lazy_steps_run_only_when_read_and_stream_in_order() {
    cluster();
    let dir = TempDir::new("steps");
    write_files(dir.path());
    let ds = LazyDataset::read_parquet([dir.path()])
        .unwrap()
        .map_batches(scale, 16)
        .unwrap();
    assert_eq!(
        ds.stage_names(),
        ["ReadParquet", "MapBatches"],
        "building a plan runs nothing"
    );
    let mut batches = ds.iter_batches(30, false).unwrap();
    let first = batches.next().unwrap().unwrap();
    assert_eq!(first.num_rows(), 30);
    assert_eq!(first.f32("x2").unwrap()[29], 29.0);
    let rest: Vec<Batch> = batches.by_ref().map(Result::unwrap).collect();
    assert_eq!(
        rest.iter().map(Batch::num_rows).collect::<Vec<_>>(),
        [30, 30, 10]
    );
    let stats = batches.stats();
    assert_eq!(stats.len(), 1, "the read and the map are fused: {stats:?}");
    assert_eq!((stats[0].blocks, stats[0].rows), (3, 100));

    // Row-level steps, a limit, and drop_last.
    let squares = LazyDataset::range(20_000)
        .filter(even)
        .map(square)
        .limit(1234);
    assert_eq!(squares.count().unwrap(), 1234);
    let rows: Vec<Squared> = squares.take(1234).unwrap();
    assert_eq!(rows[617].id, 1234);
    assert_eq!(rows[617].square, 1234 * 1234);
    let n: usize = squares
        .iter_batches(100, true)
        .unwrap()
        .map(|b| b.unwrap().num_rows())
        .sum();
    assert_eq!(n, 1200);
}

#[test]
fn shuffle_and_repartition_are_barriers_that_keep_every_row() {
    cluster();
    let ds = LazyDataset::range(30_000);
    let shuffled = ds.random_shuffle(7);
    let a = ids_of(shuffled.iter_batches(1000, false).unwrap());
    let b = ids_of(shuffled.iter_batches(1000, false).unwrap());
    assert_eq!(a, b, "one seed, one order");
    assert_ne!(a, (0..30_000).collect::<Vec<_>>());
    let mut sorted = a.clone();
    sorted.sort();
    assert_eq!(sorted, (0..30_000).collect::<Vec<_>>());
    // Rows move across blocks (range makes blocks of 8,192 rows): the
    // first output block holds rows of every input block.
    let first: Vec<i64> = shuffled.materialize().unwrap().blocks()[0]
        .i64("id")
        .unwrap()
        .to_vec();
    let inputs: BTreeSet<i64> = first.iter().map(|id| id / 8192).collect();
    assert_eq!(inputs.len(), 4, "{inputs:?}");
    assert_ne!(
        ids_of(ds.random_shuffle(8).iter_batches(1000, false).unwrap()),
        a
    );
    let mut run = shuffled.iter_batches(1000, false).unwrap();
    run.by_ref().for_each(drop);
    assert!(
        run.stats()
            .iter()
            .any(|s| s.name == "RandomShuffle" && s.rows == 30_000),
        "{:?}",
        run.stats()
    );

    let parts = ds.repartition(7).unwrap().materialize().unwrap();
    assert_eq!(parts.num_blocks(), 7);
    assert!(parts
        .blocks()
        .iter()
        .all(|b| b.num_rows() == 4285 || b.num_rows() == 4286));
    assert_eq!(
        ids_of(parts.lazy().iter_batches(999, false).unwrap()),
        (0..30_000).collect::<Vec<_>>(),
        "a repartition keeps the order"
    );
    // More blocks than rows, after a filter and a limit: empty blocks keep
    // the schema.
    let few = ds.limit(3).repartition(5).unwrap().materialize().unwrap();
    assert_eq!(few.num_blocks(), 5);
    assert_eq!(few.count(), 3);
    assert_eq!(few.schema().to_string(), "id: i64");
}

#[test]
fn the_memory_budget_bounds_the_tasks_in_flight() {
    cluster();
    let tight = LazyDataset::range(100_000).with_options(ExecutionOptions {
        memory_budget_bytes: 1,
        max_tasks_in_flight: Some(8),
        ..ExecutionOptions::default()
    });
    let mut it = tight.iter_batches(4096, false).unwrap();
    let n: usize = it.by_ref().map(|b| b.unwrap().num_rows()).sum();
    assert_eq!(n, 100_000);
    assert_eq!(it.stats()[0].peak_tasks, 1, "{:?}", it.stats());

    let loose = LazyDataset::range(100_000).with_options(ExecutionOptions {
        max_tasks_in_flight: Some(8),
        ..ExecutionOptions::default()
    });
    let mut it = loose.iter_batches(4096, false).unwrap();
    assert_eq!(
        it.by_ref().map(|b| b.unwrap().num_rows()).sum::<usize>(),
        100_000
    );
    let peak = it.stats()[0].peak_tasks;
    assert!(peak > 1 && peak <= 8, "{:?}", it.stats());

    // A consumer that stops early: the rest is never computed, and the
    // cluster goes on.
    let mut early = loose.iter_batches(10, false).unwrap();
    assert_eq!(early.next().unwrap().unwrap().num_rows(), 10);
    drop(early);
    assert_eq!(LazyDataset::range(10).count().unwrap(), 10);
}

fn fail_on_block_with_77(batch: Batch) -> Result<Batch, String> {
    if batch.i64("id").map_err(|e| e.to_string())?.contains(&77) {
        return Err("id 77 is cursed".into());
    }
    Ok(batch)
}

fn panics(_: Batch) -> Result<Batch, String> {
    panic!("batch function panicked on purpose")
}

#[test]
fn bad_input_is_a_clear_error_naming_the_file_column_or_stage() {
    cluster();
    let dir = TempDir::new("bad");
    let files = write_files(dir.path());

    let missing = dir.path().join("nope.parquet");
    let err = LazyDataset::read_parquet([&missing]).unwrap_err();
    assert!(
        matches!(&err, DataError::Io { path, .. } if *path == missing),
        "{err:?}"
    );

    let corrupt = dir.path().join("corrupt.parquet");
    let mut bytes = std::fs::read(&files[0]).unwrap();
    let n = bytes.len();
    bytes[n - 12..n - 4].copy_from_slice(&[0xff; 8]); // the footer's length
    std::fs::write(&corrupt, &bytes).unwrap();
    let err = LazyDataset::read_parquet([&corrupt]).unwrap_err();
    assert!(
        matches!(&err, DataError::Parquet { path, .. } if *path == corrupt),
        "{err:?}"
    );
    assert!(err.to_string().contains("corrupt.parquet"), "{err}");
    std::fs::remove_file(&corrupt).unwrap();

    let other = TempDir::new("other-schema");
    Dataset::from_columns([("id", Column::F64(vec![1.0]))])
        .unwrap()
        .lazy()
        .write_parquet(other.path())
        .unwrap();
    let odd = other.path().join("part-00000.parquet");
    let err = LazyDataset::read_parquet([&files[0], &odd]).unwrap_err();
    assert!(
        matches!(&err, DataError::FileSchema { path, first, .. } if *path == odd && *first == files[0]),
        "{err:?}"
    );

    let err = LazyDataset::read_parquet_columns([dir.path()], ["id", "label"]).unwrap_err();
    assert!(
        matches!(&err, DataError::MissingColumn { column, .. } if column == "label"),
        "{err:?}"
    );
    assert!(
        err.to_string().contains("\"pixels\""),
        "lists the columns: {err}"
    );

    let ds = LazyDataset::read_parquet([dir.path()]).unwrap();
    assert!(matches!(
        ds.iter_batches(0, false).unwrap_err(),
        DataError::InvalidArgument {
            argument: "batch_size",
            ..
        }
    ));
    assert!(matches!(
        ds.map_batches(scale, 0).unwrap_err(),
        DataError::InvalidArgument {
            argument: "batch_size",
            ..
        }
    ));

    let failing = ds.map_batches(fail_on_block_with_77, 10).unwrap();
    let err = failing.materialize().unwrap_err();
    assert!(
        matches!(&err, DataError::Stage { stage, block: 2, message }
            if stage == "MapBatches" && message == "id 77 is cursed"),
        "{err:?}"
    );
    let err = ds.map_batches(panics, 10).unwrap().count().unwrap_err();
    assert!(
        matches!(&err, DataError::Stage { block: 0, message, .. } if message.contains("panicked on purpose")),
        "{err:?}"
    );
}

#[test]
fn an_equal_streaming_split_feeds_concurrent_consumers_the_same_count_each_epoch() {
    cluster();
    // Blocks of 8,192 rows: 50,002 rows divide neither by 3 nor by them.
    let ds = LazyDataset::range(50_002).map_batches(tag, 1000).unwrap();
    let splits = ds.streaming_split(3, true).unwrap();
    assert!(splits.iter().all(|s| s.is_streaming()));
    for _epoch in 0..2 {
        // Each epoch's iterators come from the same DataIterators, whose
        // epoch counters advance.
        let per_split: Vec<Vec<i64>> = std::thread::scope(|scope| {
            let handles: Vec<_> = splits
                .iter()
                .map(|split| scope.spawn(move || ids_of(split.iter_batches(500, false).unwrap())))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let counts: Vec<usize> = per_split.iter().map(Vec::len).collect();
        assert_eq!(counts, [16_667; 3], "equal shares, the remainder dropped");
        let all: BTreeSet<i64> = per_split.iter().flatten().copied().collect();
        assert_eq!(all.len(), 50_001, "no row given twice, one dropped");
    }
    assert!(!splits[0].stats().unwrap().is_empty());

    // Unequal: every row once, to whoever asks.
    let splits = LazyDataset::range(30_000)
        .streaming_split(2, false)
        .unwrap();
    let handles: Vec<_> = splits
        .into_iter()
        .map(|split| std::thread::spawn(move || ids_of(split.iter_batches(1000, false).unwrap())))
        .collect();
    let mut all: Vec<i64> = handles
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    all.sort();
    assert_eq!(all, (0..30_000).collect::<Vec<_>>());
}

fn tag(batch: Batch) -> Result<Batch, DataError> {
    let n = batch.num_rows();
    batch.with_column("one", Column::F32(vec![1.0; n]))
}

#[test]
fn a_local_shuffle_buffer_mixes_rows_across_blocks_and_keeps_every_one() {
    cluster();
    let ds = LazyDataset::range(20_000);
    let read = |seed| {
        ids_of(
            ds.iter_batches(64, false)
                .unwrap()
                .local_shuffle(1000, seed),
        )
    };
    let (a, b, c) = (read(7), read(7), read(8));
    assert_eq!(a, b, "one seed, one order");
    assert_ne!(a, c);
    assert_ne!(
        a[..64],
        (0..64).collect::<Vec<_>>()[..],
        "the first batch is mixed"
    );
    let mut sorted = a.clone();
    sorted.sort();
    assert_eq!(sorted, (0..20_000).collect::<Vec<_>>(), "every row once");
    let whole: usize = ds
        .iter_batches(64, true)
        .unwrap()
        .local_shuffle(1000, 1)
        .map(|b| b.unwrap().num_rows())
        .sum();
    assert_eq!(whole, 20_000 / 64 * 64, "drop_last drops the short tail");
}

struct Tagger {
    pid: i64,
    calls: i64,
}

impl BatchMapper for Tagger {
    fn call(&mut self, batch: Batch) -> Result<Batch, MapperError> {
        self.calls += 1;
        let n = batch.num_rows();
        Ok(batch
            .with_column("pid", Column::I64(vec![self.pid; n]))?
            .with_column("call", Column::I64(vec![self.calls; n]))?)
    }
}

fn tagger() -> Result<Tagger, String> {
    Ok(Tagger {
        pid: std::process::id() as i64,
        calls: 0,
    })
}

fn no_model() -> Result<Tagger, String> {
    Err("no model file at /models/x".into())
}

#[test]
fn a_pool_of_actors_keeps_its_state_across_blocks_and_returns_them_in_order() {
    cluster();
    let ds = LazyDataset::range(50_000)
        .map_batches_with_actors(tagger, 2, 1000, 0.0)
        .unwrap();
    assert_eq!(ds.stage_names(), ["Range", "MapBatches(actors x2)"]);
    let out = ds.materialize().unwrap().take_batch(50_000);
    assert_eq!(
        out.i64("id").unwrap(),
        (0..50_000).collect::<Vec<_>>(),
        "in order"
    );
    let pids: BTreeSet<i64> = out.i64("pid").unwrap().iter().copied().collect();
    assert!(pids.len() <= 2, "two actors at most: {pids:?}");
    assert!(
        !pids.contains(&(std::process::id() as i64)),
        "not in the driver"
    );
    // 7 blocks of up to 8,192 rows in batches of 1,000: an actor that made
    // its state once counts its calls on across blocks.
    let most = out.i64("call").unwrap().iter().copied().max().unwrap();
    assert!(most > 9, "the state outlives one block: {most} calls");

    let err = LazyDataset::range(10)
        .map_batches_with_actors(no_model, 1, 10, 0.0)
        .unwrap()
        .count()
        .unwrap_err();
    assert!(
        matches!(&err, DataError::Stage { message, .. } if message.contains("no model file")),
        "{err:?}"
    );
    assert!(matches!(
        LazyDataset::range(10).map_batches_with_actors(tagger, 0, 10, 0.0),
        Err(DataError::InvalidArgument {
            argument: "pool_size",
            ..
        })
    ));
}

fn slow_tagger() -> Result<SlowTagger, String> {
    Ok(SlowTagger(tagger()?))
}

/// A mapper that takes its time, so that the actors stay busy.
struct SlowTagger(Tagger);

impl BatchMapper for SlowTagger {
    fn call(&mut self, batch: Batch) -> Result<Batch, MapperError> {
        std::thread::sleep(std::time::Duration::from_millis(20));
        self.0.call(batch)
    }
}

#[test]
fn a_pool_grows_while_its_actors_are_busy_up_to_its_max() {
    cluster();
    let ds = LazyDataset::range(50_000)
        .map_batches_with_actors(slow_tagger, (1, 3), 1000, 0.0)
        .unwrap();
    assert_eq!(ds.stage_names(), ["Range", "MapBatches(actors x1-3)"]);
    let mut run = ds.iter_batches(5000, false).unwrap();
    let mut ids = Vec::new();
    let mut pids = BTreeSet::new();
    for batch in run.by_ref() {
        let batch = batch.unwrap();
        ids.extend_from_slice(batch.i64("id").unwrap());
        pids.extend(batch.i64("pid").unwrap().iter().copied());
    }
    assert_eq!(ids, (0..50_000).collect::<Vec<_>>(), "in order");
    assert_eq!(pids.len(), 3, "{pids:?}");
    let stats = run.stats();
    let pool = stats
        .iter()
        .find(|s| s.name.starts_with("MapBatches"))
        .unwrap();
    assert_eq!(pool.peak_actors, 3, "{pool}");
    assert!(pool.to_string().ends_with("3 actors at most"), "{pool}");
    assert!(matches!(
        LazyDataset::range(10).map_batches_with_actors(tagger, (3, 2), 10, 0.0),
        Err(DataError::InvalidArgument {
            argument: "pool_size",
            ..
        })
    ));
}

#[test]
fn a_range_pool_stops_actors_left_idle_while_its_consumer_is_slow() {
    cluster();
    // 40 blocks, so that most are sent to the pool while it is slow.
    let ds = LazyDataset::range(40_000)
        .repartition(40)
        .unwrap()
        .map_batches_with_actors(slow_tagger, (1, 3), 1000, 0.0)
        .unwrap();
    let mut run = ds.iter_batches(1000, false).unwrap();
    let mut ids = Vec::new();
    for (i, batch) in run.by_ref().enumerate() {
        ids.extend_from_slice(batch.unwrap().i64("id").unwrap());
        // Fast at first (the pool grows), then slower than one actor: one
        // block at a time arrives, always for the first free actor, and
        // the others go without work for longer than POOL_IDLE.
        if i >= 10 {
            std::thread::sleep(prism_train::data::POOL_IDLE / 8);
        }
    }
    assert_eq!(ids, (0..40_000).collect::<Vec<_>>(), "every row, in order");
    let stats = run.stats();
    let pool = stats
        .iter()
        .find(|s| s.name.starts_with("MapBatches"))
        .unwrap();
    assert!(pool.peak_actors >= 2, "it grew first: {pool}");
    assert!(pool.actors_stopped_idle >= 1, "{pool}");
    assert!(pool.to_string().contains("stopped idle"), "{pool}");
}

#[derive(Deserialize)]
struct FileRow {
    path: String,
    bytes: Vec<u8>,
}

fn file_len(row: FileRow) -> Squared {
    Squared {
        id: row.bytes.len() as i64,
        square: row.path.len() as i64,
    }
}

#[test]
fn binary_files_are_rows_of_bytes_read_by_tasks_in_blocks_of_files() {
    cluster();
    let dir = TempDir::new("binary");
    let nested = dir.path().join("b");
    std::fs::create_dir_all(&nested).unwrap();
    let contents: Vec<(PathBuf, Vec<u8>)> = vec![
        (dir.path().join("a.bin"), (0..=255u8).collect()),
        (nested.join("c.bin"), Vec::new()),
        (nested.join("d.bin"), vec![0xff; 70_000]),
    ];
    for (path, data) in &contents {
        std::fs::write(path, data).unwrap();
    }
    std::fs::write(dir.path().join(".hidden"), b"skipped").unwrap();

    let ds = LazyDataset::read_binary_files_with_paths([dir.path()]).unwrap();
    assert_eq!(ds.count().unwrap(), 3, "from the listing");
    assert_eq!(ds.schema().unwrap().to_string(), "path: str, bytes: bytes");
    let batch = ds.take_batch(10).unwrap();
    let paths: Vec<String> = contents.iter().map(|c| c.0.display().to_string()).collect();
    assert_eq!(
        batch.str("path").unwrap(),
        paths,
        "recursive, in name order"
    );
    let read: Vec<&Vec<u8>> = batch.bytes("bytes").unwrap().iter().collect();
    let want: Vec<&Vec<u8>> = contents.iter().map(|c| &c.1).collect();
    assert_eq!(read, want);

    // Rows reach serde types as Vec<u8>.
    let lens = ds.map(file_len).take_batch(10).unwrap();
    assert_eq!(lens.i64("id").unwrap(), [256, 0, 70_000]);

    // A bytes column survives a Parquet round trip.
    let out = TempDir::new("binary-parquet");
    let bytes_only = LazyDataset::read_binary_files([&contents[0].0, &contents[2].0]).unwrap();
    bytes_only.write_parquet(out.path()).unwrap();
    let back = LazyDataset::read_parquet([out.path()]).unwrap();
    assert_eq!(back.schema().unwrap().to_string(), "bytes: bytes");
    assert_eq!(
        back.take_batch(5).unwrap().bytes("bytes").unwrap(),
        [contents[0].1.clone(), contents[2].1.clone()]
    );

    // Many small files are grouped, at most 1,024 to a block.
    let many = TempDir::new("binary-many");
    for i in 0..1030 {
        std::fs::write(many.path().join(format!("{i:05}")), i.to_string()).unwrap();
    }
    let all = LazyDataset::read_binary_files([many.path()])
        .unwrap()
        .materialize()
        .unwrap();
    assert_eq!(all.num_blocks(), 2);
    assert_eq!(all.count(), 1030);
    assert_eq!(all.take_batch(1030).bytes("bytes").unwrap()[1029], b"1029");

    // A path that does not exist is named at once; a file that vanishes
    // before its block runs fails the run, naming it.
    match LazyDataset::read_binary_files([dir.path().join("nope")]) {
        Err(DataError::Io { path, .. }) => assert!(path.ends_with("nope")),
        other => panic!("{:?}", other.map(|_| ())),
    }
    let vanishing = LazyDataset::read_binary_files([dir.path()]).unwrap();
    std::fs::remove_file(&contents[1].0).unwrap();
    let err = vanishing.materialize().unwrap_err().to_string();
    assert!(err.contains("c.bin"), "{err}");
}

/// Adds the CPUs free in the cluster while the task runs.
fn free_cpus(batch: Batch) -> Result<Batch, DataError> {
    let (_, free) = prism::cluster_resources().map_err(|e| DataError::InvalidArgument {
        argument: "cluster",
        value: e.to_string(),
        reason: "the cluster's resources must be readable",
    })?;
    let n = batch.num_rows();
    batch.with_column("free", Column::F64(vec![free.get("CPU").as_f64(); n]))
}

fn identity(batch: Batch) -> Result<Batch, DataError> {
    Ok(batch)
}

#[test]
fn a_step_asks_for_its_own_cpus_and_a_fused_task_for_the_most_of_its_steps() {
    cluster();
    // The test cluster has 2 CPUs: a task that holds both leaves none free,
    // whatever else runs.
    let both = LazyDataset::range(10)
        .map_batches(identity, 5)
        .unwrap()
        .num_cpus(2.0)
        .unwrap()
        .map_batches(free_cpus, 5)
        .unwrap();
    let batch = both.take_batch(10).unwrap();
    assert_eq!(batch.f64("free").unwrap(), [0.0; 10]);

    for bad in [-1.0, f64::NAN, f64::INFINITY] {
        let err = LazyDataset::range(10)
            .map_batches(identity, 5)
            .unwrap()
            .num_cpus(bad)
            .unwrap_err();
        assert!(
            matches!(
                err,
                DataError::InvalidArgument {
                    argument: "num_cpus",
                    ..
                }
            ),
            "{err}"
        );
    }
    let err = LazyDataset::range(10).limit(3).num_cpus(1.0).unwrap_err();
    assert!(
        err.to_string().contains("map_batches, map or filter"),
        "{err}"
    );
}

#[test]
fn a_streaming_split_shows_its_progress_line_in_the_process_that_made_it() {
    const CHILD: &str = "PRISM_PIPELINE_TEST_PROGRESS_CHILD";
    const NAME: &str = "a_streaming_split_shows_its_progress_line_in_the_process_that_made_it";
    if std::env::var_os(CHILD).is_some() {
        // The child: a driver on a "terminal" (PRISM_DATA_PROGRESS=1)
        // reading two splits, then staying up long enough to be polled.
        cluster();
        let splits = LazyDataset::range(20_000).streaming_split(2, true).unwrap();
        let readers: Vec<_> = splits
            .into_iter()
            .map(|s| {
                std::thread::spawn(move || {
                    s.iter_batches(500, false)
                        .unwrap()
                        .map(|b| b.unwrap().num_rows())
                        .sum::<usize>()
                })
            })
            .collect();
        let rows: usize = readers.into_iter().map(|r| r.join().unwrap()).sum();
        assert_eq!(rows, 20_000);
        std::thread::sleep(std::time::Duration::from_millis(1500));
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", NAME, "--nocapture", "--test-threads", "1"])
        .env(CHILD, "1")
        .env("PRISM_DATA_PROGRESS", "1")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("streaming_split(2) Range: 20000 rows") && stderr.contains("rows/s"),
        "{stderr}"
    );
}
