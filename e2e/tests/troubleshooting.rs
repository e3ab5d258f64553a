//! README's troubleshooting table against the binaries: every CNI error
//! code, Event reason and Allocate refusal the table quotes is one the
//! binaries produce, and every one they can produce has a row. What they
//! produce comes from the crates' own lists (`macvtap_cni::error::CODES`,
//! `macvtap_deviceplugin::operator::events::REASONS`,
//! `macvtap_deviceplugin::error::ALLOCATE_REFUSALS`), which their unit tests
//! check against the error and event enums.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::path::Path;

/// The heading of the section that holds the table.
const HEADING: &str = "### Troubleshooting";

/// What one row of the table quotes in its "code or reason" column.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Key {
    /// A CNI error code.
    Cni(u32),
    /// A Node Event's reason.
    Event(String),
    /// An Allocate refusal: the gRPC code's name and the words of its
    /// message (empty for the catch-all `Internal`).
    Allocate { code: String, words: String },
    /// The scheduler's message for a pod no node has room for.
    Scheduler(String),
}

fn readme() -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md")).unwrap()
}

/// The keys of the table under [`HEADING`] in `readme`, in row order; an
/// error names a row that cannot be read.
fn table(readme: &str) -> Result<Vec<Key>, String> {
    let section = readme
        .split_once(&format!("\n{HEADING}\n"))
        .ok_or("README has no troubleshooting section")?
        .1;
    let section = section.split("\n#").next().unwrap_or(section);
    let rows: Vec<&str> = section
        .lines()
        .filter(|l| l.starts_with('|'))
        .skip(2) // the header and its separator
        .collect();
    if rows.is_empty() {
        return Err("the troubleshooting section has no table".into());
    }
    let mut keys = Vec::new();
    for row in rows {
        let cells: Vec<&str> = row.trim().trim_matches('|').split('|').collect();
        if cells.len() != 4 {
            return Err(format!("not 4 cells: {row}"));
        }
        let cell = cells[1].trim();
        let quoted: Vec<&str> = cell.split('`').skip(1).step_by(2).collect();
        let kind = cell.split_whitespace().next().unwrap_or("");
        match (kind, quoted.as_slice()) {
            ("CNI", [code]) => keys.push(Key::Cni(
                code.parse().map_err(|_| format!("not a code: {cell}"))?,
            )),
            ("Event", reasons) if !reasons.is_empty() => {
                keys.extend(reasons.iter().map(|r| Key::Event(r.to_string())))
            }
            ("Allocate", [code]) => keys.push(Key::Allocate {
                code: code.to_string(),
                words: String::new(),
            }),
            ("Allocate", [code, words]) => keys.push(Key::Allocate {
                code: code.to_string(),
                words: words.to_string(),
            }),
            ("scheduler", [message]) => keys.push(Key::Scheduler(message.to_string())),
            _ => return Err(format!("cannot read the code or reason {cell:?}")),
        }
    }
    Ok(keys)
}

/// Every key the binaries can produce, from their crates' own lists.
fn produced() -> BTreeSet<Key> {
    let mut keys = BTreeSet::new();
    keys.extend(macvtap_cni::error::CODES.iter().map(|c| Key::Cni(*c)));
    keys.extend(
        macvtap_deviceplugin::operator::events::REASONS
            .iter()
            .map(|r| Key::Event(r.to_string())),
    );
    keys.extend(
        macvtap_deviceplugin::error::ALLOCATE_REFUSALS
            .iter()
            .map(|r| Key::Allocate {
                code: format!("{:?}", r.code),
                words: r.words.to_string(),
            }),
    );
    // kube-scheduler's NodeResourcesFit: `fmt.Sprintf("Insufficient %v", rName)`.
    keys.insert(Key::Scheduler(format!(
        "Insufficient {}/<name>",
        macvtap_link::RESOURCE_PREFIX
    )));
    keys
}

/// What is wrong between the table's keys and the produced ones: rows
/// quoting what nothing produces, produced keys without a row, rows twice.
fn mismatches(table: &[Key], produced: &BTreeSet<Key>) -> Vec<String> {
    let mut out = Vec::new();
    let mut seen = BTreeSet::new();
    for k in table {
        if !seen.insert(k) {
            out.push(format!("the table has {k:?} twice"));
        }
        if !produced.contains(k) {
            out.push(format!(
                "the table quotes {k:?}, which the binaries never produce"
            ));
        }
    }
    for k in produced {
        if !seen.contains(k) {
            out.push(format!("the binaries produce {k:?}, which the table lacks"));
        }
    }
    out
}

#[test]
fn the_troubleshooting_table_covers_exactly_what_the_binaries_produce() {
    let keys = table(&readme()).unwrap();
    let wrong = mismatches(&keys, &produced());
    assert!(wrong.is_empty(), "README {HEADING}:\n{}", wrong.join("\n"));
}

/// `readme` without the table row whose code or reason cell is `cell`.
fn without_row(readme: &str, cell: &str) -> String {
    let needle = format!("| {cell} |");
    let before = readme.lines().count();
    let out: String = readme
        .lines()
        .filter(|l| !(l.starts_with('|') && l.contains(&needle)))
        .map(|l| format!("{l}\n"))
        .collect();
    assert_eq!(out.lines().count(), before - 1, "no single row {cell}");
    out
}

#[test]
fn a_row_missing_from_the_table_is_caught() {
    let readme = readme();
    for (cell, key) in [
        ("CNI `104`", Key::Cni(104)),
        (
            "Event `MacvtapNICDown`",
            Key::Event("MacvtapNICDown".into()),
        ),
        (
            "Allocate `FailedPrecondition` `did not appear`",
            Key::Allocate {
                code: "FailedPrecondition".into(),
                words: "did not appear".into(),
            },
        ),
    ] {
        let keys = table(&without_row(&readme, cell)).unwrap();
        let wrong = mismatches(&keys, &produced());
        assert_eq!(
            wrong,
            [format!(
                "the binaries produce {key:?}, which the table lacks"
            )]
        );
    }
}

#[test]
fn a_new_code_reason_or_refusal_in_the_binaries_is_caught() {
    let keys = table(&readme()).unwrap();
    for key in [
        Key::Cni(110),
        Key::Event("MacvtapSomethingNew".into()),
        Key::Allocate {
            code: "ResourceExhausted".into(),
            words: "no devices left".into(),
        },
    ] {
        let mut produced = produced();
        produced.insert(key.clone());
        assert_eq!(
            mismatches(&keys, &produced),
            [format!(
                "the binaries produce {key:?}, which the table lacks"
            )]
        );
    }
}

#[test]
fn a_row_quoting_what_nothing_produces_is_caught() {
    let readme = readme().replace("| CNI `104` |", "| CNI `2` |");
    let keys = table(&readme).unwrap();
    let wrong = mismatches(&keys, &produced());
    assert_eq!(
        wrong,
        [
            format!(
                "the table quotes {:?}, which the binaries never produce",
                Key::Cni(2)
            ),
            format!(
                "the binaries produce {:?}, which the table lacks",
                Key::Cni(104)
            ),
        ]
    );
}
