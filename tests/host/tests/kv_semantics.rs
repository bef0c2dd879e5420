//! Key-value backend semantics at the Rust level: Spin 3.6 SQLite quirks,
//! the label allow-list, several connections sharing one file, and Spin
//! 3.6's Redis backend on a real Redis server.

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

// --- Redis (Spin 3.6's `type = "redis"` backend) -----------------------------
//
// These run on `METAL_IPAM_TEST_REDIS_URL`, else on a private redis-server,
// else print "skipped: no redis-server" (a failure under CI=true); see
// `metal_ipam_host::test_redis`. Each test has its own database number.

use metal_ipam_host::test_redis::TestRedis;
use metal_ipam_host::RedisSwap;

async fn redis_store(redis: &TestRedis, db: u8, swap: RedisSwap) -> KvStore {
    let url = redis.fresh_db(db);
    open(&KvStores::new(KvBackend::Redis { url, swap }), "default").await
}

#[tokio::test]
async fn redis_basic_ops_follow_spin() {
    let Some(redis) = TestRedis::get("redis_basic_ops_follow_spin") else {
        return;
    };
    let s = redis_store(&redis, 1, RedisSwap::Spin36).await;
    assert_eq!(s.get("a").await.unwrap(), None);
    assert!(!s.exists("a").await.unwrap());
    s.set("a", b"1").await.unwrap();
    s.set("a", &[0, 159, 146, 150]).await.unwrap();
    assert_eq!(s.get("a").await.unwrap(), Some(vec![0, 159, 146, 150]));
    assert!(s.exists("a").await.unwrap());
    s.set_many(vec![
        ("b".into(), b"x".to_vec()),
        ("c".into(), b"y".to_vec()),
    ])
    .await
    .unwrap();
    let mut keys = s.get_keys().await.unwrap();
    keys.sort();
    assert_eq!(keys, vec!["a", "b", "c"]);
    s.delete_many(vec!["a".into(), "b".into(), "nope".into()])
        .await
        .unwrap();
    s.delete("c").await.unwrap();
    s.delete("c").await.unwrap();
    assert!(s.get_keys().await.unwrap().is_empty());
    // Empty batches never reach Redis (Spin's host answers them).
    assert!(s.get_many(vec![]).await.unwrap().is_empty());
    s.set_many(vec![]).await.unwrap();
    s.delete_many(vec![]).await.unwrap();
}

/// Spin's Redis `get_many` sends `KEYS <key>...` instead of `MGET`:
/// reproduced, so a component that uses `batch.get-many` on Redis fails
/// here as it would on Spin 3.6.
#[tokio::test]
async fn redis_get_many_is_spins_keys_command() {
    let Some(redis) = TestRedis::get("redis_get_many_is_spins_keys_command") else {
        return;
    };
    let s = redis_store(&redis, 2, RedisSwap::Spin36).await;
    s.set("a", b"1").await.unwrap();
    s.set("b", b"2").await.unwrap();
    // Two keys: KEYS takes one pattern.
    let err = s.get_many(vec!["a".into(), "b".into()]).await.unwrap_err();
    assert!(
        matches!(&err, KvError::Other(m) if m.contains("wrong number of arguments")),
        "{err:?}"
    );
    // One absent key: KEYS matches nothing, which reads as "no pairs".
    assert_eq!(s.get_many(vec!["zz".into()]).await.unwrap(), vec![]);
    // One present key: KEYS answers its name, an odd-length "pair list";
    // redis-rs panics on it inside Spin's host, so the request traps.
    match s.get_many(vec!["a".into()]).await {
        Err(KvError::Trap(m)) => assert!(m.contains("KEYS"), "{m}"),
        other => panic!("expected a trap, got {other:?}"),
    }
}

#[tokio::test]
async fn redis_cas_on_an_existing_key() {
    let Some(redis) = TestRedis::get("redis_cas_on_an_existing_key") else {
        return;
    };
    for (db, mode) in [(3, RedisSwap::Spin36), (4, RedisSwap::ExecReply)] {
        let store = redis_store(&redis, db, mode).await;
        store.set("k", b"v1").await.unwrap();

        // Uncontended: the SET is applied. Spin 3.6 still reports
        // cas-failed (its `UNWATCH k` is refused by Redis).
        let mut cas = store.open_cas("k").await.unwrap();
        assert_eq!(cas.current().await.unwrap(), Some(b"v1".to_vec()));
        let reported = cas.swap(b"v2".to_vec()).await;
        assert_eq!(store.get("k").await.unwrap(), Some(b"v2".to_vec()));
        match mode {
            RedisSwap::Spin36 => assert_eq!(reported, Err(SwapError::CasFailed)),
            RedisSwap::ExecReply => assert_eq!(reported, Ok(())),
        }

        // Changed between current and swap: the WATCH aborts the EXEC and
        // nothing is written, but no mode reports it truthfully as such:
        // ExecReply says success, Spin 3.6 says cas-failed as always.
        let mut cas = store.open_cas("k").await.unwrap();
        assert_eq!(cas.current().await.unwrap(), Some(b"v2".to_vec()));
        store.set("k", b"intruder").await.unwrap();
        let reported = cas.swap(b"mine".to_vec()).await;
        assert_eq!(store.get("k").await.unwrap(), Some(b"intruder".to_vec()));
        match mode {
            RedisSwap::Spin36 => assert_eq!(reported, Err(SwapError::CasFailed)),
            RedisSwap::ExecReply => assert_eq!(reported, Ok(()), "aborted swap reads as success"),
        }

        // Deleted in between: aborted too.
        let mut cas = store.open_cas("k").await.unwrap();
        cas.current().await.unwrap();
        store.delete("k").await.unwrap();
        let _ = cas.swap(b"mine".to_vec()).await;
        assert_eq!(store.get("k").await.unwrap(), None);

        // A swap without `current` has no WATCH: a blind SET.
        store.set("k", b"old").await.unwrap();
        let blind = store.open_cas("k").await.unwrap();
        let reported = blind.swap(b"new".to_vec()).await;
        assert_eq!(store.get("k").await.unwrap(), Some(b"new".to_vec()));
        assert_eq!(reported.is_ok(), mode == RedisSwap::ExecReply);
    }
}

/// Unlike Spin's SQLite upsert (where both creators succeed and the last
/// one wins), Redis's WATCH on an absent key aborts the second creator: the
/// first value stays. How that is reported depends on the mode.
#[tokio::test]
async fn redis_cas_on_an_absent_key() {
    let Some(redis) = TestRedis::get("redis_cas_on_an_absent_key") else {
        return;
    };
    for (db, mode) in [(5, RedisSwap::Spin36), (6, RedisSwap::ExecReply)] {
        let store = redis_store(&redis, db, mode).await;
        let mut a = store.open_cas("lease").await.unwrap();
        let mut b = store.open_cas("lease").await.unwrap();
        assert_eq!(a.current().await.unwrap(), None);
        assert_eq!(b.current().await.unwrap(), None);
        let ra = a.swap(b"owner-a".to_vec()).await;
        let rb = b.swap(b"owner-b".to_vec()).await;
        assert_eq!(store.get("lease").await.unwrap(), Some(b"owner-a".to_vec()));
        let want = match mode {
            RedisSwap::Spin36 => Err(SwapError::CasFailed),
            RedisSwap::ExecReply => Ok(()),
        };
        assert_eq!((ra, rb), (want.clone(), want), "{mode:?}");
    }
}

/// The quirk of Spin's swap as written (`MULTI`/`SET`/`EXEC` read into
/// `()`): a nil EXEC reply — the transaction aborted by the WATCH — reads as
/// `Ok`. With two handles on one key both swaps report success and only the
/// first value lands. On Spin 3.6 itself the refused `UNWATCH <key>` turns
/// both reports into cas-failed instead; the values land the same way.
#[tokio::test]
async fn redis_aborted_swap_is_reported_as_success() {
    let Some(redis) = TestRedis::get("redis_aborted_swap_is_reported_as_success") else {
        return;
    };
    let store = redis_store(&redis, 7, RedisSwap::ExecReply).await;
    store.set("pool", b"rev-1").await.unwrap();
    let mut first = store.open_cas("pool").await.unwrap();
    let mut second = store.open_cas("pool").await.unwrap();
    assert_eq!(first.current().await.unwrap(), Some(b"rev-1".to_vec()));
    assert_eq!(second.current().await.unwrap(), Some(b"rev-1".to_vec()));
    assert_eq!(first.swap(b"rev-2-first".to_vec()).await, Ok(()));
    assert_eq!(
        second.swap(b"rev-2-second".to_vec()).await,
        Ok(()),
        "the aborted swap is reported as a success"
    );
    assert_eq!(
        store.get("pool").await.unwrap(),
        Some(b"rev-2-first".to_vec()),
        "only the first value landed"
    );

    // The same on Spin 3.6's exact code: both report cas-failed.
    let store = redis_store(&redis, 8, RedisSwap::Spin36).await;
    store.set("pool", b"rev-1").await.unwrap();
    let mut first = store.open_cas("pool").await.unwrap();
    let mut second = store.open_cas("pool").await.unwrap();
    first.current().await.unwrap();
    second.current().await.unwrap();
    assert_eq!(
        first.swap(b"rev-2-first".to_vec()).await,
        Err(SwapError::CasFailed),
        "applied, yet reported as cas-failed"
    );
    assert_eq!(
        second.swap(b"rev-2-second".to_vec()).await,
        Err(SwapError::CasFailed)
    );
    assert_eq!(
        store.get("pool").await.unwrap(),
        Some(b"rev-2-first".to_vec())
    );
}

#[tokio::test]
async fn redis_increment_is_incrby_on_decimal_text() {
    let Some(redis) = TestRedis::get("redis_increment_is_incrby_on_decimal_text") else {
        return;
    };
    let store = redis_store(&redis, 9, RedisSwap::Spin36).await;
    assert_eq!(store.increment("n", 1).await.unwrap(), 1);
    assert_eq!(store.increment("n", 41).await.unwrap(), 42);
    assert_eq!(store.increment("n", -50).await.unwrap(), -8);
    assert_eq!(store.get("n").await.unwrap(), Some(b"-8".to_vec()));
    // increment(key, 0) on an absent key leaves "0" (SQLite: 8 zero bytes).
    assert_eq!(store.increment("zero", 0).await.unwrap(), 0);
    assert_eq!(store.get("zero").await.unwrap(), Some(b"0".to_vec()));
    // Decimal text written by `set` is a counter too.
    store.set("m", b"41").await.unwrap();
    assert_eq!(store.increment("m", 1).await.unwrap(), 42);

    // Anything else is Redis's error — an ordinary error, not a trap — and
    // nothing is written. SQLite's 8-byte encoding is "anything else".
    for bad in [
        &b"abc"[..],
        &b""[..],
        &b"1.5"[..],
        &41i64.to_le_bytes()[..],
        &b"{\"v\":1}"[..],
    ] {
        store.set("bad", bad).await.unwrap();
        match store.increment("bad", 1).await {
            Err(KvError::Other(m)) => assert!(m.contains("not an integer"), "{m}"),
            other => panic!("increment of {bad:?}: expected an error, got {other:?}"),
        }
        assert_eq!(store.get("bad").await.unwrap(), Some(bad.to_vec()));
    }
    // Overflow is an error too (SQLite wraps).
    store
        .set("max", i64::MAX.to_string().as_bytes())
        .await
        .unwrap();
    assert!(matches!(
        store.increment("max", 1).await,
        Err(KvError::Other(_))
    ));
}

/// Every label configured with one URL shares the database's keyspace:
/// Spin's Redis backend ignores the store name.
#[tokio::test]
async fn redis_labels_share_one_keyspace() {
    let Some(redis) = TestRedis::get("redis_labels_share_one_keyspace") else {
        return;
    };
    let url = redis.fresh_db(13);
    let stores = KvStores::with_labels(
        KvBackend::Memory,
        [
            ("default".to_string(), KvBackend::redis(url.clone())),
            ("leases".to_string(), KvBackend::redis(url)),
        ],
    );
    let all = allowed(&["default", "leases"]);
    let default = stores.open(&all, "default").await.unwrap();
    let leases = stores.open(&all, "leases").await.unwrap();
    default.set("k", b"from-default").await.unwrap();
    assert_eq!(
        leases.get("k").await.unwrap(),
        Some(b"from-default".to_vec())
    );
    leases.set("only-leases", b"x").await.unwrap();
    let mut keys = default.get_keys().await.unwrap();
    keys.sort();
    assert_eq!(keys, vec!["k", "only-leases"]);
    leases.delete("k").await.unwrap();
    assert!(!default.exists("k").await.unwrap());
    // The allow-list still applies per label.
    assert_eq!(
        stores
            .open(&allowed(&["default"]), "leases")
            .await
            .unwrap_err(),
        KvError::AccessDenied
    );
}
