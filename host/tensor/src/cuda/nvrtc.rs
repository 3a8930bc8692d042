//! Compiling the kernels with NVRTC, to a CUBIN for one GPU architecture.
//!
//! Why a CUBIN (machine code for `sm_XY`) and not PTX: a driver JIT-compiles
//! PTX only if it is at least as new as the NVRTC that wrote it, so PTX from
//! NVRTC 12.8 fails to load under a CUDA 12.4 driver, while a CUBIN loads
//! under any 12.x driver that knows the architecture. cudarc's safe NVRTC API
//! returns PTX only, so this module calls NVRTC through cudarc's raw bindings.
//!
//! NVRTC needs no GPU: the tests compile the kernels for several
//! architectures wherever libnvrtc is found.

use std::collections::HashMap;
use std::ffi::{CStr, CString, c_char};
use std::sync::{Arc, Mutex};

use cudarc::nvrtc::{result, sys};

/// The architecture name NVRTC takes for a compute capability, e.g. `sm_90`.
pub(crate) fn arch_for(major: i32, minor: i32) -> String {
    format!("sm_{major}{minor}")
}

fn nvrtc_present() -> bool {
    // SAFETY: only tries to open the library.
    unsafe { sys::is_culib_present() }
}

pub(crate) const NO_NVRTC: &str = "no NVRTC library (libnvrtc.so.12) found, needed to compile \
    the tensor kernels; install the CUDA toolkit, or `pip install nvidia-cuda-nvrtc-cu12` and \
    add its nvidia/cuda_nvrtc/lib folder to LD_LIBRARY_PATH";

/// Destroys the program however compilation ends.
struct Program(sys::nvrtcProgram);

impl Drop for Program {
    fn drop(&mut self) {
        // SAFETY: created by create_program and destroyed only here.
        let _ = unsafe { result::destroy_program(self.0) };
    }
}

fn c_chars_to_string(chars: &[c_char]) -> String {
    let bytes: Vec<u8> = chars.iter().map(|&c| c as u8).collect();
    match CStr::from_bytes_until_nul(&bytes) {
        Ok(s) => s.to_string_lossy().into_owned(),
        Err(_) => String::from_utf8_lossy(&bytes).into_owned(),
    }
}

/// The `sm_XY` numbers (`XY`) this NVRTC can compile for.
pub(crate) fn supported_archs() -> Result<Vec<i32>, String> {
    if !nvrtc_present() {
        return Err(NO_NVRTC.to_string());
    }
    std::panic::catch_unwind(|| {
        let mut n: std::ffi::c_int = 0;
        // SAFETY: `n` is a valid out pointer.
        unsafe { sys::nvrtcGetNumSupportedArchs(&mut n) }
            .result()
            .map_err(|e| format!("nvrtcGetNumSupportedArchs failed: {e}"))?;
        let mut archs = vec![0 as std::ffi::c_int; usize::try_from(n).unwrap_or(0)];
        // SAFETY: `archs` has room for the `n` entries NVRTC reported.
        unsafe { sys::nvrtcGetSupportedArchs(archs.as_mut_ptr()) }
            .result()
            .map_err(|e| format!("nvrtcGetSupportedArchs failed: {e}"))?;
        Ok(archs)
    })
    .unwrap_or_else(|_| {
        Err("cudarc panicked while calling NVRTC (is libnvrtc older than 12.8?)".into())
    })
}

fn compile_uncached(src: &str, arch: &str) -> Result<Vec<u8>, String> {
    if let Ok(archs) = supported_archs() {
        let known = archs.iter().any(|a| format!("sm_{a}") == arch);
        if !known {
            let list: Vec<String> = archs.iter().map(|a| format!("sm_{a}")).collect();
            return Err(format!(
                "this NVRTC cannot compile for {arch} (it supports {}); use an NVRTC at \
                 least as new as the GPU",
                list.join(", ")
            ));
        }
    }
    let src = CString::new(src).map_err(|_| "kernel source contains a NUL byte".to_string())?;
    let prog = Program(
        result::create_program(&src, Some(c"monarch_tensor_kernels.cu"))
            .map_err(|e| format!("nvrtcCreateProgram failed: {e}"))?,
    );
    let options = [format!("--gpu-architecture={arch}")];
    // SAFETY: `prog` is a live program; `src` outlives it (dropped after `prog`).
    if let Err(e) = unsafe { result::compile_program(prog.0, &options) } {
        // SAFETY: as above.
        let log = unsafe { result::get_program_log(prog.0) }
            .map(|l| c_chars_to_string(&l))
            .unwrap_or_default();
        return Err(format!(
            "NVRTC could not compile the tensor kernels for {arch} ({e}):\n{log}"
        ));
    }
    let mut size = 0usize;
    // SAFETY: `prog` compiled successfully; `size` is a valid out pointer.
    unsafe { sys::nvrtcGetCUBINSize(prog.0, &mut size) }
        .result()
        .map_err(|e| format!("nvrtcGetCUBINSize failed: {e}"))?;
    let mut cubin = vec![0u8; size];
    // SAFETY: `cubin` has the `size` bytes NVRTC asked for.
    unsafe { sys::nvrtcGetCUBIN(prog.0, cubin.as_mut_ptr().cast::<c_char>()) }
        .result()
        .map_err(|e| format!("nvrtcGetCUBIN failed: {e}"))?;
    if cubin.is_empty() {
        return Err(format!("NVRTC returned an empty CUBIN for {arch}"));
    }
    Ok(cubin)
}

/// The CUBIN of `src` for `arch`, compiled once per process and architecture.
/// Errors are kept too, so a broken setup is reported the same way each time.
pub(crate) fn compile_cubin(src: &str, arch: &str) -> Result<Arc<Vec<u8>>, String> {
    type Cache = HashMap<(String, String), Result<Arc<Vec<u8>>, String>>;
    static CACHE: Mutex<Option<Cache>> = Mutex::new(None);
    let mut cache = CACHE.lock().unwrap_or_else(|p| p.into_inner());
    let cache = cache.get_or_insert_with(HashMap::new);
    let key = (src.to_string(), arch.to_string());
    if let Some(found) = cache.get(&key) {
        return found.clone();
    }
    let compiled = if nvrtc_present() {
        // cudarc panics if libnvrtc lacks a symbol it binds (a library older
        // than 12.8); report that instead of unwinding through the caller.
        std::panic::catch_unwind(|| compile_uncached(src, arch)).unwrap_or_else(|_| {
            Err("cudarc panicked while calling NVRTC (is libnvrtc older than 12.8?)".into())
        })
    } else {
        Err(NO_NVRTC.to_string())
    }
    .map(Arc::new);
    if let Ok(cubin) = &compiled {
        tracing::debug!(arch, bytes = cubin.len(), "compiled the tensor kernels");
    }
    cache.insert(key, compiled.clone());
    compiled
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::kernels;

    /// Compiles the kernels with NVRTC for the architectures we expect to
    /// meet (A100, H100/H200, and one older); needs libnvrtc but no GPU.
    /// Skips when the library is absent unless `MONARCH_REQUIRE_GPU=1`.
    #[test]
    fn kernels_compile_with_nvrtc() {
        if !nvrtc_present() {
            if std::env::var("MONARCH_REQUIRE_GPU").as_deref() == Ok("1") {
                panic!("MONARCH_REQUIRE_GPU=1 but libnvrtc was not found: {NO_NVRTC}");
            }
            eprintln!("SKIP kernels_compile_with_nvrtc: {NO_NVRTC}");
            return;
        }
        let (src, names) = kernels::source();
        let supported = supported_archs().unwrap_or_else(|e| panic!("{e}"));
        // Volta, Ampere, Hopper: whichever this NVRTC still knows (CUDA 13 dropped Volta).
        let archs: Vec<String> = [70, 80, 90]
            .into_iter()
            .filter(|a| supported.contains(a))
            .map(|a| format!("sm_{a}"))
            .collect();
        assert!(
            !archs.is_empty(),
            "NVRTC supports none of sm_70/80/90: {supported:?}"
        );
        for arch in &archs {
            let arch = arch.as_str();
            let cubin = compile_cubin(&src, arch).unwrap_or_else(|e| panic!("{e}"));
            assert!(cubin.starts_with(b"\x7fELF"), "{arch}: not an ELF image");
            for name in &names {
                let symbol = format!("{name}\0");
                assert!(
                    cubin.windows(symbol.len()).any(|w| w == symbol.as_bytes()),
                    "{arch}: kernel {name} missing from the CUBIN"
                );
            }
            // Cached: the same image comes back without recompiling.
            assert!(Arc::ptr_eq(&cubin, &compile_cubin(&src, arch).unwrap()));
        }
    }

    #[test]
    fn unknown_architectures_are_refused_clearly() {
        if !nvrtc_present() {
            eprintln!("SKIP unknown_architectures_are_refused_clearly: {NO_NVRTC}");
            return;
        }
        let err = compile_cubin("extern \"C\" __global__ void k() {}", "sm_1").unwrap_err();
        assert!(err.contains("cannot compile for sm_1"), "{err}");
    }

    #[test]
    fn compile_errors_carry_the_log() {
        if !nvrtc_present() {
            eprintln!("SKIP compile_errors_carry_the_log: {NO_NVRTC}");
            return;
        }
        let err = compile_cubin(
            "extern \"C\" __global__ void k() { undefined_name; }",
            "sm_80",
        )
        .unwrap_err();
        assert!(err.contains("undefined_name"), "{err}");
        assert!(err.contains("sm_80"), "{err}");
    }

    #[test]
    fn arch_names() {
        assert_eq!(arch_for(9, 0), "sm_90");
        assert_eq!(arch_for(8, 6), "sm_86");
    }
}
