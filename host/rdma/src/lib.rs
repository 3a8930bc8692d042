//! monarch-rdma: registered buffers and one-sided transfers between procs.
