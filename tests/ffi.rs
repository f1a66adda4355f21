//! The C ABI: builds the cdylib the documented way, compiles the C example against
//! `include/botmesh.h` with the system C compiler, and runs it.
#![cfg(feature = "ffi")]

use std::path::PathBuf;
use std::process::Command;

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
