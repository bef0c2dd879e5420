//! Key-value backend semantics at the Rust level: Spin 3.6 SQLite quirks,
//! the label allow-list, and several connections sharing one file.

mod common;

use std::collections::HashSet;

use common::TempDir;
use metal_ipam_host::kv::{KvError, KvStore, KvStores, SwapError};
use metal_ipam_host::KvBackend;

fn allowed(labels: &[&str]) -> HashSet<String> {
    labels.iter().map(|s| s.to_string()).collect()
}

async fn open(stores: &KvStores, label: &str) -> KvStore {
    stores
        .open(&allowed(&[label]), label)
        .await
        .expect("open store")
}

fn backends(dir: &TempDir) -> Vec<KvBackend> {
    vec![
        KvBackend::Memory,
        KvBackend::SqliteFile(dir.join("kv/spin.db")),
    ]
}

#[tokio::test]
async fn cas_on_absent_key_is_an_upsert_and_both_creators_win() {
    let dir = TempDir::new("cas-absent");
    for backend in backends(&dir) {
        let store = open(&KvStores::new(backend.clone()), "default").await;
        let mut a = store.new_cas("lease");
        let mut b = store.new_cas("lease");
        assert_eq!(a.current().await.unwrap(), None);
        assert_eq!(b.current().await.unwrap(), None);
        a.swap(b"owner-a".to_vec())
            .await
            .expect("first create-if-absent succeeds");
        // Spin's SQLite backend upserts when `current` saw no value: the
        // second "create if absent" also succeeds and overwrites.
        b.swap(b"owner-b".to_vec())
            .await
            .expect("second create-if-absent also succeeds ({backend})");
        assert_eq!(store.get("lease").await.unwrap(), Some(b"owner-b".to_vec()));
    }
}

#[tokio::test]
async fn swap_without_current_is_a_blind_upsert() {
    let store = open(&KvStores::new(KvBackend::Memory), "default").await;
    store.set("k", b"old").await.unwrap();
    let cas = store.new_cas("k");
    cas.swap(b"new".to_vec())
        .await
        .expect("no current: upsert regardless of the value");
    assert_eq!(store.get("k").await.unwrap(), Some(b"new".to_vec()));
}

#[tokio::test]
async fn cas_fails_when_the_value_changed_and_succeeds_otherwise() {
    let dir = TempDir::new("cas-changed");
    for backend in backends(&dir) {
        let store = open(&KvStores::new(backend), "default").await;
        store.set("k", b"v1").await.unwrap();

        let mut cas = store.new_cas("k");
        assert_eq!(cas.current().await.unwrap(), Some(b"v1".to_vec()));
        store.set("k", b"v2").await.unwrap();
        assert_eq!(cas.swap(b"mine".to_vec()).await, Err(SwapError::CasFailed));
        assert_eq!(store.get("k").await.unwrap(), Some(b"v2".to_vec()));

        // Deleted in between: the conditional UPDATE matches no row.
        let mut cas = store.new_cas("k");
        cas.current().await.unwrap();
        store.delete("k").await.unwrap();
        assert_eq!(cas.swap(b"mine".to_vec()).await, Err(SwapError::CasFailed));
        assert_eq!(store.get("k").await.unwrap(), None);

        store.set("k", b"v3").await.unwrap();
        let mut cas = store.new_cas("k");
        cas.current().await.unwrap();
        cas.swap(b"v4".to_vec()).await.unwrap();
        assert_eq!(store.get("k").await.unwrap(), Some(b"v4".to_vec()));
    }
}

#[tokio::test]
async fn increment_uses_8_byte_little_endian_and_traps_on_other_lengths() {
    let dir = TempDir::new("incr");
    for backend in backends(&dir) {
        let store = open(&KvStores::new(backend), "default").await;
        assert_eq!(store.increment("n", 1).await.unwrap(), 1);
        assert_eq!(store.increment("n", 2).await.unwrap(), 3);
        assert_eq!(store.increment("n", -10).await.unwrap(), -7);
        assert_eq!(
            store.get("n").await.unwrap(),
            Some((-7i64).to_le_bytes().to_vec())
        );

        store.set("m", &41i64.to_le_bytes()).await.unwrap();
        assert_eq!(store.increment("m", 1).await.unwrap(), 42);

        for bad in [&b"abc"[..], &b""[..], &[0u8; 9][..], &b"12"[..]] {
            store.set("bad", bad).await.unwrap();
            match store.increment("bad", 1).await {
                Err(KvError::Trap(msg)) => assert!(msg.contains("incorrect length"), "{msg}"),
                other => panic!(
                    "expected a trap for a {}-byte value, got {other:?}",
                    bad.len()
                ),
            }
            assert_eq!(
                store.get("bad").await.unwrap(),
                Some(bad.to_vec()),
                "nothing written"
            );
        }
    }
}

#[tokio::test]
async fn labels_are_allow_listed_and_isolated() {
    let dir = TempDir::new("labels");
    let stores = KvStores::with_labels(
        KvBackend::Memory,
        [
            (
                "extra".to_string(),
                KvBackend::SqliteFile(dir.join("extra.db")),
            ),
            (
                "same-file".to_string(),
                KvBackend::SqliteFile(dir.join("extra.db")),
            ),
        ],
    );
    assert!(stores.is_defined("default") && stores.is_defined("extra"));
    assert!(!stores.is_defined("nope"));

    // Not in the component's list: access-denied, whether defined or not.
    assert_eq!(
        stores
            .open(&allowed(&["default"]), "extra")
            .await
            .unwrap_err(),
        KvError::AccessDenied
    );
    assert_eq!(
        stores
            .open(&allowed(&["default"]), "nope")
            .await
            .unwrap_err(),
        KvError::AccessDenied
    );
    // Allowed but undefined: no-such-store.
    assert_eq!(
        stores.open(&allowed(&["nope"]), "nope").await.unwrap_err(),
        KvError::NoSuchStore
    );

    let all = allowed(&["default", "extra", "same-file"]);
    let default = stores.open(&all, "default").await.unwrap();
    let extra = stores.open(&all, "extra").await.unwrap();
    let same_file = stores.open(&all, "same-file").await.unwrap();
    default.set("k", b"d").await.unwrap();
    extra.set("k", b"e").await.unwrap();
    same_file.set("k", b"s").await.unwrap();
    assert_eq!(default.get("k").await.unwrap(), Some(b"d".to_vec()));
    assert_eq!(extra.get("k").await.unwrap(), Some(b"e".to_vec()));
    assert_eq!(extra.get_keys().await.unwrap(), vec!["k"]);
    // Two labels in one file are separated by the `store` column.
    let conn = rusqlite::Connection::open(dir.join("extra.db")).unwrap();
    let mut rows: Vec<(String, String)> = conn
        .prepare("SELECT store, key FROM spin_key_value ORDER BY store")
        .unwrap()
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    rows.sort();
    assert_eq!(
        rows,
        vec![
            ("extra".into(), "k".into()),
            ("same-file".into(), "k".into())
        ]
    );
}

#[tokio::test]
async fn file_layout_is_spins_and_data_persists() {
    let dir = TempDir::new("layout");
    let path = dir.join(".spin/sqlite_key_value.db");
    {
        let store = open(
            &KvStores::new(KvBackend::SqliteFile(path.clone())),
            "default",
        )
        .await;
        store.set("a", b"1").await.unwrap();
        store.increment("c", 5).await.unwrap();
    }
    let conn = rusqlite::Connection::open(&path).unwrap();
    let sql: String = conn
        .query_row(
            "SELECT sql FROM sqlite_master WHERE type='table' AND name='spin_key_value'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    let normalized: String = sql.split_whitespace().collect::<Vec<_>>().join(" ");
    assert_eq!(
        normalized,
        "CREATE TABLE spin_key_value ( store TEXT NOT NULL, key TEXT NOT NULL, value BLOB NOT NULL, PRIMARY KEY (store, key) )"
    );
    let v: Vec<u8> = conn
        .query_row(
            "SELECT value FROM spin_key_value WHERE store='default' AND key='c'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(v, 5i64.to_le_bytes().to_vec());

    // A new store manager (as after a restart) sees the data.
    let store = open(&KvStores::new(KvBackend::SqliteFile(path)), "default").await;
    assert_eq!(store.get("a").await.unwrap(), Some(b"1".to_vec()));
}

#[tokio::test]
async fn get_keys_and_batches_follow_spin() {
    let store = open(&KvStores::new(KvBackend::Memory), "default").await;
    store
        .set_many(
            (0..1200)
                .map(|i| (format!("k{i:04}"), vec![i as u8]))
                .collect(),
        )
        .await
        .unwrap();
    assert_eq!(store.get_keys().await.unwrap().len(), 1200);
    let wanted: Vec<String> = vec!["k0001".into(), "missing".into(), "k1199".into()];
    let mut got = store.get_many(wanted).await.unwrap();
    got.sort();
    // Absent keys are omitted, not returned as None.
    assert_eq!(
        got,
        vec![
            ("k0001".into(), Some(vec![1])),
            ("k1199".into(), Some(vec![1199u32 as u8]))
        ]
    );
    // Batches larger than one statement's chunk work.
    let all: Vec<String> = (0..1200).map(|i| format!("k{i:04}")).collect();
    assert_eq!(store.get_many(all.clone()).await.unwrap().len(), 1200);
    store.delete_many(all).await.unwrap();
    assert!(store.get_keys().await.unwrap().is_empty());
    assert!(store.get_many(vec![]).await.unwrap().is_empty());
}

/// Two store managers (two connections, as two host processes would have)
/// on one file: increments never lose updates and a CAS loop stays exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_connections_on_one_file_stay_consistent() {
    let dir = TempDir::new("two-conns");
    let path = dir.join("shared.db");
    let a = open(
        &KvStores::new(KvBackend::SqliteFile(path.clone())),
        "default",
    )
    .await;
    let b = open(
        &KvStores::new(KvBackend::SqliteFile(path.clone())),
        "default",
    )
    .await;

    const PER_TASK: i64 = 40;
    let mut tasks = Vec::new();
    for store in [a.clone(), b.clone(), a.clone(), b.clone()] {
        tasks.push(tokio::spawn(async move {
            for _ in 0..PER_TASK {
                store.increment("counter", 1).await.expect("increment");
            }
        }));
    }
    // CAS-increment a text counter from both connections.
    a.set("cas-counter", b"0").await.unwrap();
    for store in [a.clone(), b.clone()] {
        tasks.push(tokio::spawn(async move {
            let mut done = 0;
            while done < PER_TASK {
                let mut cas = store.new_cas("cas-counter");
                let cur = cas.current().await.expect("current").expect("present");
                let n: i64 = String::from_utf8(cur).unwrap().parse().unwrap();
                match cas.swap((n + 1).to_string().into_bytes()).await {
                    Ok(()) => done += 1,
                    Err(SwapError::CasFailed) => {}
                    Err(e) => panic!("swap error: {e}"),
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(
        b.get("counter").await.unwrap(),
        Some((4 * PER_TASK).to_le_bytes().to_vec())
    );
    assert_eq!(
        a.get("cas-counter").await.unwrap(),
        Some((2 * PER_TASK).to_string().into_bytes())
    );
}
