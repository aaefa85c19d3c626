//! The C allocator's settings for serving.
//!
//! A large request body (a long conversation: 1–4 MB) is allocated when it arrives and
//! freed when its request is done, several times a second. glibc's defaults return that
//! memory to the kernel each time: a block of 128 KiB or more is its own mapping (the
//! threshold rises only after such a block is freed, and only to the size of that block),
//! and a heap whose free top exceeds twice the threshold is trimmed. With a few 2 MB bodies
//! in flight, each new body then touched fresh pages: 150–330 page faults per request,
//! a quarter of the proxy's CPU on 2 MB requests (BENCHMARKS.md, "What was tried").
//!
//! Fixed thresholds keep that memory for the next body instead. What is kept is bounded by
//! [`TRIM_THRESHOLD`] per heap, and peak memory is what the bodies in flight need either
//! way.

/// Blocks smaller than this come from the heap and are reused when freed. Bodies up to
/// 8 MiB are preallocated whole (`body::read_body`); past that a body is rare enough to
/// get its own mapping.
const MMAP_THRESHOLD: i32 = 8 << 20;

/// Free memory at the top of a heap up to this much is kept rather than handed back.
const TRIM_THRESHOLD: i32 = 16 << 20;

/// Sets the thresholds, unless the environment already sets the allocator's
/// ([`set_by_user`]). Called once, before the serving threads start. Returns whether the
/// settings were applied.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[allow(unsafe_code, reason = "mallopt is a C call")]
pub fn keep_large_blocks() -> bool {
    let tunables = std::env::var("GLIBC_TUNABLES").ok();
    let names = std::env::vars_os().map(|(name, _)| name.to_string_lossy().into_owned());
    if set_by_user(tunables.as_deref(), names) {
        return false;
    }
    // SAFETY: mallopt only changes the allocator's parameters, under its own lock.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
            && libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
    }
}

/// Whether a user tuned glibc's allocator for this process: `GLIBC_TUNABLES` naming a
/// `glibc.malloc.` setting, or one of the older `MALLOC_…_` variables
/// (`MALLOC_ARENA_MAX`, `MALLOC_TRIM_THRESHOLD_`, …). Their choice wins over ours.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn set_by_user(tunables: Option<&str>, mut names: impl Iterator<Item = String>) -> bool {
    tunables.is_some_and(|t| t.contains("glibc.malloc."))
        || names.any(|name| name.starts_with("MALLOC_"))
}

/// Other platforms' allocators keep their own defaults.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn keep_large_blocks() -> bool {
    false
}

/// Page faults taken by the calling thread so far: what the tests of the allocator's
/// settings and of the large buffers count.
#[cfg(all(test, target_os = "linux"))]
#[allow(unsafe_code, reason = "getrusage is a C call")]
pub fn minor_faults() -> i64 {
    // SAFETY: getrusage fills the struct it is given.
    unsafe {
        let mut usage: libc::rusage = std::mem::zeroed();
        assert_eq!(libc::getrusage(libc::RUSAGE_THREAD, &mut usage), 0);
        usage.ru_minflt
    }
}

#[cfg(test)]
#[cfg(all(target_os = "linux", target_env = "gnu"))]
mod tests {
    use super::*;

    /// Five 2 MB bodies in flight at once, written whole, then all freed: the shape of the
    /// 2 MB loads. Returns the page faults it took.
    fn five_bodies() -> i64 {
        let before = minor_faults();
        let bodies: Vec<Vec<u8>> = (0..5u8)
            .map(|i| {
                let mut body = Vec::with_capacity(2 << 20);
                body.resize(2 << 20, i + 1); // written, so every page is touched
                std::hint::black_box(body)
            })
            .collect();
        drop(std::hint::black_box(bodies));
        minor_faults() - before
    }

    #[test]
    fn a_user_s_own_allocator_settings_win() {
        let names = |list: &[&str]| list.iter().map(|n| n.to_string()).collect::<Vec<_>>();
        let ordinary = names(&["PATH", "HOME", "RUST_LOG", "LOOPWARDEN_OPENAI_BASE_URL"]);
        assert!(!set_by_user(None, ordinary.clone().into_iter()));
        assert!(!set_by_user(
            Some("glibc.rtld.optional_static_tls=512"),
            ordinary.clone().into_iter()
        ));
        assert!(set_by_user(
            Some("glibc.malloc.arena_max=2"),
            ordinary.into_iter()
        ));
        for name in [
            "MALLOC_ARENA_MAX",
            "MALLOC_TRIM_THRESHOLD_",
            "MALLOC_MMAP_THRESHOLD_",
        ] {
            assert!(
                set_by_user(None, names(&["PATH", name]).into_iter()),
                "{name}"
            );
        }
    }

    #[test]
    fn freed_bodies_are_reused_without_new_page_faults() {
        assert!(
            keep_large_blocks(),
            "GLIBC_TUNABLES or MALLOC_* in the test's environment: settings left to it"
        );
        // The first round grows the heap to hold them (or finds room already there). With
        // glibc's defaults every later round takes ~2,560 faults (10 MB of 4 KiB pages),
        // because the freed top of the heap is trimmed each time.
        five_bodies();
        for round in 1..4 {
            let faults = five_bodies();
            assert!(
                faults < 100,
                "round {round} took {faults} page faults: freed bodies went back to the kernel"
            );
        }
    }
}
