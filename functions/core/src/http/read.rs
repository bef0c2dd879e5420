//! The read-only handlers: the Prometheus exposition and the browser
//! view (its page and files, answered without a credential, and its data).
//! Every answer but a 405 or 404 of the data routes carries the read-only
//! headers (nothing cached, sniffed, referred or framed).

use serde_json::Value;

use crate::error::{Error, Result};
use crate::http::api::{ApiRequest, ApiResponse};
use crate::http::services::Services;
use crate::http::{method_not_allowed, no_route};
use crate::observe::{metrics as exposition, ui, view};
use crate::ports::http::HttpClient;
use crate::ports::kv::KvStore;
use crate::routes::Route;

/// Headers of every answer of the read-only components: nothing cached,
/// nothing sniffed, no referrer, not framed.
fn read_only_headers(r: &mut ApiResponse) {
    r.headers.push(("cache-control", "no-store".to_string()));
    r.headers
        .push(("x-content-type-options", "nosniff".to_string()));
    r.headers
        .push(("referrer-policy", "no-referrer".to_string()));
    r.headers.push(("x-frame-options", "DENY".to_string()));
}

/// `GET /v1/metrics`: the Prometheus exposition (text format 0.0.4), with
/// the API token or the read token.
pub(crate) fn metrics<K: KvStore, H: HttpClient + ?Sized>(s: &Services<'_, K, H>) -> ApiResponse {
    let route = Route::Metrics.template();
    let mut r = match s.store().and_then(|ctx| exposition::scrape(ctx)) {
        Ok(text) => {
            let mut r = ApiResponse::success(200, None, route, "scraped");
            r.text = Some((exposition::CONTENT_TYPE, text));
            r
        }
        Err(e) => ApiResponse::from_error(&e, route),
    };
    read_only_headers(&mut r);
    r
}

/// The browser view's page and files (`/ui`, `/ui/{file}`: `route`),
/// answered without a token and without the store (they hold no data).
/// Non-GET → 405, an unknown file → 404, each with the page's headers.
pub(crate) fn ui_file(route: &Route, req: &ApiRequest<'_>) -> ApiResponse {
    let def = route.def();
    let mut r = if !def.allows(req.method) {
        method_not_allowed(def.template, def.methods)
    } else {
        let f = match route {
            Route::UiAsset { file } => ui::asset(file),
            _ => Some(ui::page()),
        };
        match f {
            Some((content_type, text)) => {
                let mut r = ApiResponse::success(200, None, def.template, "served");
                r.text = Some((content_type, text.to_string()));
                r
            }
            None => no_route(req.path),
        }
    };
    r.headers.push((
        "content-security-policy",
        ui::CONTENT_SECURITY_POLICY.to_string(),
    ));
    read_only_headers(&mut r);
    r
}

/// The browser view's data routes under `/ui/api/` (the API token or the
/// read token, sent by the page from `fetch`).
pub(crate) fn ui_data<K: KvStore, H: HttpClient + ?Sized>(
    s: &Services<'_, K, H>,
    req: &ApiRequest<'_>,
    route: &Route,
) -> ApiResponse {
    let template = route.template();
    let data = |v: Result<Option<Value>>, what: String| match v {
        Ok(Some(v)) => ApiResponse::success(200, Some(v), template, "read").touching("view", what),
        Ok(None) => ApiResponse::from_error(
            &Error::not_found("NotFound", format!("{what} is not in the store")),
            template,
        ),
        Err(e) => ApiResponse::from_error(&e, template),
    };
    let mut r = match s.store() {
        Err(e) => ApiResponse::from_error(&e, template),
        Ok(ctx) => match route {
            Route::UiOverview => data(view::overview(ctx).map(Some), "overview".into()),
            Route::UiPool(id) => data(view::pool(ctx, id), id.display()),
            Route::UiMachines => data(view::machines(ctx).map(Some), "machines".into()),
            Route::UiSearch => data(view::search(ctx, req.query).map(Some), "search".into()),
            _ => no_route(req.path),
        },
    };
    read_only_headers(&mut r);
    r
}
