//! With the `tch` feature: an rpath to libtorch's shared libraries on the example binaries
//! (`digits --backend tch` runs without `LD_LIBRARY_PATH`). torch-sys links libtorch from where
//! it found it (`LIBTORCH_USE_PYTORCH=1` or `LIBTORCH`) without an rpath, and a build script's link
//! arguments reach only its own package's targets, so this repeats ddp-core's `build.rs`: it reads
//! the directory torch-sys passes on as `DEP_TCH_LIBTORCH_LIB`.

fn main() {
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
