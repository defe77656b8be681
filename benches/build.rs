//! With the `tch` feature: an rpath to libtorch's shared libraries on the benches (as
//! ddp-examples' and ddp-core's `build.rs` do: torch-sys gives the programs that link libtorch no
//! rpath; it passes its directory on as `DEP_TCH_LIBTORCH_LIB`).

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
