//! The reference-compatible C++ headers (`include/ub/umdk/ulock/dlock/`) cannot drift from the
//! library they declare.
//!
//! - Every function of the reference's `dlock_client_api.h` and `dlock_server_api.h` is
//!   declared there with the reference's signature; each one declared `extern "C"` is
//!   `dlock.h`'s function of the same signature or a `dlock_compat_*` export of
//!   `src/ffi/compat/` (compared with its Rust definition).
//! - Every struct the library reads or writes is laid out by the C++ compiler as the Rust side
//!   expects (`tests/cpp/layout.cpp`, built with `-Wextra -pedantic` too); the counter and
//!   status enums are the reference's.
//! - `dlock.h` and the drop-in headers refuse to share a translation unit, with a message.
//!
//! `tests/reference_programs.rs` runs programs written against them.

#[path = "common/cpp.rs"]
mod cpp;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::mem::{offset_of, size_of};
use std::path::Path;
use std::process::Command;

use cpp::{HEADERS, MANIFEST_DIR, cxx, program, read};
use dlock_engine_glue::dlock_core::word::fair::FairWord;
use dlock_engine_glue::dlock_core::{LockKind, Status};
use dlock_engine_glue::ffi::compat::ops::RefState;
use dlock_engine_glue::ffi::compat::stats::REF_COUNTER_NAMES;
use dlock_engine_glue::ffi::compat::types as compat;
use dlock_engine_glue::ffi::types as native;

// ---------------------------------------------------------------------------------------------
// Reading declarations out of the headers

/// `text` without comments and preprocessor lines.
fn code(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(i) = rest.find("/*") {
        out.push_str(&rest[..i]);
        let end = rest[i..].find("*/").expect("unterminated comment") + i + 2;
        rest = &rest[end..];
    }
    out.push_str(rest);
    out.lines()
        .map(|l| l.split("//").next().unwrap())
        .filter(|l| !l.trim_start().starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n")
}

/// `const struct lock_desc *desc` → `const lock_desc *`; `None` for `void` or nothing.
fn param_type(p: &str) -> Option<String> {
    let spaced = p.replace('*', " * ").replace('&', " & ");
    let mut tokens: Vec<&str> = spaced
        .split_whitespace()
        .filter(|t| *t != "struct")
        .collect();
    if tokens.is_empty() || tokens == ["void"] {
        return None;
    }
    let last = *tokens.last().unwrap();
    assert!(
        tokens.len() > 1 && last != "*" && last != "&",
        "parameter `{p}` needs a name"
    );
    tokens.pop();
    Some(tokens.join(" "))
}

/// `int trylock(int client_id, ...)` → `("trylock", "int(int, ...)")`.
fn signature(decl: &str) -> (String, String) {
    let decl = decl.split_whitespace().collect::<Vec<_>>().join(" ");
    let open = decl.find('(').expect("a function");
    let close = decl.rfind(')').expect("a function");
    let head = decl[..open].replace('*', " * ");
    let mut head: Vec<&str> = head
        .split_whitespace()
        .filter(|t| !["inline", "struct"].contains(t))
        .collect();
    let name = head.pop().expect("a name").to_owned();
    let params: Vec<String> = decl[open + 1..close]
        .split(',')
        .filter_map(param_type)
        .collect();
    (name, format!("{}({})", head.join(" "), params.join(", ")))
}

/// The functions a header declares: `extern "C"` ones and inline C++ ones, by name.
#[derive(Debug, Default)]
struct Declared {
    extern_c: BTreeMap<String, String>,
    inline: BTreeMap<String, Vec<String>>,
}

/// Reads every function declaration of `text` (a C or C++ header): blocks opened by
/// `namespace` or `extern "C"` are looked into, every other `{ ... }` (a type, a function body)
/// is skipped.
fn declarations(text: &str) -> Declared {
    let code = code(text);
    let mut out = Declared::default();
    // One entry per open namespace / extern "C" block: whether it is (within) extern "C".
    let mut blocks: Vec<bool> = Vec::new();
    let mut stmt = String::new();
    let mut chars = code.chars();
    while let Some(c) = chars.next() {
        match c {
            '{' => {
                let head = stmt.split_whitespace().collect::<Vec<_>>().join(" ");
                if head.starts_with("namespace") || head == "extern \"C\"" {
                    let outer = blocks.last().copied().unwrap_or(false);
                    blocks.push(outer || head == "extern \"C\"");
                    stmt.clear();
                    continue;
                }
                let mut depth = 1;
                while depth > 0 {
                    match chars.next().expect("unbalanced braces") {
                        '{' => depth += 1,
                        '}' => depth -= 1,
                        _ => {}
                    }
                }
                if head.starts_with("inline") {
                    let (name, sig) = signature(&head);
                    out.inline.entry(name).or_default().push(sig);
                    stmt.clear();
                } else {
                    // A type definition, which ends at its `;`.
                    stmt.push_str(" {} ");
                }
            }
            '}' => {
                blocks.pop();
                stmt.clear();
            }
            ';' => {
                let s = stmt.trim();
                let is_function = s.contains('(')
                    && !s.contains("{}")
                    && !s.starts_with("typedef")
                    && !s.starts_with("static_assert");
                if is_function && blocks.last() == Some(&true) {
                    let (name, sig) = signature(s);
                    assert!(
                        out.extern_c.insert(name.clone(), sig).is_none(),
                        "{name} declared twice"
                    );
                }
                stmt.clear();
            }
            _ => stmt.push(c),
        }
    }
    out
}

/// The drop-in headers' declarations, all together.
fn dropin_declarations() -> Declared {
    let mut all = Declared::default();
    for h in ["dlock_types.h", "dlock_client_api.h", "dlock_server_api.h"] {
        let d = declarations(&read(&format!("{HEADERS}/{h}")));
        for (name, sig) in d.extern_c {
            assert!(all.extern_c.insert(name.clone(), sig).is_none(), "{name}");
        }
        for (name, sigs) in d.inline {
            all.inline.entry(name).or_default().extend(sigs);
        }
    }
    all
}

/// The C spelling of a Rust FFI type, as `signature` normalises C.
fn c_type(rust: &str) -> String {
    let rust = rust.trim();
    if let Some(t) = rust.strip_prefix("*const ") {
        return format!("const {} *", c_type(t));
    }
    if let Some(t) = rust.strip_prefix("*mut ") {
        return format!("{} *", c_type(t));
    }
    match rust {
        "c_int" | "i32" => "int".into(),
        "c_uint" | "u32" => "unsigned int".into(),
        "u64" => "uint64_t".into(),
        "c_void" => "void".into(),
        "c_char" => "char".into(),
        "native::lock_op_res" => "lock_op_res".into(),
        other => other.to_owned(),
    }
}

/// `name -> "ret(param types)"` of every `#[unsafe(no_mangle)]` function under
/// `src/ffi/compat/`.
fn compat_exports() -> BTreeMap<String, String> {
    let dir = Path::new(MANIFEST_DIR).join("src/ffi/compat");
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let src = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        for (at, _) in src.match_indices("#[unsafe(no_mangle)]") {
            let line_start = src[..at].rfind('\n').map_or(0, |i| i + 1);
            if !src[line_start..at].trim().is_empty() {
                continue; // inside a comment or a string
            }
            let rest = &src[at..];
            let start = rest.find("extern \"C\" fn ").expect("an extern \"C\" fn") + 14;
            let sig: String = rest[start..rest.find('{').unwrap()]
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ");
            let (open, close) = (sig.find('(').unwrap(), sig.rfind(')').unwrap());
            let params: Vec<String> = sig[open + 1..close]
                .split(',')
                .map(str::trim)
                .filter(|p| !p.is_empty())
                .map(|p| c_type(p.split_once(':').expect("name: type").1))
                .collect();
            let ret = sig[close + 1..]
                .trim()
                .strip_prefix("->")
                .map_or("void".into(), c_type);
            let name = sig[..open].trim().to_owned();
            out.insert(name, format!("{ret}({})", params.join(", ")));
        }
    }
    out
}

/// The reference's API, read from its `dlock_client_api.h` and `dlock_server_api.h`.
const REFERENCE_API: [(&str, &str); 36] = [
    ("dserver_lib_init", "int(unsigned int)"),
    ("dserver_lib_deinit", "void()"),
    ("server_start", "int(const server_cfg &, int &)"),
    ("server_stop", "int(int)"),
    ("get_server_debug_stats", "int(int, debug_stats *)"),
    ("clear_server_debug_stats", "int(int)"),
    ("dclient_lib_init", "int(const client_cfg *)"),
    ("dclient_lib_deinit", "void()"),
    ("client_init", "int(int *, const char *)"),
    ("client_reinit", "int(int, const char *)"),
    ("client_deinit", "int(int)"),
    ("client_heartbeat", "int(int, unsigned int)"),
    ("client_reinit_done", "int(int)"),
    ("get_lock", "int(int, const lock_desc *, int *)"),
    ("release_lock", "int(int, int)"),
    ("update_all_locks", "int(int)"),
    ("get_client_debug_stats", "int(int, debug_stats *)"),
    ("clear_client_debug_stats", "int(int)"),
    ("trylock", "int(int, const lock_request *, void *)"),
    ("lock", "int(int, const lock_request *, void *)"),
    ("unlock", "int(int, int, void *)"),
    ("lock_extend", "int(int, const lock_request *, void *)"),
    (
        "batch_get_lock",
        "int(int, unsigned int, const lock_desc *, int *)",
    ),
    ("batch_release_lock", "int(int, unsigned int, int *)"),
    (
        "batch_trylock",
        "int(int, unsigned int, const lock_request *, void *)",
    ),
    (
        "batch_unlock",
        "int(int, unsigned int, const int *, void *)",
    ),
    (
        "batch_lock_extend",
        "int(int, unsigned int, const lock_request *, void *)",
    ),
    ("lock_request_async", "int(int, const lock_request *)"),
    ("lock_result_check", "int(int, void *)"),
    (
        "umo_atomic64_create",
        "int(int, const umo_atomic64_desc *, uint64_t, int *)",
    ),
    ("umo_atomic64_destroy", "int(int, int)"),
    (
        "umo_atomic64_get",
        "int(int, const umo_atomic64_desc *, int *)",
    ),
    ("umo_atomic64_release", "int(int, int)"),
    ("umo_atomic64_faa", "int(int, int, uint64_t, uint64_t *)"),
    ("umo_atomic64_cas", "int(int, int, uint64_t, uint64_t)"),
    ("umo_atomic64_get_snapshot", "int(int, int, uint64_t *)"),
];

#[test]
fn dropin_headers_declare_the_reference_api_bound_to_dlock() {
    let dropin = dropin_declarations();
    let dlock_h = declarations(&read("include/dlock.h")).extern_c;
    assert!(dlock_h.len() > 30, "dlock.h read: {dlock_h:?}");
    for (name, sig) in REFERENCE_API {
        let as_extern = dropin.extern_c.get(name);
        let as_inline = dropin.inline.get(name).into_iter().flatten();
        assert!(
            as_extern.is_some_and(|s| s == sig) || as_inline.clone().any(|s| s == sig),
            "{name}: the reference's `{sig}`, the headers' {as_extern:?} / {:?}",
            dropin.inline.get(name)
        );
    }
    // Bound to a symbol: dlock.h's function with the same signature, or a compat export.
    let compat = compat_exports();
    for (name, sig) in &dropin.extern_c {
        let defined = if name.starts_with("dlock_compat_") {
            compat.get(name)
        } else {
            dlock_h.get(name)
        };
        assert_eq!(
            defined,
            Some(sig),
            "{name}: the drop-in headers vs its definition"
        );
    }
    for name in compat.keys() {
        assert!(
            dropin.extern_c.contains_key(name),
            "{name} is exported but the headers do not declare it"
        );
    }
    // An inline function of the reference's name calls the library through a compat export,
    // never by another C++ name.
    for name in dropin.inline.keys() {
        assert!(
            !dropin.extern_c.contains_key(name),
            "{name} is both extern \"C\" and inline"
        );
    }
}

/// `NAME = value` pairs of the C++ enum `tag` of `dlock_types.h`, implicit values counted.
fn enum_values(tag: &str) -> Vec<(String, i64)> {
    let code = code(&read(&format!("{HEADERS}/dlock_types.h")));
    let start = code.find(tag).unwrap_or_else(|| panic!("{tag}"));
    let body = &code[start..];
    let body = &body[body.find('{').unwrap() + 1..body.find('}').unwrap()];
    let mut next = 0;
    body.split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .map(|e| {
            let (k, v) = match e.split_once('=') {
                Some((k, v)) => {
                    let v = v.trim();
                    let v = match v.strip_prefix("0x") {
                        Some(h) => i64::from_str_radix(h, 16).unwrap(),
                        None => v.parse().unwrap(),
                    };
                    (k.trim(), v)
                }
                None => (e, next),
            };
            next = v + 1;
            (k.to_owned(), v)
        })
        .collect()
}

#[test]
fn counter_indices_and_status_values_are_the_references() {
    let counters = enum_values("enum debug_stats_code");
    let names: Vec<String> = REF_COUNTER_NAMES
        .iter()
        .map(|n| format!("DEBUG_STATS_{n}"))
        .chain(["DEBUG_STATS_MAX".to_owned()])
        .collect();
    let values: Vec<i64> = (0..=REF_COUNTER_NAMES.len() as i64).collect();
    assert_eq!(
        counters,
        names.into_iter().zip(values).collect::<Vec<_>>(),
        "the reference's order, which dlock's library fills"
    );
    let statuses: BTreeMap<String, i64> = enum_values("enum dlock_status").into_iter().collect();
    let dlock: BTreeMap<String, i64> = Status::ALL
        .iter()
        .map(|s| (s.name().to_owned(), s.code().into()))
        .collect();
    assert_eq!(statuses, dlock);
}

// ---------------------------------------------------------------------------------------------
// Layouts

/// What the Rust side lays out, in the lines `layout.cpp` prints.
fn rust_layout() -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    macro_rules! layout {
        ($($c:literal, $t:ty, [$($f:ident $(as $cf:literal)?),* $(,)?];)*) => {$(
            out.insert(format!("size {} {}", $c, size_of::<$t>()));
            $(
                #[allow(unused_mut, unused_assignments)]
                let mut field = stringify!($f).trim_start_matches("r#").to_owned();
                $(field = $cf.to_owned();)?
                out.insert(format!("field {}.{} {}", $c, field, offset_of!($t, $f)));
            )*
        )*};
    }
    layout! {
        "dlock_eid_t", compat::dlock_eid_t, [];
        "ssl_cfg", compat::ssl_cfg, [
            ssl_enable, ca_path, crl_path, cert_path, prkey_path, cert_verify_cb, prkey_pwd_cb,
            erase_prkey_cb,
        ];
        "client_cfg", compat::client_cfg, [
            dev_name, eid, log_level, primary_port, ssl, tp_mode, ub_token_disable,
        ];
        "replica_cfg", compat::replica_cfg, [primary_ip_str, primary_port];
        "primary_cfg", native::primary_cfg, [
            num_of_replica, recovery_client_num, ctrl_cpuset, cmd_cpuset, server_ip_str,
            server_port, replica_port, replica_enable,
        ];
        "server_cfg", compat::server_cfg, [
            r#type, dev_name, eid, log_level, sleep_mode_enable, role as "primary",
            role as "replica", ssl, tp_mode, ub_token_disable,
        ];
        "server_cfg_ext", compat::server_cfg_ext, [
            locks_max, clients_max, objects_max, client_lease_ms, client_lease_max_ms, epoch,
            insecure_plaintext, insecure_recovery, session_key_file, recoverer_local,
        ];
        "client_cfg_ext", compat::client_cfg_ext, [lease_ms, timeout_ms];
        "debug_stats", compat::debug_stats, [];
        "atomic_state", compat::atomic_state, [client_id, time_out];
        "rw_state", compat::rw_state, [time_out, client_id, rcount, rsvd];
        "fairlock_state", compat::fairlock_state, [
            n_exclusive, n_shared, m_exclusive, m_shared, time_out, t_value,
        ];
        "lock_state", [u32; 4], [];
        "lock_op_res", compat::lock_op_res, [state as "atomic", op_ret];
        "lock_desc", native::lock_desc, [p_desc, len, lock_type, lease_time];
        "lock_request", native::lock_request, [lock_id, lock_op, expire_time];
        "umo_atomic64_desc", native::umo_atomic64_desc, [p_desc, len, lease_time];
    }
    // Where the fair lock's bit fields land in t_value, as the library packs them.
    let fair = |w: FairWord| match RefState::of(LockKind::Fair, w.into_bits()) {
        RefState::Fair(s) => s.t_value,
        other => panic!("{other:?}"),
    };
    for (name, bits) in [
        ("rms", fair(FairWord::new().with_rms(0xFFFF))),
        ("rflag", fair(FairWord::new().with_rflag(true))),
        ("rcnt", fair(FairWord::new().with_rcnt(63))),
    ] {
        out.insert(format!("bits fairlock_state.bs.{name} {bits:#x}"));
    }
    out
}

#[test]
fn dropin_struct_layouts_are_the_layouts_the_library_reads_and_writes() {
    let out = Command::new(program("layout")).output().unwrap();
    assert!(out.status.success(), "layout: {}", out.status);
    let cpp: BTreeSet<String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    let rust = rust_layout();
    let only_cpp: Vec<_> = cpp.difference(&rust).collect();
    let only_rust: Vec<_> = rust.difference(&cpp).collect();
    assert!(
        only_cpp.is_empty() && only_rust.is_empty(),
        "C++ says {only_cpp:#?}\nRust says {only_rust:#?}"
    );
}

/// Drop-in headers and `dlock.h` in one translation unit, in either order: refused with a
/// message that says why, not with a page of conflicting declarations.
#[test]
fn dlock_h_and_the_dropin_headers_do_not_mix() {
    let cxx = cxx();
    for (i, (first, second)) in [
        ("dlock_types.h", "dlock.h"),
        ("dlock.h", "dlock_client_api.h"),
    ]
    .into_iter()
    .enumerate()
    {
        let src = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("reference-mix-{i}.cpp"));
        let mut f = std::fs::File::create(&src).unwrap();
        writeln!(
            f,
            "#include \"{first}\"\n#include \"{second}\"\nint main() {{ return 0; }}"
        )
        .unwrap();
        let out = Command::new(&cxx)
            .args(["-std=c++17", "-fsyntax-only", "-I"])
            .arg(Path::new(MANIFEST_DIR).join(HEADERS))
            .arg("-I")
            .arg(Path::new(MANIFEST_DIR).join("include"))
            .arg(&src)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{first} then {second} compiled");
        let err = String::from_utf8_lossy(&out.stderr);
        let first_error = err
            .lines()
            .find(|l| l.contains("error"))
            .unwrap_or_default();
        assert!(
            first_error.contains("#error"),
            "{first} then {second}: {err}"
        );
    }
}
