//! The crate's shape, checked: no source file over 800 lines, and no import cycle,
//! neither among the crate's top-level modules nor among the files of one folder
//! module. The rule (see `src/lib.rs`): a module uses only modules below it.
//!
//! The check reads `src/` as text. A module's uses are its `crate::x` paths (a name
//! re-exported at the crate root counts as a use of the module that defines it) and,
//! inside a folder, its `super::x` and `self::x` paths. Comments and inline test
//! modules (from `#[cfg(test)]` on) are left out.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

const MAX_LINES: usize = 800;

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<PathBuf> = fs::read_dir(dir)
        .expect("read src")
        .map(|e| e.expect("dir entry").path())
        .collect();
    entries.sort();
    for p in entries {
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|e| e == "rs") {
            out.push(p);
        }
    }
}

/// The code of a file without comments and without its inline tests.
fn code(text: &str) -> String {
    let mut out = String::new();
    for line in text.lines() {
        let t = line.trim_start();
        if t.starts_with("#[cfg(test)]") {
            break;
        }
        if t.starts_with("//") {
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The first identifiers of every path that starts with `prefix::` (`crate`,
/// `super`, `self`), looking into one level of braces: `crate::{a::X, b}` gives `a`
/// and `b`.
fn heads(code: &str, prefix: &str) -> BTreeSet<String> {
    let pat = format!("{prefix}::");
    let mut found = BTreeSet::new();
    let bytes = code.as_bytes();
    let mut at = 0;
    while let Some(i) = code[at..].find(&pat) {
        let start = at + i;
        at = start + pat.len();
        // A whole-word match only (`myself::` is not `self::`).
        if start > 0 && is_ident(bytes[start - 1] as char) {
            continue;
        }
        let rest = &code[at..];
        if let Some(inner) = rest.strip_prefix('{') {
            let mut depth = 1;
            let mut word = String::new();
            let mut expecting = true;
            for c in inner.chars() {
                // The first word of each top-level item, ended by any other character.
                if depth == 1 && expecting {
                    if is_ident(c) {
                        word.push(c);
                    } else if !word.is_empty() {
                        found.insert(std::mem::take(&mut word));
                        expecting = false;
                    }
                }
                match c {
                    '{' => depth += 1,
                    '}' => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    ',' if depth == 1 => expecting = true,
                    _ => {}
                }
            }
        } else {
            let word: String = rest.chars().take_while(|c| is_ident(*c)).collect();
            if !word.is_empty() {
                found.insert(word);
            }
        }
    }
    found
}

/// A cycle in `edges`, as the nodes along it, if there is one.
fn cycle(edges: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        n: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(n.to_owned(), 1);
        path.push(n.to_owned());
        for m in edges.get(n).into_iter().flatten() {
            match state.get(m.as_str()).copied().unwrap_or(0) {
                1 => {
                    let from = path.iter().position(|p| p == m).unwrap_or(0);
                    let mut c = path[from..].to_vec();
                    c.push(m.clone());
                    return Some(c);
                }
                0 => {
                    if let Some(c) = visit(m, edges, state, path) {
                        return Some(c);
                    }
                }
                _ => {}
            }
        }
        path.pop();
        state.insert(n.to_owned(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for n in edges.keys() {
        if state.get(n.as_str()).copied().unwrap_or(0) == 0
            && let Some(c) = visit(n, edges, &mut state, &mut Vec::new())
        {
            return Some(c);
        }
    }
    None
}

/// The top-level modules (`mod x;` in lib.rs) and, for each name re-exported at the
/// crate root, the module that defines it.
fn root(lib: &str) -> (BTreeSet<String>, BTreeMap<String, String>) {
    let lib = code(lib);
    let mut modules = BTreeSet::new();
    for line in lib.lines() {
        let t = line.trim();
        let t = t.strip_prefix("pub ").unwrap_or(t);
        if let Some(name) = t.strip_prefix("mod ").and_then(|r| r.strip_suffix(';')) {
            modules.insert(name.to_owned());
        }
    }
    let mut names = BTreeMap::new();
    for stmt in lib.split(';') {
        let Some(at) = stmt.find("use ") else {
            continue;
        };
        let path = &stmt[at + "use ".len()..];
        let path = path.strip_prefix("self::").unwrap_or(path);
        let Some((module, rest)) = path.split_once("::") else {
            continue;
        };
        let list = rest.trim().trim_start_matches('{').trim_end_matches('}');
        for name in list.split(',') {
            let name = name.trim();
            if !name.is_empty() {
                names.insert(name.to_owned(), module.trim().to_owned());
            }
        }
    }
    (modules, names)
}

#[test]
fn no_source_file_is_over_800_lines() {
    let mut files = Vec::new();
    rust_files(Path::new("src"), &mut files);
    let long: Vec<String> = files
        .iter()
        .filter_map(|p| {
            let n = fs::read_to_string(p).expect("read").lines().count();
            (n > MAX_LINES).then(|| format!("{} ({n} lines)", p.display()))
        })
        .collect();
    assert!(long.is_empty(), "over {MAX_LINES} lines: {long:?}");
}

#[test]
fn modules_form_layers_without_import_cycles() {
    let (modules, names) = root(&fs::read_to_string("src/lib.rs").expect("lib.rs"));
    assert!(modules.contains("replica") && names.contains_key("Bot"));
    let mut files = Vec::new();
    rust_files(Path::new("src"), &mut files);
    let mut top: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut folders: BTreeMap<String, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for path in &files {
        let rel = path.strip_prefix("src").expect("under src");
        let parts: Vec<String> = rel
            .iter()
            .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_owned())
            .collect();
        if parts == ["lib"] || parts.last().is_some_and(|p| p.ends_with("_tests")) {
            continue;
        }
        let module = parts[0].clone();
        let text = code(&fs::read_to_string(path).expect("read"));
        let uses = top.entry(module.clone()).or_default();
        for head in heads(&text, "crate") {
            let target = if modules.contains(&head) {
                Some(head)
            } else {
                names.get(&head).cloned()
            };
            if let Some(t) = target.filter(|t| *t != module) {
                uses.insert(t);
            }
        }
        if parts.len() == 2 {
            // A file of a folder module: its uses of its siblings and of `mod.rs`.
            let folder = folders.entry(module.clone()).or_default();
            let file = parts[1].clone();
            let siblings: BTreeSet<String> = fs::read_dir(Path::new("src").join(&module))
                .expect("folder")
                .map(|e| {
                    e.expect("entry")
                        .path()
                        .file_stem()
                        .map(|s| s.to_string_lossy().into_owned())
                        .unwrap_or_default()
                })
                .collect();
            let mut local = heads(&text, "super");
            if file == "mod" {
                local = heads(&text, "self");
                // `mod.rs` names its parts directly too: `use part::X;`, `part::f()`.
                for s in &siblings {
                    if text.contains(&format!("use {s}::")) || text.contains(&format!(" {s}::")) {
                        local.insert(s.clone());
                    }
                }
            }
            // A name `mod.rs` re-exports from one of its parts belongs to that part.
            let (_, reexported) = root(
                &fs::read_to_string(Path::new("src").join(&module).join("mod.rs"))
                    .unwrap_or_default(),
            );
            let edges = folder.entry(file.clone()).or_default();
            for head in local {
                let target = if siblings.contains(&head) {
                    head
                } else if let Some(part) = reexported.get(&head).filter(|p| siblings.contains(*p)) {
                    part.clone()
                } else {
                    "mod".to_owned()
                };
                if target != file {
                    edges.insert(target);
                }
            }
        }
    }
    if let Some(c) = cycle(&top) {
        panic!("import cycle among modules: {}", c.join(" -> "));
    }
    for (folder, edges) in &folders {
        if let Some(c) = cycle(edges) {
            panic!("import cycle inside {folder}/: {}", c.join(" -> "));
        }
    }
}

#[test]
fn the_cycle_finder_finds_cycles() {
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    edges.entry("a".into()).or_default().insert("b".into());
    edges.entry("b".into()).or_default().insert("c".into());
    assert_eq!(cycle(&edges), None);
    edges.entry("c".into()).or_default().insert("a".into());
    assert_eq!(
        cycle(&edges),
        Some(vec!["a".into(), "b".into(), "c".into(), "a".into()])
    );
    let found = heads(
        "use crate::{a::{X, Y}, b, c::d};\nlet x = crate::e::f();",
        "crate",
    );
    let want: BTreeSet<String> = ["a", "b", "c", "e"].iter().map(|s| s.to_string()).collect();
    assert_eq!(found, want);
}
