//! The transport layer of dlock (filled by the runtime issue).
