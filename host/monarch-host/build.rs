//! Link settings of the `monarch-host` binary.

fn main() {
    // Release builds only: a debug binary is ten times larger, and procs
    // would start from a fresh copy of it after every build.
    let linux = std::env::var("CARGO_CFG_TARGET_OS").is_ok_and(|os| os == "linux");
    if linux && std::env::var("PROFILE").is_ok_and(|profile| profile == "release") {
        // Segments aligned to 2 MiB in the file and in memory, so that the
        // kernel can map the code with 2 MiB pages where the page cache
        // holds it in 2 MiB folios; the procs this binary starts run a
        // copy of it written so (`hyperactor_mesh::exe`), and stop missing
        // in the TLB on each turn of a crowded core (docs/benchmarks.md,
        // "Issue 19").
        println!("cargo:rustc-link-arg-bins=-Wl,-z,max-page-size=0x200000");
    }
    println!("cargo:rerun-if-changed=build.rs");
}
