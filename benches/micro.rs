//! Criterion micro-benchmarks of the pieces on every check's path (`cargo bench --bench
//! micro`): RTDB key encoding, window arithmetic, `MemoryStore::admit_now`, and the whole
//! in-process decision (`Limiter::check` over the memory store, on a tokio runtime),
//! without and then with the Prometheus recorder installed.
//!
//! They isolate our own code from gRPC and HTTP/2 so a regression in it shows up here
//! even when the load generator's numbers are dominated by the transport. Results and
//! how to read them: BENCHMARKS.md.

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use ratelimit::limiter::{Limiter, LimiterOptions};
use ratelimit::limits::{Limit, Limits};
use ratelimit::store::rtdb::keys;
use ratelimit::store::{CounterStore, MemoryStore};
use ratelimit::window;
use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;

/// 2025-11-30T00:00:10Z: an ordinary moment, 50 s before its minute window ends.
const NOW_MS: u64 = 1_764_460_810_000;
/// High enough that no benchmark loop ever exhausts a key.
const HIGH: u32 = 1_000_000_000;

fn key_encoding(c: &mut Criterion) {
    let mut g = c.benchmark_group("keys::encode");
    let long_slashes = "/".repeat(512);
    for (name, key) in [
        (
            "token id (36 B, nothing to escape)",
            "tok_3f9a1c2e-5b7d-4e8f-9a0b-1c2d3e4f5a6b",
        ),
        ("e-mail (1 escape)", "alice.smith@example.com"),
        ("IPv4 (3 escapes)", "203.0.113.17"),
        ("512 B of '/' (base64 form)", long_slashes.as_str()),
    ] {
        g.bench_with_input(BenchmarkId::from_parameter(name), key, |b, k| {
            b.iter(|| keys::encode(black_box(k)))
        });
    }
    g.finish();
}

fn window_math(c: &mut Criterion) {
    let mut g = c.benchmark_group("window");
    g.bench_function("number", |b| {
        b.iter(|| window::number(black_box(NOW_MS), black_box(60_000)))
    });
    g.bench_function("until_end + ceil_secs", |b| {
        b.iter(|| {
            let w = window::number(black_box(NOW_MS), 60_000);
            window::ceil_secs(window::until_end(black_box(NOW_MS), w, 60_000))
        })
    });
    g.finish();
}

fn memory_admit(c: &mut Criterion) {
    let store = MemoryStore::new();
    let limit = Limit::new("bench", HIGH, Duration::from_secs(60));
    let w = window::number(NOW_MS, limit.window_ms);
    let many: Vec<String> = (0..10_000).map(|i| format!("token-{i}")).collect();
    let mut g = c.benchmark_group("MemoryStore::admit_now");
    g.bench_function("one hot key", |b| {
        b.iter(|| store.admit_now(&limit, black_box("token-hot"), w, &[1]))
    });
    let mut i = 0usize;
    g.bench_function("10,000 keys round robin", |b| {
        b.iter(|| {
            i = (i + 1) % many.len();
            store.admit_now(&limit, black_box(&many[i]), w, &[1])
        })
    });
    g.finish();
}

fn limiter_check(c: &mut Criterion) {
    let rt = runtime();
    check_group(c, &rt, "Limiter::check (memory store)");
}

/// The same with the Prometheus recorder installed, as `ratelimit serve --metrics-listen`
/// runs. Last of all: the recorder is process-wide and cannot be removed again.
fn limiter_check_with_metrics(c: &mut Criterion) {
    let rt = runtime();
    rt.block_on(ratelimit::metrics::serve(
        "127.0.0.1:0".parse().expect("addr"),
    ))
    .expect("metrics recorder installs");
    check_group(c, &rt, "Limiter::check (memory store, Prometheus recorder)");
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

fn check_group(c: &mut Criterion, rt: &tokio::runtime::Runtime, name: &str) {
    // The system clock, as the service runs: windows are real, the limit is never reached.
    let clock = ratelimit::clock::system();
    let store: Arc<dyn CounterStore> = Arc::new(MemoryStore::new());
    let limits = Limits::new(
        "micro",
        vec![Limit::new("bench", HIGH, Duration::from_secs(60))],
        "bench",
    )
    .expect("valid limits");
    let limiter = Limiter::new(limits, store, clock, LimiterOptions::default());
    let many: Vec<String> = (0..10_000).map(|i| format!("token-{i}")).collect();
    let mut g = c.benchmark_group(name);
    g.bench_function("one hot key", |b| {
        b.to_async(rt)
            .iter(|| limiter.check("bench", black_box("token-hot"), 1, None))
    });
    let mut i = 0usize;
    g.bench_function("10,000 keys round robin", |b| {
        b.to_async(rt).iter(|| {
            i = (i + 1) % many.len();
            limiter.check("bench", black_box(&many[i]), 1, None)
        })
    });
    g.finish();
}

criterion_group!(
    benches,
    key_encoding,
    window_math,
    memory_admit,
    limiter_check,
    limiter_check_with_metrics
);
criterion_main!(benches);
