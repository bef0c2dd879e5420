//! phoenixNAP's four vendored specifications, each loaded once per process
//! with the shared loader ([`crate::metal_sim::spec::Spec::load`]), and
//! which of them a request path belongs to.

use std::sync::OnceLock;

use serde_json::Value;

use crate::metal_sim::spec::{Spec, SpecOptions};

const BMC: &str = include_str!("../../fixtures/phoenixnap-openapi/bmcapi.spec.yaml");
const NETWORKS: &str = include_str!("../../fixtures/phoenixnap-openapi/networkapi.spec.yaml");
const IPS: &str = include_str!("../../fixtures/phoenixnap-openapi/ipapi.spec.yaml");
const AUDIT: &str = include_str!("../../fixtures/phoenixnap-openapi/auditapi.spec.yaml");

/// The token endpoint's path (on the simulator's one server).
pub const TOKEN_PATH: &str = "/auth/realms/BMC/protocol/openid-connect/token";

/// One of the four APIs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Api {
    /// Bare Metal Cloud API: servers and their network configuration.
    Bmc,
    /// Networks API: private and public networks.
    Networks,
    /// IP Addresses API: IP blocks.
    Ips,
    /// Audit Log API: events.
    Audit,
}

/// Every API, in the order of [`Api`].
pub const APIS: [Api; 4] = [Api::Bmc, Api::Networks, Api::Ips, Api::Audit];

/// An edit of a parsed spec (see [`SpecOptions::relax`]).
type Relax = fn(&mut Value);

/// `Server.privateIpAddresses` has `minItems: 1`, which a server on no
/// private network cannot meet: the simulator's answers drop that bound
/// (the only edit; listed in the module docs).
fn relax_bmc(doc: &mut Value) {
    if let Some(Value::Object(p)) =
        doc.pointer_mut("/components/schemas/Server/properties/privateIpAddresses")
    {
        p.remove("minItems");
    }
}

impl Api {
    /// The base path its operations live under, e.g. `/bmc/v1`.
    pub fn base_path(self) -> &'static str {
        match self {
            Api::Bmc => "/bmc/v1",
            Api::Networks => "/networks/v1",
            Api::Ips => "/ips/v1",
            Api::Audit => "/audit/v1",
        }
    }

    /// The API a path belongs to and the path relative to its base
    /// (`/servers/x`), if it is under one of the four bases.
    pub fn of_path(path: &str) -> Option<(Api, &str)> {
        APIS.into_iter().find_map(|api| {
            path.strip_prefix(api.base_path())
                .filter(|rest| rest.starts_with('/'))
                .map(|rest| (api, rest))
        })
    }

    /// Its loaded specification (parsed on first use).
    pub(crate) fn spec(self) -> &'static Spec {
        static SPECS: [OnceLock<Spec>; 4] = [
            OnceLock::new(),
            OnceLock::new(),
            OnceLock::new(),
            OnceLock::new(),
        ];
        let (i, text, name, relax): (usize, &str, &'static str, Option<Relax>) = match self {
            Api::Bmc => (0, BMC, "phoenixNAP BMC", Some(relax_bmc)),
            Api::Networks => (1, NETWORKS, "phoenixNAP Networks", None),
            Api::Ips => (2, IPS, "phoenixNAP IP Addresses", None),
            Api::Audit => (3, AUDIT, "phoenixNAP Audit Log", None),
        };
        SPECS[i].get_or_init(|| {
            Spec::load(
                text,
                &SpecOptions {
                    name,
                    nested_href: false,
                    relax,
                },
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metal_sim::spec::Lookup;

    #[test]
    fn paths_find_their_api_and_operation() {
        let (api, rel) = Api::of_path(
            "/bmc/v1/servers/abc/network-configuration/private-network-configuration/private-networks",
        )
        .unwrap();
        assert_eq!(api, Api::Bmc);
        let Lookup::Found(op, params) = api.spec().lookup("POST", rel) else {
            panic!("no match")
        };
        assert_eq!(op.id, "serversServerIdPrivateNetworksPost");
        assert_eq!(params["serverId"], "abc");
        assert!(Api::of_path("/bmc/v2/servers").is_none());
        assert!(Api::of_path("/ips/v1").is_none());
    }

    #[test]
    fn every_emulated_operation_is_in_its_spec() {
        for (api, id) in super::super::state::EMULATED {
            assert!(api.spec().operation(id).is_some(), "{api:?} {id}");
        }
    }
}
