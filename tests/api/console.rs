//! The console in a real browser: Debian's chromium, headless, driven over WebDriver
//! (chromedriver) by fantoccini. An admin logs in with the keyboard, sees the parked events a
//! test made (no queue bound, `outbox.max_attempts = 1`), binds a queue, retries the group from
//! the page, and watches the events arrive and the action appear in the log.

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use fantoccini::key::Key;
use fantoccini::{Client, ClientBuilder, Locator};

use crate::admin::{admin_address, park, parking_daemon, ADMIN_TOKEN};
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

#[actix_web::test]
async fn an_admin_retries_a_parked_group_from_the_console_in_a_browser() {
    let app = parking_daemon().await;
    park(&app, "browser", 3).await;
    let base = admin_address(&app).to_owned();
    let driver = ChromeDriver::start().await;
    let browser = driver.browser().await;

    // Not logged in: the login page. The token typed, Enter sends the form.
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
    let overview = page_at(&browser, "/console", "Delivery:").await;
    assert!(overview.contains("Delivery: needs attention"), "{overview}");
    assert!(overview.contains("3 parked event(s)"), "{overview}");
    assert!(overview.contains("NO_ROUTE"), "{overview}");

    // The group's events, with their errors and payloads.
    browser
        .find(Locator::LinkText("See the events"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let events = page_at(&browser, "/console/events", "browser-").await;
    assert!(
        events.contains("browser-0") && events.contains("browser-2"),
        "{events}"
    );

    // A queue is bound; the group is retried from the overview, after a confirmation.
    let mut consumer = TestConsumer::bind(&app.settings.amqp.exchange, "#").await;
    browser.goto(&format!("{base}/console")).await.unwrap();
    browser
        .find(Locator::LinkText("Retry this group…"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let confirm = page_at(&browser, "/console/confirm", "match").await;
    assert!(confirm.contains("3 event(s) match"), "{confirm}");
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
    assert_eq!(
        app.count("SELECT count(*) FROM outbox_events WHERE failed_at IS NOT NULL")
            .await,
        0
    );
    app.relay_until_empty().await;
    let delivered = consumer.drain(Duration::from_secs(2)).await;
    assert_eq!(delivered.len(), 3, "the retried events arrive in the queue");

    // The action in the log, with who and how many.
    browser
        .find(Locator::LinkText("The action log"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
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
