//! Buffers for large request bodies (1 MiB and more): mapped on transparent huge pages, and
//! kept for the next large body when freed.
//!
//! Why huge pages: a large body stays in memory as its conversation's last body, and the
//! next request reads all of it back, out of the cache, twice: once to compare it with the
//! bytes arriving (`body::read_body`) and once to write it upstream, since the bytes the two
//! bodies share are sent from it. On 4 KiB pages each of a 2 MB body's 512 pages is then
//! also a TLB miss, and on a virtual machine a miss is a two-level page walk. On 2 MiB
//! pages a 2 MB body arrived 30–200 µs sooner, and the 2 MB streams' first token came
//! ~0.1 ms sooner (BENCHMARKS.md, "What was tried").
//!
//! Why kept: a fresh mapping is a page fault on first touch of each page (a huge page is
//! zeroed whole). glibc's heap keeps freed bodies for the same reason (`crate::proxy::serve::allocator`),
//! but its memory is already on 4 KiB pages, and a hint given after the first touch changes
//! nothing until the kernel's background scan, much later, merges the pages.

#![allow(
    unsafe_code,
    reason = "a mapping of its own, handed to `Bytes` as its owner: each block says why it holds"
)]

use std::ptr::NonNull;
use std::sync::{Mutex, PoisonError};

use bytes::Bytes;

/// A huge page's size on x86_64 and arm64 (4 KiB base pages), and the step in which
/// mappings are sized, so that a body a few KB larger than the last reuses its mapping.
const HUGE_PAGE: usize = 2 << 20;

/// Freed mappings kept for reuse, in bytes of address space (resident only where a body
/// wrote): past this, a freed mapping is unmapped. As much as glibc keeps per heap
/// (`crate::proxy::serve::allocator`).
const KEPT_MAX: usize = 16 << 20;

/// A buffer that bytes are appended to, then frozen into [`Bytes`].
pub struct LargeBuffer {
    mapping: Mapping,
    len: usize,
}

impl LargeBuffer {
    /// An empty buffer with room for at least `capacity` bytes; `None` when no memory can
    /// be mapped (the caller then uses an ordinary buffer).
    pub fn with_capacity(capacity: usize) -> Option<LargeBuffer> {
        Some(LargeBuffer {
            mapping: KEPT.take(capacity)?,
            len: 0,
        })
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the first `len` bytes of the mapping were written (`append`), and the
        // mapping lives as long as `self`.
        unsafe { std::slice::from_raw_parts(self.mapping.start.as_ptr(), self.len) }
    }

    /// Appends `data` with non-temporal stores (see `copy_uncached`), moving to a larger
    /// mapping first when it does not fit. `None` when no larger mapping can be had.
    pub fn append(&mut self, data: &[u8]) -> Option<()> {
        let needed = self.len.checked_add(data.len())?;
        if needed > self.mapping.len {
            let mut larger = KEPT.take(needed.max(2 * self.mapping.len))?;
            // SAFETY: `larger` is a fresh mapping of at least `needed` bytes, apart from
            // ours; our first `len` bytes were written.
            unsafe { copy_uncached(self.as_slice(), larger.start.as_ptr()) };
            std::mem::swap(&mut self.mapping, &mut larger);
            KEPT.give_back(larger);
        }
        // SAFETY: `len + data.len()` bytes fit in the mapping, which `data` (a shared
        // borrow of other memory) cannot overlap.
        unsafe { copy_uncached(data, self.mapping.start.as_ptr().add(self.len)) };
        self.len = needed;
        Some(())
    }

    /// The bytes written, shared without a copy; the mapping is kept for reuse once the
    /// last clone of them is dropped.
    pub fn freeze(self) -> Bytes {
        Bytes::from_owner(self)
    }
}

impl AsRef<[u8]> for LargeBuffer {
    fn as_ref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl Drop for LargeBuffer {
    fn drop(&mut self) {
        let mapping = std::mem::replace(&mut self.mapping, Mapping::EMPTY);
        KEPT.give_back(mapping);
    }
}

/// Copies `data` to `dst` with non-temporal stores, which write to memory without first
/// reading each destination line into the cache (and without evicting what the cache
/// holds): a 2 MB body does not stay in a 2 MiB L2 anyway, and an ordinary copy took
/// 130–240 µs where this takes 80 (BENCHMARKS.md, "What was tried"). x86_64 only (SSE2 is part
/// of its baseline); elsewhere an ordinary copy.
///
/// # Safety
/// `dst..dst + data.len()` must be writable and must not overlap `data`.
unsafe fn copy_uncached(data: &[u8], dst: *mut u8) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
        // The streaming stores need 16-byte aligned destinations: the bytes before the
        // first aligned address, and those after the last whole line, are copied plainly.
        // A cache line (four stores) per iteration: a loop of single stores spent more
        // instructions on its own bookkeeping than on the copy (0.77 M per 2 MB body, most
        // of a 2 MB request's; 0.54 M now, callgrind of the whole proxy).
        let head = dst.align_offset(16).min(data.len());
        let lines = (data.len() - head) / 64;
        let tail = head + lines * 64;
        // SAFETY (with the caller's): every store lies in `dst..dst + data.len()`, and
        // `dst + head` is 16-byte aligned, so is every `dst + at`; the fence orders the
        // streaming stores before any later read of the buffer.
        std::ptr::copy_nonoverlapping(data.as_ptr(), dst, head);
        for line in 0..lines {
            let at = head + line * 64;
            let from = data.as_ptr().add(at);
            let to = dst.add(at);
            for i in [0, 16, 32, 48] {
                let v = _mm_loadu_si128(from.add(i).cast::<__m128i>());
                _mm_stream_si128(to.add(i).cast::<__m128i>(), v);
            }
        }
        _mm_sfence();
        std::ptr::copy_nonoverlapping(data.as_ptr().add(tail), dst.add(tail), data.len() - tail);
    }
    #[cfg(not(target_arch = "x86_64"))]
    std::ptr::copy_nonoverlapping(data.as_ptr(), dst, data.len());
}

/// Anonymous memory of `len` bytes (a multiple of [`HUGE_PAGE`]) starting on a huge page,
/// unmapped when dropped.
struct Mapping {
    start: NonNull<u8>,
    len: usize,
}

// SAFETY: a mapping is memory owned by its one `Mapping`; shared, it is only read.
unsafe impl Send for Mapping {}
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Holds nothing (what a buffer leaves behind when its mapping is given back).
    const EMPTY: Mapping = Mapping {
        start: NonNull::dangling(),
        len: 0,
    };

    /// A new mapping of `len` bytes, its first `huge` (at most `len`) asked to be backed by
    /// huge pages (a hint: where the kernel has none to give, or transparent huge pages are
    /// off, they are 4 KiB pages) and the rest asked not to be.
    #[cfg(target_os = "linux")]
    fn new(len: usize, huge: usize) -> Option<Mapping> {
        // Mapped one huge page longer, then trimmed to start on one.
        let whole = len.checked_add(HUGE_PAGE)?;
        // SAFETY: a fresh private anonymous mapping; only its own pages are unmapped or
        // advised below.
        unsafe {
            let base = libc::mmap(
                std::ptr::null_mut(),
                whole,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            );
            if base == libc::MAP_FAILED {
                return None;
            }
            let base = base.cast::<u8>();
            let lead = base.align_offset(HUGE_PAGE);
            if lead > 0 {
                libc::munmap(base.cast(), lead);
            }
            let start = base.add(lead);
            let trail = whole - lead - len;
            if trail > 0 {
                libc::munmap(start.add(len).cast(), trail);
            }
            // The rest is advised against huge pages, so that where the kernel gives them
            // to all memory (transparent huge pages "always"), a last huge page that the
            // body fills less than half of stays on 4 KiB pages there too.
            debug_assert!(huge <= len, "advice within the mapping");
            if huge > 0 {
                libc::madvise(start.cast(), huge, libc::MADV_HUGEPAGE);
            }
            if huge < len {
                libc::madvise(start.add(huge).cast(), len - huge, libc::MADV_NOHUGEPAGE);
            }
            Some(Mapping {
                start: NonNull::new(start)?,
                len,
            })
        }
    }

    #[cfg(not(target_os = "linux"))]
    fn new(_len: usize, _huge: usize) -> Option<Mapping> {
        None
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        #[cfg(target_os = "linux")]
        if self.len > 0 {
            // SAFETY: the mapping is ours alone and nothing refers to it any more.
            unsafe { libc::munmap(self.start.as_ptr().cast(), self.len) };
        }
    }
}

/// Freed mappings, most recently freed last.
struct Kept {
    mappings: Mutex<Vec<Mapping>>,
}

static KEPT: Kept = Kept::new();

impl Kept {
    const fn new() -> Kept {
        Kept {
            mappings: Mutex::new(Vec::new()),
        }
    }

    /// A mapping with room for `capacity` bytes: the smallest kept one that fits, else a
    /// new one. A new one's last huge page is asked for only when `capacity` fills at least
    /// half of it: one touched byte makes a huge page resident whole, so a body just past a
    /// multiple of 2 MiB would otherwise hold almost twice its size.
    fn take(&self, capacity: usize) -> Option<Mapping> {
        let len = capacity.max(1).checked_next_multiple_of(HUGE_PAGE)?;
        {
            let mut kept = self.lock();
            let fits = kept
                .iter()
                .enumerate()
                .filter(|(_, m)| m.len >= len)
                .min_by_key(|(_, m)| m.len)
                .map(|(i, _)| i);
            if let Some(i) = fits {
                return Some(kept.swap_remove(i));
            }
        }
        let huge = (capacity + HUGE_PAGE / 2) / HUGE_PAGE * HUGE_PAGE;
        Mapping::new(len, huge)
    }

    /// Keeps `mapping` for reuse while what is kept stays within [`KEPT_MAX`]; unmaps it
    /// otherwise (outside the lock).
    fn give_back(&self, mapping: Mapping) {
        if mapping.len == 0 {
            return;
        }
        let mut kept = self.lock();
        let held: usize = kept.iter().map(|m| m.len).sum();
        if held + mapping.len <= KEPT_MAX {
            kept.push(mapping);
            return;
        }
        drop(kept);
        drop(mapping);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Mapping>> {
        // Nothing panics while holding it; the list is consistent either way.
        self.mappings.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(len: usize) -> Vec<u8> {
        (0..len as u32).map(|i| (i * 7 + 3) as u8).collect()
    }

    #[test]
    fn appended_bytes_read_back_at_any_alignment_and_length() {
        let data = sample(300);
        // Every alignment of the destination, and lengths around whole 16-byte blocks and
        // 64-byte lines.
        for already in 0..17 {
            for len in [
                0, 1, 15, 16, 17, 31, 33, 63, 64, 65, 79, 80, 81, 127, 128, 129, 255, 300,
            ] {
                let mut buffer = LargeBuffer::with_capacity(LARGE).unwrap();
                buffer.append(&data[..already]).unwrap();
                buffer.append(&data[..len]).unwrap();
                let expected = [&data[..already], &data[..len]].concat();
                assert_eq!(
                    buffer.as_slice(),
                    expected,
                    "after {already} bytes, {len} more"
                );
            }
        }
    }

    const LARGE: usize = 1 << 20;

    #[test]
    fn a_buffer_grows_past_its_mapping_and_freezes_without_a_copy() {
        let data = sample(3 << 20);
        let mut buffer = LargeBuffer::with_capacity(LARGE).unwrap();
        for frame in data.chunks(65_537) {
            buffer.append(frame).unwrap();
        }
        assert_eq!(buffer.len(), data.len());
        let at = buffer.as_slice().as_ptr();
        let frozen = buffer.freeze();
        assert_eq!(frozen.as_ptr(), at, "frozen in place");
        let part = frozen.slice(10..20);
        drop(frozen);
        assert_eq!(&part[..], &data[10..20], "a slice outlives the whole");
    }

    #[test]
    fn a_freed_mapping_is_kept_for_the_next_body_within_the_bound() {
        let kept = Kept::new();
        let first = kept.take(3 << 20).unwrap();
        assert_eq!(first.len, 4 << 20, "sized in whole huge pages");
        let at = first.start;
        kept.give_back(first);
        let again = kept.take((4 << 20) - 5).unwrap();
        assert_eq!(again.start, at, "the freed mapping, not a new one");
        kept.give_back(again);
        // A mapping too small for the body is passed over.
        assert_ne!(kept.take(5 << 20).unwrap().start, at);
        // Past the bound, a freed mapping is unmapped rather than kept.
        let many: Vec<Mapping> = (0..6).map(|_| kept.take(4 << 20).unwrap()).collect();
        for mapping in many {
            kept.give_back(mapping);
        }
        let held: usize = kept.lock().iter().map(|m| m.len).sum();
        assert!(held <= KEPT_MAX, "{held} bytes kept");
        assert_eq!(held, KEPT_MAX, "as many as fit");
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_body_written_into_a_kept_mapping_takes_no_page_faults() {
        use crate::proxy::serve::minor_faults;
        let kept = Kept::new();
        let data = sample(2 << 20);
        let write = |kept: &Kept| {
            let mapping = kept.take(data.len()).unwrap();
            // SAFETY: the mapping has room for `data`, and is not `data`.
            unsafe { copy_uncached(&data, mapping.start.as_ptr()) };
            kept.give_back(mapping);
        };
        write(&kept);
        let before = minor_faults();
        write(&kept);
        let faults = minor_faults() - before;
        assert!(
            faults < 8,
            "{faults} page faults writing into a kept mapping"
        );
    }

    /// How much of `mapping` the kernel backs with huge pages, in KiB: the `AnonHugePages`
    /// of every region of `/proc/self/smaps` within it (advice splits one mapping into
    /// several regions).
    #[cfg(target_os = "linux")]
    fn huge_kb(mapping: &Mapping) -> u64 {
        let start = mapping.start.as_ptr() as usize;
        let within = start..start + mapping.len;
        let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
        let mut inside = false;
        let mut total = 0;
        for line in smaps.lines() {
            let region = line.split_once(' ').and_then(|(range, _)| {
                let (from, to) = range.split_once('-')?;
                Some((
                    usize::from_str_radix(from, 16).ok()?,
                    usize::from_str_radix(to, 16).ok()?,
                ))
            });
            if let Some((from, to)) = region {
                inside = within.contains(&from) && to <= within.end;
                continue;
            }
            if let Some(kb) = line.strip_prefix("AnonHugePages:").filter(|_| inside) {
                total += kb
                    .trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<u64>()
                    .unwrap();
            }
        }
        total
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_large_body_lies_on_huge_pages_where_the_kernel_offers_them() {
        let setting = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
            .unwrap_or_default();
        let on = !setting.is_empty() && !setting.contains("[never]");
        let kept = Kept::new();
        // Written whole: huge pages where each is at least half filled, not past that, under
        // "always" as under "madvise".
        for (len, expected_kb) in [
            (4 << 20, 4096),
            ((4 << 20) - (512 << 10), 4096),
            ((2 << 20) + (100 << 10), 2048),
        ] {
            let mapping = kept.take(len).unwrap();
            // SAFETY: the mapping has room for `len` bytes, apart from the sample's.
            unsafe { copy_uncached(&sample(len), mapping.start.as_ptr()) };
            let huge = huge_kb(&mapping);
            if on {
                assert_eq!(huge, expected_kb, "{len} bytes ({setting})");
            } else {
                assert_eq!(huge, 0, "{len} bytes: transparent huge pages are off");
            }
            drop(mapping);
        }
    }
}
