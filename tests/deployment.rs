//! Deployment: the container image (read, since no test machine runs Docker) runs as an
//! unprivileged user with a health check and its dependencies in a layer of their own; the
//! health check's command answers for a running proxy and fails without one; the benchmark
//! and PGO scripts need nothing outside the repository.
#![allow(
    clippy::disallowed_methods,
    reason = "tests start their servers as they like"
)]

use std::path::Path;
use std::process::Stdio;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_loopwarden");
const ROOT: &str = env!("CARGO_MANIFEST_DIR");

fn read(path: &str) -> String {
    std::fs::read_to_string(Path::new(ROOT).join(path)).unwrap()
}

#[tokio::test]
async fn the_health_check_answers_for_a_running_proxy_and_fails_without_one() {
    let dir = tempfile::tempdir().unwrap();
    let mut proxy = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--db"])
        .arg(format!("sqlite://{}", dir.path().join("log.db").display()))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let stdout = proxy.stdout.take().unwrap();
    let line = BufReader::new(stdout)
        .lines()
        .next_line()
        .await
        .unwrap()
        .unwrap();
    let addr = line
        .strip_prefix("loopwarden listening on http://")
        .unwrap()
        .to_string();
    // As in the image: the address comes from the environment `serve` read too.
    let up = Command::new(BIN)
        .arg("health")
        .env("LOOPWARDEN_LISTEN", &addr)
        .output()
        .await
        .unwrap();
    assert!(up.status.success(), "{up:?}");
    assert_eq!(String::from_utf8_lossy(&up.stdout), "ok\n");

    proxy.kill().await.unwrap();
    proxy.wait().await.unwrap();
    let down = Command::new(BIN)
        .args(["health", "--listen", &addr])
        .output()
        .await
        .unwrap();
    assert!(!down.status.success(), "{down:?}");
    assert!(
        String::from_utf8_lossy(&down.stderr).contains(&addr),
        "{down:?}"
    );
}

/// The instructions of the image's last stage (after its last `FROM`), one per line.
fn final_stage(dockerfile: &str) -> Vec<String> {
    let joined = dockerfile.replace("\\\n", " ");
    let instructions: Vec<String> = joined
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(str::to_string)
        .collect();
    let last_from = instructions
        .iter()
        .rposition(|l| l.starts_with("FROM "))
        .unwrap();
    instructions[last_from..].to_vec()
}

#[test]
fn the_image_runs_unprivileged_with_a_health_check_and_a_dependency_layer() {
    let dockerfile = read("docker/Dockerfile");
    let stage = final_stage(&dockerfile);
    let user = stage
        .iter()
        .rev()
        .find_map(|l| l.strip_prefix("USER "))
        .expect("a USER in the final stage");
    let user = user.split(':').next().unwrap().trim();
    assert!(user != "root" && user != "0", "runs as {user}");
    let health = stage
        .iter()
        .find(|l| l.starts_with("HEALTHCHECK "))
        .expect("a HEALTHCHECK");
    assert!(health.contains("\"loopwarden\", \"health\""), "{health}");
    let entry = stage.iter().find(|l| l.starts_with("ENTRYPOINT ")).unwrap();
    assert!(entry.contains("\"serve\""), "{entry}");

    // The dependencies are built from the manifest and lock file alone, before the sources
    // come in.
    let at = |needle: &str| dockerfile.find(needle).unwrap_or(usize::MAX);
    let manifest = at("COPY Cargo.toml Cargo.lock");
    let first_build = at("cargo build");
    let sources = at("COPY . .");
    assert!(
        manifest < first_build && first_build < sources && sources != usize::MAX,
        "no dependency layer"
    );
}

/// The README's first command (`cargo run --release`) builds in minutes: release has no
/// whole-program LTO. What is published or measured is built in `dist`, which has it.
#[test]
fn release_builds_quickly_and_published_or_measured_binaries_build_dist() {
    let manifest: toml::Value = toml::from_str(&read("Cargo.toml")).unwrap();
    let profile = |name: &str| manifest["profile"][name].clone();
    let release = profile("release");
    let lto = release
        .get("lto")
        .and_then(|l| l.as_str().map(str::to_string));
    assert!(
        matches!(release.get("lto"), None | Some(toml::Value::Boolean(false)))
            || lto.as_deref() == Some("thin"),
        "release: lto = {:?}",
        release.get("lto")
    );
    assert!(release
        .get("codegen-units")
        .is_none_or(|n| n.as_integer() > Some(1)));
    let dist = profile("dist");
    assert_eq!(dist["inherits"].as_str(), Some("release"));
    assert_eq!(dist["lto"].as_str(), Some("fat"));
    assert_eq!(dist["codegen-units"].as_integer(), Some(1));
    for script in [
        "docker/Dockerfile",
        "scripts/bench.sh",
        "scripts/build_pgo.sh",
    ] {
        let text = read(script);
        assert!(text.contains("cargo build --profile dist"), "{script}");
        assert!(!text.contains("cargo build --release"), "{script}");
    }
}

#[test]
fn the_benchmark_and_pgo_scripts_need_nothing_outside_the_repository() {
    for script in [
        "scripts/bench.sh",
        "scripts/build_pgo.sh",
        "scripts/harness.sh",
        "scripts/bench_payloads.py",
        "scripts/bench_summary.py",
        "scripts/bench_ratios.py",
        "scripts/api_payloads.py",
        "scripts/idle_memory.py",
    ] {
        let text = read(script);
        for outside in ["../shared", "/work/shared", "BENCH_HARNESS"] {
            assert!(!text.contains(outside), "{script} refers to {outside}");
        }
        // Every script of the repository they name is there.
        for word in text.split(|c: char| !(c.is_alphanumeric() || "/_.-".contains(c))) {
            if let Some(name) = word.strip_prefix("scripts/") {
                if name.ends_with(".sh") || name.ends_with(".py") {
                    assert!(
                        Path::new(ROOT).join("scripts").join(name).exists(),
                        "{script} names scripts/{name}, which is not in the repository"
                    );
                }
            }
        }
    }
    assert!(Path::new(ROOT).join("examples/loadgen.rs").exists());
}

/// The compose file's replicas read a config a team edits (its policies): a directory is
/// mounted where the image looks for its config file, by default the repository's
/// `config/`, whose `loopwarden.toml` loads.
#[test]
fn the_compose_replicas_mount_the_config_the_image_reads() {
    let dockerfile = read("docker/Dockerfile");
    let config_file = dockerfile
        .split_whitespace()
        .find_map(|w| w.strip_prefix("LOOPWARDEN_CONFIG="))
        .expect("the image names its config file");
    let (config_dir, file_name) = config_file.rsplit_once('/').unwrap();
    let compose = read("docker/compose.yml");
    let target = format!(":{config_dir}:ro");
    let mount = compose
        .lines()
        .map(str::trim)
        .filter_map(|l| l.strip_prefix("- "))
        .find(|l| l.ends_with(&target))
        .unwrap_or_else(|| panic!("no volume mounted on {config_dir}"));
    let source = mount.strip_suffix(&target).unwrap();
    let default = source
        .strip_prefix("${LOOPWARDEN_CONFIG_DIR:-")
        .and_then(|s| s.strip_suffix('}'))
        .unwrap_or(source);
    // Relative to the compose file's directory.
    let file = Path::new(ROOT).join("docker").join(default).join(file_name);
    assert!(file.is_file(), "{} is not there", file.display());
    loopwarden::config::Config::load(Some(&file), |_| None).unwrap();
    // Both replicas share the mount (the YAML anchor both extend).
    let anchor = compose.find("x-replica: &replica").unwrap();
    let services = compose.find("\nservices:").unwrap();
    assert!((anchor..services).contains(&compose.find(mount).unwrap()));
    assert_eq!(compose.matches("<<: *replica").count(), 2);
}

/// The value of the first `key: value` line of a YAML text (these manifests hold each key
/// the test reads once, or first where it matters).
fn yaml_value<'a>(yaml: &'a str, key: &str) -> &'a str {
    yaml.lines()
        .find_map(|l| l.trim().strip_prefix(&format!("{key}:")))
        .unwrap_or_else(|| panic!("no {key} in the manifest"))
        .trim()
}

/// The ConfigMap's `loopwarden.toml`, as the pods read it.
fn configmap_toml() -> String {
    let yaml = read("deploy/kubernetes/configmap.yaml");
    let mut lines = yaml
        .lines()
        .skip_while(|l| l.trim() != "loopwarden.toml: |");
    lines.next().expect("the ConfigMap holds loopwarden.toml");
    lines
        .take_while(|l| l.is_empty() || l.starts_with("    "))
        .map(|l| l.strip_prefix("    ").unwrap_or(l))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The Kubernetes manifests (their schema is checked in `.ci/run` by kubernetes-validate)
/// fit the proxy they run: the ConfigMap is a configuration `serve` accepts; the pod's
/// termination grace is above the proxy's shutdown grace; the drain outlasts the readiness
/// probe's notice; the probes ask `/healthz` and `/readyz`; the database URL and the admin
/// token come from Secrets; the spill file is on a volume of its own.
#[test]
fn the_kubernetes_manifests_fit_the_proxy_they_run() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("loopwarden.toml");
    std::fs::write(&file, configmap_toml()).unwrap();
    let config = loopwarden::config::Config::load(Some(&file), |_| None).unwrap();
    let server = &config.server;

    let deployment = read("deploy/kubernetes/deployment.yaml");
    let termination: u64 = yaml_value(&deployment, "terminationGracePeriodSeconds")
        .parse()
        .unwrap();
    assert!(
        termination > server.shutdown_grace_secs,
        "the kubelet's SIGKILL ({termination} s) must come after the proxy's grace ({} s)",
        server.shutdown_grace_secs
    );
    let readiness = deployment
        .split("readinessProbe:")
        .nth(1)
        .expect("a readiness probe");
    assert_eq!(yaml_value(readiness, "path"), "/readyz");
    let period: u64 = yaml_value(readiness, "periodSeconds").parse().unwrap();
    let failures: u64 = yaml_value(readiness, "failureThreshold").parse().unwrap();
    assert!(
        server.drain_secs >= 2 * period * failures,
        "the drain ({} s) must leave the probe time to see 503 and the Service to drop the pod",
        server.drain_secs
    );
    let liveness = deployment.split("livenessProbe:").nth(1).unwrap();
    assert_eq!(yaml_value(liveness, "path"), "/healthz");
    for (variable, secret) in [
        ("LOOPWARDEN_DB", "loopwarden-postgres"),
        ("LOOPWARDEN_ADMIN_TOKEN", "loopwarden-admin"),
    ] {
        let env = deployment
            .split(&format!("- name: {variable}"))
            .nth(1)
            .unwrap_or_else(|| panic!("{variable} is set"));
        assert_eq!(yaml_value(env, "name"), secret, "{variable} by reference");
    }
    let spill_dir = std::path::Path::new(&config.store.spill)
        .parent()
        .expect("store.spill is set")
        .display()
        .to_string();
    assert!(
        deployment.contains(&format!("mountPath: {spill_dir}\n")),
        "the spill file's directory {spill_dir} is a volume"
    );
}
