//! The console in a real browser: Debian's chromium, headless, driven over WebDriver
//! (chromedriver) by fantoccini. An admin logs in with the keyboard, sees the parked events a
//! test made (no queue bound, `outbox.max_attempts = 1`), binds a queue, retries the group from
//! the page, and watches the events arrive and the action appear in the log. Then the overview
//! as a person sees it, at a desktop's and a phone's width: its charts, their words for screen
//! readers, each point's title, the axes' text size; and every page at both widths (1280 and
//! 390 px): none wider than the window, no table scrolling inside its box, lists one line a
//! row, an event's own page and its fields. Screenshots are kept under the target directory
//! (`target/console-screenshots/`).

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fantoccini::key::Key;
use fantoccini::{Client, ClientBuilder, Locator};

use crate::admin::{
    admin_address, admin_post, event_of, history_points, park, park_then_send,
    parked_head_and_held_event, parking_daemon, total, ADMIN_TOKEN,
};
use crate::common::consumer::TestConsumer;
use crate::common::daemon::free_port;
use crate::common::helpers::eventually;

/// chromedriver on a port of its own, in a process group of its own: the group (chromedriver
/// and the browsers it started) is killed with the test, also when the test fails before it
/// closed its browser.
struct ChromeDriver {
    child: Child,
    port: u16,
    profile: std::path::PathBuf,
}

impl ChromeDriver {
    async fn start() -> Self {
        let binary = ["/usr/bin/chromedriver", "/usr/lib/chromium/chromedriver"]
            .into_iter()
            .find(|path| std::path::Path::new(path).exists())
            .expect(
                "chromedriver is missing: install Debian's chromium and chromium-driver (.ci/run and scripts/setup do)",
            );
        let port = free_port();
        use std::os::unix::process::CommandExt;
        let child = Command::new(binary)
            .arg(format!("--port={port}"))
            .process_group(0)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("chromedriver starts");
        let profile =
            std::env::temp_dir().join(format!("retrysafe-chromium-{}", uuid::Uuid::new_v4()));
        let driver = Self {
            child,
            port,
            profile,
        };
        let http = awc::Client::default();
        eventually(Duration::from_secs(30), || async {
            http.get(format!("http://127.0.0.1:{port}/status"))
                .send()
                .await
                .map(drop)
                .map_err(|error| format!("chromedriver did not answer: {error}"))
        })
        .await;
        driver
    }

    async fn browser(&self) -> Client {
        let mut capabilities = serde_json::Map::new();
        capabilities.insert(
            "goog:chromeOptions".into(),
            serde_json::json!({
                "binary": "/usr/bin/chromium",
                "args": [
                    "--headless=new",
                    "--no-sandbox",
                    "--disable-gpu",
                    "--disable-background-networking",
                    "--disable-component-update",
                    "--no-first-run",
                    "--disable-dev-shm-usage",
                    format!("--user-data-dir={}", self.profile.display()),
                ],
            }),
        );
        ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
            .capabilities(capabilities)
            .connect(&format!("http://127.0.0.1:{}", self.port))
            .await
            .expect("a browser session")
    }
}

impl Drop for ChromeDriver {
    fn drop(&mut self) {
        // The group's id is chromedriver's pid.
        let group = self.child.id() as libc::pid_t;
        // SAFETY: kill(2) with a negative pid signals that process group; no memory is involved.
        unsafe {
            libc::kill(-group, libc::SIGKILL);
        }
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

/// The text of the page at `path` once it shows `needle`: a click or a key that sends a form
/// can return before the browser has loaded the next page, so the old page may still be there.
/// Fails after 30 s, saying where the browser is and what it shows.
async fn page_at(browser: &Client, path: &str, needle: &str) -> String {
    eventually(Duration::from_secs(30), || async {
        let url = browser
            .current_url()
            .await
            .map_err(|error| error.to_string())?;
        // The body may belong to a page being replaced: read again rather than fail.
        let text = match browser.find(Locator::Css("body")).await {
            Ok(body) => body.text().await.unwrap_or_default(),
            Err(_) => String::new(),
        };
        if url.path() == path && text.contains(needle) {
            Ok(text)
        } else {
            Err(format!(
                "no {path} showing {needle:?}: at {url}, showing\n{text}"
            ))
        }
    })
    .await
}

/// Clicks the link whose text is `text`.
async fn follow(browser: &Client, text: &str) {
    browser
        .find(Locator::LinkText(text))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
}

/// Logs in as an admin with the keyboard: the console at `base` sends a browser without a
/// session to the login page, where the token typed and Enter send the form. The text of the
/// overview it then shows.
async fn log_in(browser: &Client, base: &str) -> String {
    browser.goto(&format!("{base}/console")).await.unwrap();
    assert_eq!(
        browser.current_url().await.unwrap().path(),
        "/console/login"
    );
    let token = browser.find(Locator::Id("token")).await.unwrap();
    token
        .send_keys(&format!("{ADMIN_TOKEN}{}", char::from(Key::Enter)))
        .await
        .unwrap();
    page_at(browser, "/console", "Delivery:").await
}

#[actix_web::test]
async fn an_admin_retries_a_parked_group_from_the_console_in_a_browser() {
    let app = parking_daemon().await;
    park(&app, "browser", 3).await;
    let base = admin_address(&app).to_owned();
    let driver = ChromeDriver::start().await;
    let browser = driver.browser().await;

    let overview = log_in(&browser, &base).await;
    assert!(overview.contains("Delivery: needs attention"), "{overview}");
    assert!(overview.contains("3 parked event(s)"), "{overview}");
    assert!(overview.contains("NO_ROUTE"), "{overview}");

    // The group's events, with their errors and payloads.
    follow(&browser, "See the events").await;
    let events = page_at(&browser, "/console/events", "browser-").await;
    assert!(
        events.contains("browser-0") && events.contains("browser-2"),
        "{events}"
    );
    assert!(
        events.contains("3 parked event(s) match these filters."),
        "{events}"
    );
    // Every action is above the list: the selection's, and every matching event's.
    let actions_top = number(
        &browser,
        "return document.querySelector('.actions').getBoundingClientRect().bottom;",
    )
    .await;
    let list_top = number(
        &browser,
        "return document.querySelector('table.list').getBoundingClientRect().top;",
    )
    .await;
    assert!(actions_top <= list_top, "{actions_top} > {list_top}");
    let actions = browser
        .find(Locator::Css(".actions"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for action in [
        "Retry the selected…",
        "Skip the selected…",
        "Retry all 3 matching…",
        "Skip all 3 matching…",
    ] {
        assert!(actions.contains(action), "{action}: {actions}");
    }

    // A queue is bound; the group is retried from the overview, after a confirmation.
    let mut consumer = TestConsumer::bind(&app.settings.amqp.exchange, "#").await;
    browser.goto(&format!("{base}/console")).await.unwrap();
    follow(&browser, "Retry this group…").await;
    let confirm = page_at(&browser, "/console/confirm", "match").await;
    assert!(confirm.contains("3 event(s) match"), "{confirm}");
    at_both_widths(&browser, "the group's confirmation", "confirm-group").await;
    assert_eq!(
        app.count("SELECT count(*) FROM outbox_events WHERE failed_at IS NOT NULL")
            .await,
        3,
        "nothing is retried before the confirmation"
    );
    browser
        .find(Locator::XPath("//button[contains(., 'Retry 3 event(s)')]"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let done = page_at(&browser, "/console/act", "Retry:").await;
    assert!(done.contains("Retry: 3 of 3 event(s)"), "{done}");
    at_both_widths(&browser, "the outcome", "done").await;
    assert_eq!(
        app.count("SELECT count(*) FROM outbox_events WHERE failed_at IS NOT NULL")
            .await,
        0
    );
    app.relay_until_empty().await;
    let delivered = consumer.drain(Duration::from_secs(2)).await;
    assert_eq!(delivered.len(), 3, "the retried events arrive in the queue");

    // The action in the log, with who and how many.
    follow(&browser, "The action log").await;
    let log = page_at(&browser, "/console/actions", "retry").await;
    assert!(log.contains("ops") && log.contains("retry"), "{log}");
    assert!(log.contains("NO_ROUTE"), "the selector is shown: {log}");

    // The key lookup answers for any client.
    browser
        .goto(&format!(
            "{base}/console/keys?client=anonymous&key=browser-1"
        ))
        .await
        .unwrap();
    let key = page_at(&browser, "/console/keys", "entry.created").await;
    assert!(
        key.contains("entry.created") && key.contains("sent"),
        "{key}"
    );
    browser.close().await.unwrap();
}

/// Where the screenshots go: `console-screenshots/` in the target directory (beside the
/// `tmp/` that cargo gives integration tests), not in the source tree.
fn screenshot_directory() -> std::path::PathBuf {
    let directory = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .parent()
        .expect("CARGO_TARGET_TMPDIR is in the target directory")
        .join("console-screenshots");
    std::fs::create_dir_all(&directory).expect("the screenshot directory can be made");
    directory
}

/// Saves a screenshot of what the browser shows as `name`.png.
async fn screenshot(browser: &Client, name: &str) {
    let png = browser.screenshot().await.expect("a screenshot");
    assert!(png.starts_with(b"\x89PNG"), "a PNG image");
    std::fs::write(screenshot_directory().join(format!("{name}.png")), png)
        .expect("the screenshot is written");
}

/// The page's width and the window's: `(scrollWidth, clientWidth)` of the document.
async fn widths(browser: &Client) -> (u64, u64) {
    let answer = browser
        .execute(
            "return [document.documentElement.scrollWidth, document.documentElement.clientWidth];",
            Vec::new(),
        )
        .await
        .expect("the widths are read");
    (
        answer[0].as_u64().expect("a width"),
        answer[1].as_u64().expect("a width"),
    )
}

/// The browser's window at `width` pixels, tall enough that a screenshot holds the page; the
/// page must not scroll sideways, nor any table inside its box (every column in sight).
async fn at_width(browser: &Client, width: u32, page: &str) {
    browser.set_window_size(width, 2400).await.unwrap();
    let (scroll, client) = widths(browser).await;
    assert!(
        client <= u64::from(width) && client + 40 >= u64::from(width),
        "the window is {width} px wide: the page has {client} px"
    );
    assert!(
        scroll <= client,
        "{page} at {width} px scrolls sideways: {scroll} px of content in {client} px"
    );
    let hidden = browser
        .execute(
            "return Array.from(document.querySelectorAll('.scroll'))
                 .filter(box => box.scrollWidth > box.clientWidth)
                 .map(box => (box.querySelector('caption') || box).textContent.slice(0, 60)
                             + ': ' + box.scrollWidth + ' px in ' + box.clientWidth);",
            Vec::new(),
        )
        .await
        .unwrap();
    assert_eq!(
        hidden,
        serde_json::json!([]),
        "{page} at {width} px: tables that scroll inside their box"
    );
}

/// The page at a phone's width and a desktop's: it fits at both ([`at_width`]), and a
/// screenshot of each is kept (`<name>-390.png`, `<name>-1280.png`). Ends at the desktop's.
async fn at_both_widths(browser: &Client, page: &str, name: &str) {
    for width in [390, 1280] {
        at_width(browser, width, page).await;
        screenshot(browser, &format!("{name}-{width}")).await;
    }
}

/// The value of a script that returns a number.
async fn number(browser: &Client, script: &str) -> f64 {
    browser
        .execute(script, Vec::new())
        .await
        .unwrap()
        .as_f64()
        .unwrap_or_else(|| panic!("a number from {script}"))
}

/// The heights of the rows of the page's lists, in pixels.
async fn list_row_heights(browser: &Client) -> Vec<f64> {
    let heights = browser
        .execute(
            "return Array.from(document.querySelectorAll('table.list tbody tr'))
                 .map(row => row.getBoundingClientRect().height);",
            Vec::new(),
        )
        .await
        .unwrap();
    heights
        .as_array()
        .unwrap()
        .iter()
        .map(|height| height.as_f64().unwrap())
        .collect()
}

/// Every row of the page's lists is one line (at most 36 px: a page of 50 is 1,800 px, about
/// two screens), and there is at least one.
async fn rows_are_one_line(browser: &Client, page: &str) {
    let heights = list_row_heights(browser).await;
    assert!(!heights.is_empty(), "{page} lists no row");
    assert!(
        heights.iter().all(|height| *height <= 36.0),
        "{page}: rows of more than one line: {heights:?}"
    );
}

/// The texts of a table's row headers and cells, as (header, cell) pairs: an event's fields.
async fn fields(browser: &Client) -> Vec<(String, String)> {
    let mut found = Vec::new();
    for row in browser
        .find_all(Locator::Css("table.fields tr"))
        .await
        .unwrap()
    {
        let header = row
            .find(Locator::Css("th"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        let cell = row
            .find(Locator::Css("td"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        found.push((header, cell));
    }
    found
}

/// The cell of the field `name`.
fn field<'a>(fields: &'a [(String, String)], name: &str) -> &'a str {
    fields
        .iter()
        .find(|(header, _)| header == name)
        .map(|(_, cell)| cell.as_str())
        .unwrap_or_else(|| panic!("no field {name:?}: {fields:?}"))
}

/// The charts of the page: each one's id, its count of data points, its title and
/// description, and the marks it draws.
async fn charts(browser: &Client) -> Vec<(String, u64, String, String, usize)> {
    let mut found = Vec::new();
    for svg in browser
        .find_all(Locator::Css("figure.chart > svg"))
        .await
        .unwrap()
    {
        let id = svg.attr("id").await.unwrap().unwrap_or_default();
        assert_eq!(svg.attr("role").await.unwrap().as_deref(), Some("img"));
        let labelled_by = svg
            .attr("aria-labelledby")
            .await
            .unwrap()
            .unwrap_or_default();
        assert_eq!(labelled_by, format!("{id}-title {id}-desc"));
        let points = svg
            .attr("data-points")
            .await
            .unwrap()
            .and_then(|points| points.parse().ok())
            .unwrap_or(0);
        let text_of = async |tag: &str| {
            let element = svg.find(Locator::Css(tag)).await.unwrap();
            element
                .prop("textContent")
                .await
                .unwrap()
                .unwrap_or_default()
        };
        let (title, description) = (text_of("title").await, text_of("desc").await);
        let marks = svg
            .find_all(Locator::Css("polyline.line"))
            .await
            .unwrap()
            .len();
        found.push((id, points, title, description, marks));
    }
    found
}

#[actix_web::test]
async fn the_overview_draws_its_trends_and_reads_without_sideways_scrolling_on_a_desktop_and_a_phone(
) {
    let app = parking_daemon().await;
    // Parked events (no queue bound), with a long error each; then sent ones.
    park_then_send(&app, "trend", 4, 6).await;
    // The samples that counted them, as the API gives them.
    history_points(&app, |points| {
        let (sent, parked) = (total(points, "sent"), total(points, "newly_parked"));
        if sent == 6 && parked == 4 && points.len() >= 3 {
            Ok(())
        } else {
            Err(format!(
                "{} point(s), sent {sent}, parked {parked}",
                points.len()
            ))
        }
    })
    .await;

    let base = admin_address(&app).to_owned();
    let driver = ChromeDriver::start().await;
    let browser = driver.browser().await;
    let overview = log_in(&browser, &base).await;
    // The verdict comes first, before the charts.
    assert!(overview.contains("4 parked event(s)."), "{overview}");
    let verdict_at = overview.find("Delivery: needs attention: ");
    let trends_at = overview.find("Trends over the last");
    assert!(
        verdict_at.is_some() && trends_at.is_some() && verdict_at < trends_at,
        "{overview}"
    );
    assert!(
        browser
            .find_all(Locator::Css("meta[http-equiv='refresh']"))
            .await
            .unwrap()
            .is_empty(),
        "the overview does not reload itself unless asked"
    );

    // Four charts, each with points and its words for screen readers.
    let drawn = charts(&browser).await;
    assert_eq!(drawn.len(), 4, "{drawn:?}");
    for (id, points, title, description, marks) in &drawn {
        assert!(*points >= 2, "{id} has {points} point(s)");
        assert!(*marks >= 1, "{id} draws its points");
        // The window fits what the daemon has: it started seconds ago.
        assert!(
            title.contains("(since this daemon started)"),
            "{id}: {title:?}"
        );
        assert!(
            description.contains("samples from") && description.contains("now"),
            "{id}: {description:?}"
        );
    }
    let words_of = |chart: &str| {
        drawn
            .iter()
            .find(|(id, ..)| id == chart)
            .map(|(.., description, _)| description.clone())
            .unwrap_or_else(|| panic!("no chart {chart}: {drawn:?}"))
    };
    let parked_words = words_of("chart-parked");
    assert!(
        parked_words.contains("now 4 parked event(s)"),
        "{parked_words:?}"
    );
    let rate_words = words_of("chart-sent-rate");
    assert!(
        !rate_words.contains("most 0."),
        "events were sent: {rate_words:?}"
    );

    // Each point's time and value on hover: its SVG title, the newest last.
    let titles = browser
        .find_all(Locator::Css("#chart-parked rect.point title"))
        .await
        .unwrap();
    assert!(!titles.is_empty(), "the parked chart's points have titles");
    let newest = titles
        .last()
        .unwrap()
        .prop("textContent")
        .await
        .unwrap()
        .unwrap_or_default();
    let (time, value) = newest.split_once(" UTC: ").unwrap_or_default();
    assert!(
        time.len() == 8 && time.as_bytes()[2] == b':' && value == "4 parked event(s)",
        "{newest:?}"
    );
    // The axes: the value's unit at the top, round times of the clock below.
    let value_axis = browser
        .find(Locator::Css("#chart-parked text.axis.value"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(value_axis, "5 event(s)");
    let times = browser
        .find_all(Locator::Css("#chart-parked text.axis.time"))
        .await
        .unwrap();
    assert!(!times.is_empty(), "the time axis is labelled");

    at_both_widths(&browser, "the overview", "overview").await;
    // The axes' text keeps its size at a phone's width (the charts stretch, their text does not).
    let smallest_label =
        "return Math.min(...Array.from(document.querySelectorAll('figure.chart text.axis'))
        .map(text => parseFloat(getComputedStyle(text).fontSize) * text.getScreenCTM().a));";
    for width in [390, 1280] {
        at_width(&browser, width, "the overview").await;
        let smallest = number(&browser, smallest_label).await;
        assert!(
            smallest >= 11.0,
            "at {width} px the axes' text is {smallest} px"
        );
    }
    at_width(&browser, 390, "the overview").await;

    // Times say how long ago, the exact time on hover.
    let parked_time = browser.find(Locator::Css("td time")).await.unwrap();
    let exact = parked_time.attr("title").await.unwrap().unwrap_or_default();
    assert!(exact.ends_with('Z') && exact.starts_with("20"), "{exact}");
    let words = parked_time.text().await.unwrap();
    assert!(words.ends_with("ago") || words == "just now", "{words}");

    // The day's range, and a refresh on request: a meta refresh of the page's own address.
    follow(&browser, "day").await;
    page_at(&browser, "/console", "Reload this page").await;
    follow(&browser, "every 30 s").await;
    page_at(&browser, "/console", "Reload this page").await;
    // The day's charts draw the samples the daemon has from its first minutes.
    let day = charts(&browser).await;
    assert!(
        day.iter()
            .all(|(id, points, ..)| id.contains("rate") || *points >= 2),
        "{day:?}"
    );
    let refresh = browser
        .find(Locator::Css("meta[http-equiv='refresh']"))
        .await
        .unwrap();
    assert_eq!(
        refresh.attr("content").await.unwrap().as_deref(),
        Some("30")
    );
    assert_eq!(
        browser.current_url().await.unwrap().query(),
        Some("range=day&refresh=30")
    );

    // The events page at both widths: long errors folded, states in words.
    browser
        .goto(&format!("{base}/console/events?state=parked"))
        .await
        .unwrap();
    let events = page_at(&browser, "/console/events", "trend-parked-").await;
    assert!(events.contains("parked"), "{events}");
    let folded = browser
        .find_all(Locator::Css("td details.error summary"))
        .await
        .unwrap();
    assert_eq!(folded.len(), 4, "each long error is folded: {events}");
    at_both_widths(&browser, "the events page", "events").await;
    rows_are_one_line(&browser, "the events page").await;
    browser.close().await.unwrap();
}

#[actix_web::test]
async fn every_page_reads_on_a_desktop_and_a_phone_and_an_event_has_a_page_of_its_own() {
    let app = parking_daemon().await;
    park(&app, "wide", 3).await;
    let (head, held) = parked_head_and_held_event(&app, "order").await;
    // An action for the log: one parked event skipped by its id.
    let skipped = event_of(&app, "wide-2").await;
    let skip = admin_post(
        &app,
        "/admin/v1/events/skip",
        Some("skip-wide-2"),
        serde_json::json!({"event_ids": [skipped]}).to_string(),
    )
    .await;
    assert_eq!(skip.status, 200, "{}", skip.describe());

    let base = admin_address(&app).to_owned();
    let driver = ChromeDriver::start().await;
    let browser = driver.browser().await;
    browser
        .goto(&format!("{base}/console/login"))
        .await
        .unwrap();
    page_at(&browser, "/console/login", "token").await;
    at_both_widths(&browser, "the login page", "login").await;
    log_in(&browser, &base).await;
    let go = async |path: &str, needle: &str| {
        browser.goto(&format!("{base}{path}")).await.unwrap();
        page_at(&browser, path.split('?').next().unwrap(), needle).await
    };

    // The parked list, one line a row; the unsent one says what its event waits behind.
    let parked = go("/console/events?state=parked", "match these filters").await;
    assert!(parked.contains("3 parked event(s) match"), "{parked}");
    at_both_widths(&browser, "the parked events", "events-parked").await;
    rows_are_one_line(&browser, "the parked events").await;
    let unsent = go("/console/events?state=unsent", "match these filters").await;
    let short = |id: uuid::Uuid| format!("…{}", &id.to_string()[28..]);
    assert!(
        unsent.contains(&format!("held behind {} (parked)", short(head))),
        "{unsent}"
    );
    at_both_widths(&browser, "the unsent events", "events-unsent").await;
    rows_are_one_line(&browser, "the unsent events").await;

    // The held event's page, reached from the list by its short id.
    follow(&browser, &short(held)).await;
    let page = page_at(&browser, &format!("/console/events/{held}"), "Payload").await;
    assert!(page.contains("Held: it waits for"), "{page}");
    assert!(page.contains("which is parked"), "{page}");
    let held_fields = fields(&browser).await;
    assert_eq!(field(&held_fields, "Event id"), held.to_string());
    assert_eq!(field(&held_fields, "Type"), "entry.created");
    assert_eq!(field(&held_fields, "Client / key"), "anonymous / order-2");
    assert_eq!(field(&held_fields, "Ordering key"), "order #2");
    assert_eq!(
        field(&held_fields, "Waits for"),
        format!("{} (parked)", short(head))
    );
    assert_eq!(field(&held_fields, "Attempts"), "0 failed");
    assert_eq!(field(&held_fields, "First error"), "none");
    assert_eq!(
        field(&held_fields, "Next attempt"),
        "when the earlier events of its ordering key are sent or skipped"
    );
    let payload = browser
        .find(Locator::Css("pre.payload"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(payload.contains("\"n\": 2"), "pretty-printed: {payload}");
    for link in ["Retry this event…", "Skip this event…"] {
        browser.find(Locator::LinkText(link)).await.unwrap();
    }
    at_both_widths(&browser, "a held event's page", "event-held").await;

    // The parked head's page: its errors with their times, its replay.
    follow(&browser, "The parked event it waits for").await;
    page_at(&browser, &format!("/console/events/{head}"), "Payload").await;
    let head_fields = fields(&browser).await;
    assert!(
        field(&head_fields, "State").starts_with("parked"),
        "{head_fields:?}"
    );
    assert_eq!(field(&head_fields, "Attempts"), "1 failed");
    for name in ["First error", "Last error"] {
        let error = field(&head_fields, name);
        assert!(
            (error.contains(" ago: ") || error.starts_with("just now: "))
                && error.contains("NO_ROUTE")
                && error.ends_with("for routing key \"entry.created\")"),
            "{name}, whole, with its time: {error}"
        );
    }
    assert_eq!(field(&head_fields, "Replays"), "1");
    let replays = browser
        .find(Locator::XPath("//table[caption[contains(., 'replays')]]"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        replays.contains("queue:audit") && replays.contains("alice@ops"),
        "{replays}"
    );
    at_both_widths(&browser, "a parked event's page", "event-parked").await;

    // The key lookup, empty and found: times as how long ago, events by their pages.
    go("/console/keys", "Look up").await;
    at_both_widths(&browser, "the key lookup", "keys-empty").await;
    let key = go("/console/keys?client=anonymous&key=order-2", "Its events").await;
    assert!(
        !key.split_whitespace()
            .any(|word| word.len() > 19 && word.contains('T') && word.ends_with('Z')),
        "no raw RFC 3339 time: {key}"
    );
    assert!(key.contains(&short(held)), "{key}");
    let record_times = browser
        .find_all(Locator::Css("table.fields time[title$='Z']"))
        .await
        .unwrap();
    assert_eq!(record_times.len(), 2, "created and expires");
    at_both_widths(&browser, "a key", "keys").await;

    // The action log writes the selector as the filter it is.
    let log = go("/console/actions", "Every admin action").await;
    assert!(
        log.contains(&format!("event(s) {}", short(skipped))),
        "{log}"
    );
    assert!(!log.contains("{\""), "no JSON: {log}");
    at_both_widths(&browser, "the action log", "actions").await;

    // The confirmation of a retry of a parked group, and the overview.
    let group = "/console/confirm?action=retry&type=entry.created";
    let confirm = go(group, "match").await;
    assert!(
        confirm.contains("parked events of type entry.created"),
        "{confirm}"
    );
    at_both_widths(&browser, "a confirmation", "confirm").await;
    let overview = go("/console", "Delivery:").await;
    assert!(
        overview.contains("Unsent and parked events by type"),
        "{overview}"
    );
    at_both_widths(&browser, "the overview", "overview-blocked").await;
    let refused = go("/console/events/not-an-id", "Something went wrong").await;
    assert!(refused.contains("is not an event id"), "{refused}");
    at_both_widths(&browser, "an error page", "error").await;
    browser.close().await.unwrap();
}
