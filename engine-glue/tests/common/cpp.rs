//! Building the C++ programs of `tests/cpp/` against the drop-in headers
//! (`include/ub/umdk/ulock/dlock/`) and the static library of this very build, and running
//! them with a time limit. Shared by `tests/reference_headers.rs` and
//! `tests/reference_programs.rs`; each uses a different subset, hence the allow.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub const MANIFEST_DIR: &str = env!("CARGO_MANIFEST_DIR");
/// Where the drop-in headers live: what `-I` names.
pub const HEADERS: &str = "include/ub/umdk/ulock/dlock";
/// How long a C++ program may run before a test gives up on it.
pub const PROGRAM_TIMEOUT: Duration = Duration::from_secs(120);

/// A file of this crate.
pub fn read(rel: &str) -> String {
    let p = Path::new(MANIFEST_DIR).join(rel);
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The C++ compiler: `$CXX`, or `c++`.
pub fn cxx() -> String {
    std::env::var("CXX").unwrap_or_else(|_| "c++".into())
}

/// The static library this build produced (see `tests/c_abi.rs`, which finds it the same way:
/// cargo builds every crate type of the library before the tests that depend on it).
fn static_lib() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().expect("target/<profile>/deps/<test>");
    [deps.to_path_buf(), deps.parent().unwrap().to_path_buf()]
        .iter()
        .map(|d| d.join("libdlock_engine_glue.a"))
        .find(|lib| lib.exists())
        .expect("libdlock_engine_glue.a beside the test (crate-type \"staticlib\")")
}

/// `tests/cpp/<name>.cpp` compiled with `-std=c++17 -Wall -Werror` against the drop-in headers
/// alone and linked against the static library, once per test binary.
pub fn program(name: &'static str) -> PathBuf {
    static BUILT: Mutex<BTreeMap<&str, PathBuf>> = Mutex::new(BTreeMap::new());
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(p) = built.get(name) {
        return p.clone();
    }
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("reference-{name}"));
    let cxx = cxx();
    let mut cmd = Command::new(&cxx);
    cmd.args(["-std=c++17", "-Wall", "-Werror", "-O1"]);
    if name == "layout" {
        cmd.args(["-Wextra", "-pedantic"]);
    }
    let status = cmd
        .arg("-I")
        .arg(Path::new(MANIFEST_DIR).join(HEADERS))
        .arg(Path::new(MANIFEST_DIR).join(format!("tests/cpp/{name}.cpp")))
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
        .unwrap_or_else(|e| panic!("cannot run the C++ compiler `{cxx}`: {e}"));
    assert!(status.success(), "compiling {name}.cpp failed: {status}");
    built.insert(name, out.clone());
    out
}

/// Waits for `child` at most `PROGRAM_TIMEOUT` (then kills it) and returns its exit code and
/// standard output (read meanwhile, so a chatty program never blocks on a full pipe).
pub fn finish(mut child: Child, what: &str) -> (i32, String) {
    let reader = child.stdout.take().map(|mut s| {
        std::thread::spawn(move || {
            let mut out = String::new();
            s.read_to_string(&mut out).unwrap();
            out
        })
    });
    let deadline = Instant::now() + PROGRAM_TIMEOUT;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("{what} did not finish within {PROGRAM_TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let out = reader.map(|r| r.join().unwrap()).unwrap_or_default();
    (status.code().unwrap_or(-1), out)
}
