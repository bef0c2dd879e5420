//! The bench's baseline: a deliberately **naive, racy** allocator behind
//! `POST /v1/claims` (see `tests/bench/naive/spin.toml`). It is wrong on
//! purpose and never deployed.
//!
//! It does what an allocator does when it ignores concurrency: `get` the
//! pool record, take the lowest free address, `set` the record back, `set`
//! the claim's binding — three key-value operations, no compare-and-swap,
//! no intents, no read-back, no check for an existing binding. Two requests
//! that overlap hand out the same address. Everything else is shared with
//! the real `allocate` component so that the bench compares protocols and
//! nothing else: the same glue (auth, bounded body, log line), the same
//! claim parser, the same pool record (JSON, ranges) and the same binding
//! and `IPAddress` answer.

use metal_ipam_core::http::api::{ApiRequest, ApiResponse};
use metal_ipam_core::http::dispatch::{Admitted, Services};
use metal_ipam_core::ip::from_u128;
use metal_ipam_core::ipam::alloc::AllocRequest;
use metal_ipam_core::ipam::claim::Claim;
use metal_ipam_core::ipam::store::{ClaimRecord, Next, PoolRecord};
use metal_ipam_core::kv::keys;
use metal_ipam_core::ports::http::HttpClient;
use metal_ipam_core::ports::kv::KvStore;
use metal_ipam_core::routes::Component;
use metal_ipam_core::{Error, Result};
use spin_sdk::http::{IncomingRequest, ResponseOutparam};
use spin_sdk::http_component;

const ROUTE: &str = "/v1/claims";

/// The component's entry point: authenticated as `allocate`'s
/// `POST /v1/claims` is (the API token), logged and counted as `naive`.
#[http_component]
async fn handle(req: IncomingRequest, out: ResponseOutparam) {
    let serving = metal_ipam_spin::Serving {
        component: Component::Allocate,
        name: "naive",
        handler: naive,
        public: None,
    };
    metal_ipam_spin::serve(&serving, req, out).await
}

/// Parse, then [`allocate`]; errors map as in the real component.
fn naive<K: KvStore, H: HttpClient + ?Sized>(
    s: &Services<'_, K, H>,
    req: &ApiRequest<'_>,
    _: Admitted,
) -> ApiResponse {
    match allocate(s, req) {
        Ok(r) => r,
        Err(e) => ApiResponse::from_error(&e, ROUTE),
    }
}

fn allocate<K: KvStore, H: HttpClient + ?Sized>(
    s: &Services<'_, K, H>,
    req: &ApiRequest<'_>,
) -> Result<ApiResponse> {
    let ctx = s
        .ctx
        .ok_or_else(|| Error::internal("the naive component has no store"))?;
    let body = serde_json::from_slice(req.body).map_err(|e| Error::malformed(e.to_string()))?;
    let claim = Claim::parse(&body)?;
    let key = keys::pool(&claim.pool);
    let bytes = ctx
        .kv
        .get(&key)
        .map_err(|e| Error::internal(e.to_string()))?
        .ok_or_else(|| Error::internal("no such pool"))?;
    let rec = PoolRecord::decode(&bytes)?;
    let loaded = rec
        .load(&claim.pool)?
        .ok_or_else(|| Error::internal("the pool was deleted"))?;
    let (object, pool, mut state) = (loaded.object, loaded.pool, loaded.state);
    let claim_name = claim.id.display();
    let ask = AllocRequest {
        claim: &claim_name,
        claim_name: &claim.id.name,
        uid: &claim.id.uid,
        requested: None,
    };
    let address = state
        .allocate(&pool, &ask, ctx.env.now())
        .map_err(|e| e.into_error(&pool, &claim.pool.display()))?;
    let token = ctx.env.token();
    let binding = ClaimRecord::new(&claim, from_u128(pool.family, address), &pool, None, &token);
    let next = Next {
        pool: Some((object, pool)),
        state,
    };
    let mut out = PoolRecord::build(&next, rec.rev + 1, token, rec.swap_check);
    out.recent_writers = rec.writers_after();
    let store = |k: &str, v: &[u8]| ctx.kv.set(k, v).map_err(|e| Error::internal(e.to_string()));
    store(&key, &out.encode())?;
    store(
        &keys::claim(&claim.id.namespace, &claim.id.name),
        &binding.encode(),
    )?;
    let ip = binding
        .to_ip_address(&claim.id.namespace, &claim.id.name)?
        .to_json();
    Ok(ApiResponse::success(201, Some(ip), ROUTE, "allocated"))
}
