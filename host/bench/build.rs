//! Link settings of the `monarch-bench` binary: the procs it starts run
//! it, as `monarch-host`'s run `monarch-host`, so its code is aligned to
//! 2 MiB the same way (see `host/monarch-host/build.rs`).

fn main() {
    // Release builds only: a debug binary is ten times larger, and procs
    // would start from a fresh copy of it after every build.
    let linux = std::env::var("CARGO_CFG_TARGET_OS").is_ok_and(|os| os == "linux");
    if linux && std::env::var("PROFILE").is_ok_and(|profile| profile == "release") {
        println!("cargo:rustc-link-arg-bins=-Wl,-z,max-page-size=0x200000");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
