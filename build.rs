//! Rebuilds the daemon when a migration is added or changed: `refinery::embed_migrations!` reads
//! the directory at compile time, which Cargo does not watch on its own.
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
