#![no_main]
//! See `monarch_host_fuzz::reference`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| monarch_host_fuzz::reference(data));
