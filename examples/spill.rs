//! Spilling against the disk it spills to, in one run:
//!
//! - first times `dd` on the spill directory, with the same bytes in 64 MiB
//!   blocks: a buffered write (`dd_write_gigabytes`), a write that bypasses
//!   the page cache (`dd_direct_write_gigabytes`, `oflag=direct`), and reads
//!   of the file back, buffered and direct;
//! - then puts `--gib` GiB (default 1.5) of 64 MiB objects through a 256 MiB
//!   store, so most of them are spilled, then gets each back (restored);
//! - prints the raylet's own figures: bytes spilled and restored, and the
//!   time its spill writes and restore reads took (`spill_write_gigabytes`,
//!   `restore_read_gigabytes`, in GB/s of I/O time).
//!
//! Spill files are written through the page cache, as `dd` without flags
//! writes. Prints one `name value unit` line per figure.
//!
//! Run: `cargo run --release --example spill [-- --gib N]`

use std::path::Path;
use std::process::Command;
use std::time::Instant;

const BLOCK: usize = 64 << 20;

fn parse_gib() -> Result<f64, String> {
    let mut args = std::env::args().skip(1);
    let mut gib = 1.5;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--gib" => {
                let v = args.next().ok_or("--gib needs a number")?;
                gib = v
                    .parse()
                    .ok()
                    .filter(|g: &f64| *g > 0.0)
                    .ok_or(format!("--gib: {v:?} is not a positive number"))?;
            }
            other => return Err(format!("unknown argument {other:?}; expected --gib N")),
        }
    }
    Ok(gib)
}

/// Seconds `dd` took with `args`.
fn dd(args: &[String]) -> Result<f64, String> {
    let started = Instant::now();
    let out = Command::new("dd")
        .args(args)
        .output()
        .map_err(|e| format!("cannot run dd: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "dd {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(started.elapsed().as_secs_f64())
}

fn gbps(bytes: u64, secs: f64) -> f64 {
    bytes as f64 / secs.max(1e-9) / 1e9
}

fn disk_figures(dir: &Path, blocks: usize) -> Result<(), String> {
    let file = dir.join("dd-probe");
    let bytes = (blocks * BLOCK) as u64;
    let of = format!("of={}", file.display());
    let inf = format!("if={}", file.display());
    let bs = format!("bs={BLOCK}");
    let count = format!("count={blocks}");
    let a = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let write = dd(&a(&["if=/dev/zero", &of, &bs, &count]))?;
    let read = dd(&a(&[&inf, "of=/dev/null", &bs]))?;
    let direct_write = dd(&a(&["if=/dev/zero", &of, &bs, &count, "oflag=direct"]))?;
    let direct_read = dd(&a(&[&inf, "of=/dev/null", &bs, "iflag=direct"]))?;
    let _ = std::fs::remove_file(&file);
    println!("dd_write_gigabytes {:.3} GB_per_s", gbps(bytes, write));
    println!("dd_read_gigabytes {:.3} GB_per_s", gbps(bytes, read));
    println!(
        "dd_direct_write_gigabytes {:.3} GB_per_s",
        gbps(bytes, direct_write)
    );
    println!(
        "dd_direct_read_gigabytes {:.3} GB_per_s",
        gbps(bytes, direct_read)
    );
    Ok(())
}

fn main() -> Result<(), String> {
    let gib = parse_gib()?;
    let blocks = ((gib * (1u64 << 30) as f64) / BLOCK as f64).ceil().max(5.0) as usize;
    let dir = std::env::temp_dir().join(format!("prism-spill-bench-{}", std::process::id()));
    let config = prism::Config::default()
        .num_cpus(1)
        .object_store_memory(256 << 20)
        .object_spill_dir(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    // The disk first, with nothing else dirty in the page cache; then
    // Prism, after the disk's writes are flushed.
    sync();
    disk_figures(&dir, blocks)?;
    sync();
    prism::init(config).map_err(|e| e.to_string())?;
    let outcome = (|| {
        let started = Instant::now();
        let mut refs = Vec::with_capacity(blocks);
        for i in 0..blocks {
            let value = vec![i as u8; BLOCK];
            refs.push(prism::put(value).map_err(|e| e.to_string())?);
        }
        let put_secs = started.elapsed().as_secs_f64();
        let started = Instant::now();
        for (i, r) in refs.iter().enumerate() {
            let value = prism::get(r).map_err(|e| e.to_string())?;
            if value.len() != BLOCK || value[BLOCK / 2] != i as u8 {
                return Err(format!("object {i} came back changed"));
            }
        }
        let get_secs = started.elapsed().as_secs_f64();
        let s = prism::object_store_stats().map_err(|e| e.to_string())?;
        let total = (blocks * BLOCK) as u64;
        println!("objects_put {blocks} objects_of_64_MiB");
        println!("put_all_gigabytes {:.3} GB_per_s", gbps(total, put_secs));
        println!("get_all_gigabytes {:.3} GB_per_s", gbps(total, get_secs));
        println!("spilled_bytes {} bytes", s.spilled_bytes_total);
        println!("restored_bytes {} bytes", s.restored_bytes_total);
        println!(
            "spill_write_gigabytes {:.3} GB_per_s",
            gbps(s.spilled_bytes_total, s.spill_write_nanos as f64 / 1e9)
        );
        println!(
            "restore_read_gigabytes {:.3} GB_per_s",
            gbps(s.restored_bytes_total, s.restore_read_nanos as f64 / 1e9)
        );
        Ok(())
    })();
    prism::shutdown();
    let _ = std::fs::remove_dir_all(&dir);
    outcome
}

/// Flushes dirty pages, so one phase's writeback does not slow the next.
fn sync() {
    let _ = Command::new("sync").status();
}
