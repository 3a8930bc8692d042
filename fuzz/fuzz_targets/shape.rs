#![no_main]
//! See `monarch_host_fuzz::shape`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| monarch_host_fuzz::shape(data));
