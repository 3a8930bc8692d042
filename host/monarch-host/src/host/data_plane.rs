//! The WIT `tensor` and `rdma` imports: thin adapters from the guest's
//! resources to [`crate::tensor`] and [`crate::rdma`], whose waits post
//! their `done` events to the instance's completion queue.

use monarch_tensor::mesh::TensorMeshOptions;
use wasmtime::component::Resource;

use super::HostState;
use crate::bindings::monarch::host::{rdma, tensor};
use crate::mesh::ProcMeshHandle;
use crate::rdma::BufferHandle;
use crate::tensor::{EngineHandle, TensorHandle};

pub(crate) use crate::rdma::RdmaMeshes;

impl HostState {
    fn tensor(&self, this: &Resource<TensorHandle>) -> wasmtime::Result<&TensorHandle> {
        Ok(self.table.get(this)?)
    }

    /// Pushes the tensor `make` builds from `this`.
    fn derive(
        &mut self,
        this: &Resource<TensorHandle>,
        make: impl FnOnce(&TensorHandle) -> TensorHandle,
    ) -> wasmtime::Result<Resource<TensorHandle>> {
        let made = make(self.tensor(this)?);
        self.push(made)
    }

    /// Pushes the tensor `make` builds from `this` and `other`.
    fn derive2(
        &mut self,
        this: &Resource<TensorHandle>,
        other: &Resource<TensorHandle>,
        make: impl FnOnce(&TensorHandle, &TensorHandle) -> TensorHandle,
    ) -> wasmtime::Result<Resource<TensorHandle>> {
        let made = make(self.tensor(this)?, self.tensor(other)?);
        self.push(made)
    }

    /// A new request id, and where its `done` goes.
    fn completion(&mut self) -> (u64, crate::bindings::Completions) {
        (self.request_id(), self.completions.clone())
    }
}

impl tensor::Host for HostState {}

impl tensor::HostEngine for HostState {
    async fn spawn(
        &mut self,
        procs: Resource<ProcMeshHandle>,
    ) -> wasmtime::Result<Result<Resource<EngineHandle>, String>> {
        let (extent, procs) = {
            let mesh = self.table.get(&procs)?;
            let extent: Vec<(String, u32)> = mesh
                .extent
                .iter()
                .map(|d| (d.name.clone(), d.size))
                .collect();
            (extent, mesh.procs.clone())
        };
        let client = match self.cluster.client() {
            Ok(client) => client.clone(),
            Err(e) => return Ok(Err(e)),
        };
        let options = TensorMeshOptions {
            fanout: self.cluster.sandbox.fanout,
            timeout: self.call_timeout,
            ..TensorMeshOptions::default()
        };
        match EngineHandle::spawn(client, &procs, extent, options).await {
            Ok(engine) => Ok(Ok(self.push(engine)?)),
            Err(e) => Ok(Err(format!("cannot start a tensor engine: {e}"))),
        }
    }

    async fn create(
        &mut self,
        this: Resource<EngineHandle>,
        dims: Vec<u64>,
        dtype: tensor::Dtype,
        device: tensor::Device,
        sharding: tensor::Sharding,
        init: tensor::Init,
    ) -> wasmtime::Result<Resource<TensorHandle>> {
        let made = self
            .table
            .get(&this)?
            .create(dims, dtype, device, sharding, init);
        self.push(made)
    }

    async fn sync(&mut self, this: Resource<EngineHandle>) -> wasmtime::Result<u64> {
        let (id, done) = self.completion();
        self.table.get(&this)?.sync(id, done);
        Ok(id)
    }

    async fn drop(&mut self, this: Resource<EngineHandle>) -> wasmtime::Result<()> {
        self.table.delete(this)?;
        Ok(())
    }
}

impl tensor::HostTensor for HostState {
    async fn layout(&mut self, this: Resource<TensorHandle>) -> wasmtime::Result<tensor::Layout> {
        Ok(self.tensor(&this)?.layout())
    }

    async fn binary(
        &mut self,
        this: Resource<TensorHandle>,
        op: tensor::BinaryOp,
        other: Resource<TensorHandle>,
    ) -> wasmtime::Result<Resource<TensorHandle>> {
        self.derive2(&this, &other, |a, b| a.binary(op, b))
    }

    async fn scalar(
        &mut self,
        this: Resource<TensorHandle>,
        op: tensor::BinaryOp,
        value: f64,
    ) -> wasmtime::Result<Resource<TensorHandle>> {
        self.derive(&this, |a| a.scalar(op, value))
    }

    async fn unary(
        &mut self,
        this: Resource<TensorHandle>,
        op: tensor::UnaryOp,
    ) -> wasmtime::Result<Resource<TensorHandle>> {
        self.derive(&this, |a| a.unary(op))
    }

    async fn matmul(
        &mut self,
        this: Resource<TensorHandle>,
        other: Resource<TensorHandle>,
    ) -> wasmtime::Result<Resource<TensorHandle>> {
        self.derive2(&this, &other, |a, b| a.matmul(b))
    }

    async fn transpose(
        &mut self,
        this: Resource<TensorHandle>,
    ) -> wasmtime::Result<Resource<TensorHandle>> {
        self.derive(&this, |a| a.transpose())
    }

    async fn sum(
        &mut self,
        this: Resource<TensorHandle>,
        dim: Option<u32>,
    ) -> wasmtime::Result<Resource<TensorHandle>> {
        self.derive(&this, |a| a.sum(dim))
    }

    async fn copy(
        &mut self,
        this: Resource<TensorHandle>,
    ) -> wasmtime::Result<Resource<TensorHandle>> {
        self.derive(&this, |a| a.copy())
    }

    async fn axpy(
        &mut self,
        this: Resource<TensorHandle>,
        alpha: f64,
        x: Resource<TensorHandle>,
    ) -> wasmtime::Result<()> {
        let (y, x) = (self.tensor(&this)?, self.tensor(&x)?);
        y.axpy(alpha, x);
        Ok(())
    }

    async fn assign(
        &mut self,
        this: Resource<TensorHandle>,
        src: Resource<TensorHandle>,
    ) -> wasmtime::Result<()> {
        let (dst, src) = (self.tensor(&this)?, self.tensor(&src)?);
        dst.assign(src);
        Ok(())
    }

    async fn all_reduce(
        &mut self,
        this: Resource<TensorHandle>,
        mesh_dim: String,
    ) -> wasmtime::Result<u64> {
        let (id, done) = self.completion();
        self.table.get_mut(&this)?.all_reduce(&mesh_dim, id, done);
        Ok(id)
    }

    async fn fetch(&mut self, this: Resource<TensorHandle>) -> wasmtime::Result<u64> {
        let (id, done) = self.completion();
        self.tensor(&this)?.fetch(id, done);
        Ok(id)
    }

    async fn fetch_shard(
        &mut self,
        this: Resource<TensorHandle>,
        rank: u32,
    ) -> wasmtime::Result<u64> {
        let (id, done) = self.completion();
        self.tensor(&this)?.fetch_shard(rank, id, done);
        Ok(id)
    }

    async fn sync(&mut self, this: Resource<TensorHandle>) -> wasmtime::Result<u64> {
        let (id, done) = self.completion();
        self.tensor(&this)?.sync(id, done);
        Ok(id)
    }

    async fn send_shard(
        &mut self,
        this: Resource<TensorHandle>,
        from: u32,
        dst: Resource<TensorHandle>,
        to: u32,
    ) -> wasmtime::Result<u64> {
        let (id, done) = self.completion();
        let (src, dst) = (self.tensor(&this)?, self.tensor(&dst)?);
        src.send_shard(from, dst, to, id, done);
        Ok(id)
    }

    async fn drop(&mut self, this: Resource<TensorHandle>) -> wasmtime::Result<()> {
        self.table.delete(this)?;
        Ok(())
    }
}

impl rdma::Host for HostState {}

impl rdma::HostBuffer for HostState {
    async fn allocate(
        &mut self,
        procs: Resource<ProcMeshHandle>,
        rank: u32,
        size: u64,
    ) -> wasmtime::Result<Result<Resource<BufferHandle>, String>> {
        let procs = self.table.get(&procs)?.procs.clone();
        let client = match self.cluster.client() {
            Ok(client) => client.clone(),
            Err(e) => return Ok(Err(e)),
        };
        let timeout = self.call_timeout;
        match self
            .rdma
            .allocate(client, &procs, rank, size, timeout)
            .await
        {
            Ok(buffer) => Ok(Ok(self.push(buffer)?)),
            Err(e) => Ok(Err(e)),
        }
    }

    async fn size(&mut self, this: Resource<BufferHandle>) -> wasmtime::Result<u64> {
        Ok(self.table.get(&this)?.size())
    }

    async fn to_ref(&mut self, this: Resource<BufferHandle>) -> wasmtime::Result<Vec<u8>> {
        Ok(self.table.get(&this)?.to_ref())
    }

    async fn from_ref(
        &mut self,
        reference: Vec<u8>,
    ) -> wasmtime::Result<Result<Resource<BufferHandle>, String>> {
        let client = match self.cluster.client() {
            Ok(client) => client.clone(),
            Err(e) => return Ok(Err(e)),
        };
        let timeout = self.call_timeout;
        match self.rdma.open_ref(client, &reference, timeout).await {
            Ok(buffer) => Ok(Ok(self.push(buffer)?)),
            Err(e) => Ok(Err(e)),
        }
    }

    async fn write(
        &mut self,
        this: Resource<BufferHandle>,
        offset: u64,
        bytes: Vec<u8>,
    ) -> wasmtime::Result<u64> {
        let (id, done) = self.completion();
        let timeout = self.call_timeout;
        self.table
            .get(&this)?
            .write(offset, bytes, timeout, id, done);
        Ok(id)
    }

    async fn read(
        &mut self,
        this: Resource<BufferHandle>,
        offset: u64,
        len: u64,
    ) -> wasmtime::Result<u64> {
        let (id, done) = self.completion();
        let timeout = self.call_timeout;
        self.table.get(&this)?.read(offset, len, timeout, id, done);
        Ok(id)
    }

    async fn read_into(
        &mut self,
        this: Resource<BufferHandle>,
        dst: Resource<BufferHandle>,
    ) -> wasmtime::Result<u64> {
        let (id, done) = self.completion();
        let timeout = self.call_timeout;
        let (src, dst) = (self.table.get(&this)?, self.table.get(&dst)?);
        BufferHandle::read_into(src, dst, timeout, id, done);
        Ok(id)
    }

    async fn write_from(
        &mut self,
        this: Resource<BufferHandle>,
        src: Resource<BufferHandle>,
    ) -> wasmtime::Result<u64> {
        let (id, done) = self.completion();
        let timeout = self.call_timeout;
        let (dst, src) = (self.table.get(&this)?, self.table.get(&src)?);
        BufferHandle::write_from(dst, src, timeout, id, done);
        Ok(id)
    }

    async fn free(&mut self, this: Resource<BufferHandle>) -> wasmtime::Result<u64> {
        let (id, done) = self.completion();
        let timeout = self.call_timeout;
        self.table.get(&this)?.free(timeout, id, done);
        Ok(id)
    }

    async fn drop(&mut self, this: Resource<BufferHandle>) -> wasmtime::Result<()> {
        self.table.delete(this)?;
        Ok(())
    }
}
