//! A small HTTP/1 client for talking to host processes over loopback.

use std::time::Duration;

use anyhow::{Context, Result};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

use crate::harness::TOKEN;

/// A pooled keep-alive client.
#[derive(Clone)]
pub struct HttpClient {
    inner: Client<HttpConnector, Full<Bytes>>,
}

/// A decoded response.
#[derive(Debug, Clone)]
pub struct Reply {
    /// Status code.
    pub status: u16,
    /// JSON body (`Null` if none).
    pub body: Value,
    /// `x-kv-ops` from the test host.
    pub kv_ops: Option<u64>,
}

impl Default for HttpClient {
    fn default() -> Self {
        Self::new()
    }
}

impl HttpClient {
    /// A client with a 30 s idle pool.
    pub fn new() -> Self {
        let inner = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build_http();
        HttpClient { inner }
    }

    /// Sends `method url` with the test token and an optional JSON body.
    ///
    /// # Errors
    /// Connection failures.
    pub async fn call(&self, method: &str, url: &str, body: Option<&Value>) -> Result<Reply> {
        let bytes = body
            .map(|b| serde_json::to_vec(b).expect("json"))
            .unwrap_or_default();
        let req = http::Request::builder()
            .method(method)
            .uri(url)
            .header("authorization", format!("Bearer {TOKEN}"))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(bytes)))?;
        let resp = self
            .inner
            .request(req)
            .await
            .with_context(|| format!("{method} {url}"))?;
        let status = resp.status().as_u16();
        let kv_ops = resp
            .headers()
            .get("x-kv-ops")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok());
        let body = resp.into_body().collect().await?.to_bytes();
        Ok(Reply {
            status,
            body: serde_json::from_slice(&body).unwrap_or(Value::Null),
            kv_ops,
        })
    }
}
