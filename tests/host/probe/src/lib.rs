//! A test-only Spin component exercising what `metal-ipam-host` provides.
//! Every answer is JSON. Routes (any prefix; the last path segment selects):
//!
//! - `.../headers`: the request headers as a JSON object.
//! - `.../echo`: the request as the component sees it: method, uri, path,
//!   query, headers and body.
//! - `.../var?name=N`: `variables::get(N)`.
//! - `.../http?url=U`: outbound request to `U`; `{"status", "body"}` or
//!   `{"err"}`. Optional: `method=M` (default GET), `body=B`,
//!   `header=NAME:VALUE` (repeatable), and `do=OP` key-value ops (as for
//!   `kv`, below) run before the request, their results under `"kv"`.
//! - `.../fanout?url=U&url=U...`: GETs all the URLs concurrently; an array
//!   of `{"status", "body"}` / `{"err"}` in URL order.
//! - `.../kv?do=OP&do=OP...`: key-value operations run in order, results
//!   as a JSON array. Ops (`:` separates arguments, the last one may
//!   contain `:`):
//!   - `open:spin:LABEL` / `open:wasi:LABEL`: open a store; later ops use
//!     the last store opened with that API (spin ops: `get set delete
//!     exists keys`; everything else uses the wasi bucket);
//!   - `get:K`, `set:K:V`, `delete:K`, `exists:K`, `keys` (spin API);
//!   - `wget:K`, `wset:K:V`, `wdelete:K`, `wexists:K`, `wlist`,
//!     `wlistc:CURSOR` (wasi store API);
//!   - `incr:K:DELTA`;
//!   - `cas:K:V` (new, current, swap), `blindcas:K:V` (new, swap without
//!     current), `casrace:K:INTRUDER:V` (new, current, a plain set of K to
//!     INTRUDER, swap, which must fail, then swap V on the fresh handle);
//!   - `getmany:K1,K2`, `setmany:K1=V1,K2=V2`, `delmany:K1,K2`.
//!
//!   Each result is `{"op": OP, "ok": VALUE}` or `{"op": OP, "err": TEXT}`.

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;

use serde_json::{json, Value};
use spin_sdk::http::{IntoResponse, Method, Request, Response};
use spin_sdk::http_component;
use spin_sdk::key_value::Store;
use spin_sdk::wit::wasi::keyvalue::{atomics, batch, store as wstore};

fn query_params(query: &str) -> Vec<(String, String)> {
    query
        .split('&')
        .filter(|s| !s.is_empty())
        .map(|kv| match kv.split_once('=') {
            Some((k, v)) => (decode(k), decode(v)),
            None => (decode(kv), String::new()),
        })
        .collect()
}

fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok();
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(b) => {
                        out.push(b);
                        i += 2;
                    }
                    None => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn bytes_json(v: &[u8]) -> Value {
    match std::str::from_utf8(v) {
        Ok(s) => json!({ "utf8": s, "len": v.len() }),
        Err(_) => {
            json!({ "hex": v.iter().map(|b| format!("{b:02x}")).collect::<String>(), "len": v.len() })
        }
    }
}

fn opt_bytes_json(v: Option<Vec<u8>>) -> Value {
    v.map(|v| bytes_json(&v)).unwrap_or(Value::Null)
}

fn wasi_err(e: wstore::Error) -> String {
    match e {
        wstore::Error::NoSuchStore => "no-such-store".to_string(),
        wstore::Error::AccessDenied => "access-denied".to_string(),
        wstore::Error::Other(m) => format!("other: {m}"),
    }
}

fn spin_err(e: spin_sdk::key_value::Error) -> String {
    use spin_sdk::key_value::Error as E;
    match e {
        E::StoreTableFull => "store-table-full".to_string(),
        E::NoSuchStore => "no-such-store".to_string(),
        E::AccessDenied => "access-denied".to_string(),
        E::Other(m) => format!("other: {m}"),
    }
}

#[derive(Default)]
struct Stores {
    spin: Option<Store>,
    wasi: Option<wstore::Bucket>,
}

fn run_op(op: &str, stores: &mut Stores) -> Result<Value, String> {
    let mut parts = op.splitn(2, ':');
    let name = parts.next().unwrap_or_default();
    let args = parts.next().unwrap_or_default();
    let two = |a: &str| -> (String, String) {
        match a.split_once(':') {
            Some((x, y)) => (x.to_string(), y.to_string()),
            None => (a.to_string(), String::new()),
        }
    };
    let spin = |s: &Stores| {
        s.spin
            .as_ref()
            .ok_or_else(|| "no spin store open".to_string())
            .map(|_| ())
    };
    let wasi = |s: &Stores| {
        s.wasi
            .as_ref()
            .ok_or_else(|| "no wasi bucket open".to_string())
            .map(|_| ())
    };
    match name {
        "open" => {
            let (api, label) = two(args);
            match api.as_str() {
                "spin" => {
                    stores.spin = Some(Store::open(&label).map_err(spin_err)?);
                }
                "wasi" => {
                    stores.wasi = Some(wstore::open(&label).map_err(wasi_err)?);
                }
                other => return Err(format!("unknown api {other}")),
            }
            Ok(Value::Bool(true))
        }
        "get" | "set" | "delete" | "exists" | "keys" => {
            spin(stores)?;
            let s = stores.spin.as_ref().ok_or("unreachable")?;
            match name {
                "get" => Ok(opt_bytes_json(s.get(args).map_err(spin_err)?)),
                "set" => {
                    let (k, v) = two(args);
                    s.set(&k, v.as_bytes()).map_err(spin_err)?;
                    Ok(Value::Bool(true))
                }
                "delete" => {
                    s.delete(args).map_err(spin_err)?;
                    Ok(Value::Bool(true))
                }
                "exists" => Ok(Value::Bool(s.exists(args).map_err(spin_err)?)),
                _ => {
                    let mut keys = s.get_keys().map_err(spin_err)?;
                    keys.sort();
                    Ok(json!(keys))
                }
            }
        }
        _ => {
            wasi(stores)?;
            let b = stores.wasi.as_ref().ok_or("unreachable")?;
            match name {
                "wget" => Ok(opt_bytes_json(b.get(args).map_err(wasi_err)?)),
                "wset" => {
                    let (k, v) = two(args);
                    b.set(&k, v.as_bytes()).map_err(wasi_err)?;
                    Ok(Value::Bool(true))
                }
                "wdelete" => {
                    b.delete(args).map_err(wasi_err)?;
                    Ok(Value::Bool(true))
                }
                "wexists" => Ok(Value::Bool(b.exists(args).map_err(wasi_err)?)),
                "wlist" | "wlistc" => {
                    let cursor = (name == "wlistc").then_some(args);
                    let resp = b.list_keys(cursor).map_err(wasi_err)?;
                    let mut keys = resp.keys;
                    keys.sort();
                    Ok(json!({ "keys": keys, "cursor": resp.cursor }))
                }
                "incr" => {
                    let (k, d) = two(args);
                    let delta: i64 = d.parse().map_err(|e| format!("bad delta: {e}"))?;
                    Ok(json!(atomics::increment(b, &k, delta).map_err(wasi_err)?))
                }
                "cas" | "blindcas" => {
                    let (k, v) = two(args);
                    let cas = atomics::Cas::new(b, &k).map_err(wasi_err)?;
                    let seen = if name == "cas" {
                        opt_bytes_json(cas.current().map_err(wasi_err)?)
                    } else {
                        Value::Null
                    };
                    match atomics::swap(cas, v.as_bytes()) {
                        Ok(()) => Ok(json!({ "swapped": true, "seen": seen })),
                        Err(atomics::CasError::CasFailed(_)) => {
                            Ok(json!({ "swapped": false, "seen": seen }))
                        }
                        Err(atomics::CasError::StoreError(e)) => Err(wasi_err(e)),
                    }
                }
                "casrace" => {
                    let (k, rest) = two(args);
                    let (intruder, v) = two(&rest);
                    let cas = atomics::Cas::new(b, &k).map_err(wasi_err)?;
                    let seen = opt_bytes_json(cas.current().map_err(wasi_err)?);
                    b.set(&k, intruder.as_bytes()).map_err(wasi_err)?;
                    match atomics::swap(cas, v.as_bytes()) {
                        Ok(()) => Ok(json!({ "first_swap": "succeeded", "seen": seen })),
                        Err(atomics::CasError::StoreError(e)) => Err(wasi_err(e)),
                        Err(atomics::CasError::CasFailed(fresh)) => {
                            let fresh_seen = opt_bytes_json(fresh.current().map_err(wasi_err)?);
                            let retry = match atomics::swap(fresh, v.as_bytes()) {
                                Ok(()) => "succeeded".to_string(),
                                Err(atomics::CasError::CasFailed(_)) => "cas-failed".to_string(),
                                Err(atomics::CasError::StoreError(e)) => wasi_err(e),
                            };
                            Ok(
                                json!({ "first_swap": "cas-failed", "seen": seen, "fresh_seen": fresh_seen, "retry": retry }),
                            )
                        }
                    }
                }
                "getmany" => {
                    let keys: Vec<String> = args
                        .split(',')
                        .filter(|k| !k.is_empty())
                        .map(String::from)
                        .collect();
                    let mut got = batch::get_many(b, &keys).map_err(wasi_err)?;
                    got.sort_by(|a, b| a.0.cmp(&b.0));
                    Ok(Value::Array(
                        got.into_iter()
                            .map(|(k, v)| json!([k, opt_bytes_json(v)]))
                            .collect(),
                    ))
                }
                "setmany" => {
                    let kvs: Vec<(String, Vec<u8>)> = args
                        .split(',')
                        .filter_map(|kv| kv.split_once('='))
                        .map(|(k, v)| (k.to_string(), v.as_bytes().to_vec()))
                        .collect();
                    batch::set_many(b, &kvs).map_err(wasi_err)?;
                    Ok(Value::Bool(true))
                }
                "delmany" => {
                    let keys: Vec<String> = args
                        .split(',')
                        .filter(|k| !k.is_empty())
                        .map(String::from)
                        .collect();
                    batch::delete_many(b, &keys).map_err(wasi_err)?;
                    Ok(Value::Bool(true))
                }
                other => Err(format!("unknown op {other}")),
            }
        }
    }
}

fn method(name: &str) -> Method {
    match name.to_ascii_uppercase().as_str() {
        "GET" => Method::Get,
        "POST" => Method::Post,
        "PUT" => Method::Put,
        "DELETE" => Method::Delete,
        "PATCH" => Method::Patch,
        "HEAD" => Method::Head,
        "OPTIONS" => Method::Options,
        other => Method::Other(other.to_string()),
    }
}

async fn send(req: Request) -> Value {
    let result: Result<Response, _> = spin_sdk::http::send(req).await;
    match result {
        Ok(resp) => {
            json!({ "status": resp.status(), "body": String::from_utf8_lossy(resp.body()) })
        }
        Err(e) => json!({ "err": format!("{e:?}") }),
    }
}

/// Polls all the futures until every one is ready (a minimal `join_all`).
async fn join_all<F: Future>(futures: Vec<F>) -> Vec<F::Output> {
    let mut futures: Vec<Pin<Box<F>>> = futures.into_iter().map(Box::pin).collect();
    let mut done: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (f, slot) in futures.iter_mut().zip(done.iter_mut()) {
            if slot.is_some() {
                continue;
            }
            match f.as_mut().poll(cx) {
                Poll::Ready(v) => *slot = Some(v),
                Poll::Pending => pending = true,
            }
        }
        if pending {
            Poll::Pending
        } else {
            Poll::Ready(())
        }
    })
    .await;
    done.into_iter().flatten().collect()
}

fn run_ops(params: &[(String, String)]) -> Vec<Value> {
    let mut stores = Stores::default();
    let mut results = Vec::new();
    for (k, op) in params {
        if k != "do" {
            continue;
        }
        results.push(match run_op(op, &mut stores) {
            Ok(v) => json!({ "op": op, "ok": v }),
            Err(e) => json!({ "op": op, "err": e }),
        });
    }
    results
}

fn json_response(status: u16, v: Value) -> Response {
    Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(v.to_string())
        .build()
}

#[http_component]
async fn handle(req: Request) -> impl IntoResponse {
    let path = req.path().to_string();
    let params = query_params(req.query());
    let param = |n: &str| params.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
    let last = path.rsplit('/').next().unwrap_or_default().to_string();
    println!("{}", json!({ "probe": last, "path": path }));
    match last.as_str() {
        "headers" => {
            let mut map = serde_json::Map::new();
            for (name, value) in req.headers() {
                map.insert(
                    name.to_string(),
                    json!(value.as_str().unwrap_or("<non-utf8>")),
                );
            }
            json_response(200, Value::Object(map))
        }
        "var" => {
            let name = param("name").unwrap_or_default();
            let v = match spin_sdk::variables::get(&name) {
                Ok(v) => json!({ "ok": v }),
                Err(e) => json!({ "err": format!("{e:?}") }),
            };
            json_response(200, v)
        }
        "echo" => {
            let mut headers = serde_json::Map::new();
            for (name, value) in req.headers() {
                headers.insert(
                    name.to_string(),
                    json!(value.as_str().unwrap_or("<non-utf8>")),
                );
            }
            json_response(
                200,
                json!({
                    "method": req.method().to_string(),
                    "uri": req.uri(),
                    "path": req.path(),
                    "query": req.query(),
                    "headers": headers,
                    "body": String::from_utf8_lossy(req.body()),
                }),
            )
        }
        "http" => {
            let kv = run_ops(&params);
            let url = param("url").unwrap_or_default();
            let mut builder = Request::builder();
            builder
                .method(method(&param("method").unwrap_or_else(|| "GET".into())))
                .uri(url);
            for (k, v) in &params {
                if k == "header" {
                    let (name, value) = v.split_once(':').unwrap_or((v, ""));
                    builder.header(name, value);
                }
            }
            if let Some(body) = param("body") {
                builder.body(body.into_bytes());
            }
            let mut v = send(builder.build()).await;
            if !kv.is_empty() {
                v["kv"] = Value::Array(kv);
            }
            json_response(200, v)
        }
        "fanout" => {
            let sends: Vec<_> = params
                .iter()
                .filter(|(k, _)| k == "url")
                .map(|(_, u)| send(Request::get(u.clone()).build()))
                .collect();
            json_response(200, Value::Array(join_all(sends).await))
        }
        "kv" => json_response(200, Value::Array(run_ops(&params))),
        other => json_response(404, json!({ "err": format!("unknown probe {other}") })),
    }
}
