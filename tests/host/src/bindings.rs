//! Host implementations of the non-WASI interfaces of world
//! `metal-ipam:platform/host-imports` (`/work/main/wit`):
//! `fermyon:spin/key-value@2.0.0`, `fermyon:spin/variables@2.0.0` and
//! `wasi:keyvalue/{store,atomics,batch}@0.2.0-draft2`, on the per-request
//! [`InstanceState`].

use std::collections::HashSet;
use std::sync::{Arc, Mutex};

use wasmtime::component::{Resource, ResourceTable};
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};
use wasmtime_wasi_http::{WasiHttpCtx, WasiHttpCtxView, WasiHttpView};

use crate::kv::{KvCas, KvError, KvOpCounts, KvStore, KvStores, SwapError};
use crate::outbound_hooks::OutboundHooks;
use crate::variables::{ComponentVariables, VariableError};

mod generated {
    wasmtime::component::bindgen!({
        path: "../../wit",
        world: "metal-ipam:platform/host-imports",
        imports: { default: async | trappable },
        with: {
            "fermyon:spin/key-value.store": crate::bindings::SpinStoreRes,
            "wasi:keyvalue/store.bucket": crate::bindings::BucketRes,
            "wasi:keyvalue/atomics.cas": crate::bindings::CasRes,
        },
    });
}

use generated::fermyon::spin::key_value as spin_kv;
use generated::fermyon::spin::variables as spin_vars;
use generated::wasi::keyvalue::{atomics, batch, store as wasi_store};
pub(crate) use generated::HostImports;

/// Table entry behind a `fermyon:spin/key-value.store` handle.
pub struct SpinStoreRes(KvStore);
/// Table entry behind a `wasi:keyvalue/store.bucket` handle.
pub struct BucketRes(KvStore);
/// Table entry behind a `wasi:keyvalue/atomics.cas` handle.
pub struct CasRes(KvCas);

/// Per-instance key-value state: the component's allowed labels, the
/// application's stores and the request's operation counter.
pub(crate) struct KvInstance {
    pub allowed: Arc<HashSet<String>>,
    pub stores: KvStores,
    pub counts: Arc<Mutex<KvOpCounts>>,
}

impl KvInstance {
    fn count(&self, f: impl FnOnce(&mut KvOpCounts)) {
        let mut guard = match self.counts.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        f(&mut guard);
    }
}

/// The `T` of `Store<T>`: everything one component instance (one request)
/// needs.
pub(crate) struct InstanceState {
    pub wasi: WasiCtx,
    pub http: WasiHttpCtx,
    pub table: ResourceTable,
    pub hooks: OutboundHooks,
    pub kv: KvInstance,
    pub variables: Arc<ComponentVariables>,
    /// Records the linear memory the instance asks for.
    pub memory: crate::host::MemoryRecorder,
}

impl WasiView for InstanceState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl WasiHttpView for InstanceState {
    fn http(&mut self) -> WasiHttpCtxView<'_> {
        WasiHttpCtxView {
            ctx: &mut self.http,
            table: &mut self.table,
            hooks: &mut self.hooks,
        }
    }
}

/// Adds the interfaces implemented here to `linker`.
pub(crate) fn add_to_linker(
    linker: &mut wasmtime::component::Linker<InstanceState>,
) -> wasmtime::Result<()> {
    HostImports::add_to_linker::<InstanceState, wasmtime::component::HasSelf<InstanceState>>(
        linker,
        |s| s,
    )
}

fn trap(e: KvError) -> wasmtime::Error {
    wasmtime::Error::msg(e.to_string())
}

fn spin_err(e: KvError) -> wasmtime::Result<spin_kv::Error> {
    Ok(match e {
        KvError::NoSuchStore => spin_kv::Error::NoSuchStore,
        KvError::AccessDenied => spin_kv::Error::AccessDenied,
        KvError::Other(m) => spin_kv::Error::Other(m),
        KvError::Trap(_) => return Err(trap(e)),
    })
}

fn wasi_err(e: KvError) -> wasmtime::Result<wasi_store::Error> {
    Ok(match e {
        KvError::NoSuchStore => wasi_store::Error::NoSuchStore,
        KvError::AccessDenied => wasi_store::Error::AccessDenied,
        KvError::Other(m) => wasi_store::Error::Other(m),
        KvError::Trap(_) => return Err(trap(e)),
    })
}

/// Maps a backend result to the `wasmtime::Result<Result<T, spin error>>`
/// shape of the generated traits (a [`KvError::Trap`] becomes a trap).
fn spin_result<T>(r: Result<T, KvError>) -> wasmtime::Result<Result<T, spin_kv::Error>> {
    match r {
        Ok(v) => Ok(Ok(v)),
        Err(e) => Ok(Err(spin_err(e)?)),
    }
}

fn wasi_result<T>(r: Result<T, KvError>) -> wasmtime::Result<Result<T, wasi_store::Error>> {
    match r {
        Ok(v) => Ok(Ok(v)),
        Err(e) => Ok(Err(wasi_err(e)?)),
    }
}

impl InstanceState {
    fn spin_store(&self, res: &Resource<SpinStoreRes>) -> wasmtime::Result<KvStore> {
        Ok(self.table.get(res)?.0.clone())
    }

    fn bucket(&self, res: &Resource<BucketRes>) -> wasmtime::Result<KvStore> {
        Ok(self.table.get(res)?.0.clone())
    }
}

// --- fermyon:spin/key-value@2.0.0 -------------------------------------------

impl spin_kv::Host for InstanceState {}

impl spin_kv::HostStore for InstanceState {
    async fn open(
        &mut self,
        label: String,
    ) -> wasmtime::Result<Result<Resource<SpinStoreRes>, spin_kv::Error>> {
        match self.kv.stores.open(&self.kv.allowed, &label).await {
            Ok(store) => Ok(Ok(self.table.push(SpinStoreRes(store))?)),
            Err(e) => Ok(Err(spin_err(e)?)),
        }
    }

    async fn get(
        &mut self,
        store: Resource<SpinStoreRes>,
        key: String,
    ) -> wasmtime::Result<Result<Option<Vec<u8>>, spin_kv::Error>> {
        self.kv.count(|c| c.get += 1);
        let store = self.spin_store(&store)?;
        spin_result(store.get(&key).await)
    }

    async fn set(
        &mut self,
        store: Resource<SpinStoreRes>,
        key: String,
        value: Vec<u8>,
    ) -> wasmtime::Result<Result<(), spin_kv::Error>> {
        self.kv.count(|c| c.set += 1);
        let store = self.spin_store(&store)?;
        spin_result(store.set(&key, &value).await)
    }

    async fn delete(
        &mut self,
        store: Resource<SpinStoreRes>,
        key: String,
    ) -> wasmtime::Result<Result<(), spin_kv::Error>> {
        self.kv.count(|c| c.delete += 1);
        let store = self.spin_store(&store)?;
        spin_result(store.delete(&key).await)
    }

    async fn exists(
        &mut self,
        store: Resource<SpinStoreRes>,
        key: String,
    ) -> wasmtime::Result<Result<bool, spin_kv::Error>> {
        self.kv.count(|c| c.exists += 1);
        let store = self.spin_store(&store)?;
        spin_result(store.exists(&key).await)
    }

    async fn get_keys(
        &mut self,
        store: Resource<SpinStoreRes>,
    ) -> wasmtime::Result<Result<Vec<String>, spin_kv::Error>> {
        self.kv.count(|c| c.get_keys += 1);
        let store = self.spin_store(&store)?;
        spin_result(store.get_keys().await)
    }

    async fn drop(&mut self, store: Resource<SpinStoreRes>) -> wasmtime::Result<()> {
        self.table.delete(store)?;
        Ok(())
    }
}

// --- fermyon:spin/variables@2.0.0 --------------------------------------------

impl spin_vars::Host for InstanceState {
    async fn get(&mut self, name: String) -> wasmtime::Result<Result<String, spin_vars::Error>> {
        Ok(self.variables.get(&name).map_err(|e| match e {
            VariableError::InvalidName(m) => spin_vars::Error::InvalidName(m),
            VariableError::Undefined(m) => spin_vars::Error::Undefined(m),
        }))
    }
}

// --- wasi:keyvalue/store@0.2.0-draft2 ----------------------------------------

impl wasi_store::Host for InstanceState {
    async fn open(
        &mut self,
        identifier: String,
    ) -> wasmtime::Result<Result<Resource<BucketRes>, wasi_store::Error>> {
        match self.kv.stores.open(&self.kv.allowed, &identifier).await {
            Ok(store) => Ok(Ok(self.table.push(BucketRes(store))?)),
            Err(e) => Ok(Err(wasi_err(e)?)),
        }
    }
}

impl wasi_store::HostBucket for InstanceState {
    async fn get(
        &mut self,
        bucket: Resource<BucketRes>,
        key: String,
    ) -> wasmtime::Result<Result<Option<Vec<u8>>, wasi_store::Error>> {
        self.kv.count(|c| c.get += 1);
        let store = self.bucket(&bucket)?;
        wasi_result(store.get(&key).await)
    }

    async fn set(
        &mut self,
        bucket: Resource<BucketRes>,
        key: String,
        value: Vec<u8>,
    ) -> wasmtime::Result<Result<(), wasi_store::Error>> {
        self.kv.count(|c| c.set += 1);
        let store = self.bucket(&bucket)?;
        wasi_result(store.set(&key, &value).await)
    }

    async fn delete(
        &mut self,
        bucket: Resource<BucketRes>,
        key: String,
    ) -> wasmtime::Result<Result<(), wasi_store::Error>> {
        self.kv.count(|c| c.delete += 1);
        let store = self.bucket(&bucket)?;
        wasi_result(store.delete(&key).await)
    }

    async fn exists(
        &mut self,
        bucket: Resource<BucketRes>,
        key: String,
    ) -> wasmtime::Result<Result<bool, wasi_store::Error>> {
        self.kv.count(|c| c.exists += 1);
        let store = self.bucket(&bucket)?;
        wasi_result(store.exists(&key).await)
    }

    /// As Spin: a cursor is an error; without one, every key is returned
    /// and the returned cursor is `none`.
    async fn list_keys(
        &mut self,
        bucket: Resource<BucketRes>,
        cursor: Option<String>,
    ) -> wasmtime::Result<Result<wasi_store::KeyResponse, wasi_store::Error>> {
        self.kv.count(|c| c.get_keys += 1);
        if cursor.is_some() {
            return Ok(Err(wasi_store::Error::Other(
                "list_keys: cursor not supported".to_string(),
            )));
        }
        let store = self.bucket(&bucket)?;
        Ok(wasi_result(store.get_keys().await)?
            .map(|keys| wasi_store::KeyResponse { keys, cursor: None }))
    }

    async fn drop(&mut self, bucket: Resource<BucketRes>) -> wasmtime::Result<()> {
        self.table.delete(bucket)?;
        Ok(())
    }
}

// --- wasi:keyvalue/batch@0.2.0-draft2 ----------------------------------------

impl batch::Host for InstanceState {
    async fn get_many(
        &mut self,
        bucket: Resource<BucketRes>,
        keys: Vec<String>,
    ) -> wasmtime::Result<Result<Vec<(String, Option<Vec<u8>>)>, wasi_store::Error>> {
        self.kv.count(|c| c.get_many += 1);
        let store = self.bucket(&bucket)?;
        wasi_result(store.get_many(keys).await)
    }

    async fn set_many(
        &mut self,
        bucket: Resource<BucketRes>,
        key_values: Vec<(String, Vec<u8>)>,
    ) -> wasmtime::Result<Result<(), wasi_store::Error>> {
        self.kv.count(|c| c.set_many += 1);
        let store = self.bucket(&bucket)?;
        wasi_result(store.set_many(key_values).await)
    }

    async fn delete_many(
        &mut self,
        bucket: Resource<BucketRes>,
        keys: Vec<String>,
    ) -> wasmtime::Result<Result<(), wasi_store::Error>> {
        self.kv.count(|c| c.delete_many += 1);
        let store = self.bucket(&bucket)?;
        wasi_result(store.delete_many(keys).await)
    }
}

// --- wasi:keyvalue/atomics@0.2.0-draft2 --------------------------------------

impl atomics::HostCas for InstanceState {
    async fn new(
        &mut self,
        bucket: Resource<BucketRes>,
        key: String,
    ) -> wasmtime::Result<Result<Resource<CasRes>, wasi_store::Error>> {
        let store = self.bucket(&bucket)?;
        match store.open_cas(&key).await {
            Ok(cas) => Ok(Ok(self.table.push(CasRes(cas))?)),
            Err(e) => Ok(Err(wasi_err(e)?)),
        }
    }

    async fn current(
        &mut self,
        cas: Resource<CasRes>,
    ) -> wasmtime::Result<Result<Option<Vec<u8>>, wasi_store::Error>> {
        self.kv.count(|c| c.cas_current += 1);
        let mut handle = self.table.get(&cas)?.0.clone();
        let result = handle.current().await;
        // Remember what `current` saw, as Spin's CAS does.
        self.table.get_mut(&cas)?.0 = handle;
        wasi_result(result)
    }

    async fn drop(&mut self, cas: Resource<CasRes>) -> wasmtime::Result<()> {
        self.table.delete(cas)?;
        Ok(())
    }
}

impl atomics::Host for InstanceState {
    async fn increment(
        &mut self,
        bucket: Resource<BucketRes>,
        key: String,
        delta: i64,
    ) -> wasmtime::Result<Result<i64, wasi_store::Error>> {
        self.kv.count(|c| c.increment += 1);
        let store = self.bucket(&bucket)?;
        wasi_result(store.increment(&key, delta).await)
    }

    /// As Spin: on a failed swap the fresh handle is a new CAS on the same
    /// key (on Redis, with a new connection) whose `current` has already
    /// been read.
    async fn swap(
        &mut self,
        cas: Resource<CasRes>,
        value: Vec<u8>,
    ) -> wasmtime::Result<Result<(), atomics::CasError>> {
        self.kv.count(|c| c.cas_swap += 1);
        let handle = self.table.delete(cas)?.0;
        match handle.swap(value).await {
            Ok(()) => Ok(Ok(())),
            Err(SwapError::Other(m)) => Ok(Err(atomics::CasError::StoreError(
                wasi_store::Error::Other(m),
            ))),
            Err(SwapError::CasFailed) => {
                let mut fresh = match handle.store().open_cas(handle.key()).await {
                    Ok(cas) => cas,
                    Err(e) => return Ok(Err(atomics::CasError::StoreError(wasi_err(e)?))),
                };
                if let Err(e) = fresh.current().await {
                    return Ok(Err(atomics::CasError::StoreError(wasi_err(e)?)));
                }
                let res = self.table.push(CasRes(fresh))?;
                Ok(Err(atomics::CasError::CasFailed(res)))
            }
        }
    }
}
