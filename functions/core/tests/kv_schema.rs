//! Golden values in kv-schema/examples round-trip through the code's types,
//! and the key table in kv-schema/README.md names every key the code writes.

use std::path::PathBuf;

use metal_ipam_core::ipam::pool::{PoolId, PoolObject};
use metal_ipam_core::ipam::store::{ClaimRecord, Next, PoolRecord};
use metal_ipam_core::kv::keys;
use metal_ipam_core::kv::Ctx;
use metal_ipam_core::ports::kv::KvStore;
use metal_ipam_core::testing::{Backend, MemKv, TestEnv};
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
    let p = rec.state.pool.as_ref().unwrap();
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
        if rec.state.deleted {
            assert!(rec.state.pool.is_none());
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
        let ip = rec.to_ip_address("ns", "claim-name").unwrap().to_json();
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
        keys::net_device("<uuid>"),
        keys::net_device_init("<uuid>"),
        keys::POOL_INDEX.to_string(),
        keys::POOL_INDEX_INIT.to_string(),
        keys::holders(
            &PoolId::namespaced("<namespace>", "<name>"),
            "<incarnation>",
            0,
        )
        .replace("/0", "/<page>"),
        keys::holders_init(
            &PoolId::namespaced("<namespace>", "<name>"),
            "<incarnation>",
            0,
        )
        .replace("/0", "/<page>"),
        keys::obs_request("<signature>"),
        keys::OBS_SIGNATURES.to_string(),
        keys::OBS_SIGNATURES_INIT.to_string(),
        keys::OBS_DROPPED.to_string(),
        keys::obs_kube("<component>", "<class>"),
        keys::obs_metal(0, "<class>").replace("/0/", "/<operation>/"),
        keys::obs_conflicts("<component>"),
        keys::OBS_COUNTERS.to_string(),
        keys::OBS_COUNTERS_INIT.to_string(),
        keys::OBS_SUMMARY.to_string(),
    ];
    for k in written {
        assert!(
            readme.contains(&format!("`{k}`")),
            "kv-schema/README.md does not document {k}"
        );
    }
}

#[test]
fn registry_examples_round_trip_through_the_record() {
    use metal_ipam_core::kv::registry::RegistryRecord;
    use metal_ipam_core::kv::CasRecord;
    for (file, v) in examples("registry-") {
        let bytes = serde_json::to_vec(&v).unwrap();
        let rec = RegistryRecord::decode(&bytes).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert_eq!(
            serde_json::from_slice::<Value>(&rec.encode()).unwrap(),
            v,
            "{file}"
        );
    }
}

/// The holder page examples round-trip through the record, and their
/// entries are the holders a reader finds for the pool example they
/// belong to (`pool-namespaced.json`, as its incarnation's page): a binding in the
/// page, bindings in the record's `recent`, an intent, and a stale page
/// entry of a released (cooling) address that no reader asks about.
#[test]
fn holder_page_examples_round_trip_and_resolve_with_their_pool() {
    use metal_ipam_core::ipam::holders;
    use metal_ipam_core::ipam::store::{HolderPage, HolderPageRecord};
    use metal_ipam_core::kv::CasRecord;
    for (file, v) in examples("holders-") {
        let bytes = serde_json::to_vec(&v).unwrap();
        let rec = HolderPageRecord::decode(&bytes).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert_eq!(
            serde_json::from_slice::<Value>(&rec.encode()).unwrap(),
            v,
            "{file}"
        );
        let _: &HolderPage = &rec.state;
    }
    let (_, pool) = examples("pool-namespaced").remove(0);
    let (_, page) = examples("holders-page").remove(0);
    let rec = PoolRecord::decode(&serde_json::to_vec(&pool).unwrap()).unwrap();
    let id = pool_id_of(&rec);
    let l = rec.load(&id).unwrap().unwrap();
    let kv = MemKv::new(Backend::SpinSqlite);
    let p = l.state.holders.pages.first().unwrap();
    let inc = l.state.holders.page_incarnation();
    kv.set(
        &keys::holders(&id, inc, p),
        &serde_json::to_vec(&page).unwrap(),
    )
    .unwrap();
    let held: Vec<u128> = l
        .state
        .used
        .iter()
        .filter(|v| !l.state.is_cooling(*v))
        .collect();
    let found = holders::holders_of(&kv, &l, &held).unwrap();
    let by_address: Vec<(String, String)> = found
        .by_value
        .iter()
        .map(|(v, h)| (l.pool.ip(*v).to_string(), h.claim.clone()))
        .collect();
    assert_eq!(
        by_address,
        [
            ("192.0.2.10", "team-a/web-md-0"),
            ("192.0.2.12", "team-a/web-md-1"),
            ("192.0.2.14", "team-a/web-md-2"),
            ("192.0.2.20", "team-a/web-cp-0"),
        ]
        .map(|(a, c)| (a.to_string(), c.to_string()))
    );
}

/// The pool index's examples round-trip through the record.
#[test]
fn pool_index_examples_round_trip_through_the_record() {
    use metal_ipam_core::ipam::index::IndexRecord;
    use metal_ipam_core::kv::CasRecord;
    for (file, v) in examples("index") {
        let bytes = serde_json::to_vec(&v).unwrap();
        let rec = IndexRecord::decode(&bytes).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert_eq!(
            serde_json::from_slice::<Value>(&rec.encode()).unwrap(),
            v,
            "{file}"
        );
    }
}

/// A version 1 pool index (a registry of pool keys, tombstoned pools
/// included) is read as entries whose addresses are not known, and its
/// next write reads each pool's record once: the live one is filled in,
/// the deleted one goes.
#[test]
fn a_version_1_pool_index_migrates_on_its_next_write() {
    use metal_ipam_core::ip::Family;
    use metal_ipam_core::ipam::index::{self, Held};
    let (_, bytes) = golden("index-v1").remove(0);
    let kv = MemKv::new(Backend::SpinSqlite);
    let env = TestEnv::at(1_700_000_000);
    let c = Ctx::auto(&kv, &env);
    // The golden index lists a live namespaced pool and a deleted global one.
    metal_ipam_core::ipam::ops::put_pool(
        &c,
        PoolObject::parse(
            &PoolId::namespaced("team-a", "p"),
            &serde_json::json!({"apiVersion": "ipam.metal-ipam.dev/v1alpha1", "kind": "MetalIPPool",
                "metadata": {"name": "p", "namespace": "team-a"},
                "spec": {"addresses": ["10.50.0.0/28"], "prefix": 28}}),
        )
        .unwrap(),
    )
    .unwrap();
    kv.set(keys::POOL_INDEX, &bytes).unwrap();
    let old = index::read(&kv).unwrap().unwrap();
    assert_eq!(old.ids().len(), 2);
    assert!(old.pools.values().all(|e| e.held.is_none()));
    // Any write: a registration of an unrelated pool.
    let q = PoolId::namespaced("team-b", "q");
    index::reserve(&c, &q, &Held::empty(Family::V4)).unwrap();
    let new = index::read(&kv).unwrap().unwrap();
    let p = &new.pools[&keys::pool(&PoolId::namespaced("team-a", "p"))];
    assert_eq!(
        p.held.as_deref(),
        Some(&["10.50.0.1-10.50.0.14".to_string()][..])
    );
    assert!(!new.pools.contains_key(&keys::pool(&PoolId::global("g"))));
    let raw: Value = serde_json::from_slice(&kv.get(keys::POOL_INDEX).unwrap().unwrap()).unwrap();
    assert_eq!(raw["v"], 2);
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
    assert_eq!(rec.state.journal.len(), 1);
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
        let rebuilt = CursorRecord::build(
            &rec.view(&metal_ipam_core::cloud::CloudKind::Metal)
                .unwrap()
                .unwrap(),
            rec.envelope(),
        );
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

fn golden(prefix: &str) -> Vec<(String, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden/kv");
    let mut out: Vec<(String, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with(prefix))
        .map(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            (name, std::fs::read(&p).unwrap())
        })
        .collect();
    out.sort();
    assert!(!out.is_empty(), "no golden {prefix}* records");
    out
}

/// What a record's stored bytes say, compared across a migration: the
/// envelope's writer, and the content (`state` in the new format, the
/// fields beside the envelope in the old one).
fn content_of(v: &Value) -> Value {
    match v.get("state") {
        Some(state) => state.clone(),
        None => {
            let mut c = v.clone();
            let m = c.as_object_mut().unwrap();
            for k in ["v", "rev", "writer", "recentWriters", "swapCheck"] {
                m.remove(k);
            }
            c
        }
    }
}

/// The backends a stored record can meet: `swapCheck: exact` is only
/// ever written on Spin's SQLite store.
fn backends_for(old: &Value) -> Vec<metal_ipam_core::testing::Backend> {
    use metal_ipam_core::testing::Backend;
    match old["swapCheck"].as_str() {
        Some("exact") => vec![Backend::SpinSqlite],
        _ => vec![Backend::SpinSqlite, Backend::Redis, Backend::RedisSpin36],
    }
}

/// Pool records written by the build before the envelope (`tests/golden/kv`,
/// real bytes from its protocol and its golden examples) load, are updated
/// through the protocol with what they hold, and read back in the new
/// format (version 2, content under `state`) with the same content, on
/// every backend's semantics.
#[test]
fn golden_old_pool_records_migrate_on_their_next_write() {
    use metal_ipam_core::ipam::store::{self, POOL_VERSION};
    use metal_ipam_core::kv::{protocol::Decision, Ctx};
    use metal_ipam_core::ports::kv::KvStore;
    use metal_ipam_core::testing::{MemKv, TestEnv};
    let mut golden_files = golden("pool-");
    golden_files.extend(golden("example-pool-"));
    for (file, bytes) in golden_files {
        let old: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(old["v"], 1, "{file}: an old record");
        let rec = PoolRecord::decode(&bytes).unwrap_or_else(|e| panic!("{file}: {e}"));
        let id = if rec.state.deleted {
            PoolId::namespaced("team-a", "old")
        } else {
            pool_id_of(&rec)
        };
        let before = rec.load(&id).unwrap();
        for backend in backends_for(&old) {
            let kv = MemKv::new(backend);
            let env = TestEnv::at(1_764_440_100);
            kv.set(&keys::pool(&id), &bytes).unwrap();
            let ctx = Ctx::auto(&kv, &env);
            let seen = store::update_pool(&ctx, &id, |cur| {
                let next = Next {
                    pool: cur.map(|l| (l.object.clone(), l.pool.clone())),
                    state: cur.map(|l| l.state.clone()).unwrap_or_default(),
                };
                Ok(Decision::Write(Box::new(next), cur.cloned()))
            })
            .unwrap_or_else(|e| panic!("{file} {backend:?}: {e}"));
            assert_eq!(seen, before, "{file}: what the decision saw");
            let stored = kv.get(&keys::pool(&id)).unwrap().unwrap();
            let new: Value = serde_json::from_slice(&stored).unwrap();
            assert_eq!(new["v"], POOL_VERSION, "{file} {backend:?}");
            assert_eq!(new["rev"], old["rev"].as_u64().unwrap() + 1, "{file}");
            assert_eq!(new["swapCheck"], old["swapCheck"], "{file}");
            assert!(
                new["recentWriters"]
                    .as_array()
                    .unwrap()
                    .contains(&old["writer"]),
                "{file}: the old writer is remembered"
            );
            let mut want = content_of(&old);
            want.as_object_mut().unwrap().remove("journal");
            assert_eq!(content_of(&new), want, "{file} {backend:?}: same content");
            let again = store::read_pool(&kv, &id).unwrap();
            assert_eq!(
                again.map(|l| (l.object, l.state)),
                before.clone().map(|l| (l.object, l.state)),
                "{file} {backend:?}: read back the same"
            );
        }
    }
}

/// Metal progress records written by the build before the envelope
/// (version 2, and the version 1 fixture) are updated through the protocol
/// and read back as version 3 with the same content.
#[test]
fn golden_old_progress_records_migrate_on_their_next_write() {
    use metal_ipam_core::kv::protocol::{read_record, update_record, Decision};
    use metal_ipam_core::kv::Ctx;
    use metal_ipam_core::ports::kv::KvStore;
    use metal_ipam_core::provision::record::{ProgressRecord, PROGRESS_VERSION};
    use metal_ipam_core::testing::{MemKv, TestEnv};
    let mut golden_files = golden("metal-progress");
    golden_files.extend(golden("example-metal-progress"));
    let id = PoolId::namespaced("ns", "vrf-pool");
    for (file, bytes) in golden_files {
        let old: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(old["v"], 2, "{file}: an old record");
        let before = {
            use metal_ipam_core::kv::protocol::CasRecord;
            let rec = ProgressRecord::decode(&bytes).unwrap_or_else(|e| panic!("{file}: {e}"));
            rec.view(&id).unwrap().unwrap()
        };
        for backend in backends_for(&old) {
            let kv = MemKv::new(backend);
            let env = TestEnv::at(1_764_440_100);
            kv.set(&keys::metal_pool(&id), &bytes).unwrap();
            let ctx = Ctx::auto(&kv, &env);
            let seen = update_record::<_, ProgressRecord, _>(&ctx, &id, |cur| {
                let p = cur.cloned().unwrap();
                Ok(Decision::Write(Box::new(p.clone()), p))
            })
            .unwrap_or_else(|e| panic!("{file} {backend:?}: {e}"));
            assert_eq!(seen, before, "{file}: what the decision saw");
            let stored = kv.get(&keys::metal_pool(&id)).unwrap().unwrap();
            let new: Value = serde_json::from_slice(&stored).unwrap();
            assert_eq!(new["v"], PROGRESS_VERSION, "{file} {backend:?}");
            assert_eq!(new["rev"], old["rev"].as_u64().unwrap() + 1, "{file}");
            assert_eq!(content_of(&new), content_of(&old), "{file} {backend:?}");
            let again = read_record::<_, ProgressRecord>(&kv, &id).unwrap();
            assert_eq!(again, Some(before.clone()), "{file} {backend:?}");
        }
    }
}

/// What an old replica does with a new record: it refuses it (500,
/// "unknown field `state`") rather than misread it; it never writes over
/// what it cannot read. Checked here on the old decoder's rules: a record
/// with the envelope's fields and `deny_unknown_fields` (the shape of the
/// version 1 pool record and the version 2 progress record).
#[test]
fn an_old_reader_refuses_a_new_record() {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "camelCase", deny_unknown_fields)]
    #[allow(dead_code)]
    struct OldEnvelope {
        v: u32,
        rev: u64,
        writer: String,
        #[serde(default)]
        recent_writers: Vec<String>,
        swap_check: String,
        #[serde(default)]
        used: Vec<String>,
        #[serde(default)]
        uid: Option<String>,
    }
    for (file, v) in examples("pool-")
        .into_iter()
        .chain(examples("metal-progress"))
    {
        let e = serde_json::from_value::<OldEnvelope>(v).err();
        assert!(
            e.is_some_and(|e| e.to_string().contains("unknown field `state`")),
            "{file}"
        );
    }
}
