//! What the reference-compatible C++ headers (`include/ub/umdk/ulock/dlock/`) call where the
//! reference's API cannot bind to `dlock.h`'s functions as they are.
//!
//! # Why these exist
//!
//! The reference declares its C API `extern "C"` inside `namespace dlock`, with its own struct
//! layouts. C++ treats two `extern "C"` declarations of one name as the same function, so the
//! headers can bind a reference function straight to dlock's symbol only where the signature
//! and every struct it reaches are laid out alike; they do so for most of the API
//! (`client_init`, `get_lock`, `umo_atomic64_*`, ...). The rest differs and goes through an
//! inline C++ function in the headers that calls one of these, under a name of its own:
//!
//! | reference                                                | why it cannot bind to dlock.h  | here |
//! |----------------------------------------------------------|--------------------------------|------|
//! | `server_start(const server_cfg &, int &)`                | C++ references; the reference's `server_cfg` | [`config`] |
//! | `dclient_lib_init(const client_cfg *)`                   | the reference's `client_cfg`   | [`config`] |
//! | `ssl_cfg` inside both                                    | its password callbacks' shapes | `key` |
//! | `trylock`, `lock`, `unlock`, `lock_extend`, `lock_result_check` | `void *result` is the reference's 8/16-byte state | [`ops`] |
//! | `batch_trylock`, `batch_unlock`, `batch_lock_extend`     | `void *results` is the reference's 20-byte `lock_op_res` | [`ops`] |
//! | `get_server_debug_stats`, `get_client_debug_stats`       | 45 counters in the reference's order | [`stats`] |
//!
//! Each calls dlock's own C function after converting, so checks, status codes and policies
//! are dlock's; the tables in each module say what is converted how.
//!
//! # What checks them
//!
//! The symbols are `dlock_compat_*`. They are declared in the C++ headers, not in `dlock.h`:
//! `tests/reference_headers.rs` compares each with its declaration there and every struct
//! layout with what the C++ compiler computes; `tests/reference_programs.rs` runs programs
//! written in the reference's style against a server. (`tests/c_abi.rs` reads only the files
//! directly in `src/ffi/`.)

pub mod config;
mod key;
pub mod ops;
pub mod stats;
pub mod types;
