//! `/ui`: the read-only browser view (its page, files and data routes).
//!
//! All logic is in [`metal_ipam_core::observe`]. The page and its files
//! hold no data and no secret: they are answered here, before the shell's
//! token check ([`metal_ipam_spin::admit`] wants a token on every
//! request), by [`metal_ipam_core::http::components::ui_file`]; every
//! other request (the data routes under `/ui/api/`) goes through the
//! pipeline and is authenticated first.

use std::io::Write;
use std::time::Instant;

use metal_ipam_core::http::components::ui_file;
use metal_ipam_core::ports::kv::OpCounts;
use metal_ipam_spin::{render, RequestParts};
use spin_sdk::http::{Fields, IncomingRequest, OutgoingResponse, ResponseOutparam};
use spin_sdk::http_component;

/// The component's `wasi:http/incoming-handler` entry point.
#[http_component]
async fn handle(req: IncomingRequest, out: ResponseOutparam) {
    let started = Instant::now();
    let parts = RequestParts::from_incoming(&req);
    let api = parts.api_request(&[]);
    let Some(resp) = ui_file(&api) else {
        return metal_ipam_spin::serve_component(
            "ui",
            req,
            out,
            true,
            metal_ipam_core::http::components::ui,
        )
        .await;
    };
    let millis = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    let line = resp.log_line(
        "ui",
        &api,
        millis,
        started.elapsed().as_secs_f64() * 1000.0,
        OpCounts::default(),
    );
    let _ = writeln!(std::io::stdout().lock(), "{line}");
    let rendered = render(&resp);
    let headers: Vec<(String, Vec<u8>)> = rendered
        .headers()
        .map(|(n, v)| (n.to_string(), v.as_bytes().to_vec()))
        .collect();
    let fields = Fields::from_list(&headers).unwrap_or_else(|_| Fields::new());
    let outgoing = OutgoingResponse::new(fields);
    let _ = outgoing.set_status_code(*rendered.status());
    if let Err(e) = out.set_with_body(outgoing, rendered.into_body()).await {
        eprintln!("could not send the response: {e:?}");
    }
}
