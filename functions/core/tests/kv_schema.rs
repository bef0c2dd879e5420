//! Golden values in kv-schema/examples round-trip through the code's types,
//! and the key table in kv-schema/README.md names every key the code writes.

use std::path::PathBuf;

use metal_ipam_core::ipam::pool::PoolId;
use metal_ipam_core::ipam::store::{ClaimRecord, Next, PoolRecord};
use metal_ipam_core::kv::keys;
use serde_json::Value;

fn kv_schema_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../kv-schema")
}

fn examples(prefix: &str) -> Vec<(String, Value)> {
    let mut out: Vec<(String, Value)> = std::fs::read_dir(kv_schema_dir().join("examples"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with(prefix))
        .map(|p| {
            let v = serde_json::from_slice(&std::fs::read(&p).unwrap()).unwrap();
            (p.file_name().unwrap().to_string_lossy().into_owned(), v)
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    assert!(!out.is_empty(), "no {prefix}* examples");
    out
}

fn pool_id_of(rec: &PoolRecord) -> PoolId {
    let p = rec.pool.as_ref().unwrap();
    let name = p["metadata"]["name"].as_str().unwrap();
    match p["metadata"]["namespace"].as_str() {
        Some(ns) => PoolId::namespaced(ns, name),
        None => PoolId::global(name),
    }
}

#[test]
fn pool_record_examples_round_trip_and_rebuild_identically() {
    for (file, v) in examples("pool-") {
        let bytes = serde_json::to_vec(&v).unwrap();
        let rec = PoolRecord::decode(&bytes).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert_eq!(
            serde_json::to_value(&rec).unwrap(),
            v,
            "{file}: decode/encode changed it"
        );
        if rec.deleted {
            assert!(rec.pool.is_none());
            continue;
        }
        let id = pool_id_of(&rec);
        let loaded = rec
            .load(&id)
            .unwrap()
            .unwrap_or_else(|| panic!("{file}: not a pool"));
        // What the writer would produce from the loaded state is byte-for-byte
        // the golden value: the format is the code's, not hand-made.
        let next = Next {
            pool: Some((loaded.object.clone(), loaded.pool.clone())),
            state: loaded.state.clone(),
        };
        let mut rebuilt = PoolRecord::build(&next, rec.rev, rec.writer.clone(), rec.swap_check);
        rebuilt.recent_writers = rec.recent_writers.clone();
        assert_eq!(
            serde_json::to_value(&rebuilt).unwrap(),
            v,
            "{file}: rebuild differs"
        );
        // The cooling subset is inside used.
        for c in &loaded.state.cooling {
            assert!(
                loaded.state.used.contains(c.address),
                "{file}: cooling outside used"
            );
        }
    }
}

#[test]
fn claim_record_examples_round_trip_and_render() {
    for (file, v) in examples("claim") {
        let rec = ClaimRecord::decode(&serde_json::to_vec(&v).unwrap())
            .unwrap_or_else(|e| panic!("{file}: {e}"));
        assert_eq!(serde_json::to_value(&rec).unwrap(), v, "{file}");
        let ip = rec.to_ip_address("ns", "claim-name").unwrap();
        assert_eq!(ip["spec"]["address"], v["address"]);
        assert_eq!(ip["apiVersion"], v["apiVersion"]);
    }
}

#[test]
fn unknown_versions_and_fields_are_refused() {
    let (_, mut v) = examples("claim.json").remove(0);
    v["v"] = 2.into();
    assert_eq!(
        ClaimRecord::decode(&serde_json::to_vec(&v).unwrap())
            .unwrap_err()
            .status(),
        500
    );
    let (_, mut v) = examples("pool-namespaced").remove(0);
    v["surprise"] = true.into();
    assert!(PoolRecord::decode(&serde_json::to_vec(&v).unwrap()).is_err());
}

#[test]
fn readme_key_table_lists_every_key_the_code_writes() {
    let readme = std::fs::read_to_string(kv_schema_dir().join("README.md")).unwrap();
    let written = [
        keys::pool(&PoolId::namespaced("<namespace>", "<name>")),
        keys::pool(&PoolId::global("<name>")),
        keys::pool_init(&PoolId::namespaced("<namespace>", "<name>")),
        keys::pool_init(&PoolId::global("<name>")),
        keys::claim("<namespace>", "<name>"),
        keys::metal_pool(&PoolId::namespaced("<namespace>", "<name>")),
        keys::metal_pool(&PoolId::global("<name>")),
        keys::metal_claim("<namespace>", "<name>"),
        keys::metal_claim_init("<namespace>", "<name>"),
        keys::METAL_POLL.to_string(),
        keys::METAL_POLL_INIT.to_string(),
        "net/device/<uuid>".to_string(),
        "net-init/device/<uuid>".to_string(),
    ];
    for k in written {
        assert!(
            readme.contains(&format!("`{k}`")),
            "kv-schema/README.md does not document {k}"
        );
    }
}

/// A record written before intents (with a journal) still loads: the
/// journal is read and ignored, its addresses stay used, and the next
/// write leaves it out.
#[test]
fn a_record_with_a_journal_from_an_earlier_version_loads() {
    let old = serde_json::json!({
        "v": 1, "rev": 3, "writer": "0123456789abcdef", "swapCheck": "exact",
        "pool": {"apiVersion": "ipam.metal-ipam.dev/v1alpha1", "kind": "MetalIPPool",
                 "metadata": {"name": "p", "namespace": "ns"},
                 "spec": {"addresses": ["10.0.0.1-10.0.0.9"], "prefix": 24}},
        "used": ["10.0.0.1-10.0.0.2"], "cooling": [],
        "journal": [{"claim": "ns/a", "uid": "u", "address": "10.0.0.2", "at": 5}]
    });
    let rec = PoolRecord::decode(&serde_json::to_vec(&old).unwrap()).unwrap();
    assert_eq!(rec.journal.len(), 1);
    let l = rec
        .load(&PoolId::namespaced("ns", "p"))
        .unwrap()
        .expect("a pool");
    assert!(l.state.used.contains(0x0a00_0002));
    assert!(l.state.intents.is_empty());
    let encoded = serde_json::to_value(&rec).unwrap();
    assert!(encoded.get("journal").is_none(), "never written again");
}

#[test]
fn metal_progress_examples_round_trip_through_the_record() {
    use metal_ipam_core::kv::protocol::CasRecord;
    use metal_ipam_core::provision::record::ProgressRecord;
    for (file, v) in examples("metal-progress") {
        let rec = ProgressRecord::decode(&serde_json::to_vec(&v).unwrap())
            .unwrap_or_else(|e| panic!("{file}: {e}"));
        assert_eq!(serde_json::to_value(&rec).unwrap(), v, "{file}");
        // What the writer builds from the progress it holds is the golden
        // value: the format is the code's.
        let progress = rec.view(&PoolId::namespaced("ns", "p")).unwrap().unwrap();
        let rebuilt = ProgressRecord::build(&progress, rec.envelope());
        assert_eq!(
            serde_json::to_value(&rebuilt).unwrap(),
            v,
            "{file}: rebuild differs"
        );
    }
}

#[test]
fn metal_assignment_and_cursor_examples_round_trip_through_their_records() {
    use metal_ipam_core::kv::protocol::CasRecord;
    use metal_ipam_core::provision::assign::AssignmentRecord;
    use metal_ipam_core::provision::poll::CursorRecord;
    let id = ("ns".to_string(), "m".to_string());
    for (file, v) in examples("metal-assignment") {
        let rec = AssignmentRecord::decode(&serde_json::to_vec(&v).unwrap())
            .unwrap_or_else(|e| panic!("{file}: {e}"));
        assert_eq!(serde_json::to_value(&rec).unwrap(), v, "{file}");
        let state = rec.view(&id).unwrap().unwrap();
        let rebuilt = AssignmentRecord::build(&state, rec.envelope());
        assert_eq!(
            serde_json::to_value(&rebuilt).unwrap(),
            v,
            "{file}: rebuild differs"
        );
    }
    for (file, v) in examples("metal-poll") {
        let rec = CursorRecord::decode(&serde_json::to_vec(&v).unwrap())
            .unwrap_or_else(|e| panic!("{file}: {e}"));
        let rebuilt = CursorRecord::build(&rec.view(&()).unwrap().unwrap(), rec.envelope());
        assert_eq!(serde_json::to_value(&rebuilt).unwrap(), v, "{file}");
    }
}

#[test]
fn net_device_examples_round_trip_through_the_record() {
    use metal_ipam_core::kv::protocol::CasRecord;
    use metal_ipam_core::network::apply::ApplyRecord;
    for (file, v) in examples("net-device") {
        let rec = ApplyRecord::decode(&serde_json::to_vec(&v).unwrap())
            .unwrap_or_else(|e| panic!("{file}: {e}"));
        let state = rec.view("d").unwrap().unwrap();
        let rebuilt = ApplyRecord::build(&state, rec.envelope());
        assert_eq!(serde_json::to_value(&rebuilt).unwrap(), v, "{file}");
        assert_eq!(ApplyRecord::key("d"), "net/device/d");
    }
}
