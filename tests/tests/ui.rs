//! The browser view's component (`fn_ui.wasm`) on the test host: the page
//! and its files without a token (with the CSP and the right content
//! types, holding no token), the data routes with the API token or the
//! read token only, GET only.

use metal_ipam_tests::harness::{claim_json, pool_json, App, TOKEN};

const READ: &str = "ui-read-token-7c1e";

fn app() -> App {
    App::with_variables(&[("read_token", READ)])
}

fn header(r: &metal_ipam_tests::harness::Resp, name: &str) -> String {
    r.headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_string()
}

#[tokio::test]
async fn page_and_files_are_served_without_a_token() {
    let app = app();
    for (path, content_type, needle) in [
        ("/ui", "text/html; charset=utf-8", "<form id=\"login\">"),
        ("/ui/app.css", "text/css; charset=utf-8", ":focus-visible"),
        (
            "/ui/app.js",
            "text/javascript; charset=utf-8",
            "sessionStorage",
        ),
    ] {
        let r = app.call_with("GET", path, None, None).await;
        assert_eq!(r.status, 200, "{path}: {}", r.text());
        assert_eq!(header(&r, "content-type"), content_type, "{path}");
        assert_eq!(
            header(&r, "content-security-policy"),
            "default-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
            "{path}"
        );
        assert_eq!(header(&r, "x-content-type-options"), "nosniff", "{path}");
        assert_eq!(header(&r, "cache-control"), "no-store", "{path}");
        let text = r.text();
        assert!(text.contains(needle), "{path}");
        assert!(
            !text.contains(TOKEN) && !text.contains(READ),
            "{path} holds no token"
        );
        app.assert_kv_ops(&r, 0, "a file never touches the store");
        // With a token, the same file.
        let again = app.call("GET", path, None).await;
        assert_eq!(again.raw, r.raw, "{path}");
    }
    let r = app.call_with("GET", "/ui/secrets.txt", None, None).await;
    assert_eq!(r.status, 404);
    for m in ["POST", "PUT", "DELETE"] {
        for path in ["/ui", "/ui/app.js"] {
            let r = app.call_with(m, path, None, None).await;
            assert_eq!(r.status, 405, "{m} {path}");
        }
    }
}

#[tokio::test]
async fn data_routes_need_the_api_token_or_the_read_token() {
    let app = app();
    let put = app
        .call(
            "PUT",
            "/v1/pools/team-a/nodes",
            Some(&pool_json("team-a", "nodes", &["10.0.0.10-10.0.0.19"], 24)),
        )
        .await;
    assert!(put.status < 300, "{}", put.text());
    let c = app
        .call(
            "POST",
            "/v1/claims",
            Some(&claim_json("team-a", "cp-0", "u0", "nodes")),
        )
        .await;
    assert_eq!(c.status, 201, "{}", c.text());
    let routes = [
        "/ui/api/overview",
        "/ui/api/pools/team-a/nodes",
        "/ui/api/global-pools/none",
        "/ui/api/machines",
        "/ui/api/search?q=10.0.0.10",
    ];
    for path in routes {
        for auth in [
            None,
            Some("Bearer not-the-token".to_string()),
            Some(format!("Basic {READ}")),
        ] {
            let r = app.call_with("GET", path, None, auth.as_deref()).await;
            assert_eq!(r.status, 401, "{path} with {auth:?}");
            assert!(!r.text().contains("10.0.0"), "{path}: no data in a 401");
        }
        for token in [TOKEN, READ] {
            let r = app
                .call_with("GET", path, None, Some(&format!("Bearer {token}")))
                .await;
            let want = if path.contains("global-pools/none") {
                404
            } else {
                200
            };
            assert_eq!(r.status, want, "{path} with {token}: {}", r.text());
            assert_eq!(header(&r, "cache-control"), "no-store");
        }
        let r = app
            .call_with("POST", path, None, Some(&format!("Bearer {READ}")))
            .await;
        assert_eq!(r.status, 405, "POST {path}");
    }
    let auth = format!("Bearer {READ}");
    let o = app
        .call_with("GET", "/ui/api/overview", None, Some(&auth))
        .await;
    assert_eq!(o.body["pools"][0]["id"], "team-a/nodes");
    assert_eq!(o.body["pools"][0]["used"], 1);
    let p = app
        .call_with("GET", "/ui/api/pools/team-a/nodes", None, Some(&auth))
        .await;
    assert_eq!(p.body["addresses"][0]["claim"], "team-a/cp-0");
    let s = app
        .call_with("GET", "/ui/api/search?q=10.0.0.10", None, Some(&auth))
        .await;
    assert_eq!(s.body["results"][0]["claim"], "team-a/cp-0");
    for bad in [
        "/ui/api/search",
        "/ui/api/search?q=",
        &format!("/ui/api/search?q={}", "a".repeat(401)),
    ] {
        let r = app.call_with("GET", bad, None, Some(&auth)).await;
        assert_eq!(r.status, 422, "{bad}: {}", r.text());
    }
}

#[tokio::test]
async fn the_read_token_changes_nothing() {
    let app = app();
    let auth = format!("Bearer {READ}");
    let r = app
        .call_with(
            "PUT",
            "/v1/pools/team-a/nodes",
            Some(&pool_json("team-a", "nodes", &["10.0.0.10"], 24)),
            Some(&auth),
        )
        .await;
    assert_eq!(r.status, 401, "{}", r.text());
    let r = app
        .call_with(
            "POST",
            "/v1/claims",
            Some(&claim_json("team-a", "cp-0", "u0", "nodes")),
            Some(&auth),
        )
        .await;
    assert_eq!(r.status, 401, "{}", r.text());
}
