//! The repository stands alone: every requirement ID the code and tests cite is defined in
//! docs/requirements.md (or, for `KMQ-` IDs, docs/kubemq-behaviour.md), and every document they
//! cite is in the repository; every source file and folder docs/architecture.md walks through
//! exists.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The ID families of the specification and of docs/kubemq-behaviour.md.
const FAMILIES: [&str; 22] = [
    "ADDR", "AUD", "CFG", "CONN", "ENV", "ERR", "ES", "EV", "FLOW", "GEN", "KMQ", "LINK", "MET",
    "NG", "OBS", "Q", "RPC", "SASL", "SEC", "SEL", "SESS", "XFER",
];

/// Source files, by the extensions of the languages the project is written and tested in.
const SOURCES: [&str; 6] = ["rs", "py", "js", "go", "java", "sh"];

/// Folders that hold no source of the project's own.
const SKIP: [&str; 5] = [
    "target",
    "node_modules",
    ".git",
    "tests/go/bin",
    "fuzz/corpus",
];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the repository root")
        .to_path_buf()
}

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let path = e.path();
        let rel = path
            .strip_prefix(root())
            .unwrap_or(&path)
            .to_string_lossy()
            .to_string();
        if SKIP.iter().any(|s| rel.ends_with(s)) {
            continue;
        }
        if path.is_dir() {
            sources(&path, out);
        } else if path
            .extension()
            .and_then(|x| x.to_str())
            .is_some_and(|x| SOURCES.contains(&x))
        {
            out.push(path);
        }
    }
}

/// The requirement IDs in `text`: `FAMILY-N`, `OP-FAMILY-N` and `Q-SN`, as whole words.
fn ids(text: &str) -> Vec<String> {
    let b = text.as_bytes();
    let word = |c: u8| c.is_ascii_alphanumeric() || c == b'_' || c == b'-';
    let mut found = Vec::new();
    let mut i = 0;
    while i < b.len() {
        if !b[i].is_ascii_uppercase() || (i > 0 && word(b[i - 1])) {
            i += 1;
            continue;
        }
        let mut j = i;
        while j < b.len() && (b[j].is_ascii_alphanumeric() || b[j] == b'-') {
            j += 1;
        }
        let token = text[i..j].trim_end_matches('-');
        let bare = token.strip_prefix("OP-").unwrap_or(token);
        if let Some((family, number)) = bare.split_once('-') {
            let number = number
                .strip_prefix('S')
                .filter(|_| family == "Q")
                .unwrap_or(number);
            if FAMILIES.contains(&family)
                && !number.is_empty()
                && number.len() <= 3
                && number.bytes().all(|c| c.is_ascii_digit())
            {
                found.push(token.to_string());
            }
        }
        i = j.max(i + 1);
    }
    found
}

/// The Markdown documents `text` names (`name.md`, with any path before it).
fn documents(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for (at, _) in text.match_indices(".md") {
        let after = text[at + 3..].chars().next();
        if after.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let start = text[..at]
            .rfind(|c: char| !(c.is_alphanumeric() || "_-./".contains(c)))
            .map_or(0, |p| p + 1);
        let name = &text[start..at + 3];
        if name.len() > 3 {
            found.push(name.to_string());
        }
    }
    found
}

/// IDs defined by a document: the first cell of its table rows, and `## ID` headings.
fn defined(doc: &str) -> BTreeSet<String> {
    let text = std::fs::read_to_string(root().join(doc)).expect(doc);
    let mut out = BTreeSet::new();
    for line in text.lines() {
        let head = if let Some(row) = line.strip_prefix("| ") {
            row.split('|').next().unwrap_or("")
        } else if let Some(h) = line.strip_prefix("## ") {
            h.split(' ').next().unwrap_or("")
        } else {
            continue;
        };
        out.extend(ids(head));
    }
    out
}

#[test]
fn every_cited_requirement_and_document_is_in_the_repository() {
    let mut defs = defined("docs/requirements.md");
    defs.extend(defined("docs/kubemq-behaviour.md"));
    let mut files = Vec::new();
    sources(&root(), &mut files);
    assert!(files.len() > 100, "only {} source files found", files.len());
    let mut undefined: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut missing_docs: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let me = root().join("tests/tests/requirements.rs");
    for f in files.iter().filter(|f| **f != me) {
        let Ok(text) = std::fs::read_to_string(f) else {
            continue;
        };
        let rel = f.strip_prefix(root()).unwrap_or(f).display().to_string();
        for id in ids(&text) {
            if !defs.contains(&id) {
                undefined.entry(id).or_default().insert(rel.clone());
            }
        }
        for doc in documents(&text) {
            let here = f.parent().unwrap_or(&root()).join(&doc);
            let exists = root().join(&doc).exists()
                || root().join("docs").join(&doc).exists()
                || here.exists();
            if !exists {
                missing_docs.entry(doc).or_default().insert(rel.clone());
            }
        }
    }
    // The documents themselves cite only documents that exist, too.
    let mut markdown = vec![root().join("README.md"), root().join("BENCHMARKS.md")];
    for dir in ["docs", "crds"] {
        if let Ok(entries) = std::fs::read_dir(root().join(dir)) {
            markdown.extend(
                entries
                    .flatten()
                    .map(|e| e.path())
                    .filter(|p| p.extension().is_some_and(|x| x == "md")),
            );
        }
    }
    for f in &markdown {
        let text = std::fs::read_to_string(f).unwrap_or_default();
        let rel = f.strip_prefix(root()).unwrap_or(f).display().to_string();
        for doc in documents(&text) {
            let here = f.parent().unwrap_or(&root()).join(&doc);
            if !(root().join(&doc).exists() || here.exists()) {
                missing_docs.entry(doc).or_default().insert(rel.clone());
            }
        }
    }
    assert!(
        undefined.is_empty(),
        "IDs cited but not defined in docs/requirements.md or docs/kubemq-behaviour.md: {undefined:#?}"
    );
    assert!(
        missing_docs.is_empty(),
        "documents cited but not in the repository: {missing_docs:#?}"
    );
}

/// The names of functions (Rust `fn`, Go `func`, Python `def`, Java `void`) in `text`.
fn function_names(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for keyword in ["fn ", "func ", "def ", "void "] {
        for (at, _) in text.match_indices(keyword) {
            let boundary = at == 0 || !text.as_bytes()[at - 1].is_ascii_alphanumeric();
            let name: String = text[at + keyword.len()..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if boundary && !name.is_empty() {
                out.push(name);
            }
        }
    }
    out
}

/// Every test docs/requirements.md names as pinning a requirement exists: a renamed or deleted
/// test cannot leave a requirement that only looks pinned.
#[test]
fn every_pinning_test_named_in_the_requirements_exists() {
    let mut files = Vec::new();
    sources(&root(), &mut files);
    let mut functions = BTreeSet::new();
    for f in &files {
        functions.extend(function_names(
            &std::fs::read_to_string(f).unwrap_or_default(),
        ));
    }
    let text = std::fs::read_to_string(root().join("docs/requirements.md")).expect("requirements");
    let mut missing: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut named = 0;
    for row in text
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| ID"))
    {
        let cells: Vec<&str> = row.trim_end_matches('|').split(" | ").collect();
        let (Some(id), Some(pinned)) = (cells.first(), cells.last()) else {
            continue;
        };
        for name in pinned.split('`').skip(1).step_by(2) {
            named += 1;
            if !functions.contains(name) {
                missing
                    .entry(id.trim_start_matches("| ").to_string())
                    .or_default()
                    .push(name.to_string());
            }
        }
    }
    assert!(named > 300, "only {named} pinning tests named");
    assert!(
        missing.is_empty(),
        "tests named in docs/requirements.md that do not exist: {missing:#?}"
    );
}

/// The source files and folders a page names in backticks (`a/b.rs`, `bridge/events/`).
fn source_paths(text: &str) -> Vec<&str> {
    text.split('`')
        .skip(1)
        .step_by(2)
        .filter(|t| {
            (t.ends_with(".rs") || t.ends_with('/'))
                && t.contains('/')
                && t.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "/._-".contains(c))
        })
        .collect()
}

#[test]
fn every_file_the_architecture_page_names_exists() {
    let page = std::fs::read_to_string(root().join("docs/architecture.md")).expect("the page");
    let named = source_paths(&page);
    assert!(named.len() > 30, "only {} paths named", named.len());
    // Paths inside the connector are written from `connector/src/`, as its modules name them.
    let missing: Vec<&str> = named
        .into_iter()
        .filter(|p| !root().join(p).exists() && !root().join("connector/src").join(p).exists())
        .collect();
    assert!(missing.is_empty(), "docs/architecture.md names {missing:?}");
}

#[test]
fn the_scanner_finds_ids_and_documents() {
    assert_eq!(
        ids("CONN-11. (OP-ADDR-3, Q-S2; KMQ-5) SHA-256 UTF-8 xQ-1 Q-12a"),
        ["CONN-11", "OP-ADDR-3", "Q-S2", "KMQ-5"]
    );
    assert_eq!(
        documents("see docs/decisions.md, kubemq-grpc.md §4 and README.md."),
        ["docs/decisions.md", "kubemq-grpc.md", "README.md"]
    );
    assert_eq!(
        source_paths("`store/log.rs` and `bridge/events/`, not `fdatasync` or `a b/`"),
        ["store/log.rs", "bridge/events/"]
    );
}
