//! Layer2 / Hybrid server networking on Equinix Metal (a machine's desired
//! per-port state, the plan that gets its device there through Metal's
//! port API), a phoenixNAP server's networks with its addresses, and the
//! node's OS configuration.
//!
//! - [`profile`]: the network profile (per port: bonded, layer2, VLANs with
//!   their addresses, native VLAN), its rules, each bond's derived mode.
//! - [`plan`]: the observed ports and the desired ones → the ordered Metal
//!   port calls, in Metal's safe order (pure).
//! - [`apply`]: the plan executed through Metal one step at a time, each
//!   polled to its end, resumable, one writer per device (a KV lease whose
//!   every write is fenced), the operator's release remembered.
//! - [`batch`]: the VLAN batch steps (attach, detach) the apply runs
//!   through their own components, and the port it runs them through.
//! - [`changes`]: a server's membership changes (types the apply's report
//!   and [`memberships`] share).
//! - [`memberships`]: the same on clouds whose servers join networks
//!   with chosen addresses (phoenixNAP): the memberships wanted, their
//!   plan, their apply under the same record and lease.
//! - [`node`]: the node's links from its profile (tagged or untagged as
//!   Metal delivers each VLAN) and addresses.
//! - [`render`]: the node's VLAN interfaces as netplan, ifupdown,
//!   cloud-init or shell (pure).
//! - [`network_data`]: the node's whole configuration as OpenStack
//!   `network_data.json` (ports, bonds, Metal's Layer3 addresses and the
//!   VLANs), from the profile and the device (pure).
//!
//! May import `ipam` (pool names), `kube::names`, `metal` (ports as Metal
//! reports them, the client for `apply`), `kv` (the apply record) and the
//! ports; never `http` or `capi`.

pub mod apply;
pub mod batch;
pub mod changes;
pub mod memberships;
pub mod network_data;
pub mod node;
pub mod plan;
pub mod profile;
pub mod render;
