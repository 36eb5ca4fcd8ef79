//! The checked-in C header must match what cbindgen generates from the code now.

#[test]
fn checked_in_header_matches_generated() {
    let generated = include_str!(concat!(env!("OUT_DIR"), "/rdzv.h"));
    let checked_in = include_str!("../include/rdzv.h");
    assert!(
        generated == checked_in,
        "include/rdzv.h is stale: regenerate with `RDZV_WRITE_HEADER=1 cargo build` and commit it"
    );
}

/// Every name the header defines: macros, types, enum values and functions.
fn defined_names(header: &str) -> Vec<String> {
    let ident = |s: &str| -> String {
        s.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    let mut names = Vec::new();
    let mut in_comment = false;
    let mut in_enum = false;
    for raw in header.lines() {
        let line = raw.trim();
        if in_comment {
            in_comment = !line.contains("*/");
            continue;
        }
        if line.starts_with("/*") {
            in_comment = !line.contains("*/");
            continue;
        }
        if line.starts_with("//") || line.is_empty() {
            continue;
        }
        if let Some(rest) = line.strip_prefix("#define ") {
            names.push(ident(rest));
        } else if line.starts_with("enum ") || line.starts_with("typedef enum") {
            in_enum = !line.contains('}');
            if let Some(name) = line.split_whitespace().nth(1).filter(|n| *n != "enum") {
                names.push(ident(name));
            }
        } else if in_enum {
            if line.starts_with('}') {
                in_enum = false;
                let name = ident(line.trim_start_matches('}').trim());
                if !name.is_empty() {
                    names.push(name);
                }
            } else {
                names.push(ident(line));
            }
        } else if line.starts_with("typedef ") {
            let last = line
                .trim_end_matches(';')
                .rsplit([' ', '*', ')'])
                .next()
                .unwrap_or("");
            // A function pointer type: `typedef void (*name)(...)`.
            let name = match line.find("(*") {
                Some(at) => ident(&line[at + 2..]),
                None => ident(last),
            };
            names.push(name);
        } else if let Some(open) = line.find('(') {
            // A function declaration: the identifier before its parenthesis.
            if !line.starts_with('#') && !raw.starts_with(' ') {
                let before = &line[..open];
                names.push(ident(before.rsplit([' ', '*']).next().unwrap_or("")));
            }
        }
    }
    names.retain(|n| !n.is_empty());
    names
}

#[test]
fn every_name_the_header_defines_is_rdzvs() {
    let header = include_str!("../include/rdzv.h");
    let names = defined_names(header);
    assert!(names.len() > 100, "too few names found: {names:?}");
    for must in [
        "RDZV_VERSION",
        "rdzv_next",
        "rdzv_status_t",
        "RDZV_OK",
        "rdzv_heartbeat",
    ] {
        assert!(
            names.iter().any(|n| n == must),
            "{must} not found in {names:?}"
        );
    }
    let foreign: Vec<&String> = names
        .iter()
        .filter(|n| !n.starts_with("rdzv_") && !n.starts_with("RDZV_"))
        .collect();
    assert!(
        foreign.is_empty(),
        "include/rdzv.h defines names without rdzv_/RDZV_ (a program's own `VERSION` or \
         `SECTIONS` would clash): {foreign:?}"
    );
}
