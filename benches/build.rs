//! With the `tch` feature: an rpath to libtorch's shared libraries on the benches. torch-sys
//! gives the programs that link libtorch no rpath and a build script's link arguments reach only
//! its own package's targets, so this runs ddp-core's `build.rs` again, for this package (as
//! ddp-examples' does): it reads the directory torch-sys passes on as `DEP_TCH_LIBTORCH_LIB`.

#[path = "../ddp-core/build.rs"]
mod libtorch_rpath;

fn main() {
    println!("cargo:rerun-if-changed=../ddp-core/build.rs");
    libtorch_rpath::main();
}
