//! The pool whose cloud resources are provisioned, and how its resources
//! are known as its own: the identifying tag (the pool's uid, or its id),
//! the tags and customdata every created resource carries, and the check
//! that refuses to adopt another pool's resource. Used by the driver
//! ([`super::step`]) and the clouds' calls ([`super::vrf_cloud`],
//! [`super::vrf_metal`]).

use serde_json::{Map, Value};

use crate::error::{Error, ErrorKind, Result};
use crate::ipam::backing::Backing;
use crate::ipam::pnap::PnapSpec;
use crate::ipam::pool::PoolId;
use crate::ipam::vrf::MetalSpec;

/// The pool whose resources are provisioned.
#[derive(Debug, Clone)]
pub struct Target<'a> {
    /// The pool.
    pub id: &'a PoolId,
    /// What backs it (`spec.metal` or `spec.phoenixnap`).
    pub spec: Backing<'a>,
    /// The pool's uid, when it came from Kubernetes.
    pub uid: Option<String>,
    /// The pool's cluster (its `cluster.x-k8s.io/cluster-name` label).
    pub cluster: Option<String>,
}

impl<'a> Target<'a> {
    /// The target for pool `id` (uid and cluster when known).
    pub fn new(
        id: &'a PoolId,
        spec: impl Into<Backing<'a>>,
        uid: Option<&str>,
        cluster: Option<&str>,
    ) -> Target<'a> {
        Target {
            id,
            spec: spec.into(),
            uid: uid.map(str::to_string),
            cluster: cluster.map(str::to_string),
        }
    }

    /// The pool's `spec.metal`.
    ///
    /// # Errors
    /// 500 `WrongCloud` when the pool is backed by another cloud.
    pub fn metal(&self) -> Result<&'a MetalSpec> {
        self.spec
            .metal()
            .ok_or_else(|| self.wrong_cloud("Equinix Metal"))
    }

    /// The pool's `spec.phoenixnap`.
    ///
    /// # Errors
    /// 500 `WrongCloud` when the pool is backed by another cloud.
    pub fn pnap(&self) -> Result<&'a PnapSpec> {
        self.spec
            .pnap()
            .ok_or_else(|| self.wrong_cloud("phoenixNAP"))
    }

    fn wrong_cloud(&self, cloud: &str) -> Error {
        Error::new(
            ErrorKind::Internal,
            "WrongCloud",
            format!(
                "pool {} is backed by {} ({}), not by {cloud}",
                self.id.display(),
                self.spec.cloud(),
                self.spec.path()
            ),
        )
    }

    /// The same pool as incarnation `uid` (whose resources carry its tag):
    /// the target of an earlier incarnation's teardown.
    pub fn with_uid(&self, uid: Option<&str>) -> Target<'a> {
        Target {
            uid: uid.map(str::to_string),
            ..self.clone()
        }
    }

    /// The tag that identifies the pool's resources ([`tag_for`]).
    pub fn tag(&self) -> String {
        tag_for(self.id, self.uid.as_deref())
    }

    /// Every tag a created resource carries: the identifying one, the
    /// pool's kind, namespace and name for people, and its cluster.
    pub fn tags(&self) -> Vec<String> {
        let mut tags = vec![
            self.tag(),
            format!(
                "metal-ipam.dev/pool-name={}/{}",
                self.id.kind.kind_name(),
                self.id.display()
            ),
        ];
        if let Some(c) = &self.cluster {
            tags.push(format!("cluster.x-k8s.io/cluster-name={c}"));
        }
        tags
    }

    /// The customdata of a created reservation: the pool (kind, namespace,
    /// name, uid) and its cluster, under `metal-ipam.dev`.
    pub fn customdata(&self) -> Map<String, Value> {
        let mut pool = Map::new();
        pool.insert("kind".into(), self.id.kind.kind_name().into());
        if let Some(ns) = &self.id.namespace {
            pool.insert("namespace".into(), ns.clone().into());
        }
        pool.insert("name".into(), self.id.name.clone().into());
        if let Some(u) = &self.uid {
            pool.insert("uid".into(), u.clone().into());
        }
        let mut m = Map::new();
        m.insert("pool".into(), pool.into());
        if let Some(c) = &self.cluster {
            m.insert("cluster".into(), c.clone().into());
        }
        let mut out = Map::new();
        out.insert("metal-ipam.dev".into(), m.into());
        out
    }

    /// Whether `tags` say the resource was created for another pool (an
    /// identifying tag that is not ours): such a resource is never adopted.
    ///
    /// ```
    /// use metal_ipam_core::ipam::{pool::PoolId, vrf::MetalSpec};
    /// use metal_ipam_core::provision::target::Target;
    /// let (id, spec) = (PoolId::namespaced("a", "b"), MetalSpec::default());
    /// let t = Target::new(&id, &spec, Some("u-1"), None);
    /// assert!(!t.belongs_elsewhere(&["metal-ipam.dev/pool-uid=u-1".into(), "x".into()]));
    /// assert!(!t.belongs_elsewhere(&["team=blue".into()]));
    /// assert!(t.belongs_elsewhere(&["metal-ipam.dev/pool-uid=u-2".into()]));
    /// ```
    pub fn belongs_elsewhere(&self, tags: &[String]) -> bool {
        let ours = self.tag();
        tags.iter().any(|t| {
            (t.starts_with("metal-ipam.dev/pool-uid=") || t.starts_with("metal-ipam.dev/pool="))
                && *t != ours
        })
    }
}

/// The tag of the resources created for a pool: its uid when it came from
/// Kubernetes (a re-created pool of the same name gets new resources),
/// else its id.
///
/// ```
/// use metal_ipam_core::ipam::pool::PoolId;
/// use metal_ipam_core::provision::target::tag_for;
/// assert_eq!(tag_for(&PoolId::namespaced("a", "b"), Some("u-1")), "metal-ipam.dev/pool-uid=u-1");
/// assert_eq!(tag_for(&PoolId::namespaced("a", "b"), None), "metal-ipam.dev/pool=a/b");
/// ```
pub fn tag_for(id: &PoolId, uid: Option<&str>) -> String {
    match uid {
        Some(u) => format!("metal-ipam.dev/pool-uid={u}"),
        None => format!("metal-ipam.dev/pool={}", id.display()),
    }
}
