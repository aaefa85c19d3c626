//! nginx running the shipped `docker/nginx.conf` in front of two replicas over loopback
//! (its upstream names and port replaced by loopback addresses), for the tests of the
//! compose stack's front without Docker. Needs nginx (Debian's `nginx`): a test that uses it
//! fails when it is missing.
#![allow(
    clippy::disallowed_methods,
    reason = "tests start their servers as they like"
)]
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// nginx running `docker/nginx.conf`, stopped (its master process, which stops its
/// workers) when dropped.
pub struct Nginx {
    master: Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Nginx {
    /// nginx in front of `replicas`; fails the test when nginx is not installed.
    pub fn start(replicas: [std::net::SocketAddr; 2]) -> Nginx {
        let Some(binary) = ["/usr/sbin/nginx", "/usr/bin/nginx"]
            .into_iter()
            .map(PathBuf::from)
            .find(|p| p.is_file())
        else {
            panic!("this test needs nginx (apt-get install -y nginx)");
        };
        let dir = tempfile::tempdir().unwrap();
        // The workers may run as another user (nginx started by root): they write their
        // temporary files under the directory.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let shipped = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("docker/nginx.conf"),
        )
        .unwrap();
        let at = dir.path().display().to_string();
        let conf = [
            ("loopwarden-a:8788", replicas[0].to_string()),
            ("loopwarden-b:8788", replicas[1].to_string()),
            ("listen 8788;", format!("listen 127.0.0.1:{port};")),
            ("/tmp/", format!("{at}/")),
        ]
        .iter()
        .fold(shipped, |conf, (from, to)| {
            assert!(conf.contains(from), "docker/nginx.conf has no {from:?}");
            conf.replace(from, to)
        });
        let path = dir.path().join("nginx.conf");
        std::fs::write(&path, conf).unwrap();
        let master = Command::new(binary)
            .arg("-c")
            .arg(&path)
            .arg("-p")
            .arg(dir.path())
            .arg("-e")
            .arg(dir.path().join("error.log"))
            .args(["-g", "daemon off;"])
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        Nginx {
            master,
            port,
            _dir: dir,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    pub async fn ready(&self) {
        let client = reqwest::Client::builder().no_proxy().build().unwrap();
        for _ in 0..200 {
            if let Ok(r) = client.get(self.url("/healthz")).send().await {
                if r.status().is_success() {
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("nginx did not answer /healthz");
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        // SIGQUIT to the master this test started: nginx's graceful stop, workers included.
        let _ = Command::new("kill")
            .args(["-QUIT", &self.master.id().to_string()])
            .status();
        let _ = self.master.wait();
    }
}
