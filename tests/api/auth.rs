//! Bearer tokens and client scoping.

use crate::common::daemon::spawn_app_with;
use crate::common::helpers::{client, entry_body};

#[actix_web::test]
async fn missing_or_wrong_credentials_are_refused_and_write_nothing() {
    let app =
        spawn_app_with(|settings| settings.auth.clients = vec![client("billing", "s3cret-token")])
            .await;
    let body = entry_body(1);

    app.post_entry_as(None, "auth-1", &body)
        .await
        .assert_problem(401, "unauthorized");
    app.post_entry_as(Some("wrong-token"), "auth-1", &body)
        .await
        .assert_problem(401, "unauthorized");
    app.post_entry_as(Some(""), "auth-1", &body)
        .await
        .assert_problem(401, "unauthorized");
    let basic = app
        .send(
            app.post_request("auth-1")
                .insert_header(("Authorization", "Basic czNjcmV0LXRva2Vu")),
            body.to_string(),
        )
        .await;
    basic.assert_problem(401, "unauthorized");
    assert_eq!(basic.header("www-authenticate").as_deref(), Some("Bearer"));
    app.get("/v1/idempotency-keys/auth-1", None)
        .await
        .assert_problem(401, "unauthorized");
    app.get(
        &format!("/v1/entries/{}", uuid::Uuid::now_v7()),
        Some("wrong"),
    )
    .await
    .assert_problem(401, "unauthorized");
    // Two Authorization headers: a proxy in front may read one, the daemon the other.
    for second in ["Bearer s3cret-token", "Bearer wrong-token"] {
        app.send(
            app.post_request("auth-1")
                .append_header(("Authorization", "Bearer s3cret-token"))
                .append_header(("Authorization", second)),
            body.to_string(),
        )
        .await
        .assert_problem(401, "unauthorized");
    }
    assert_eq!(app.row_counts().await, (0, 0, 0));

    let created = app
        .post_entry_as(Some("s3cret-token"), "auth-1", &body)
        .await;
    created.assert_created();
    // Health probes need no credentials.
    assert_eq!(app.get("/healthz", None).await.status, 200);
}

#[actix_web::test]
async fn a_client_sees_only_its_own_entries_and_keys() {
    let app = spawn_app_with(|settings| {
        settings.auth.clients = vec![client("billing", "token-a"), client("shipping", "token-b")];
    })
    .await;
    let created = app
        .post_entry_as(Some("token-a"), "private-1", &entry_body(1))
        .await;
    created.assert_created();
    let id = created.json()["id"].as_str().unwrap().to_owned();

    assert_eq!(
        app.get(&format!("/v1/entries/{id}"), Some("token-a"))
            .await
            .status,
        200
    );
    assert_eq!(
        app.get("/v1/idempotency-keys/private-1", Some("token-a"))
            .await
            .status,
        200
    );

    app.get(&format!("/v1/entries/{id}"), Some("token-b"))
        .await
        .assert_problem(404, "not-found");
    app.get("/v1/idempotency-keys/private-1", Some("token-b"))
        .await
        .assert_problem(404, "not-found");
    assert_eq!(app.row_counts().await, (1, 1, 1));
}

#[test]
fn anonymous_access_is_refused_off_loopback() {
    let mut settings = crate::common::helpers::test_settings();
    settings.http.listen = "0.0.0.0:0".parse().unwrap();
    let error = settings.validate().unwrap_err().to_string();
    assert!(error.contains("auth.clients"), "{error}");
    settings.auth.clients = vec![client("billing", "t")];
    settings.validate().unwrap();
}
