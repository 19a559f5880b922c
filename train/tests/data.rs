//! The dataset layer: building datasets, every operation on them, reading
//! them epoch by epoch, the distributed sampler, and `map_batches` on a
//! real embedded cluster (this binary doubles as its workers).

use prism_train::data::{
    Batch, Column, ColumnType, DataError, Dataset, DistributedSampler, ItemProblem,
};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::sync::OnceLock;

/// Starts this binary's cluster once; tests in one process share it.
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

/// A file under the temp dir with a name no other run uses; removed on drop.
struct TempFile(PathBuf);

impl TempFile {
    fn with(name: &str, contents: &[u8]) -> TempFile {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let path =
            std::env::temp_dir().join(format!("prism-data-test-{}-{n}-{name}", std::process::id()));
        std::fs::write(&path, contents).expect("the temp dir must be writable");
        TempFile(path)
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn ids(ds: &Dataset) -> Vec<i64> {
    ds.take_batch(usize::MAX)
        .i64("id")
        .expect("an id column")
        .to_vec()
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Example {
    name: String,
    pixels: Vec<f32>,
    label: i64,
    weight: f64,
}

fn examples(n: usize) -> Vec<Example> {
    (0..n)
        .map(|i| Example {
            name: format!("ex{i}"),
            pixels: vec![i as f32, i as f32 + 0.5, -1.0],
            label: (i % 3) as i64,
            weight: i as f64 / 4.0,
        })
        .collect()
}

// ---- Building datasets ----

#[test]
fn from_items_makes_typed_columns_in_field_order_and_take_gives_the_items_back() {
    let items = examples(5);
    let ds = Dataset::from_items(&items).unwrap();
    assert_eq!(ds.count(), 5);
    assert_eq!(ds.columns(), ["name", "pixels", "label", "weight"]);
    let schema = ds.schema();
    assert_eq!(schema.data_type("name"), Some(ColumnType::Str));
    assert_eq!(
        schema.data_type("pixels"),
        Some(ColumnType::Tensor { row_len: 3 })
    );
    assert_eq!(schema.data_type("label"), Some(ColumnType::I64));
    assert_eq!(schema.data_type("weight"), Some(ColumnType::F64));
    let batch = ds.take_batch(2);
    assert_eq!(batch.tensor("pixels").unwrap().shape(), [2, 3]);
    assert_eq!(
        batch.tensor("pixels").unwrap().row(1),
        Some(&[1.0f32, 1.5, -1.0][..])
    );
    assert_eq!(ds.take::<Example>(3).unwrap(), items[..3]);
    assert_eq!(ds.take_all::<Example>().unwrap(), items);
}

#[test]
fn from_items_widens_integers_to_floats_when_a_later_item_has_a_fraction() {
    let rows: Vec<BTreeMap<&str, f64>> =
        vec![BTreeMap::from([("x", 1.0)]), BTreeMap::from([("x", 2.5)])];
    // serde_json writes 1.0 as a float; mix a real integer in through JSON.
    let json: Vec<serde_json::Value> =
        vec![serde_json::json!({"x": 1}), serde_json::json!({"x": 2.5})];
    let ds = Dataset::from_items(&json).unwrap();
    assert_eq!(ds.take_batch(2).f64("x").unwrap(), [1.0, 2.5]);
    assert_eq!(
        Dataset::from_items(&rows).unwrap().schema().data_type("x"),
        Some(ColumnType::F64)
    );
}

#[test]
fn from_items_rejects_items_that_do_not_fit_the_first_ones_schema() {
    let err = Dataset::from_items([1, 2]).unwrap_err();
    assert!(
        matches!(
            err,
            DataError::Item {
                index: 0,
                reason: ItemProblem::NotARecord { found: "a number" }
            }
        ),
        "{err:?}"
    );
    let rows = vec![
        serde_json::json!({"a": 1, "b": "x"}),
        serde_json::json!({"a": 2}),
    ];
    let err = Dataset::from_items(&rows).unwrap_err();
    assert!(
        matches!(
            &err,
            DataError::Item {
                index: 1,
                reason: ItemProblem::Fields { .. }
            }
        ),
        "{err:?}"
    );
    let rows = vec![serde_json::json!({"a": 1}), serde_json::json!({"a": "one"})];
    let err = Dataset::from_items(&rows).unwrap_err();
    assert!(
        matches!(
            &err,
            DataError::Item {
                index: 1,
                reason: ItemProblem::TypeChanged {
                    expected: ColumnType::I64,
                    found: ColumnType::Str,
                    ..
                }
            }
        ),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "item 1: field \"a\" is str, but the first item's is i64"
    );
    let rows = vec![
        serde_json::json!({"v": [1.0, 2.0]}),
        serde_json::json!({"v": [1.0]}),
    ];
    assert!(matches!(
        Dataset::from_items(&rows).unwrap_err(),
        DataError::Item {
            index: 1,
            reason: ItemProblem::TypeChanged { .. }
        }
    ));
    let rows = vec![serde_json::json!({"a": null})];
    assert!(matches!(
        Dataset::from_items(&rows).unwrap_err(),
        DataError::Item {
            index: 0,
            reason: ItemProblem::Unsupported { found: "null", .. }
        }
    ));
}

#[test]
fn from_columns_checks_lengths_and_names() {
    let ds = Dataset::from_columns([
        ("x", Column::F32(vec![1.0, 2.0])),
        ("y", Column::I64(vec![3, 4])),
    ])
    .unwrap();
    assert_eq!(ds.count(), 2);
    assert_eq!(ds.schema().to_string(), "x: f32, y: i64");
    let err = Dataset::from_columns([
        ("x", Column::F32(vec![1.0, 2.0])),
        ("y", Column::I64(vec![3])),
    ])
    .unwrap_err();
    assert!(
        matches!(&err, DataError::ColumnLength { column, len: 1, expected: 2 } if column == "y"),
        "{err:?}"
    );
    let err = Dataset::from_columns([("x", Column::F32(vec![1.0])), ("x", Column::F32(vec![2.0]))])
        .unwrap_err();
    assert!(matches!(err, DataError::DuplicateColumn { .. }), "{err:?}");
    assert!(matches!(
        Column::tensor(vec![1.0; 5], 2).unwrap_err(),
        DataError::TensorShape {
            values: 5,
            row_len: 2,
            ..
        }
    ));
}

#[test]
fn range_counts_from_zero_in_an_id_column() {
    let ds = Dataset::range(7);
    assert_eq!(ds.count(), 7);
    assert_eq!(ds.columns(), ["id"]);
    assert_eq!(ids(&ds), (0..7).collect::<Vec<_>>());
    assert_eq!(Dataset::range(0).count(), 0);
}

#[test]
fn from_batches_requires_one_schema() {
    let a = Batch::new(vec![("x".into(), Column::I64(vec![1]))]).unwrap();
    let b = Batch::new(vec![("x".into(), Column::F64(vec![1.0]))]).unwrap();
    let err = Dataset::from_batches(vec![a.clone(), a.clone(), b]).unwrap_err();
    assert!(
        matches!(err, DataError::SchemaMismatch { block: 2, .. }),
        "{err:?}"
    );
    assert_eq!(
        Dataset::from_batches(vec![a.clone(), a]).unwrap().count(),
        2
    );
}

// ---- Batches ----

#[test]
fn accessors_name_the_column_the_type_found_and_the_type_asked() {
    let batch = Dataset::range(3).take_batch(3);
    assert_eq!(batch.i64("id").unwrap(), [0, 1, 2]);
    let err = batch.f32("id").unwrap_err();
    assert!(
        matches!(&err, DataError::ColumnType { column, found: ColumnType::I64, expected: "f32" } if column == "id"),
        "{err:?}"
    );
    assert_eq!(err.to_string(), "column \"id\" holds i64, not f32");
    let err = batch.tensor("pixels").unwrap_err();
    assert_eq!(
        err.to_string(),
        "no column named \"pixels\"; the columns are [\"id\"]"
    );
    assert_eq!(batch.to_f32_vec("id").unwrap(), [0.0, 1.0, 2.0]);
}

#[test]
fn batches_survive_a_serde_round_trip() {
    let ds = Dataset::from_items(examples(4)).unwrap();
    let text = serde_json::to_string(&ds).unwrap();
    let back: Dataset = serde_json::from_str(&text).unwrap();
    assert_eq!(back, ds);
}

// ---- CSV ----

#[test]
fn read_csv_infers_integer_float_and_string_columns() {
    let file = TempFile::with(
        "ok.csv",
        b"id,score,name,mixed\n1,0.5,ann,3\n2,1,bob,x\n3,-2e3,\"c, d\",4\n",
    );
    let ds = Dataset::read_csv(&file.0).unwrap();
    assert_eq!(ds.count(), 3);
    assert_eq!(
        ds.schema().to_string(),
        "id: i64, score: f64, name: str, mixed: str"
    );
    let batch = ds.take_batch(3);
    assert_eq!(batch.i64("id").unwrap(), [1, 2, 3]);
    assert_eq!(batch.f64("score").unwrap(), [0.5, 1.0, -2000.0]);
    assert_eq!(batch.str("name").unwrap(), ["ann", "bob", "c, d"]);
}

#[test]
fn read_csv_reports_the_file_and_line_of_a_malformed_record() {
    let file = TempFile::with("bad.csv", b"a,b\n1,2\n3,4\n5\n");
    let err = Dataset::read_csv(&file.0).unwrap_err();
    match &err {
        DataError::Csv { path, line, .. } => {
            assert_eq!(path, &file.0);
            assert_eq!(*line, 4, "the short record is on line 4");
        }
        other => panic!("expected a CSV error, got {other:?}"),
    }
    let message = err.to_string();
    assert!(
        message.contains(&file.0.display().to_string())
            && message.contains(":4")
            && message.contains("1 fields, but the header has 2"),
        "{message}"
    );

    let file = TempFile::with("utf8.csv", b"a,b\n1,\xff\xfe\n");
    let err = Dataset::read_csv(&file.0).unwrap_err();
    assert!(
        matches!(&err, DataError::Csv { line: 2, column: Some(c), .. } if c == "b"),
        "{err:?}"
    );

    let file = TempFile::with("dup.csv", b"a,a\n1,2\n");
    assert!(matches!(
        Dataset::read_csv(&file.0).unwrap_err(),
        DataError::Csv {
            line: 1,
            column: Some(_),
            ..
        }
    ));

    let file = TempFile::with("empty.csv", b"");
    assert!(matches!(
        Dataset::read_csv(&file.0).unwrap_err(),
        DataError::Csv { line: 1, .. }
    ));

    let missing = std::env::temp_dir().join("prism-data-test-no-such-file.csv");
    assert!(matches!(
        Dataset::read_csv(&missing).unwrap_err(),
        DataError::Io { .. }
    ));
}

// ---- Operations ----

#[test]
fn random_shuffle_is_a_permutation_fixed_by_its_seed() {
    let ds = Dataset::range(100).repartition(4).unwrap();
    let a = ds.random_shuffle(1);
    assert_eq!(ids(&a), ids(&ds.random_shuffle(1)), "one seed, one order");
    assert_ne!(ids(&a), ids(&ds.random_shuffle(2)));
    assert_ne!(ids(&a), ids(&ds));
    let mut sorted = ids(&a);
    sorted.sort();
    assert_eq!(sorted, ids(&ds));
    assert_eq!(a.num_blocks(), 4, "blocks keep their sizes");
    assert_eq!(
        ids(&ds),
        (0..100).collect::<Vec<_>>(),
        "the input is unchanged"
    );
}

#[test]
fn equal_split_gives_every_shard_the_same_count_and_drops_the_remainder() {
    let ds = Dataset::range(10).repartition(3).unwrap();
    let shards = ds.split(3, true).unwrap();
    assert_eq!(
        shards.iter().map(Dataset::count).collect::<Vec<_>>(),
        [3, 3, 3]
    );
    assert_eq!(ids(&shards[0]), [0, 1, 2]);
    assert_eq!(ids(&shards[1]), [3, 4, 5]);
    assert_eq!(ids(&shards[2]), [6, 7, 8]);

    let shards = ds.split(3, false).unwrap();
    assert_eq!(
        shards.iter().map(Dataset::count).collect::<Vec<_>>(),
        [4, 3, 3]
    );
    let all: Vec<i64> = shards.iter().flat_map(ids).collect();
    assert_eq!(all, (0..10).collect::<Vec<_>>(), "no row lost or repeated");

    let shards = Dataset::range(2).split(4, true).unwrap();
    assert!(shards.iter().all(|s| s.count() == 0));
    assert_eq!(
        shards[0].columns(),
        ["id"],
        "an empty shard keeps the schema"
    );
    assert!(matches!(
        ds.split(0, true).unwrap_err(),
        DataError::InvalidArgument { argument: "n", .. }
    ));
}

#[test]
fn repartition_balances_rows_over_blocks() {
    let ds = Dataset::range(10).repartition(4).unwrap();
    assert_eq!(
        ds.blocks().iter().map(Batch::num_rows).collect::<Vec<_>>(),
        [3, 3, 2, 2]
    );
    assert_eq!(ids(&ds), (0..10).collect::<Vec<_>>());
}

#[test]
fn iter_batches_spans_blocks_and_drops_the_short_tail_on_request() {
    let ds = Dataset::range(10).repartition(3).unwrap(); // blocks of 4, 3, 3
    let batches: Vec<Batch> = ds.iter_batches(3, false).unwrap().collect();
    let sizes: Vec<usize> = batches.iter().map(Batch::num_rows).collect();
    assert_eq!(sizes, [3, 3, 3, 1]);
    assert_eq!(
        batches[1].i64("id").unwrap(),
        [3, 4, 5],
        "spans blocks 0 and 1"
    );
    let flat: Vec<i64> = batches
        .iter()
        .flat_map(|b| b.i64("id").unwrap().to_vec())
        .collect();
    assert_eq!(flat, (0..10).collect::<Vec<_>>());

    let it = ds.iter_batches(3, true).unwrap();
    assert_eq!(it.len(), 3);
    assert_eq!(it.map(|b| b.num_rows()).collect::<Vec<_>>(), [3, 3, 3]);
    assert_eq!(ds.iter_batches(100, true).unwrap().count(), 0);
    assert!(matches!(
        ds.iter_batches(0, false).unwrap_err(),
        DataError::InvalidArgument {
            argument: "batch_size",
            ..
        }
    ));
}

#[test]
fn a_shard_iterator_reshuffles_each_epoch_deterministically_and_serializes() {
    let shard = Dataset::range(50)
        .streaming_split(2, true)
        .unwrap()
        .remove(1)
        .local_shuffle_seed(9);
    let epoch = |it: &prism_train::data::DataIterator| -> Vec<i64> {
        it.iter_batches(8, false)
            .unwrap()
            .flat_map(|b| b.unwrap().i64("id").unwrap().to_vec())
            .collect()
    };
    let e0 = epoch(&shard);
    let e1 = epoch(&shard);
    assert_eq!(shard.epoch(), 2);
    assert_ne!(e0, e1, "each epoch gets a new order");
    let mut sorted = e0.clone();
    sorted.sort();
    assert_eq!(sorted, (25..50).collect::<Vec<_>>());

    // A copy sent to a worker reads the same orders.
    let copy: prism_train::data::DataIterator =
        serde_json::from_str(&serde_json::to_string(&shard).unwrap()).unwrap();
    copy.set_epoch(0);
    assert_eq!(epoch(&copy), e0);
    assert_eq!(epoch(&copy), e1);

    let plain = Dataset::range(5).iterator();
    assert_eq!(epoch(&plain), [0, 1, 2, 3, 4]);
    assert_eq!(epoch(&plain), [0, 1, 2, 3, 4], "no seed, no shuffle");
}

// ---- The distributed sampler ----

fn sampler_indices(len: usize, world: usize, epoch: u64, drop_last: bool) -> Vec<Vec<usize>> {
    (0..world)
        .map(|rank| {
            let mut s = DistributedSampler::new(len, rank, world)
                .unwrap()
                .seed(3)
                .drop_last(drop_last);
            s.set_epoch(epoch);
            s.indices()
        })
        .collect()
}

#[test]
fn sampler_ranks_cover_every_index_and_are_disjoint_when_the_length_divides() {
    let parts = sampler_indices(12, 4, 0, false);
    assert!(parts.iter().all(|p| p.len() == 3));
    let mut all: Vec<usize> = parts.concat();
    all.sort();
    assert_eq!(all, (0..12).collect::<Vec<_>>(), "disjoint and complete");

    // 10 over 4: padded to 12 by wrapping; every index still appears.
    let parts = sampler_indices(10, 4, 0, false);
    assert!(parts.iter().all(|p| p.len() == 3));
    let covered: HashSet<usize> = parts.concat().into_iter().collect();
    assert_eq!(covered, (0..10).collect());

    // With drop_last, 2 per rank and no repeats.
    let parts = sampler_indices(10, 4, 0, true);
    assert!(parts.iter().all(|p| p.len() == 2));
    let all = parts.concat();
    assert_eq!(all.iter().collect::<HashSet<_>>().len(), 8);

    // More ranks than items: padding repeats the items.
    let parts = sampler_indices(2, 5, 0, false);
    assert!(parts.iter().all(|p| p.len() == 1));
    assert!(sampler_indices(0, 3, 0, false).iter().all(Vec::is_empty));
}

#[test]
fn sampler_reshuffles_per_epoch_and_repeats_for_the_same_seed_and_epoch() {
    assert_eq!(
        sampler_indices(100, 2, 1, false),
        sampler_indices(100, 2, 1, false)
    );
    assert_ne!(
        sampler_indices(100, 2, 1, false),
        sampler_indices(100, 2, 2, false)
    );
    let unshuffled = DistributedSampler::new(7, 1, 3).unwrap().shuffle(false);
    assert_eq!(
        unshuffled.indices(),
        [1, 4, 0],
        "torch's order: rank::world, wrapped"
    );
    assert_eq!(unshuffled.batches(2).unwrap(), [vec![1, 4], vec![0]]);
    assert!(matches!(
        DistributedSampler::new(5, 3, 3).unwrap_err(),
        DataError::InvalidRank {
            rank: 3,
            world_size: 3
        }
    ));
}

// ---- map_batches on the cluster ----

fn tag_with_pid(batch: Batch) -> Result<Batch, DataError> {
    let doubled = batch.i64("id")?.iter().map(|x| x * 2).collect();
    let pid = vec![std::process::id() as i64; batch.num_rows()];
    batch
        .with_column("doubled", Column::I64(doubled))?
        .with_column("pid", Column::I64(pid))
}

#[test]
fn map_batches_runs_each_batch_as_a_task_in_a_worker_process() {
    cluster();
    let ds = Dataset::range(100);
    let out = ds.map_batches(tag_with_pid, 10).unwrap();
    assert_eq!(out.num_blocks(), 10, "one output block per batch");
    assert_eq!(out.count(), 100);
    let all = out.take_batch(100);
    assert_eq!(
        all.i64("id").unwrap(),
        (0..100).collect::<Vec<_>>(),
        "in order"
    );
    assert_eq!(
        all.i64("doubled").unwrap(),
        (0..100).map(|x| x * 2).collect::<Vec<_>>()
    );
    let driver = std::process::id() as i64;
    assert!(
        all.i64("pid").unwrap().iter().all(|&p| p != driver),
        "batch functions must run in worker processes, not the driver"
    );
}

fn fail_on_55(batch: Batch) -> Result<Batch, String> {
    let ids = batch.i64("id").map_err(|e| e.to_string())?;
    if ids.contains(&55) {
        return Err("id 55 is cursed".to_string());
    }
    Ok(batch)
}

fn panics(_: Batch) -> Result<Batch, String> {
    panic!("batch function panicked on purpose")
}

#[test]
fn a_failing_batch_function_comes_back_as_a_typed_error_naming_the_batch() {
    cluster();
    let err = Dataset::range(100).map_batches(fail_on_55, 10).unwrap_err();
    assert!(
        matches!(&err, DataError::MapFn { batch_index: 5, message } if message == "id 55 is cursed"),
        "{err:?}"
    );
    let err = Dataset::range(2).map_batches(panics, 2).unwrap_err();
    assert!(
        matches!(
            &err,
            DataError::Task {
                batch_index: 0,
                source: prism::Error::TaskFailed {
                    kind: prism::FailureKind::Panic,
                    ..
                }
            }
        ),
        "{err:?}"
    );
}

#[test]
fn a_batch_whose_columns_disagree_is_refused_when_deserialized() {
    let bad = r#"{"names":["a","b"],"columns":[{"I64":[1,2]},{"I64":[3]}],"num_rows":2}"#;
    let err = serde_json::from_str::<Batch>(bad).unwrap_err();
    assert!(err.to_string().contains("column \"b\" has 1 rows"), "{err}");
}
