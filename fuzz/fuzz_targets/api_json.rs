#![no_main]
//! See `monarch_host_fuzz::api_json`.

libfuzzer_sys::fuzz_target!(|data: &[u8]| monarch_host_fuzz::api_json(data));
