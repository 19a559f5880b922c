//! GPU metrics through a real node: a head started with `--num-gpus 1`
//! reads the machine's GPUs from `nvidia-smi` on each scrape of its
//! `/metrics` and shows them with Ray's names. This machine has no GPU and
//! no NVIDIA driver, so the `nvidia-smi` on the node's PATH is a stand-in
//! script printing what the real one prints for `--query-gpu=... --format=
//! csv,noheader,nounits` (the one part not real here); the node, its
//! endpoint, the token check and the exposition are.

mod common;

use common::head::http;
use common::{run_bounded, text, PRISM};
use prism_tests::{must, must_become};
use std::process::Command;
use std::time::Duration;

#[test]
fn a_gpu_node_shows_its_gpus_with_rays_names() {
    let temp = std::env::temp_dir().join(format!("prism-{}-gpu-metrics", std::process::id()));
    let _ = std::fs::remove_dir_all(&temp);
    let bin = temp.join("fake-driver");
    must(std::fs::create_dir_all(&bin), "a folder for the stand-in");
    let smi = bin.join("nvidia-smi");
    must(
        std::fs::write(
            &smi,
            "#!/bin/sh\necho '0, Stand-in GPU, 42, 1024, 4096'\necho '1, Stand-in GPU, [N/A], 0, 4096'\n",
        ),
        "the stand-in nvidia-smi",
    );
    {
        use std::os::unix::fs::PermissionsExt;
        must(
            std::fs::set_permissions(&smi, std::fs::Permissions::from_mode(0o755)),
            "it runs",
        );
    }
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let temp_arg = temp.display().to_string();
    let mut start = Command::new(PRISM);
    start.args([
        "start",
        "--head",
        "--port",
        "0",
        "--dashboard-port",
        "0",
        "--num-cpus",
        "1",
        "--num-gpus",
        "1",
        "--node-ip-address",
        "127.0.0.1",
        "--temp-dir",
        &temp_arg,
    ]);
    let out = run_bounded(start, &[("PATH", &path)], Duration::from_secs(60));
    let stop = || {
        let mut stop = Command::new(PRISM);
        stop.args(["stop", "--force", "--temp-dir", &temp_arg]);
        let _ = run_bounded(stop, &[], Duration::from_secs(30));
    };
    if !out.status.success() {
        stop();
        panic!("the head must start: {}", text(&out));
    }
    let token = must(std::fs::read_to_string(temp.join("token")), "the token");
    let discovery = temp.join("prom_metrics_service_discovery.json");
    let node = must_become(
        "the head lists its node's endpoint",
        Duration::from_secs(20),
        || {
            let text = std::fs::read_to_string(&discovery).ok()?;
            let groups: serde_json::Value = serde_json::from_str(&text).ok()?;
            groups[0]["targets"][0].as_str().map(str::to_string)
        },
    );
    let (status, body) = http(&node, "GET", "/metrics", Some(token.trim()), b"");
    let (unauthorized, _) = http(&node, "GET", "/metrics", None, b"");
    stop();
    let _ = std::fs::remove_dir_all(&temp);
    assert_eq!(status, 200, "{body}");
    assert_eq!(unauthorized, 401, "the token rules stay");
    for line in [
        "ray_node_gpus_utilization{SessionName=",
        "GpuIndex=\"0\",GpuDeviceName=\"Stand-in GPU\",ip=\"127.0.0.1\"} 42",
        "ray_node_gpus_available{SessionName=",
    ] {
        assert!(body.contains(line), "{line} in:\n{body}");
    }
    let used = body
        .lines()
        .find(|l| l.starts_with("ray_node_gram_used{") && l.contains("GpuIndex=\"0\""));
    assert!(
        used.is_some_and(|l| l.ends_with(" 1073741824")),
        "1024 MiB in bytes: {used:?}"
    );
    let available = body
        .lines()
        .find(|l| l.starts_with("ray_node_gpus_available{"));
    assert!(
        available.is_some_and(|l| l.ends_with(" 1")),
        "the GPU whose line did not parse is left out: {available:?}"
    );
}
