//! What a component has at hand for one request ([`Services`]): the
//! store, the Kubernetes and Metal clients, outbound HTTP and the tokens,
//! with the errors that say which one a component lacks. The dispatcher
//! builds it; the handlers read what they need of it.

use crate::error::{Error, ErrorKind, Result};
use crate::http::auth::Tokens;
use crate::kube::Kube;
use crate::kv::Ctx;
use crate::metal::client::Metal;
use crate::network::batch::Chained;
use crate::pnap::client::Pnap;
use crate::ports::http::HttpClient;
use crate::ports::kv::KvStore;
use crate::ports::Env;
use crate::provision::clouds::{BareMetal, Clouds};

/// What a component has at hand for one request.
pub struct Services<'a, K: KvStore, H: HttpClient + ?Sized> {
    /// The key-value store (`None` for components without one).
    pub ctx: Option<&'a Ctx<'a, K>>,
    /// The Kubernetes client (`None` when `k8s_token` is not configured).
    pub kube: Option<&'a Kube<'a, H>>,
    /// Outbound HTTP (service chaining).
    pub http: &'a H,
    /// The API token (every route; also sent on chained requests).
    pub api_token: &'a str,
    /// The events token (accepted on `/v1/events` only; empty = none).
    pub events_token: &'a str,
    /// The read token (accepted on the read-only routes, `metrics` and
    /// `ui`'s data; empty = none).
    pub read_token: &'a str,
    /// The Metal client (`None` when the component has no Metal token).
    pub metal: Option<&'a Metal<'a, H, dyn Env + 'a>>,
    /// The phoenixNAP client (`None` when the component has no phoenixNAP
    /// client credentials).
    pub pnap: Option<&'a PnapOf<'a, H>>,
}

/// The Metal client as the services hold it.
pub(crate) type MetalOf<'a, H> = Metal<'a, H, dyn Env + 'a>;

/// The phoenixNAP client as the services hold it.
pub type PnapOf<'a, H> = Pnap<'a, H, dyn Env + 'a>;

impl<'a, K: KvStore, H: HttpClient + ?Sized> Services<'a, K, H> {
    /// The services of a component with a store and nothing else (no
    /// Kubernetes, no Metal, no optional token): the plain API's, natively.
    pub fn store_only(ctx: &'a Ctx<'a, K>, http: &'a H, api_token: &'a str) -> Self {
        Services {
            ctx: Some(ctx),
            kube: None,
            http,
            api_token,
            events_token: "",
            read_token: "",
            metal: None,
            pnap: None,
        }
    }

    /// The tokens a request may present.
    pub fn tokens(&self) -> Tokens<'a> {
        Tokens {
            api: self.api_token,
            read: self.read_token,
            events: self.events_token,
        }
    }

    /// The store.
    ///
    /// # Errors
    /// 500 `StoreMisconfigured` for a component without one.
    pub(crate) fn store(&self) -> Result<&'a Ctx<'a, K>> {
        self.ctx.ok_or_else(|| {
            Error::new(
                ErrorKind::Internal,
                "StoreMisconfigured",
                "this component has no key-value store",
            )
        })
    }

    /// The Kubernetes client.
    ///
    /// # Errors
    /// 500 `KubeNotConfigured` without one.
    pub(crate) fn kube(&self) -> Result<&'a Kube<'a, H>> {
        self.kube.ok_or_else(|| {
            Error::new(
                ErrorKind::Internal,
                "KubeNotConfigured",
                "the Kubernetes API is not configured (variables k8s_api_url and k8s_token)",
            )
        })
    }

    /// The Metal client.
    ///
    /// # Errors
    /// 500 `MetalNotConfigured` without one.
    pub(crate) fn metal(&self) -> Result<&'a MetalOf<'a, H>> {
        self.metal.ok_or_else(|| {
            Error::new(
                ErrorKind::Internal,
                "MetalNotConfigured",
                "Equinix Metal is not configured (variables metal_token and metal_project_id)",
            )
        })
    }

    /// The clouds the component has credentials for: pools and claims are
    /// served by the cloud of their backing.
    pub(crate) fn clouds(&self) -> Clouds<'a>
    where
        H: 'a,
    {
        Clouds {
            metal: self.metal.map(|m| m as &dyn BareMetal),
            pnap: self.pnap.map(|p| p as &dyn BareMetal),
        }
    }

    /// The chained steps (VLAN batches, an event's steps), reached with
    /// the API token.
    pub(crate) fn chained(&self) -> Chained<'a, H> {
        Chained {
            http: self.http,
            api_token: self.api_token,
        }
    }
}
