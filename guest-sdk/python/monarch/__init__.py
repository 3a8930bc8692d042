"""monarch-host's Python SDK: Monarch's ``monarch.actor`` API for programs
that run as WebAssembly components on monarch-host. See docs/python.md."""

__version__ = "0.2.0"
