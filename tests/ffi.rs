//! The C ABI: builds the cdylib the documented way, compiles the C examples against
//! `include/botmesh.h` with the system C compiler and runs them, runs the Python
//! `ctypes` demo against the same library; checks that the header's codes are the
//! Rust ones.
#![cfg(feature = "ffi")]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use botmesh::ffi::{OUTCOME_CODES, SESSION_CODES, STATUS_CODES};

/// The cdylib, built once for all the tests here the documented way (`cargo rustc
/// --features ffi --crate-type cdylib --lib`), in a target directory of its own (the
/// outer `cargo test` may hold the main one). Returns the directory holding it.
fn cdylib() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
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
        target.join("debug")
    })
}

/// Compiles `examples/c/<name>.c` against `include/botmesh.h` with the system C
/// compiler (warnings are errors, as in CI), runs it, and checks that it exits 0 and
/// prints `"ok":true`.
fn compile_and_run(name: &str) {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let lib_dir = cdylib();
    let exe = lib_dir.join(format!("c-{name}"));
    let source = format!("examples/c/{name}.c");
    let compiled = Command::new("cc")
        .current_dir(&root)
        .args(["-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&exe)
        .arg(&source)
        .arg("-Iinclude")
        .arg(format!("-L{}", lib_dir.display()))
        .args(["-lbotmesh", "-lpthread"])
        .status()
        .expect("run cc (is a C compiler installed?)");
    assert!(compiled.success(), "compiling {source} failed");
    let out = Command::new(&exe)
        .env("LD_LIBRARY_PATH", lib_dir)
        .output()
        .expect("run the C example");
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{source} failed: {stdout}");
    assert!(stdout.contains("\"ok\":true"), "{stdout}");
}

#[test]
fn the_c_example_compiles_and_runs() {
    compile_and_run("echo");
}

/// A C transport registered on two replicas: only the leader's starts, replies go
/// through it, a clean stop hands it to the standby with a greater token; the
/// metrics text shows the leader gauge.
#[test]
fn the_c_transport_example_runs_under_leadership() {
    compile_and_run("leader");
}

/// The Python `ctypes` demo against the same cdylib: a handler written in Python, a
/// transport started on the leader, the metrics text, a clean stop.
#[test]
fn the_python_ctypes_demo_runs() {
    let python = match Command::new("python3").arg("--version").output() {
        Ok(out) if out.status.success() => "python3",
        _ => {
            eprintln!("SKIPPED the_python_ctypes_demo_runs: python3 is not installed");
            return;
        }
    };
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let lib = cdylib().join(format!(
        "{}botmesh{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    ));
    let out = Command::new(python)
        .current_dir(&root)
        .arg("examples/python/echo_bot.py")
        .arg(&lib)
        .output()
        .expect("run python3");
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "the Python demo failed: {stdout}");
    assert!(stdout.contains("\"ok\":true"), "{stdout}");
    assert!(
        stdout.contains("botmesh_leader_election_master_status{name=\"py-phone\"} 1"),
        "{stdout}"
    );
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
    // Each table's names carry its prefix, and no other table's.
    let prefixes = ["BOTMESH_OUTCOME_", "BOTMESH_SESSION_"];
    for (table, codes, prefix) in [
        ("STATUS_CODES", STATUS_CODES, None),
        ("OUTCOME_CODES", OUTCOME_CODES, Some(prefixes[0])),
        ("SESSION_CODES", SESSION_CODES, Some(prefixes[1])),
    ] {
        let mut values = BTreeSet::new();
        for &(name, value) in codes {
            let has = prefixes.iter().copied().find(|p| name.starts_with(p));
            if has != prefix {
                problems.push(format!(
                    "{table} holds {name}, which belongs to another table"
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
