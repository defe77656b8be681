//! The checker itself, on small in-memory crates.

use super::circles_of;
use std::collections::HashMap;

fn circles(files: &[(&str, &str)]) -> Vec<String> {
    let sources: HashMap<&str, &str> = files.iter().copied().collect();
    let read = |path: &str| sources.get(path).map(|s| s.to_string());
    circles_of(&["c/src/lib.rs".to_string()], &read).unwrap()
}

#[test]
fn a_circle_is_found_with_its_names() {
    let found = circles(&[
        ("c/src/lib.rs", "mod a;\nmod b;"),
        ("c/src/a.rs", "use crate::b::B;\npub struct A(B);"),
        (
            "c/src/b.rs",
            "use super::a::{A, helper as _};\npub struct B;\nfn f(_: A) {}",
        ),
    ]);
    assert_eq!(
        found,
        ["circle: c/src/a.rs -> c/src/b.rs (B); c/src/b.rs -> c/src/a.rs (A)"]
    );
}

#[test]
fn a_path_in_code_is_an_import() {
    let found = circles(&[
        ("c/src/lib.rs", "mod a;\nmod b;"),
        ("c/src/a.rs", "pub fn run() { super::b::go() }"),
        ("c/src/b.rs", "use crate::a;\npub fn go() { a::run() }"),
    ]);
    assert_eq!(
        found,
        ["circle: c/src/a.rs -> c/src/b.rs (go); c/src/b.rs -> c/src/a.rs (run)"]
    );
}

#[test]
fn a_reexport_is_not_an_edge_but_is_followed() {
    // lib.rs re-exports A and B; a.rs and b.rs import through it: a chain, no circle.
    let files = [
        (
            "c/src/lib.rs",
            "mod a;\nmod b;\npub use a::A;\npub use b::B;",
        ),
        ("c/src/a.rs", "use crate::B;\npub struct A(B);"),
        ("c/src/b.rs", "pub struct B;"),
    ];
    assert!(circles(&files).is_empty());
    // Followed through the re-export, b.rs -> a.rs closes a circle with a.rs -> b.rs.
    let files = [
        (
            "c/src/lib.rs",
            "mod a;\nmod b;\npub use a::A;\npub use b::B;",
        ),
        ("c/src/a.rs", "use crate::B;\npub struct A(B);"),
        ("c/src/b.rs", "pub struct B;\nfn f(_: crate::A) {}"),
    ];
    assert_eq!(
        circles(&files),
        ["circle: c/src/a.rs -> c/src/b.rs (B); c/src/b.rs -> c/src/a.rs (A)"]
    );
}

#[test]
fn a_cfg_test_block_is_ignored() {
    let found = circles(&[
        ("c/src/lib.rs", "mod a;\nmod b;"),
        ("c/src/a.rs", "use crate::b::B;\npub struct A(B);"),
        (
            "c/src/b.rs",
            "pub struct B;\n#[cfg(test)]\nmod tests {\n    use super::super::a::A;\n    #[test]\n    fn t() { let _ = crate::a::A(super::B); }\n}",
        ),
    ]);
    assert!(found.is_empty(), "{found:?}");
}

#[test]
fn a_chain_without_a_cycle_passes() {
    let found = circles(&[
        ("c/src/lib.rs", "mod a;\nmod b;\nmod c;\npub use a::A;"),
        ("c/src/a.rs", "use crate::b::B;\npub struct A(B);"),
        (
            "c/src/b.rs",
            "use super::c::{C, make};\npub struct B(C);\nfn f() -> C { make() }",
        ),
        ("c/src/c.rs", "pub struct C;\npub fn make() -> C { C }"),
    ]);
    assert!(found.is_empty(), "{found:?}");
}

#[test]
fn words_in_comments_and_strings_are_not_imports() {
    let found = circles(&[
        ("c/src/lib.rs", "mod a;\nmod b;"),
        ("c/src/a.rs", "use crate::b::B;\npub struct A(B);"),
        (
            "c/src/b.rs",
            "// use crate::a::A;\n/* crate::a::A */\npub struct B;\nconst S: &str = \"crate::a::A\";\nconst R: &str = r#\"crate::a::A\"#;\nfn f<'a>(_: &'a str) -> char { '\\'' }",
        ),
    ]);
    assert!(found.is_empty(), "{found:?}");
}

#[test]
fn nested_modules_and_directories_resolve() {
    let found = circles(&[
        ("c/src/lib.rs", "mod outer;"),
        (
            "c/src/outer/mod.rs",
            "mod left;\nmod right;\npub use left::L;",
        ),
        ("c/src/outer/left.rs", "mod deep;\npub use deep::L;"),
        (
            "c/src/outer/left/deep.rs",
            "pub struct L(super::super::right::R);",
        ),
        (
            "c/src/outer/right.rs",
            "pub struct R;\nimpl R { fn l(&self) -> Option<super::L> { None } }",
        ),
    ]);
    assert_eq!(
        found,
        [
            "circle: c/src/outer/left/deep.rs -> c/src/outer/right.rs (R); c/src/outer/right.rs -> c/src/outer/left/deep.rs (L)"
        ]
    );
}

fn folder_ties(files: &[(&str, &str)]) -> Vec<String> {
    let sources: HashMap<&str, &str> = files.iter().copied().collect();
    let read = |path: &str| sources.get(path).map(|s| s.to_string());
    super::folder_ties_of(&["c/src/lib.rs".to_string()], &read).unwrap()
}

#[test]
fn two_folders_that_import_each_other_are_a_tie_though_no_files_circle() {
    // a/x.rs -> b/y.rs and b/z.rs -> a/w.rs: four files, no file circle, but a/ and b/ are tied.
    let files = [
        ("c/src/lib.rs", "mod a;\nmod b;"),
        ("c/src/a/mod.rs", "pub mod w;\npub mod x;"),
        ("c/src/a/w.rs", "pub struct W;"),
        ("c/src/a/x.rs", "use crate::b::y::Y;\npub struct X(Y);"),
        ("c/src/b/mod.rs", "pub mod y;\npub mod z;"),
        ("c/src/b/y.rs", "pub struct Y;"),
        ("c/src/b/z.rs", "use crate::a::w::W;\npub struct Z(W);"),
    ];
    assert!(circles(&files).is_empty());
    assert_eq!(
        folder_ties(&files),
        [
            "folder-tie in c/src: a/ -> b/ (Y: c/src/a/x.rs -> c/src/b/y.rs); \
          b/ -> a/ (W: c/src/b/z.rs -> c/src/a/w.rs)"
        ]
    );
}

#[test]
fn a_file_and_a_folder_beside_it_that_import_each_other_are_a_tie() {
    // plan.rs uses elastic/agent.rs and elastic/retry.rs uses plan.rs; `elastic.rs` is the
    // folder's module file, so it belongs to elastic/.
    let files = [
        ("c/src/lib.rs", "mod elastic;\nmod plan;"),
        ("c/src/elastic.rs", "pub mod agent;\npub mod retry;"),
        ("c/src/elastic/agent.rs", "pub struct Agent;"),
        (
            "c/src/elastic/retry.rs",
            "use crate::plan::Plan;\npub struct Retry(Plan);",
        ),
        (
            "c/src/plan.rs",
            "use crate::elastic::agent::Agent;\npub struct Plan;\nfn f(_: Agent) {}",
        ),
    ];
    assert!(circles(&files).is_empty());
    assert_eq!(
        folder_ties(&files),
        [
            "folder-tie in c/src: elastic/ -> plan.rs (Plan: c/src/elastic/retry.rs -> c/src/plan.rs); \
          plan.rs -> elastic/ (Agent: c/src/plan.rs -> c/src/elastic/agent.rs)"
        ]
    );
}

#[test]
fn imports_in_one_direction_between_folders_and_files_inside_one_folder_are_no_tie() {
    let files = [
        ("c/src/lib.rs", "mod a;\nmod b;\nmod top;"),
        ("c/src/a/mod.rs", "pub mod x;\npub mod y;"),
        (
            "c/src/a/x.rs",
            "use super::y::Y;\nuse crate::b::B;\npub struct X(Y, B);",
        ),
        ("c/src/a/y.rs", "use crate::b::B;\npub struct Y(B);"),
        ("c/src/b/mod.rs", "pub struct B;"),
        ("c/src/top.rs", "use crate::a::x::X;\npub struct Top(X);"),
    ];
    assert!(folder_ties(&files).is_empty());
}
