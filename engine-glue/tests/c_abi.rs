//! The C ABI as C sees it.
//!
//! - The header cannot drift: every prototype in `include/dlock.h` is compared with the
//!   `#[unsafe(no_mangle)] extern "C"` definitions under `src/ffi/` (names, parameter and return
//!   types, both directions); every status value with `Status::ALL`; every counter index with
//!   `Counter::ALL`; the constants and enums with the Rust constants; every callback typedef
//!   with its Rust `Option<unsafe extern "C" fn ..>`; and every struct's size and field
//!   offsets, as the C compiler computes them, with the Rust layout.
//! - `tests/c/abi_smoke.c`, compiled with the system C compiler against the header and the
//!   static library of this very build, starts a server, registers two clients, takes and
//!   releases each lock kind, runs 31-key batches, allocates 1,000 XIDs, feeds bad input, and
//!   must exit 0.
//! - `tests/c/cached_locks.c`, built the same way, drives cached grants and their revokes
//!   (callback and poll) over shared memory and TCP, and must exit 0.
//!
//! The static library is the `libdlock_engine_glue.a` cargo built for this very test run, found
//! beside this test's executable (`target/<profile>/deps/`): cargo builds every crate type of the
//! library before the tests that depend on it, so no nested cargo run and no build script are
//! needed.

use std::collections::{BTreeMap, BTreeSet};
use std::mem::{offset_of, size_of};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use dlock_engine_glue::dlock_core::Status;
use dlock_engine_glue::dlock_core::server::Counter;
use dlock_engine_glue::ffi::types::*;

const MANIFEST_DIR: &str = env!("CARGO_MANIFEST_DIR");

fn read(rel: &str) -> String {
    let p = Path::new(MANIFEST_DIR).join(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The header without comments, preprocessor lines and the `extern "C" {` guard.
fn header_code() -> String {
    let text = read("include/dlock.h");
    let mut out = String::new();
    let mut rest = text.as_str();
    while let Some(i) = rest.find("/*") {
        out.push_str(&rest[..i]);
        let end = rest[i..].find("*/").expect("unterminated comment") + i + 2;
        rest = &rest[end..];
    }
    out.push_str(rest);
    let mut code = String::new();
    let mut in_cplusplus = false;
    for line in out.lines() {
        let t = line.trim();
        if t.starts_with("#ifdef __cplusplus") {
            in_cplusplus = true;
        } else if in_cplusplus && t.starts_with("#endif") {
            in_cplusplus = false;
        } else if !in_cplusplus && !t.starts_with('#') {
            code.push_str(line);
            code.push('\n');
        }
    }
    code
}

/// `int x`, `const struct lock_desc *descs` → the type in canonical spelling (`int`,
/// `const struct lock_desc *`); `None` for `void` (no parameters).
fn c_param_type(p: &str) -> Option<String> {
    let spaced = p.replace('*', " * ");
    let mut tokens: Vec<&str> = spaced.split_whitespace().collect();
    if tokens == ["void"] || tokens.is_empty() {
        return None;
    }
    let last = *tokens.last().unwrap();
    assert!(
        tokens.len() > 1 && last != "*",
        "parameter `{p}` needs a name in the header"
    );
    tokens.pop();
    Some(tokens.join(" "))
}

/// `name -> "ret(param types)"` for every function the header declares.
fn header_prototypes() -> BTreeMap<String, String> {
    let code = header_code();
    // Drop every `{ ... }` body (enums, structs, unions).
    let mut flat = String::new();
    let mut depth = 0;
    for ch in code.chars() {
        match ch {
            '{' => depth += 1,
            '}' => depth -= 1,
            _ if depth == 0 => flat.push(ch),
            _ => {}
        }
    }
    let mut out = BTreeMap::new();
    for decl in flat.split(';') {
        let decl = decl.split_whitespace().collect::<Vec<_>>().join(" ");
        // Callback types are checked by `header_callback_typedefs_are_the_rust_types`.
        if decl.starts_with("typedef") {
            continue;
        }
        let Some(open) = decl.find('(') else { continue };
        assert!(decl.ends_with(')'), "cannot read declaration `{decl}`");
        let head = decl[..open].replace('*', " * ");
        let mut head: Vec<&str> = head.split_whitespace().collect();
        let name = head.pop().expect("function name").to_owned();
        let params: Vec<String> = decl[open + 1..decl.len() - 1]
            .split(',')
            .filter_map(c_param_type)
            .collect();
        let sig = format!("{}({})", head.join(" "), params.join(", "));
        assert!(
            out.insert(name.clone(), sig).is_none(),
            "{name} declared twice"
        );
    }
    out
}

/// The C spelling of a Rust FFI type.
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
        "c_char" => "char".into(),
        "c_void" => "void".into(),
        "lock_desc" | "lock_request" | "lock_op_res" | "umo_atomic64_desc" | "client_cfg"
        | "server_cfg" | "debug_stats" | "dlock_revoke" => format!("struct {rust}"),
        "dlock_revoke_cb_t" => rust.into(),
        other => panic!("no C spelling for Rust type `{other}`: add it to c_type()"),
    }
}

/// `name -> "ret(param types)"` for every exported function under `src/ffi/`.
fn rust_prototypes() -> BTreeMap<String, String> {
    let dir = Path::new(MANIFEST_DIR).join("src/ffi");
    let mut out = BTreeMap::new();
    let mut no_mangle = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "rs") {
            continue;
        }
        let src = std::fs::read_to_string(&path).unwrap();
        no_mangle += src.matches("#[unsafe(no_mangle)]").count();
        for (at, _) in src.match_indices("extern \"C\" fn ") {
            let before = &src[..at];
            let line_start = before.rfind('\n').map_or(0, |i| i + 1);
            if before[line_start..].trim_start().starts_with("//") {
                continue; // a comment that mentions the syntax
            }
            let attr = before.rfind("#[unsafe(no_mangle)]");
            let item_start = before.rfind("\n\n").unwrap_or(0);
            assert!(
                attr.is_some_and(|a| a > item_start),
                "{}: extern \"C\" fn without #[unsafe(no_mangle)]",
                path.display()
            );
            let rest = &src[at + "extern \"C\" fn ".len()..];
            let sig: String = rest[..rest.find('{').unwrap()]
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ");
            let open = sig.find('(').unwrap();
            let close = sig.rfind(')').unwrap();
            let name = sig[..open].trim().to_owned();
            let params: Vec<String> = sig[open + 1..close]
                .split(',')
                .map(str::trim)
                .filter(|p| !p.is_empty())
                .map(|p| c_type(p.split_once(':').expect("name: type").1))
                .collect();
            let ret = match sig[close + 1..].trim().strip_prefix("->") {
                Some(r) => c_type(r),
                None => "void".into(),
            };
            let proto = format!("{ret}({})", params.join(", "));
            assert!(
                out.insert(name.clone(), proto).is_none(),
                "{name} defined twice"
            );
        }
    }
    assert_eq!(
        no_mangle,
        out.len(),
        "#[unsafe(no_mangle)] on something other than an extern \"C\" fn"
    );
    out
}

#[test]
fn header_declares_every_exported_function_with_its_rust_signature() {
    let header = header_prototypes();
    let rust = rust_prototypes();
    // The reference's API, all of it (plus our additions, checked by the loops below).
    for name in [
        "dserver_lib_init",
        "dserver_lib_deinit",
        "server_start",
        "server_stop",
        "get_server_debug_stats",
        "clear_server_debug_stats",
        "dclient_lib_init",
        "dclient_lib_deinit",
        "client_init",
        "client_reinit",
        "client_reinit_done",
        "client_deinit",
        "client_heartbeat",
        "get_lock",
        "release_lock",
        "batch_get_lock",
        "batch_release_lock",
        "update_all_locks",
        "get_client_debug_stats",
        "clear_client_debug_stats",
        "trylock",
        "lock",
        "unlock",
        "lock_extend",
        "batch_trylock",
        "batch_unlock",
        "batch_lock_extend",
        "lock_request_async",
        "lock_result_check",
        "umo_atomic64_create",
        "umo_atomic64_destroy",
        "umo_atomic64_get",
        "umo_atomic64_release",
        "umo_atomic64_faa",
        "umo_atomic64_cas",
        "umo_atomic64_get_snapshot",
    ] {
        assert!(rust.contains_key(name), "{name} is not exported");
    }
    for (name, sig) in &rust {
        assert_eq!(header.get(name), Some(sig), "{name}: header vs Rust");
    }
    for name in header.keys() {
        assert!(
            rust.contains_key(name),
            "{name} is declared but not defined in Rust"
        );
    }
}

/// `RET(params)` from a C parameter list, as `header_prototypes` spells prototypes.
fn c_signature(ret: &str, params: &str) -> String {
    let params: Vec<String> = params.split(',').filter_map(c_param_type).collect();
    format!(
        "{}({})",
        ret.split_whitespace().collect::<Vec<_>>().join(" "),
        params.join(", ")
    )
}

/// `name -> "ret(param types)"` for every function pointer typedef of the header
/// (`typedef int (*name)(char *buf, int size);`).
fn header_callback_typedefs() -> BTreeMap<String, String> {
    let code = header_code();
    let mut out = BTreeMap::new();
    for decl in code.split(';') {
        let decl = decl.split_whitespace().collect::<Vec<_>>().join(" ");
        let Some(rest) = decl.strip_prefix("typedef ") else {
            continue;
        };
        let Some((ret, rest)) = rest.split_once("(*") else {
            continue;
        };
        let (name, params) = rest.split_once(")(").expect("typedef RET (*NAME)(PARAMS)");
        let params = params.strip_suffix(')').expect("closing parenthesis");
        out.insert(name.trim().to_owned(), c_signature(ret, params));
    }
    out
}

/// `name -> "ret(param types)"` for every `pub type name = Option<unsafe extern "C" fn ..>;`
/// of `src/ffi/types.rs`.
fn rust_callback_types() -> BTreeMap<String, String> {
    let src = read("src/ffi/types.rs");
    let mut out = BTreeMap::new();
    for item in src.split(';') {
        // rustfmt breaks a long one after `Option<`.
        let item = item
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
            .replace("Option< ", "Option<");
        let Some(at) = item.find("pub type ") else {
            continue;
        };
        let item = &item[at + "pub type ".len()..];
        let Some((name, fn_type)) = item.split_once(" = Option<unsafe extern \"C\" fn(") else {
            continue;
        };
        let fn_type = fn_type.strip_suffix('>').expect("Option<..>");
        let (params, ret) = fn_type.rsplit_once(')').expect("fn(..)");
        let params: Vec<String> = params
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(|p| c_type(p.split_once(':').expect("name: type").1))
            .collect();
        let ret = match ret.trim().strip_prefix("->") {
            Some(r) => c_type(r),
            None => "void".into(),
        };
        out.insert(name.to_owned(), format!("{ret}({})", params.join(", ")));
    }
    out
}

#[test]
fn header_callback_typedefs_are_the_rust_types() {
    let header = header_callback_typedefs();
    let rust = rust_callback_types();
    assert_eq!(
        header.keys().collect::<Vec<_>>(),
        [
            "dlock_cert_verify_cb_t",
            "dlock_erase_prkey_cb_t",
            "dlock_prkey_pwd_cb_t",
            "dlock_revoke_cb_t"
        ],
        "the header's callback typedefs"
    );
    assert_eq!(header, rust);
}

/// `NAME = value` pairs of the C enum `tag` (values in decimal or hex).
fn enum_values(tag: &str) -> BTreeMap<String, i64> {
    let code = header_code();
    let start = code
        .find(tag)
        .unwrap_or_else(|| panic!("{tag} not in the header"));
    let body = &code[start..];
    let body = &body[body.find('{').unwrap() + 1..body.find('}').unwrap()];
    body.split(',')
        .filter(|e| !e.trim().is_empty())
        .map(|e| {
            let (k, v) = e
                .split_once('=')
                .unwrap_or_else(|| panic!("`{e}` needs an explicit value"));
            let v = v.trim();
            let v = match v.strip_prefix("0x") {
                Some(h) => i64::from_str_radix(h, 16).unwrap(),
                None => v.parse().unwrap(),
            };
            (k.trim().to_owned(), v)
        })
        .collect()
}

/// `#define NAME value` of the header.
fn define(name: &str) -> i64 {
    let text = read("include/dlock.h");
    let line = text
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some(name) && l.starts_with("#define"))
        .unwrap_or_else(|| panic!("#define {name} not in the header"));
    let v = line.split_whitespace().nth(2).unwrap();
    match v.strip_prefix("0x") {
        Some(h) => i64::from_str_radix(h, 16).unwrap(),
        None => v.parse().unwrap(),
    }
}

#[test]
fn header_status_values_are_the_rust_status_codes() {
    let header = enum_values("enum dlock_status");
    let rust: BTreeMap<String, i64> = Status::ALL
        .iter()
        .map(|s| (s.name().to_owned(), s.code().into()))
        .collect();
    assert_eq!(header, rust);
}

#[test]
fn header_counter_indices_are_the_server_counters() {
    let mut header = enum_values("enum debug_stats_code");
    assert_eq!(
        header.remove("DEBUG_STATS_MAX"),
        Some(Counter::COUNT as i64)
    );
    let rust: BTreeMap<String, i64> = Counter::ALL
        .iter()
        .map(|c| {
            (
                format!("DEBUG_STATS_{}", c.name().to_uppercase()),
                *c as i64,
            )
        })
        .collect();
    assert_eq!(header, rust);
}

#[test]
fn header_constants_and_enums_are_the_rust_ones() {
    assert_eq!(define("MAX_LOCK_DESC_LEN"), MAX_LOCK_DESC_LEN as i64);
    assert_eq!(
        define("MAX_UMO_ATOMIC64_DESC_LEN"),
        MAX_UMO_ATOMIC64_DESC_LEN as i64
    );
    assert_eq!(define("MAX_LOCK_BATCH_SIZE"), MAX_LOCK_BATCH_SIZE as i64);
    assert_eq!(define("MAX_NUM_SERVER"), MAX_NUM_SERVER as i64);
    assert_eq!(define("DLOCK_DEFAULT_PORT"), DLOCK_DEFAULT_PORT.into());
    assert_eq!(define("DLOCK_SERVER_ID_MAX"), DLOCK_SERVER_ID_MAX.into());
    assert_eq!(
        define("DLOCK_HEARTBEAT_TIMEOUT_MAX_S"),
        DLOCK_HEARTBEAT_TIMEOUT_MAX_S.into()
    );
    assert_eq!(
        define("DLOCK_KEY_PASSWORD_LEN_MAX"),
        dlock_engine_glue::ffi::tls::KEY_PASSWORD_LEN_MAX as i64
    );
    assert_eq!(
        define("DLOCK_VALUE_BLOCK_LEN"),
        dlock_core::manager::value::VALUE_BLOCK_LEN as i64
    );
    assert_eq!(define("DLOCK_REVOKE_ALL"), DLOCK_REVOKE_ALL.into());
    let ops = enum_values("enum lock_ops");
    for (name, v) in [
        ("LOCK_EXCLUSIVE", LOCK_EXCLUSIVE),
        ("LOCK_SHARED", LOCK_SHARED),
        ("UNLOCK", UNLOCK),
        ("EXTEND_LOCK_EXCLUSIVE", EXTEND_LOCK_EXCLUSIVE),
        ("EXTEND_LOCK_SHARED", EXTEND_LOCK_SHARED),
    ] {
        assert_eq!(ops[name], v.into(), "{name}");
    }
    let kinds = enum_values("enum dlock_type");
    for (name, v) in [
        ("DLOCK_ATOMIC", DLOCK_ATOMIC),
        ("DLOCK_RW", DLOCK_RW),
        ("DLOCK_FAIR", DLOCK_FAIR),
    ] {
        assert_eq!(kinds[name], v.into(), "{name}");
    }
    assert_eq!(
        enum_values("enum server_type")["SERVER_PRIMARY"],
        SERVER_PRIMARY.into()
    );
}

/// The static library this build produced. rustc writes it into `target/<profile>/deps/`,
/// beside this test's executable (a staticlib's name carries no hash); cargo also links a copy
/// into `target/<profile>/`, but only when it rebuilds the library, so `deps/` comes first.
fn static_lib() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().expect("target/<profile>/deps/<test>");
    let candidates = [deps.to_path_buf(), deps.parent().unwrap().to_path_buf()];
    candidates
        .iter()
        .map(|d| d.join("libdlock_engine_glue.a"))
        .find(|lib| lib.exists())
        .unwrap_or_else(|| {
            panic!(
                "libdlock_engine_glue.a not found in {candidates:?}: is crate-type \"staticlib\" \
                 still in engine-glue/Cargo.toml?"
            )
        })
}

/// `tests/c/abi_smoke.c` compiled and linked once per test run.
fn smoke_binary() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| c_program("abi_smoke"))
}

/// `tests/c/<name>.c` compiled against the header and linked with the static library.
fn c_program(name: &str) -> PathBuf {
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(&cc)
        .args([
            "-std=c11",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-pedantic",
            "-O1",
            // `usleep` and the POSIX threads of `cached_locks.c`.
            "-D_DEFAULT_SOURCE",
            "-I",
        ])
        .arg(Path::new(MANIFEST_DIR).join("include"))
        .arg(Path::new(MANIFEST_DIR).join(format!("tests/c/{name}.c")))
        .arg(static_lib())
        // What Rust's std needs from the system (`rustc --print native-static-libs`).
        .args([
            "-lpthread",
            "-ldl",
            "-lm",
            "-lrt",
            "-lutil",
            "-lgcc_s",
            "-o",
        ])
        .arg(&out)
        .status()
        .unwrap_or_else(|e| panic!("cannot run the C compiler `{cc}`: {e}"));
    assert!(status.success(), "compiling {name}.c failed: {status}");
    out
}

/// The Rust side of every line `abi_smoke layout` prints.
fn rust_layout() -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    macro_rules! layout {
        ($($c:literal, $t:ty, [$($f:ident),* $(,)?];)*) => {$(
            out.insert(format!("size {} {}", $c, size_of::<$t>()));
            $(
                let field = stringify!($f).trim_start_matches("r#");
                out.insert(format!("field {}.{} {}", $c, field, offset_of!($t, $f)));
            )*
        )*};
    }
    layout! {
        "struct lock_desc", lock_desc, [p_desc, len, lock_type, lease_time];
        "struct lock_request", lock_request, [lock_id, lock_op, expire_time];
        "atomic_state", atomic_state, [client_id, rsvd, expiry_ms];
        "rw_state", rw_state, [client_id, rcount, since_ms];
        "fairlock_state", fairlock_state, [n_exclusive, n_shared, m_exclusive, m_shared, ext];
        "lock_state", lock_state, [];
        "struct lock_op_res", lock_op_res, [state, op_ret, rsvd, fence];
        "struct umo_atomic64_desc", umo_atomic64_desc, [p_desc, len, lease_time];
        "struct ssl_cfg", ssl_cfg, [
            ssl_enable, ca_path, crl_path, cert_path, prkey_path, cert_verify_cb, prkey_pwd_cb,
            erase_prkey_cb,
        ];
        "struct client_cfg", client_cfg, [log_level, primary_port, lease_ms, timeout_ms, ssl];
        "struct primary_cfg", primary_cfg, [
            num_of_replica, recovery_client_num, ctrl_cpuset, cmd_cpuset, server_ip_str,
            server_port, replica_port, replica_enable,
        ];
        "struct server_cfg", server_cfg, [
            r#type, log_level, sleep_mode_enable, primary, locks_max, clients_max, objects_max,
            client_lease_ms, client_lease_max_ms, epoch, shm_name, ssl, insecure_plaintext,
            session_key_file, insecure_recovery, recoverer_local, cluster,
        ];
        "struct cluster_cfg", cluster_cfg, [
            etcd_endpoints, cluster_name, server_id, ttl_ms, partitions, counter_step, advertise,
            etcd_ca_path, etcd_cert_path, etcd_key_path, etcd_domain,
        ];
        "struct debug_stats", debug_stats, [stats];
        "struct dlock_revoke", dlock_revoke, [lock_id, wanted_op];
    }
    out
}

#[test]
fn c_struct_layouts_are_the_rust_layouts() {
    let out = Command::new(smoke_binary()).arg("layout").output().unwrap();
    assert!(out.status.success(), "abi_smoke layout: {}", out.status);
    let c: BTreeSet<String> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    let rust = rust_layout();
    let only_c: Vec<_> = c.difference(&rust).collect();
    let only_rust: Vec<_> = rust.difference(&c).collect();
    assert!(
        only_c.is_empty() && only_rust.is_empty(),
        "C says {only_c:#?}\nRust says {only_rust:#?}"
    );
}

#[test]
fn c_program_passes_every_check_against_the_static_library() {
    let out = Command::new(smoke_binary()).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "abi_smoke exited {}\n{stdout}{stderr}",
        out.status
    );
    assert!(stdout.contains("checks passed"), "{stdout}");
}

/// `tests/c/cached_locks.c`: client A caches an RW lock, B's conflicting request makes A's
/// revoke callback (then its poll) report it, A gives it back, B gets it; over shared memory
/// and TCP; and the bad input of the cached-grant calls. Its own process: it runs a server.
#[test]
fn c_program_caches_a_lock_and_gives_it_back_when_revoked() {
    let out = Command::new(c_program("cached_locks")).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "cached_locks exited {}\n{stdout}{stderr}",
        out.status
    );
    assert!(stdout.contains("checks passed"), "{stdout}");
}

/// The only test in this binary that uses the process-wide registries.
#[test]
fn one_client_shared_by_two_threads_takes_turns() {
    use dlock_engine_glue::ffi::{client, locks, object, ops, server};

    let mut cfg = default_server_cfg();
    cfg.locks_max = 64;
    cfg.clients_max = 4;
    cfg.objects_max = 4;
    let (mut sid, mut cid, mut lock_id, mut obj) = (0, 0, 0, 0);
    let ccfg = client_cfg {
        log_level: 0,
        primary_port: 0,
        lease_ms: 0,
        timeout_ms: 0,
        ssl: ssl_cfg::DISABLED,
    };
    let name = b"shared/atomic";
    let desc = lock_desc {
        p_desc: name.as_ptr().cast(),
        len: name.len() as u32,
        lock_type: DLOCK_ATOMIC,
        lease_time: 0,
    };
    let odesc = umo_atomic64_desc {
        p_desc: c"xid".as_ptr(),
        len: 3,
        lease_time: 60,
    };
    // SAFETY: every pointer is to a live local of the right type.
    unsafe {
        assert_eq!(server::dserver_lib_init(1), 0);
        assert_eq!(server::server_start(&cfg, &mut sid), 0);
        assert_eq!(client::dclient_lib_init(&ccfg), 0);
        assert_eq!(client::client_init(&mut cid, std::ptr::null()), 0);
        assert_eq!(locks::get_lock(cid, &desc, &mut lock_id), 0);
        assert_eq!(object::umo_atomic64_create(cid, &odesc, 0, &mut obj), 0);
        assert_eq!(object::umo_atomic64_get(cid, &odesc, &mut obj), 0);
    }
    let xids: Vec<Vec<u64>> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..2)
            .map(|_| {
                s.spawn(move || {
                    let req = lock_request {
                        lock_id,
                        lock_op: LOCK_EXCLUSIVE,
                        expire_time: 5,
                    };
                    let mut st = lock_state::from_word(0);
                    let mut got = Vec::new();
                    for _ in 0..200 {
                        let mut xid = 0;
                        // SAFETY: pointers to live locals of the right types.
                        unsafe {
                            let r = ops::trylock(cid, &req, (&raw mut st).cast());
                            assert!(
                                [0, Status::AlreadyLocked.code()].contains(&r),
                                "trylock {r:#x}"
                            );
                            let r = ops::unlock(cid, lock_id, (&raw mut st).cast());
                            assert!(
                                [0, Status::AlreadyLocked.code()].contains(&r),
                                "unlock {r:#x}"
                            );
                            assert_eq!(object::umo_atomic64_faa(cid, obj, 1, &mut xid), 0);
                        }
                        got.push(xid);
                    }
                    got
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    let all: BTreeSet<u64> = xids.iter().flatten().copied().collect();
    assert_eq!(all.len(), 400, "every XID handed out once");
    let mut st = lock_state::from_word(0);
    // SAFETY: pointers to live locals of the right types.
    unsafe {
        // Every re-entry was counted down: nothing is held any more.
        assert_eq!(
            ops::unlock(cid, lock_id, (&raw mut st).cast()),
            Status::AlreadyUnlocked.code()
        );
        assert_eq!(client::client_deinit(cid), 0);
        client::dclient_lib_deinit();
        assert_eq!(server::server_stop(sid), 0);
        server::dserver_lib_deinit();
    }
}

/// A `server_cfg` with every field zero (the defaults) and no strings.
fn default_server_cfg() -> server_cfg {
    server_cfg {
        r#type: SERVER_PRIMARY,
        log_level: 0,
        sleep_mode_enable: 0,
        primary: primary_cfg {
            num_of_replica: 0,
            recovery_client_num: 0,
            ctrl_cpuset: std::ptr::null(),
            cmd_cpuset: std::ptr::null(),
            server_ip_str: std::ptr::null(),
            server_port: 0,
            replica_port: 0,
            replica_enable: 0,
        },
        locks_max: 0,
        clients_max: 0,
        objects_max: 0,
        client_lease_ms: 0,
        client_lease_max_ms: 0,
        epoch: 0,
        shm_name: std::ptr::null(),
        ssl: ssl_cfg::DISABLED,
        insecure_plaintext: 0,
        session_key_file: std::ptr::null(),
        insecure_recovery: 0,
        recoverer_local: 0,
        cluster: cluster_cfg::STANDALONE,
    }
}
