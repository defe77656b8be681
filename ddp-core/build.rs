//! With the `tch` feature: an rpath to libtorch's shared libraries on this crate's tests,
//! examples and benches, so that they run without `LD_LIBRARY_PATH`.
//!
//! torch-sys (the LibTorch backend's bindings) links `libtorch_cpu.so`, `libtorch.so` and
//! `libc10.so` from wherever it found libtorch (a pip-installed PyTorch with
//! `LIBTORCH_USE_PYTORCH=1`, or `LIBTORCH`) but gives the programs linking it no rpath, and cargo
//! adds only search paths inside its target directory to `LD_LIBRARY_PATH`: without this, the
//! test binary fails to start ("libtorch_cpu.so: cannot open shared object file"). torch-sys
//! passes the directory on as `DEP_TCH_LIBTORCH_LIB` to the crates that depend on it directly
//! (ddp-core does, with `tch`). A build script's link arguments reach only its own package's
//! targets: a user's program that trains on LibTorch sets `LD_LIBRARY_PATH` to that directory, or
//! gets the same rpath from a build script of its own (ddp-examples' includes this file as a
//! module and calls its `main`).

pub(crate) fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=DEP_TCH_LIBTORCH_LIB");
    if let Some(dir) = std::env::var_os("DEP_TCH_LIBTORCH_LIB") {
        match dir.to_str() {
            Some(dir) if !dir.contains(',') => {
                println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
            }
            // `-Wl,` splits its argument at commas, and cargo's instructions are UTF-8 text.
            _ => println!(
                "cargo:warning=libtorch's directory {} cannot be passed as an rpath (not UTF-8, or \
                 it contains a comma): set LD_LIBRARY_PATH to it to run the LibTorch tests",
                dir.display()
            ),
        }
    }
}
