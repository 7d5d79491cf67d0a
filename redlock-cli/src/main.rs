//! The `redlock` command line.

fn main() {}
