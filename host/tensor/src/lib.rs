//! monarch-tensor: tensors and their CPU and CUDA backends.
