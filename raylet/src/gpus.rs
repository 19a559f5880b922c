//! The machine's NVIDIA GPUs as its metrics show them (Ray's
//! `ray_node_gpus_utilization`, `ray_node_gram_used`): read from
//! `nvidia-smi`, which comes with the driver, on each scrape of a node that
//! offers GPUs. A node without GPUs runs nothing.

use std::io::Read;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// One GPU, now.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct GpuSample {
    pub(crate) index: String,
    pub(crate) name: String,
    /// Percent of the last sample period the GPU was busy.
    pub(crate) utilization: f64,
    pub(crate) memory_used_bytes: u64,
    pub(crate) memory_total_bytes: u64,
}

/// How long `nvidia-smi` may take.
const QUERY_WITHIN: Duration = Duration::from_secs(3);

/// The GPUs `nvidia-smi` reports, or why none are: it is not installed,
/// failed, or took too long.
pub(crate) fn sample() -> Result<Vec<GpuSample>, String> {
    let mut child = Command::new("nvidia-smi")
        .args([
            "--query-gpu=index,name,utilization.gpu,memory.used,memory.total",
            "--format=csv,noheader,nounits",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("nvidia-smi cannot run: {e}"))?;
    let start = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if start.elapsed() < QUERY_WITHIN => {
                std::thread::sleep(Duration::from_millis(10))
            }
            Ok(None) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "nvidia-smi did not answer within {} s",
                    QUERY_WITHIN.as_secs()
                ));
            }
            Err(e) => return Err(format!("nvidia-smi: {e}")),
        }
    };
    let mut text = String::new();
    if let Some(mut out) = child.stdout.take() {
        let _ = out.read_to_string(&mut text);
    }
    if !status.success() {
        return Err(format!("nvidia-smi failed ({status})"));
    }
    Ok(parse(&text))
}

/// `nvidia-smi --format=csv,noheader,nounits` lines: index, name,
/// utilization (%), memory used and total (MiB). Lines that do not parse
/// (`[N/A]`, a driver's warning) are left out.
fn parse(text: &str) -> Vec<GpuSample> {
    const MIB: u64 = 1 << 20;
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(',').map(str::trim).collect();
            let [index, name, utilization, used, total] = fields[..] else {
                return None;
            };
            Some(GpuSample {
                index: index.to_string(),
                name: name.to_string(),
                utilization: utilization.parse().ok()?,
                memory_used_bytes: used.parse::<u64>().ok()? * MIB,
                memory_total_bytes: total.parse::<u64>().ok()? * MIB,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nvidia_smi_lines_become_samples_and_unreadable_ones_are_left_out() {
        let text = "0, NVIDIA H100 80GB HBM3, 87, 40960, 81559\n\
                    1, NVIDIA H100 80GB HBM3, [N/A], 0, 81559\n\
                    garbage\n";
        let gpus = parse(text);
        assert_eq!(gpus.len(), 1);
        assert_eq!(gpus[0].index, "0");
        assert_eq!(gpus[0].name, "NVIDIA H100 80GB HBM3");
        assert_eq!(gpus[0].utilization, 87.0);
        assert_eq!(gpus[0].memory_used_bytes, 40960 << 20);
        assert_eq!(gpus[0].memory_total_bytes, 81559 << 20);
    }
}
