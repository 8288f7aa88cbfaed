//! The thin client.

pub mod link;
