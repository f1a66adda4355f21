//! The C ABI: builds the cdylib the documented way, compiles the C example against
//! `include/botmesh.h` with the system C compiler, and runs it; checks that the
//! header's codes are the Rust ones.
#![cfg(feature = "ffi")]

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Command;

use botmesh::ffi::{OUTCOME_CODES, STATUS_CODES};

#[test]
fn the_c_example_compiles_and_runs() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    // A target directory of its own: the outer `cargo test` may hold the main one.
    let target = root.join("target").join("ffi-test");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let built = Command::new(cargo)
        .current_dir(&root)
        .env("CARGO_TARGET_DIR", &target)
        .args([
            "rustc",
            "--features",
            "ffi",
            "--crate-type",
            "cdylib",
            "--lib",
        ])
        .status()
        .expect("run cargo rustc");
    assert!(built.success(), "building the cdylib failed");
    let lib_dir = target.join("debug");
    let exe = target.join("echo");
    let compiled = Command::new("cc")
        .current_dir(&root)
        .args(["-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&exe)
        .arg("examples/c/echo.c")
        .arg("-Iinclude")
        .arg(format!("-L{}", lib_dir.display()))
        .args(["-lbotmesh", "-lpthread"])
        .status()
        .expect("run cc (is a C compiler installed?)");
    assert!(compiled.success(), "compiling examples/c/echo.c failed");
    let out = Command::new(&exe)
        .env("LD_LIBRARY_PATH", &lib_dir)
        .output()
        .expect("run the C example");
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the C example failed: {stdout}");
    assert!(stdout.contains("\"ok\":true"), "{stdout}");
}

/// The integer `#define`s and enumerators (`NAME = value`) named `BOTMESH_*` in a C
/// header, in order, and every `BOTMESH_*` word it mentions (code and comments).
fn header_codes(header: &str) -> (Vec<(String, i64)>, BTreeSet<String>) {
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut defined = Vec::new();
    let mut mentioned = BTreeSet::new();
    for line in header.lines() {
        let code = line.split("/*").next().unwrap_or("").trim();
        let tokens: Vec<&str> = code
            .split(|c: char| c.is_whitespace() || c == ',' || c == '=' || c == '{')
            .filter(|t| !t.is_empty())
            .collect();
        let value = match tokens.as_slice() {
            ["#define", name, value] => Some((*name, *value)),
            [name, value] if code.contains('=') => Some((*name, *value)),
            _ => None,
        };
        if let Some((name, value)) = value.filter(|(n, _)| n.starts_with("BOTMESH_")) {
            let value = value
                .parse()
                .unwrap_or_else(|_| panic!("botmesh.h: {name} = {value:?} is not an integer"));
            defined.push((name.to_owned(), value));
        }
        mentioned.extend(
            line.split(|c: char| !word(c))
                .filter(|w| w.starts_with("BOTMESH_"))
                .map(str::to_owned),
        );
    }
    (defined, mentioned)
}

/// `include/botmesh.h` restates the codes of `botmesh::ffi`; a code added, removed,
/// renamed or renumbered on one side only would make C and Rust disagree silently.
#[test]
fn header_codes_match_the_rust_ones() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let header = std::fs::read_to_string(root.join("include/botmesh.h")).expect("read botmesh.h");
    let (defined, mentioned) = header_codes(&header);
    let mut problems = Vec::new();

    let mut rust = BTreeMap::new();
    for (table, codes, outcome) in [
        ("STATUS_CODES", STATUS_CODES, false),
        ("OUTCOME_CODES", OUTCOME_CODES, true),
    ] {
        let mut values = BTreeSet::new();
        for &(name, value) in codes {
            if name.starts_with("BOTMESH_OUTCOME_") != outcome {
                problems.push(format!(
                    "{table} holds {name}, which belongs to the other table"
                ));
            }
            if !values.insert(value) {
                problems.push(format!("{table}: {name} reuses the value {value}"));
            }
            rust.insert(name.to_owned(), i64::from(value));
        }
    }

    let mut c = BTreeMap::new();
    for (name, value) in defined {
        if let Some(old) = c.insert(name.clone(), value) {
            problems.push(format!(
                "botmesh.h defines {name} twice ({old} and {value})"
            ));
        }
    }
    for (name, &value) in &rust {
        match c.get(name) {
            None => problems.push(format!("botmesh.h lacks {name} (Rust: {value})")),
            Some(&v) if v != value => {
                problems.push(format!("{name} is {v} in botmesh.h but {value} in Rust"))
            }
            Some(_) => {}
        }
    }
    for (name, value) in &c {
        if !rust.contains_key(name) {
            problems.push(format!(
                "botmesh.h defines {name} = {value}, unknown to Rust"
            ));
        }
    }
    // A code named only in prose or in an enumerator without a value is drift too.
    for name in mentioned {
        if name != "BOTMESH_H" && !rust.contains_key(&name) && !c.contains_key(&name) {
            problems.push(format!(
                "botmesh.h mentions {name}, which has no value on either side"
            ));
        }
    }
    assert!(
        problems.is_empty(),
        "include/botmesh.h and botmesh::ffi disagree:\n  {}",
        problems.join("\n  ")
    );
}
