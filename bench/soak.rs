//! `bench soak`: the scenario `soak` (a steady mixed load against the release daemon for minutes
//! or hours) run once, its load measured slice by slice (`slices`), its end checks (`CHECKS`)
//! and memory verdict rendered into the template bench/soak.md.
//!
//! Each slice is one wrk run of `scripts/soak.lua` (70 % writes with fresh keys, 20 % replays,
//! 5 % conflicts, 5 % GETs). The rate is held by a fixed-rate schedule: each wrk thread sends
//! its next request at the next slot of its own schedule (`SOAK_INTERVAL_US` apart), so the time
//! the daemon takes to answer does not lower the offered rate, as a fixed pause after every
//! answer did. While a slice runs, the daemon's VmRSS is sampled every second; the memory
//! verdict is the least-squares slope of those samples after the warm-up, in MiB per hour.

use std::collections::HashMap;
use std::fs;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::harness::{self, MachineTicks};
use crate::outputs::{field, result_line};
use crate::report::{fill, Settings};
use crate::scenarios;
use crate::scene::{Bench, Scene};
use crate::stats::least_squares;
use crate::SoakArgs;

const THREADS: u32 = 2;
/// Fewer samples after the warm-up than this, or spanning less time, give no memory verdict.
const MIN_SAMPLES: usize = 10;
const MIN_SPAN_S: f64 = 60.0;
const TEMPLATE: &str = include_str!("soak.md");

/// Where a slice's figure comes from: the sum of figures of wrk's `SOAK_RESULT`, or a reading
/// of the daemon, the machine or the database after the slice.
#[derive(Clone, Copy)]
enum From {
    Wrk(&'static [&'static str]),
    /// VmRSS, MiB.
    Rss,
    /// The daemon's CPU over the slice (utime + stime / wall time; 1.00 = one core).
    Cores,
    /// The machine's busy share, steal counted as busy, in per cent.
    Machine,
    /// Events neither sent nor parked.
    Unsent,
    /// The daemon's open file descriptors.
    Fds,
}

/// A slice's figures: its column's name, decimals and source. The table shows the first 14
/// ("conflicts sent" in brackets after "409 reused"); 2xx is 201 created + 201 replayed + 200,
/// unexpected any other non-2xx (409 request-in-progress, 503, others), socket errors connect +
/// read + write + timeout.
type Column = (&'static str, usize, From);
#[rustfmt::skip]
const COLUMNS: [Column; 16] = [
    ("req/s", 0, From::Wrk(&["rps"])),
    ("p50 ms", 2, From::Wrk(&["p50_ms"])),
    ("p99 ms", 2, From::Wrk(&["p99_ms"])),
    ("max ms", 1, From::Wrk(&["max_ms"])),
    ("2xx", 0, From::Wrk(&["got_created", "got_replayed", "got_200"])),
    ("409 reused", 0, From::Wrk(&["got_reused"])),
    ("conflicts sent", 0, From::Wrk(&["sent_conflict"])),
    ("unexpected", 0, From::Wrk(&["got_other", "got_503", "got_in_progress"])),
    ("socket errors", 0, From::Wrk(&["errors_connect", "errors_read", "errors_write", "errors_timeout"])),
    ("RSS MiB", 1, From::Rss),
    ("daemon CPU (cores)", 2, From::Cores),
    ("machine CPU %", 0, From::Machine),
    ("unsent events", 0, From::Unsent),
    ("fds", 0, From::Fds),
    ("created", 0, From::Wrk(&["got_created"])),
    ("requests", 0, From::Wrk(&["requests"])),
];
const SHOWN: usize = 14;

/// One slice: its number, its end in seconds since the load started, each column's figure.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SliceRow(u32, u64, Vec<f64>);

/// The load: each slice's row, the RSS samples (seconds since the load started, MiB), the
/// unexpected answers wrk noted.
#[derive(Default)]
pub struct Load {
    rows: Vec<SliceRow>,
    samples: Vec<(f64, f64)>,
    unexpected: Vec<String>,
}

/// `m:ss`
fn clock(seconds: u64) -> String {
    format!("{}:{:02}", seconds / 60, seconds % 60)
}

/// A column's sum over the slices.
fn total(rows: &[SliceRow], column: &str) -> String {
    let index = COLUMNS
        .iter()
        .position(|c| c.0 == column)
        .expect("a column");
    let sum: u64 = rows.iter().map(|row| row.2[index] as u64).sum();
    sum.to_string()
}

/// A row of the slice table: the slice, its end, then each shown column's figure.
fn table_row(first: String, second: String, figure: impl Fn(usize) -> String) -> String {
    let mut cells = vec![first, second];
    for (i, column) in COLUMNS[..SHOWN].iter().enumerate() {
        match column.0 {
            "conflicts sent" => {
                let reused = cells.pop().unwrap_or_default();
                cells.push(format!("{reused} ({})", figure(i)));
            }
            _ => cells.push(figure(i)),
        }
    }
    format!("| {} |", cells.join(" | "))
}

fn slice_table(rows: &[SliceRow]) -> String {
    let mut out = table_row("slice".into(), "end".into(), |i| COLUMNS[i].0.to_owned());
    out.push_str(&format!("\n|{}", "---:|".repeat(SHOWN + 1)));
    for SliceRow(slice, end, values) in rows {
        let figure = |i: usize| format!("{:.*}", COLUMNS[i].1, values[i]);
        out += &format!("\n{}", table_row(slice.to_string(), clock(*end), figure));
    }
    out
}

/// min, max, first and last slice of every shown column.
fn summary_table(rows: &[SliceRow]) -> String {
    let head = "| column | min | max | first slice | last slice |\n|---|---:|---:|---:|---:|";
    let mut out = String::from(head);
    let (Some(first), Some(last)) = (rows.first(), rows.last()) else {
        return out;
    };
    for (i, (name, decimals, _)) in COLUMNS[..SHOWN].iter().enumerate() {
        // A figure rounded as the table shows it, printed without trailing zeros (as %g would).
        let scale = 10f64.powi(*decimals as i32);
        let shown = |row: &SliceRow| (row.2[i] * scale).round() / scale;
        let lo = rows.iter().map(shown).fold(f64::INFINITY, f64::min);
        let hi = rows.iter().map(shown).fold(f64::NEG_INFINITY, f64::max);
        let (first, last) = (shown(first), shown(last));
        out += &format!("\n| {name} | {lo} | {hi} | {first} | {last} |");
    }
    out
}

/// An end check: its name, whether it passed (none: no verdict, which does not fail the run),
/// and what it found.
type Check = (String, Option<bool>, String);

/// The memory verdict on the RSS `samples` (seconds since the load started, MiB) after
/// `warmup_s`: the slope of the line fitted to them within `limit` MiB/h (none with too few
/// samples, or too short a span), as an end check and as the report's sentence.
fn memory(samples: &[(f64, f64)], warmup_s: f64, limit: f64) -> (Check, String) {
    let after: Vec<(f64, f64)> = samples
        .iter()
        .copied()
        .filter(|s| s.0 >= warmup_s)
        .collect();
    let span_s = after
        .first()
        .zip(after.last())
        .map_or(0.0, |(a, b)| b.0 - a.0);
    let (line, enough) = (
        least_squares(&after),
        after.len() >= MIN_SAMPLES && span_s >= MIN_SPAN_S,
    );
    let flat = line.filter(|_| enough).map(|line| line.0 * 3600.0 <= limit);
    let (samples, warmup) = (after.len(), format!("{:.1} min", warmup_s / 60.0));
    let name = format!("RSS slope after the warm-up ≤ {limit} MiB/h");
    let (detail, sentence) = match (line, flat) {
        (Some((slope, intercept, rms)), Some(flat)) => (
            format!("{:+.2} MiB/h over {samples} samples after {warmup}", slope * 3600.0),
            format!(
                "RSS slope {:+.2} MiB/h by least squares over {samples} samples after the {warmup} warm-up ({} of load; fit {:.1} MiB at the warm-up's end, residual RMS {rms:.2} MiB); limit {limit} MiB/h: {}",
                slope * 3600.0,
                clock(span_s.round() as u64),
                intercept + slope * warmup_s,
                if flat { "flat" } else { "GROWING" }
            ),
        ),
        _ => (
            format!("no verdict: {samples} samples after {warmup}"),
            format!(
                "no verdict: {samples} samples spanning {span_s:.0} s after the {warmup} warm-up (at least {MIN_SAMPLES} over {MIN_SPAN_S:.0} s needed){}",
                line.map(|l| format!("; slope so far {:+.2} MiB/h", l.0 * 3600.0)).unwrap_or_default()
            ),
        ),
    };
    ((name, flat, detail), sentence)
}

/// The end checks, of the run's figures (`{name}` in a detail; see `soak`).
type Condition = fn(&dyn Fn(&str) -> f64) -> bool;
#[rustfmt::skip]
const CHECKS: [(&str, Condition, &str); 10] = [
    ("outbox drained within 60 s of the load", |v| v("unsent") == 0.0, "{unsent} unsent"),
    ("one record, one entry, one event per key",
        |v| v("records") == v("entries") && v("entries") == v("events") && v("orphans") == 0.0,
        "{records} records, {entries} entries, {events} events, {orphans} without their entry or event"),
    ("every record is a 201", |v| v("not_201") == 0.0, "{not_201} other"),
    ("no event parked", |v| v("parked") == 0.0, "{parked} parked"),
    ("every event reached the bound queue", |v| v("queued") >= v("events"),
        "{queued} messages for {events} events (more: redeliveries after a lost confirm)"),
    // Every 201 that said "created" is a row; the rows may exceed them by the requests wrk
    // abandoned in flight at the end of each slice (at most one per connection per slice).
    ("rows = fresh 201s (+ requests in flight at slice ends)",
        |v| (0.0..=v("connections") * v("slices")).contains(&(v("entries") - v("created"))),
        "{entries} entries, {created} fresh 201s"),
    ("no unexpected answer", |v| v("unexpected") == 0.0, "{unexpected}{example}"),
    ("no socket error", |v| v("socket_errors") == 0.0, "{socket_errors}"),
    ("no WARN or ERROR in the daemon's log under load", |v| v("log_problems") == 0.0, "{log_problems}{first}"),
    ("clean exit on SIGTERM", |v| v("exit_code") == 0.0 && v("shutdown_log_problems") == 0.0,
        "exit {exit_code} after {stop_ms} ms, {shutdown_log_problems} WARN/ERROR lines"),
];

fn check_table(checks: &[Check]) -> String {
    let mut out = String::from("| check | result | detail |\n|---|---|---|");
    for (name, passed, detail) in checks {
        let result = passed.map_or("n/a", |ok| if ok { "ok" } else { "FAILED" });
        out += &format!("\n| {name} | {result} | {} |", detail.replace('|', "/"));
    }
    out
}

/// The soak's report (bench/soak.md): `facts` for its `{name}`s, to which the slices' tables
/// and totals, the memory sentence and the checks' table are added.
fn render(
    facts: &mut HashMap<String, String>,
    rows: &[SliceRow],
    memory: String,
    checks: &[Check],
) -> String {
    let (table, summary, checks) = (slice_table(rows), summary_table(rows), check_table(checks));
    let (requests, created) = (total(rows, "requests"), total(rows, "created"));
    let names = "table summary checks memory requests created".split(' ');
    for (name, text) in names.zip([table, summary, checks, memory, requests, created]) {
        facts.insert(name.into(), text);
    }
    fill(TEMPLATE, |name| facts.get(name).cloned())
}

pub fn run(args: SoakArgs) -> Result<()> {
    if args.slices() < 1 {
        bail!("SOAK_MINUTES * 60 must be at least SOAK_SLICE_SECONDS");
    }
    if args.connections < THREADS {
        bail!("SOAK_CONNECTIONS must be at least {THREADS}");
    }
    if args.rate == 0 {
        bail!("SOAK_RATE must be positive");
    }
    harness::ensure_tools(&[("wrk", "wrk"), ("curl", "curl")])?;
    let port = args.port.map_or_else(harness::free_port, Ok)?;
    let mut s = Settings {
        runs: 1,
        port,
        config: args.config.clone(),
        ..Settings::default()
    };
    (s.duration, s.connections, s.wrk_threads) = (args.slice_seconds, args.connections, THREADS);
    let mut bench = Bench::new(s, args.daemon.clone(), &args.amqp)?;
    bench.soak = Some(args);
    if !bench.finish(soak(&bench))? {
        bail!("a check failed");
    }
    Ok(())
}

/// Runs the soak and writes its report; whether every check passed.
fn soak(bench: &Bench) -> Result<bool> {
    let a = bench.soak.as_ref().context("not a soak")?;
    let scene = scenarios::measure(bench, scenarios::list("soak")?[0], 1)?;
    let (load, mut facts) = (&scene.soak, HashMap::new());
    for (name, value) in scene.record.0.iter().filter(|figure| figure.1.is_some()) {
        facts.insert(
            name.clone(),
            value.as_ref().map_or("", |num| &num.text).to_owned(),
        );
    }
    let cut = |line: &str| line.chars().take(160).collect::<String>();
    let example = load
        .unexpected
        .first()
        .map(|line| format!("; e.g. {}", cut(line)));
    let problems = facts.get("log_problems").is_some_and(|n| n != "0");
    let first = scene.first_problem.as_deref().filter(|_| problems);
    let first = first.map(|line| format!("; first: {}", cut(line)));
    // The daemon's path, with the glibc malloc setting it inherits when one is set.
    let arenas = std::env::var("MALLOC_ARENA_MAX").map(|n| format!(", MALLOC_ARENA_MAX={n}"));
    let daemon = format!("{}{}", bench.daemon.display(), arenas.unwrap_or_default());
    let mut m = harness::machine(&bench.pg, &a.config, false);
    let vacuum = "; SOAK_VACUUM=1: `VACUUM` of the three tables after every slice";
    m.insert("vacuum", if a.vacuum { vacuum } else { "" }.into());
    let machine = "{cpu}, {nproc} cores, {mem} GiB, {kernel}; PostgreSQL {pg} (autovacuum {autovacuum}{vacuum}), RabbitMQ {rabbit}, wrk {wrk}";
    let interval = f64::from(THREADS) * 1000.0 / f64::from(a.rate);
    let total = |column| total(&load.rows, column);
    // What the run recorded, and what it did not: a daemon killed by a signal has no exit code.
    for (name, value) in [
        ("exit_code", "by signal".into()),
        ("hwm_mib", "?".into()),
        ("created", total("created")),
        ("unexpected", total("unexpected")),
        ("socket_errors", total("socket errors")),
        ("connections", a.connections.to_string()),
        ("slices", a.slices().to_string()),
        ("example", example.unwrap_or_default()),
        ("first", first.unwrap_or_default()),
        ("id", bench.run_id.clone()),
        (
            "written_at",
            chrono::Utc::now().format("%Y-%m-%d %H:%M UTC").to_string(),
        ),
        ("commit", m["commit"].clone()),
        ("daemon", daemon),
        ("config", a.config.clone()),
        ("slice_seconds", a.slice_seconds.to_string()),
        ("rate", a.rate.to_string()),
        ("threads", THREADS.to_string()),
        ("interval", format!("{interval:.2}")),
        ("machine", fill(machine, |name| m.get(name).cloned())),
    ] {
        facts.entry(name.into()).or_insert(value);
    }
    let value = |name: &str| {
        facts
            .get(name)
            .and_then(|v| v.parse().ok())
            .unwrap_or(f64::NAN)
    };
    let check = |(name, passed, detail): &(&str, Condition, &str)| {
        let detail = fill(detail, |name| facts.get(name).cloned());
        (name.to_string(), Some(passed(&value)), detail)
    };
    let mut checks: Vec<Check> = CHECKS.iter().map(check).collect();
    let load_s = f64::from(a.slices() * a.slice_seconds);
    let warmup_s = a.warmup_minutes.map_or(load_s / 2.0, |m| m * 60.0);
    let (memory_check, memory) = memory(&load.samples, warmup_s, a.rss_slope_limit);
    checks.push(memory_check);
    let report = render(&mut facts, &load.rows, memory, &checks);
    let stamp = chrono::Utc::now().format("%Y%m%d-%H%M%S");
    let output = format!("bench/results/soak-{stamp}.md");
    fs::write(&output, report)?;
    let printed = "\n{table}\n\nMemory: {memory}.\n\n{summary}\n\n{checks}\n";
    println!("{}", fill(printed, |name| facts.get(name).cloned()));
    say!("wrote {output}; raw output in {}", bench.work.display());
    Ok(!checks.iter().any(|check| check.1 == Some(false)))
}

/// The load, slice after slice, into the scene's `soak`; the samples also to rss.tsv and the
/// unexpected answers to unexpected.txt.
pub fn slices(scene: &mut Scene) -> Result<()> {
    let (bench, db) = (scene.bench, scene.db()?.to_owned());
    let a = bench.soak.as_ref().context("not a soak")?;
    fs::write(bench.work.join("keys.txt"), "")?;
    if bench.pg.query("postgres", "SHOW autovacuum")? != "on" && !a.vacuum {
        say!("note: autovacuum is off on this server: the outbox's dead rows (one per delivered event) pile up; SOAK_VACUUM=1 vacuums between slices");
    }
    let interval_us = u64::from(THREADS) * 1_000_000 / u64::from(a.rate);
    let pid = scene.daemon.as_ref().context("no daemon")?.pid;
    let (id, slices, seconds, rate) = (&bench.run_id, a.slices(), a.slice_seconds, a.rate);
    say!("soak {id}: {slices} slices of {seconds}s, {rate} requests/s offered over {} connections on a fixed-rate schedule ({interval_us} µs per wrk thread), daemon pid {pid}", a.connections);
    let started = Instant::now();
    for slice in 1..=slices {
        let (row, text) = one_slice(scene, slice, started, interval_us)?;
        if a.vacuum {
            let vacuum = "VACUUM outbox_events, idempotency_records, entries";
            bench.pg.query(&db, vacuum)?;
        }
        let unexpected = text
            .lines()
            .filter_map(|l| l.strip_prefix("SOAK_UNEXPECTED "));
        let unexpected = unexpected.map(|line| format!("slice {slice}: {line}"));
        scene.soak.unexpected.extend(unexpected);
        let figures = COLUMNS[..SHOWN].iter().zip(&row.2);
        let figures: Vec<_> = figures
            .map(|(c, value)| format!("{} {value:.*}", c.0, c.1))
            .collect();
        say!("slice {slice} ({}): {}", clock(row.1), figures.join(", "));
        scene.soak.rows.push(row);
    }
    let rss = scene
        .soak
        .samples
        .iter()
        .map(|(t, mib)| format!("{t:.1}\t{mib:.2}\n"));
    fs::write(bench.work.join("rss.tsv"), rss.collect::<String>())?;
    let unexpected = &scene.soak.unexpected;
    if !unexpected.is_empty() {
        fs::write(
            bench.work.join("unexpected.txt"),
            unexpected.join("\n") + "\n",
        )?;
    }
    Ok(())
}

/// One slice: wrk at the held rate while the daemon's VmRSS is sampled every second; its row,
/// and what wrk printed.
fn one_slice(
    scene: &mut Scene,
    slice: u32,
    started: Instant,
    interval_us: u64,
) -> Result<(SliceRow, String)> {
    let (bench, db) = (scene.bench, scene.db()?.to_owned());
    let state = bench.work.join("keys.txt");
    let (nonce, state) = (&bench.run_id, state.display());
    let env = format!(
        "SOAK_NONCE={nonce} SOAK_SLICE={slice} SOAK_STATE={state} SOAK_INTERVAL_US={interval_us}"
    );
    let line = scene.fill(&format!("{env} {{wrk}} -s scripts/soak.lua {{url}}/"));
    let out = bench.work.join(format!("slice-{slice}.txt"));
    let samples = &mut scene.soak.samples;
    let daemon = scene.daemon.as_mut().context("no daemon")?;
    let (t0, n0, m0) = (daemon.cpu_ticks()?, Instant::now(), MachineTicks::now()?);
    let (status, text) = harness::run_program(&line, &out, Duration::from_secs(1), || {
        let rss = daemon.status_mib("VmRSS");
        samples.extend(rss.ok().map(|mib| (started.elapsed().as_secs_f64(), mib)));
        Ok(())
    })?;
    let (t1, wall_s) = (daemon.cpu_ticks()?, n0.elapsed().as_secs_f64());
    let machine = MachineTicks::now()?.since(m0);
    if !status.success() {
        bail!("wrk failed ({status}); see {}", out.display());
    }
    let result = result_line(&text, "SOAK_RESULT");
    let result = result.with_context(|| format!("wrk printed no result; see {}", out.display()))?;
    if !daemon.alive() {
        bail!(
            "the daemon died during slice {slice}; see {}",
            daemon.log.display()
        );
    }
    let unsent = "SELECT count(*) FROM outbox_events WHERE sent_at IS NULL AND failed_at IS NULL";
    let unsent = bench.pg.count(&db, unsent)?.max(0) as f64;
    let figure = |key: &&str| field(&result, key).map_or(0.0, |n| n.value.max(0.0));
    let mut values = Vec::new();
    for (_, _, from) in COLUMNS {
        values.push(match from {
            From::Wrk(keys) => keys.iter().map(figure).sum(),
            From::Rss => daemon.status_mib("VmRSS")?,
            From::Cores => (t1 - t0) as f64 / harness::clock_ticks() / wall_s,
            From::Machine => machine.busy_share(true).unwrap_or(0.0),
            From::Unsent => unsent,
            From::Fds => daemon.open_fds() as f64,
        });
    }
    Ok((SliceRow(slice, started.elapsed().as_secs(), values), text))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(slice: u32, rss: f64) -> SliceRow {
        let figures =
            format!("999.6 1.333 5.24 31.04 23842 1258 1258 0 0 {rss} 0.371 63.4 0 34 20000 30000");
        let figures = figures.split(' ').map(|figure| figure.parse().unwrap());
        SliceRow(slice, u64::from(slice) * 30, figures.collect())
    }

    /// One sample a second for `seconds`, growing at `mib_per_h` with a small wobble.
    fn samples(seconds: u32, base: f64, mib_per_h: f64) -> Vec<(f64, f64)> {
        let wobble = |s: u32| if s.is_multiple_of(2) { 0.3 } else { -0.3 };
        let at = |s: u32| base + mib_per_h * f64::from(s) / 3600.0 + wobble(s);
        (0..seconds).map(|s| (f64::from(s), at(s))).collect()
    }

    #[test]
    fn the_report_renders_slices_memory_and_checks() {
        let table = slice_table(&[row(1, 33.44), row(2, 40.0)]);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines[0], "| slice | end | req/s | p50 ms | p99 ms | max ms | 2xx | 409 reused (conflicts sent) | unexpected | socket errors | RSS MiB | daemon CPU (cores) | machine CPU % | unsent events | fds |");
        assert_eq!(lines[1], format!("|{}", "---:|".repeat(15)));
        assert_eq!(lines[2], "| 1 | 0:30 | 1000 | 1.33 | 5.24 | 31.0 | 23842 | 1258 (1258) | 0 | 0 | 33.4 | 0.37 | 63 | 0 | 34 |");
        assert_eq!((lines.len(), clock(605).as_str()), (4, "10:05"));
        // min, max, first and last slice of each shown column.
        let summary = summary_table(&[row(1, 33.4), row(2, 97.0), row(3, 90.0)]);
        assert!(summary.contains("| RSS MiB | 33.4 | 97 | 33.4 | 90 |"));
        assert!(summary.contains("| p50 ms | 1.33 | 1.33 | 1.33 | 1.33 |"));
        assert_eq!(summary.lines().count(), 2 + 14);
        let check = |name: &str, passed, detail: &str| (name.to_owned(), passed, detail.to_owned());
        let checks = [
            check("no socket error", Some(true), "0"),
            check("RSS", None, "a | b"),
        ];
        let facts = "id=12021307abcd interval=2.00 hwm_mib=41.0".split(' ');
        let facts = facts.filter_map(|pair| pair.split_once('='));
        let mut facts = facts
            .map(|(name, value)| (name.into(), value.into()))
            .collect();
        let (_, memory) = memory(&samples(60, 40.0, 0.0), 30.0, 10.0);
        let text = render(&mut facts, &[row(1, 33.4), row(2, 40.0)], memory, &checks);
        assert!(text.starts_with("# Soak run 12021307abcd\n"));
        assert!(text.contains("every 2.00 ms of its own schedule"));
        let total = "Total: 60000 requests, 40000 fresh 201s, daemon peak RSS (VmHWM) 41.0 MiB.";
        assert!(text.contains(total));
        assert!(text.contains("Memory: VmRSS sampled every second while the load ran; no verdict"));
        assert!(text.contains("| no socket error | ok | 0 |\n| RSS | n/a | a / b |"));
    }

    #[test]
    fn memory_verdicts() {
        let slope = |detail: &str| detail.split(' ').next().unwrap().parse::<f64>().unwrap();
        // Steep growth during the warm-up (the cache fills), flat after it.
        let warm_up = (0..300).map(|s| (f64::from(s), 30.0 + f64::from(s) * 0.2));
        let flat = samples(600, 90.0, 0.0)
            .into_iter()
            .map(|(t, v)| (t + 300.0, v));
        let points: Vec<(f64, f64)> = warm_up.chain(flat).collect();
        let ((_, flat, detail), sentence) = memory(&points, 300.0, 10.0);
        assert_eq!(flat, Some(true));
        assert!(
            detail.ends_with(" MiB/h over 600 samples after 5.0 min"),
            "{detail}"
        );
        assert!(
            slope(&detail).abs() < 1.0 && sentence.contains("flat"),
            "{sentence}"
        );
        // Over the whole run, the warm-up would dominate.
        let ((_, flat, _), _) = memory(&points, 0.0, 10.0);
        assert_eq!(flat, Some(false));
        let ((_, flat, detail), sentence) = memory(&samples(1200, 90.0, 36.0), 600.0, 10.0);
        assert!((slope(&detail) - 36.0).abs() < 2.0, "{detail}");
        assert!(
            flat == Some(false) && sentence.contains("GROWING"),
            "{sentence}"
        );
        // Too few samples after the warm-up give no verdict.
        let ((_, flat, _), sentence) = memory(&samples(100, 90.0, 0.0), 60.0, 10.0);
        assert!(
            flat.is_none() && sentence.starts_with("no verdict"),
            "{sentence}"
        );
        let ((_, flat, _), _) = memory(&[], 0.0, 10.0);
        assert_eq!(flat, None);
    }

    #[test]
    fn end_checks_of_the_figures() {
        let figures = |text: &'static str| {
            move |name: &str| {
                let pair = |pair: &str| pair.strip_prefix(&format!("{name}="))?.parse().ok();
                text.split_whitespace().find_map(pair).unwrap_or(f64::NAN)
            }
        };
        let good = figures("unsent=0 records=5 entries=5 events=5 orphans=0 queued=6 created=3 connections=2 slices=1 exit_code=0 shutdown_log_problems=0");
        let passed: Vec<bool> = CHECKS.iter().map(|(_, passed, _)| passed(&good)).collect();
        assert_eq!(passed[..6], [true, true, false, false, true, true]);
        // Two rows more than fresh 201s, with one connection per slice to abandon, are too many;
        // a daemon killed by a signal has no exit code, and did not exit cleanly.
        let bad = figures("entries=5 created=3 connections=1 slices=1 shutdown_log_problems=0");
        assert!(!CHECKS[5].1(&bad) && !CHECKS[9].1(&bad));
    }
}
