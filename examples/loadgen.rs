//! The load driver of `scripts/bench.sh` and `scripts/build_pgo.sh`: closed-loop requests
//! from `-c` keep-alive connections, each sending the same body as soon as its last answer
//! has ended, for a warm-up and then a measured window. It checks every answer (status
//! 200, the `--expect`ed strings) and prints one JSON line: requests and errors in the
//! window, requests per second, latency, time to the first byte and to the first `--marker`
//! (a streamed token), and for each `--pid NAME=PID` the process's CPU time per request
//! and its peak memory over the window, with the machine's steal time.
//!
//!   cargo run --release --example loadgen -- --url http://127.0.0.1:8788/v1/messages \
//!     --body payload.json -c 16 --duration 3 --warmup 0.5 -H 'x-api-key: k' --pid proxy=1234
#![allow(
    clippy::disallowed_methods,
    reason = "a tool of the benchmark, not the proxy: it starts its tasks as it likes"
)]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::Parser;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde_json::json;

#[derive(Parser, Debug)]
struct Args {
    #[arg(long)]
    url: String,
    /// File whose bytes are every request's body.
    #[arg(long)]
    body: std::path::PathBuf,
    /// Connections, each with one request in flight.
    #[arg(short = 'c', default_value_t = 1)]
    concurrency: usize,
    /// Seconds measured, after the warm-up.
    #[arg(long, default_value_t = 2.5)]
    duration: f64,
    #[arg(long, default_value_t = 0.5)]
    warmup: f64,
    /// A request header, `name: value` (repeatable).
    #[arg(short = 'H')]
    header: Vec<String>,
    /// A string every answer must hold (repeatable); an answer without it is an error.
    #[arg(long)]
    expect: Vec<String>,
    /// The first occurrence of this string in an answer is its first token (TTFT).
    #[arg(long)]
    marker: Option<String>,
    /// A process to measure, `NAME=PID` (repeatable).
    #[arg(long)]
    pid: Vec<String>,
    /// Carried into the output line as it is.
    #[arg(long, default_value = "")]
    label: String,
    /// Seconds one answer may take at most; then it is an error and its connection is
    /// made again.
    #[arg(long, default_value_t = 30.0)]
    timeout: f64,
}

/// What one answer took, in ms from the request's start.
struct Timing {
    total: f64,
    first_byte: f64,
    first_token: Option<f64>,
}

#[derive(Default)]
struct Results {
    timings: Vec<Timing>,
    errors: u64,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let line = runtime.block_on(drive(args))?;
    println!("{line}");
    Ok(())
}

async fn drive(args: Args) -> anyhow::Result<serde_json::Value> {
    let uri: http::Uri = args.url.parse()?;
    let authority = uri
        .authority()
        .ok_or_else(|| anyhow::anyhow!("no host in {}", args.url))?
        .clone();
    let body = Bytes::from(std::fs::read(&args.body)?);
    let mut headers = http::HeaderMap::new();
    headers.insert(http::header::CONTENT_TYPE, "application/json".parse()?);
    headers.insert(http::header::HOST, authority.as_str().parse()?);
    for h in &args.header {
        let (name, value) = h
            .split_once(':')
            .ok_or_else(|| anyhow::anyhow!("header {h:?} is not `name: value`"))?;
        headers.insert(
            http::HeaderName::from_bytes(name.trim().as_bytes())?,
            value.trim().parse()?,
        );
    }
    let start = Instant::now();
    let measured_from = start + Duration::from_secs_f64(args.warmup);
    let until = measured_from + Duration::from_secs_f64(args.duration);
    let results = Arc::new(Mutex::new(Results::default()));
    let job = Arc::new(Job {
        addr: format!(
            "{}:{}",
            authority.host(),
            authority.port_u16().unwrap_or(80)
        ),
        path: uri.path_and_query().map_or("/", |p| p.as_str()).to_string(),
        headers,
        body,
        expect: args.expect.clone(),
        marker: args.marker.clone(),
        timeout: Duration::from_secs_f64(args.timeout),
        measured_from,
        until,
        results: results.clone(),
    });
    let processes = args
        .pid
        .iter()
        .map(|p| {
            let (name, pid) = p
                .split_once('=')
                .ok_or_else(|| anyhow::anyhow!("--pid {p:?} is not NAME=PID"))?;
            Ok((name.to_string(), pid.parse::<u32>()?))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let watch = tokio::spawn(watch_processes(processes, measured_from, until));
    let workers: Vec<_> = (0..args.concurrency)
        .map(|_| tokio::spawn(worker(job.clone())))
        .collect();
    for w in workers {
        w.await?;
    }
    let (processes, steal) = watch.await?;
    let results = std::mem::take(&mut *results.lock().unwrap_or_else(|e| e.into_inner()));
    let n = results.timings.len();
    let quantiles = |pick: fn(&Timing) -> Option<f64>| {
        let mut xs: Vec<f64> = results.timings.iter().filter_map(pick).collect();
        xs.sort_by(f64::total_cmp);
        let at = |q: f64| {
            xs.get(((xs.len().max(1) - 1) as f64 * q).round() as usize)
                .copied()
        };
        json!({"n": xs.len(), "p50": at(0.5), "p99": at(0.99)})
    };
    let per_request = |ms: f64| if n > 0 { ms / n as f64 } else { 0.0 };
    let cpu: serde_json::Map<_, _> = processes
        .iter()
        .map(|p| (p.name.clone(), json!(per_request(p.cpu_ms))))
        .collect();
    let rss: serde_json::Map<_, _> = processes
        .iter()
        .map(|p| (p.name.clone(), json!(p.rss_peak_kb)))
        .collect();
    Ok(json!({
        "label": args.label,
        "concurrency": args.concurrency,
        "requests": n,
        "errors": results.errors,
        "rps": n as f64 / args.duration,
        "lat_ms": quantiles(|t| Some(t.total)),
        "ttfb_ms": quantiles(|t| Some(t.first_byte)),
        "ttft_ms": quantiles(|t| t.first_token),
        "cpu_ms_per_req": cpu,
        "rss_peak_kb": rss,
        "steal_pct": steal,
    }))
}

/// What every worker shares.
struct Job {
    addr: String,
    path: String,
    headers: http::HeaderMap,
    body: Bytes,
    expect: Vec<String>,
    marker: Option<String>,
    timeout: Duration,
    measured_from: Instant,
    until: Instant,
    results: Arc<Mutex<Results>>,
}

type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

/// One connection's closed loop: a request, its whole answer, the next, until the window
/// ends; a failed connection is made again.
async fn worker(job: Arc<Job>) {
    let mut sender: Option<Sender> = None;
    while Instant::now() < job.until {
        if sender.is_none() {
            sender = connect(&job.addr).await;
            if sender.is_none() {
                record(&job, Instant::now(), None);
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        }
        let Some(s) = sender.as_mut() else { continue };
        let started = Instant::now();
        let answer = tokio::time::timeout(job.timeout, one(s, &job, started)).await;
        let timing = answer.ok().flatten();
        if timing.is_none() {
            sender = None; // its state is unknown: a fresh connection
        }
        record(&job, started, timing);
    }
}

async fn connect(addr: &str) -> Option<Sender> {
    let stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    stream.set_nodelay(true).ok()?;
    let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .ok()?;
    tokio::spawn(connection);
    Some(sender)
}

/// One request and its whole answer, checked; `None` when it failed.
async fn one(sender: &mut Sender, job: &Job, started: Instant) -> Option<Timing> {
    sender.ready().await.ok()?;
    let mut request = http::Request::post(job.path.as_str())
        .body(Full::new(job.body.clone()))
        .ok()?;
    *request.headers_mut() = job.headers.clone();
    let response = sender.send_request(request).await.ok()?;
    let ok = response.status() == http::StatusCode::OK;
    let mut body = response.into_body();
    let mut got: Vec<u8> = Vec::new();
    let mut first_byte = None;
    let mut first_token = None;
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame.ok()?.into_data() else {
            continue;
        };
        let ms = started.elapsed().as_secs_f64() * 1000.0;
        first_byte.get_or_insert(ms);
        got.extend_from_slice(&data);
        if first_token.is_none() {
            if let Some(marker) = &job.marker {
                if memchr::memmem::find(&got, marker.as_bytes()).is_some() {
                    first_token = Some(ms);
                }
            }
        }
    }
    let complete = job
        .expect
        .iter()
        .all(|e| memchr::memmem::find(&got, e.as_bytes()).is_some());
    if !ok || !complete {
        return None;
    }
    Some(Timing {
        total: started.elapsed().as_secs_f64() * 1000.0,
        first_byte: first_byte.unwrap_or(0.0),
        first_token,
    })
}

/// Counts an answer that ended inside the measured window.
fn record(job: &Job, started: Instant, timing: Option<Timing>) {
    let now = Instant::now();
    if started < job.measured_from || now > job.until {
        return;
    }
    let mut results = job.results.lock().unwrap_or_else(|e| e.into_inner());
    match timing {
        Some(t) => results.timings.push(t),
        None => results.errors += 1,
    }
}

/// A measured process over the window.
struct Process {
    name: String,
    cpu_ms: f64,
    rss_peak_kb: u64,
}

/// CPU time (user + system, every thread, its children's too) of each process over the
/// window, and its largest resident memory sampled every 20 ms in it. Also the machine's steal time over the window, in % of all its CPU time.
async fn watch_processes(
    processes: Vec<(String, u32)>,
    from: Instant,
    until: Instant,
) -> (Vec<Process>, Option<f64>) {
    tokio::time::sleep_until(from.into()).await;
    let machine_before = machine_ticks();
    let ticks_before: Vec<Option<u64>> = processes.iter().map(|(_, pid)| cpu_ticks(*pid)).collect();
    let mut peaks = vec![0u64; processes.len()];
    while Instant::now() < until {
        for ((_, pid), peak) in processes.iter().zip(&mut peaks) {
            *peak = (*peak).max(rss_kb(*pid).unwrap_or(0));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let steal = machine_before
        .zip(machine_ticks())
        .and_then(|((steal0, all0), (steal1, all1))| {
            let all = all1.saturating_sub(all0);
            (all > 0).then(|| steal1.saturating_sub(steal0) as f64 * 100.0 / all as f64)
        });
    let ms_per_tick = 1000.0 / clock_ticks_per_second();
    let measured = processes
        .into_iter()
        .zip(ticks_before)
        .zip(peaks)
        .map(|(((name, pid), before), rss_peak_kb)| {
            let used = cpu_ticks(pid)
                .zip(before)
                .map_or(0, |(after, before)| after.saturating_sub(before));
            Process {
                name,
                cpu_ms: used as f64 * ms_per_tick,
                rss_peak_kb,
            }
        })
        .collect();
    (measured, steal)
}

/// The fields of /proc/PID/stat after the process's name (the state is the first).
fn stat_fields(pid: u32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_name = stat.get(stat.rfind(')')? + 2..)?;
    Some(after_name.split_whitespace().map(str::to_string).collect())
}

/// `pid` and every process below it (nginx's workers are its master's children).
fn tree(pid: u32) -> Vec<u32> {
    let mut parents: Vec<(u32, u32)> = Vec::new();
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for entry in dir.flatten() {
            let Some(p) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok())
            else {
                continue;
            };
            if let Some(ppid) = stat_fields(p).and_then(|f| f.get(1)?.parse().ok()) {
                parents.push((p, ppid));
            }
        }
    }
    let mut found = vec![pid];
    let mut i = 0;
    while i < found.len() {
        let parent = found[i];
        found.extend(
            parents
                .iter()
                .filter(|(_, pp)| *pp == parent)
                .map(|(p, _)| *p),
        );
        i += 1;
    }
    found
}

/// utime + stime of a process tree (fields 14 and 15 of /proc/PID/stat: every thread's).
fn cpu_ticks(pid: u32) -> Option<u64> {
    let ticks = |p: u32| -> Option<u64> {
        let f = stat_fields(p)?;
        Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
    };
    let own = ticks(pid)?;
    Some(own + tree(pid).into_iter().skip(1).filter_map(ticks).sum::<u64>())
}

/// Resident memory of a process tree.
fn rss_kb(pid: u32) -> Option<u64> {
    let one = |p: u32| -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{p}/status")).ok()?;
        let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
        line.split_whitespace().nth(1)?.parse().ok()
    };
    Some(tree(pid).into_iter().filter_map(one).sum())
}

#[allow(unsafe_code, reason = "sysconf is a C call")]
fn clock_ticks_per_second() -> f64 {
    // SAFETY: sysconf reads a constant of the system.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if ticks > 0 {
        ticks as f64
    } else {
        100.0
    }
}

/// The machine's CPU counters (/proc/stat, first line): (steal, all).
fn machine_ticks() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let fields: Vec<u64> = stat
        .lines()
        .next()?
        .split_whitespace()
        .skip(1)
        .filter_map(|f| f.parse().ok())
        .collect();
    Some((*fields.get(7)?, fields.iter().sum()))
}
