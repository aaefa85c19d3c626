// `sqlx::migrate!` embeds `migrations/` at compile time; without this a new or edited
// migration would not rebuild the binary that applies it.
fn main() {
    println!("cargo:rerun-if-changed=migrations");
}
