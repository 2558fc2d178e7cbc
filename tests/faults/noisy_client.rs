//! One client floods the daemon, 256 connections writing as fast as they are answered, while
//! another writes now and then. The noisy client's limits (`max_concurrent_writes`,
//! `max_requests_per_second`) refuse its excess with 429 at once, with `Retry-After` and the
//! RateLimit fields, so the quiet client keeps its share: every one of its writes succeeds, and
//! its p99 stays within a small multiple of its p99 without the flood.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::common::daemon::{spawn_app_with, TestDaemon};
use crate::common::helpers::{client, entry_body, knob, TestResponse};

const QUIET_TOKEN: &str = "rs_quiet-client-token";
const NOISY_TOKEN: &str = "rs_noisy-client-token";
const FLOOD_CONNECTIONS: usize = 256;

/// What the flood got back.
#[derive(Default)]
struct FloodCounts {
    created: AtomicUsize,
    limited: AtomicUsize,
    other: AtomicUsize,
}

/// 256 connections of the noisy client writing unique keys in a closed loop, on a thread and
/// runtime of their own (so that the quiet client's timings are not the flood's own queue),
/// until `stop`. Returns the thread, and one 429 as the flood saw it.
fn flood(
    address: String,
    stop: Arc<AtomicBool>,
    counts: Arc<FloodCounts>,
) -> std::thread::JoinHandle<Option<TestResponse>> {
    std::thread::spawn(move || {
        // The flood stands in for clients on other machines: its own CPU use (256 connections
        // on the machine's two cores) is not what the quiet client may be slowed by, so its
        // thread runs at the lowest priority. Linux applies a nice value per thread.
        // SAFETY: gettid and setpriority have no preconditions; a failure only leaves the
        // priority as it was.
        unsafe {
            libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, 19);
        }
        actix_web::rt::System::new().block_on(async move {
            let http = awc::Client::builder()
                .connector(awc::Connector::new().limit(FLOOD_CONNECTIONS * 2))
                .timeout(Duration::from_secs(30))
                .finish();
            let sample = Arc::new(std::sync::Mutex::new(None));
            let tasks = (0..FLOOD_CONNECTIONS).map(|connection| {
                let (http, address, stop, counts, sample) = (
                    http.clone(),
                    address.clone(),
                    stop.clone(),
                    counts.clone(),
                    sample.clone(),
                );
                async move {
                    let mut n = 0;
                    while !stop.load(Ordering::Relaxed) {
                        n += 1;
                        let sent = http
                            .post(format!("{address}/v1/entries"))
                            .insert_header(("Idempotency-Key", format!("flood-{connection}-{n}")))
                            .insert_header(("Content-Type", "application/json"))
                            .insert_header(("Authorization", format!("Bearer {NOISY_TOKEN}")))
                            .send_body(entry_body(n).to_string())
                            .await;
                        let Ok(response) = sent else {
                            counts.other.fetch_add(1, Ordering::Relaxed);
                            continue;
                        };
                        let Ok(answer) = TestResponse::read(response).await else {
                            counts.other.fetch_add(1, Ordering::Relaxed);
                            continue;
                        };
                        match answer.status {
                            201 => counts.created.fetch_add(1, Ordering::Relaxed),
                            429 => {
                                sample.lock().unwrap().get_or_insert(answer);
                                counts.limited.fetch_add(1, Ordering::Relaxed)
                            }
                            _ => counts.other.fetch_add(1, Ordering::Relaxed),
                        };
                    }
                }
            });
            futures_util::future::join_all(tasks).await;
            let sample = sample.lock().unwrap().take();
            sample
        })
    })
}

/// `writes` writes of the quiet client, one after another; the latency of each, sorted.
async fn quiet_writes(app: &TestDaemon, phase: &str, writes: usize) -> Vec<Duration> {
    let mut latencies = Vec::with_capacity(writes);
    for n in 0..writes {
        let started = Instant::now();
        let answer = app
            .post_entry_as(
                Some(QUIET_TOKEN),
                &format!("{phase}-{n}"),
                &entry_body(n as i64),
            )
            .await;
        latencies.push(started.elapsed());
        answer.assert_created();
    }
    latencies.sort();
    latencies
}

fn p99(sorted: &[Duration]) -> Duration {
    sorted[(sorted.len() * 99).div_ceil(100) - 1]
}

#[actix_web::test]
async fn a_flooding_client_is_refused_its_excess_and_the_others_keep_their_share() {
    // RETRYSAFE_NOISY_UNLIMITED=1 runs the same flood with no limit, for comparison.
    let limited = knob("RETRYSAFE_NOISY_UNLIMITED", 0) == 0;
    let app = spawn_app_with(|settings| {
        let mut noisy = client("noisy", NOISY_TOKEN);
        if limited {
            noisy.max_concurrent_writes = Some(8);
            noisy.max_requests_per_second = Some(500.0);
        } else {
            settings.auth.max_concurrent_writes = 0;
        }
        settings.auth.clients = vec![client("quiet", QUIET_TOKEN), noisy];
    })
    .await;
    let writes = knob("RETRYSAFE_NOISY_QUIET_WRITES", 200);
    let quiet = quiet_writes(&app, "quiet", writes).await;

    let stop = Arc::new(AtomicBool::new(false));
    let counts = Arc::new(FloodCounts::default());
    let flooding = flood(app.address.clone(), stop.clone(), counts.clone());
    tokio::time::sleep(Duration::from_secs(1)).await;
    let loud = quiet_writes(&app, "loud", writes).await;
    stop.store(true, Ordering::Relaxed);
    let sample = flooding.join().expect("the flood's thread");

    let (created, refused, other) = (
        counts.created.load(Ordering::Relaxed),
        counts.limited.load(Ordering::Relaxed),
        counts.other.load(Ordering::Relaxed),
    );
    eprintln!(
        "noisy client {}: quiet p99 {:?} alone, {:?} beside the flood ({:.1}x); flood: {created} created, {refused} refused with 429, {other} other",
        if limited { "limited" } else { "unlimited" },
        p99(&quiet),
        p99(&loud),
        p99(&loud).as_secs_f64() / p99(&quiet).as_secs_f64()
    );
    if !limited {
        return;
    }
    assert!(created > 0, "the noisy client gets its share");
    assert!(refused > 0, "and no more");
    let refusal = sample.expect("a 429 was seen");
    refusal.assert_problem(429, "rate-limited");
    let retry_after: u64 = refusal.header("retry-after").unwrap().parse().unwrap();
    assert!(retry_after >= 1);
    let policy = refusal.header("ratelimit-policy").unwrap();
    assert_eq!(
        policy,
        "\"writes\";q=8;qu=\"concurrent-requests\", \"requests\";q=500;w=1"
    );
    let state = refusal.header("ratelimit").unwrap();
    assert!(
        state == "\"writes\";r=0" || state.starts_with("\"requests\";r=0;t="),
        "{state}"
    );
    // No refused write left a row: the flood's rows are its created ones.
    assert_eq!(
        app.count("SELECT count(*) FROM idempotency_records WHERE client_id = 'noisy'")
            .await as usize,
        created
    );
    // The quiet client's p99 stays within a small multiple of its p99 alone (generous: the
    // machine's two cores also run the flood's 256 connections and the database).
    let ratio = p99(&loud).as_secs_f64() / p99(&quiet).as_secs_f64();
    assert!(
        p99(&loud) <= p99(&quiet) * 10,
        "quiet p99 {:?} beside the flood, {:?} alone ({ratio:.1}x)",
        p99(&loud),
        p99(&quiet)
    );
}
