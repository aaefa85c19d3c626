//! The C allocator's settings for serving.
//!
//! A large request body (a long conversation: 1–4 MB) is allocated when it arrives and
//! freed when its request is done, several times a second. glibc's defaults return that
//! memory to the kernel each time: a block of 128 KiB or more is its own mapping (the
//! threshold rises only after such a block is freed, and only to the size of that block),
//! and a heap whose free top exceeds twice the threshold is trimmed. With a few 2 MB bodies
//! in flight, each new body then touched fresh pages: 150–330 page faults per request,
//! a quarter of the proxy's CPU on 2 MB requests (BENCHMARKS.md, "Session 7").
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

/// Sets the thresholds, unless the environment already sets the allocator's (a user's
/// `GLIBC_TUNABLES=glibc.malloc.…` or `MALLOC_*_` variables win). Called once, before the
/// serving threads start. Returns whether the settings were applied.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
pub fn keep_large_blocks() -> bool {
    let set_by_user = std::env::var("GLIBC_TUNABLES").is_ok_and(|t| t.contains("glibc.malloc."))
        || std::env::vars_os().any(|(name, _)| {
            let name = name.to_string_lossy();
            name.starts_with("MALLOC_") && name.ends_with('_')
        });
    if set_by_user {
        return false;
    }
    // SAFETY: mallopt only changes the allocator's parameters, under its own lock.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
            && libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
    }
}

/// Other platforms' allocators keep their own defaults.
#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub fn keep_large_blocks() -> bool {
    false
}

#[cfg(all(test, target_os = "linux", target_env = "gnu"))]
mod tests {
    use super::*;

    /// Page faults taken by the calling thread so far.
    fn minor_faults() -> i64 {
        // SAFETY: getrusage fills the struct it is given.
        unsafe {
            let mut usage: libc::rusage = std::mem::zeroed();
            assert_eq!(libc::getrusage(libc::RUSAGE_THREAD, &mut usage), 0);
            usage.ru_minflt
        }
    }

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
    fn freed_bodies_are_reused_without_new_page_faults() {
        assert!(
            keep_large_blocks(),
            "the test runs with the allocator's own settings"
        );
        five_bodies(); // the heap grows to hold them (or already had room)
                       // With glibc's defaults every round takes ~2,560 faults (10 MB of 4 KiB pages):
                       // the freed top of the heap is trimmed each time.
        for round in 1..4 {
            let faults = five_bodies();
            assert!(
                faults < 100,
                "round {round} took {faults} page faults: freed bodies went back to the kernel"
            );
        }
    }
}
