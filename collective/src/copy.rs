//! Bulk copies for the shared-memory rings.
//!
//! The C library's `memcpy` picks `rep movsb` for copies of a few KiB up to
//! the cache size. On some CPUs (AMD Zen among them) that instruction slows
//! down three to eight times when the source and destination sit at certain
//! offsets from each other within a cache line or page. A ring's write
//! position moves by each call's 24-byte header, so a run of collectives
//! would hit those offsets on some calls and not others. [`copy`] is a plain
//! vector loop instead: stores aligned to the destination, loads unaligned,
//! at the same speed whatever the offsets. [`copy_streaming`] is the same
//! with non-temporal stores, for destinations larger than the caches.
//!
//! While the data is in cache the C library's wider copies are faster than
//! this loop, so the rings use these two only for calls that move buffers
//! larger than the caches ([`Mesh::set_bulk`](crate::transport::Mesh::set_bulk)),
//! and [`libc_copy`] otherwise, which takes the loop only at the one
//! distance where `rep movsb` crawls even in cache.

/// The C library's copy, the fastest for data in cache, except where the
/// destination sits just past the source (see [`rep_movsb_hazard`]): there
/// the vector loop of [`copy`].
///
/// # Safety
///
/// As for [`std::ptr::copy_nonoverlapping`].
pub(crate) unsafe fn libc_copy(dst: *mut u8, src: *const u8, len: usize) {
    if len >= LOOP_FROM && rep_movsb_hazard(dst, src) {
        vector_copy::<false>(dst, src, len);
    } else {
        std::ptr::copy_nonoverlapping(src, dst, len);
    }
}

/// Whether `dst` lies 1 to 63 bytes past `src`, counted within a 4 KiB
/// page. There `rep movsb` (which the C library uses from a few KiB up to
/// the cache size) runs far slower on AMD Zen: a 32 KiB copy in cache at 3
/// GB/s with `dst` 8 bytes ahead against 51-58 GB/s with it behind, and 33-47
/// GB/s further into the window; the vector loop ran at 41-58 GB/s
/// throughout (a C loop over `memcpy` at every distance, on this project's
/// 2-core AMD EPYC machine).
fn rep_movsb_hazard(dst: *const u8, src: *const u8) -> bool {
    let ahead = (dst as usize).wrapping_sub(src as usize) % 4096;
    (1..64).contains(&ahead)
}

/// Below this, the C library's copy (short vector moves) is as good.
const LOOP_FROM: usize = 1024;

/// Copies `len` bytes from `src` to `dst` at a speed that does not depend
/// on their offsets.
///
/// # Safety
///
/// As for [`std::ptr::copy_nonoverlapping`].
pub(crate) unsafe fn copy(dst: *mut u8, src: *const u8, len: usize) {
    vector_copy::<false>(dst, src, len);
}

/// As [`copy`], writing around the cache: the destination's lines are not
/// read first and do not displace what is cached (the ring, the next chunk).
/// Only worth it for destinations much larger than the caches.
///
/// # Safety
///
/// As for [`std::ptr::copy_nonoverlapping`].
pub(crate) unsafe fn copy_streaming(dst: *mut u8, src: *const u8, len: usize) {
    vector_copy::<true>(dst, src, len);
}

/// SSE2, which every x86-64 CPU has: 64 bytes a step, stores aligned to
/// 16 bytes, the ragged head and tail copied plainly; copies shorter than
/// [`LOOP_FROM`] go to the C library.
#[cfg(target_arch = "x86_64")]
unsafe fn vector_copy<const STREAM: bool>(dst: *mut u8, src: *const u8, len: usize) {
    use std::arch::x86_64::{
        __m128i, _mm_loadu_si128, _mm_sfence, _mm_store_si128, _mm_stream_si128,
    };
    if len < LOOP_FROM {
        std::ptr::copy_nonoverlapping(src, dst, len);
        return;
    }
    let head = dst.align_offset(16).min(len);
    std::ptr::copy_nonoverlapping(src, dst, head);
    let body = (len - head) / 64 * 64;
    let (mut d, mut s) = (dst.add(head), src.add(head));
    let end = d.add(body);
    while d < end {
        let v = [
            _mm_loadu_si128(s as *const __m128i),
            _mm_loadu_si128(s.add(16) as *const __m128i),
            _mm_loadu_si128(s.add(32) as *const __m128i),
            _mm_loadu_si128(s.add(48) as *const __m128i),
        ];
        for (k, v) in v.into_iter().enumerate() {
            let at = d.add(16 * k) as *mut __m128i;
            if STREAM {
                _mm_stream_si128(at, v);
            } else {
                _mm_store_si128(at, v);
            }
        }
        d = d.add(64);
        s = s.add(64);
    }
    std::ptr::copy_nonoverlapping(s, d, len - head - body);
    if STREAM {
        // Non-temporal stores are weakly ordered: fence them before
        // anything that may hand the buffer to another thread.
        _mm_sfence();
    }
}

#[cfg(not(target_arch = "x86_64"))]
unsafe fn vector_copy<const STREAM: bool>(dst: *mut u8, src: *const u8, len: usize) {
    std::ptr::copy_nonoverlapping(src, dst, len);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hazard_is_a_destination_just_past_its_source() {
        let base = 0x10_0000usize;
        let at = |d: usize, s: usize| rep_movsb_hazard(d as *const u8, s as *const u8);
        assert!(at(base + 8, base));
        assert!(at(base + 4096 + 63, base));
        assert!(at(base + 1, base + 8192));
        assert!(!at(base, base));
        assert!(!at(base + 64, base));
        assert!(!at(base, base + 8));
        assert!(!at(base + 4096, base));
    }

    #[test]
    fn copies_every_byte_at_every_offset_and_length() {
        let src: Vec<u8> = (0..5000u32).map(|i| (i * 7 + 3) as u8).collect();
        let copies: [unsafe fn(*mut u8, *const u8, usize); 3] = [copy, copy_streaming, libc_copy];
        for copy_with in copies {
            for len in [0, 1, 15, 63, 64, 1023, 1024, 1025, 1100, 4000] {
                for (so, dof) in [(0, 0), (1, 0), (0, 3), (24, 16), (17, 41), (63, 1), (3, 11)] {
                    let mut dst = vec![0xAAu8; 4200];
                    // SAFETY: both ranges are in bounds and do not overlap.
                    unsafe {
                        let (d, s) = (dst.as_mut_ptr().add(dof), src.as_ptr().add(so));
                        copy_with(d, s, len);
                    }
                    assert_eq!(&dst[dof..dof + len], &src[so..so + len]);
                    assert!(dst[..dof].iter().all(|&b| b == 0xAA), "wrote before");
                    assert!(dst[dof + len..].iter().all(|&b| b == 0xAA), "wrote after");
                }
            }
        }
    }
}
