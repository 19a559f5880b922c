//! The shared-memory file every process on a node maps.

use memmap2::MmapRaw;
use prism_protocol::Error;
use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// A mapping of the node's object segment.
///
/// The mapping is shared and writable: objects are written in place by their
/// creator and read in place by everyone. Immutability after sealing is a
/// protocol rule, enforced by the object table handing out offsets of
/// sealed objects only to readers.
#[derive(Debug)]
pub struct Segment {
    map: MmapRaw,
    /// One bit per 2 MiB chunk this process has already mapped in (see
    /// [`Segment::prefault`]).
    mapped_chunks: Vec<AtomicU64>,
    path: PathBuf,
    /// The creator keeps the memfd open so others can open it by path.
    _file: Option<std::fs::File>,
}

// The mapping is plain shared memory; synchronisation of object contents is
// by the create/seal/pin protocol.
unsafe impl Send for Segment {}
unsafe impl Sync for Segment {}

impl Segment {
    /// Creates an anonymous shared-memory file (`memfd`) of `capacity`
    /// bytes and maps it. Pages are allocated lazily as they are first
    /// written. Other processes open it through [`Segment::path`]
    /// (`/proc/<pid>/fd/<n>`); the memory goes back to the system when the
    /// last process holding it exits, however it exits, so nothing is left
    /// behind in `/dev/shm`. `name` shows in `/proc/<pid>/maps`.
    pub fn create(name: &str, capacity: u64) -> Result<Segment, Error> {
        use std::os::fd::FromRawFd;
        let c_name =
            std::ffi::CString::new(name).map_err(|e| Error::io("name the object store", e))?;
        // SAFETY: c_name is a valid C string; the flags are plain bits.
        let fd = unsafe { libc::memfd_create(c_name.as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            return Err(Error::io(
                "create the object store (memfd_create)",
                std::io::Error::last_os_error(),
            ));
        }
        // SAFETY: fd was just returned by memfd_create and is owned by no one else.
        let file = unsafe { std::fs::File::from_raw_fd(fd) };
        file.set_len(capacity.max(1))
            .map_err(|e| Error::io(format!("size the object store to {capacity} bytes"), e))?;
        let map = MmapRaw::map_raw(&file).map_err(|e| Error::io("map the object store", e))?;
        advise_huge_pages(&map);
        Ok(Segment {
            mapped_chunks: chunk_bitmap(map.len() as u64),
            map,
            path: PathBuf::from(format!("/proc/{}/fd/{fd}", std::process::id())),
            _file: Some(file),
        })
    }

    /// Maps an existing segment created by this node's raylet.
    pub fn open(path: &Path) -> Result<Segment, Error> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| Error::io(format!("open object store at {}", path.display()), e))?;
        let map = MmapRaw::map_raw(&file)
            .map_err(|e| Error::io(format!("map object store at {}", path.display()), e))?;
        advise_huge_pages(&map);
        Ok(Segment {
            mapped_chunks: chunk_bitmap(map.len() as u64),
            map,
            path: path.to_path_buf(),
            _file: None,
        })
    }

    /// Allocates (and zeroes) the memory of the segment's first `len`
    /// bytes now, without mapping it into this process, so that the first
    /// objects written there do not wait for it. Lowest offsets are handed
    /// out first, so the first objects land there. Costs `len` bytes of
    /// memory from now on instead of when the store fills; a no-op in
    /// processes that only opened the segment.
    pub fn allocate_ahead(&self, len: u64) -> Result<(), Error> {
        use std::os::fd::AsRawFd;
        let Some(file) = &self._file else {
            return Ok(());
        };
        let len = len.min(self.len());
        if len == 0 {
            return Ok(());
        }
        // SAFETY: fallocate on a file descriptor we own; no memory is passed.
        let r = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, len as libc::off_t) };
        if r != 0 {
            return Err(Error::io(
                format!("allocate the object store's first {len} bytes ahead"),
                std::io::Error::last_os_error(),
            ));
        }
        Ok(())
    }

    /// The mapped length.
    pub fn len(&self) -> u64 {
        self.map.len() as u64
    }

    /// Whether the mapping is empty.
    pub fn is_empty(&self) -> bool {
        self.map.len() == 0
    }

    /// The file behind the mapping.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn check(&self, offset: u64, len: u64) -> Result<(), Error> {
        if offset.checked_add(len).is_none_or(|end| end > self.len()) {
            return Err(Error::OutsideSegment {
                offset,
                len,
                segment_len: self.len(),
            });
        }
        Ok(())
    }

    /// A pointer to `len` bytes at `offset`, after a bounds check.
    pub fn ptr(&self, offset: u64, len: u64) -> Result<*mut u8, Error> {
        self.check(offset, len)?;
        // In bounds by the check above.
        Ok(unsafe { self.map.as_mut_ptr().add(offset as usize) })
    }

    /// Copies `data` into the segment at `offset`.
    ///
    /// The caller must own the range (created, not yet sealed).
    pub fn write(&self, offset: u64, data: &[u8]) -> Result<(), Error> {
        let dst = self.ptr(offset, data.len() as u64)?;
        self.prefault(offset, data.len() as u64);
        // The range is in bounds and, by the store protocol, written by no
        // one else until sealed.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), dst, data.len()) };
        Ok(())
    }

    /// Borrows `len` bytes at `offset`.
    ///
    /// # Safety
    ///
    /// The range must belong to a sealed object that stays pinned for the
    /// lifetime of the returned slice.
    pub unsafe fn slice(&self, offset: u64, len: u64) -> Result<&[u8], Error> {
        let ptr = self.ptr(offset, len)?;
        Ok(std::slice::from_raw_parts(ptr, len as usize))
    }
}

/// Ranges at least this large ask the kernel for all their pages at once.
const PREFAULT_MIN_BYTES: u64 = 1 << 20;
/// Granularity of the record of what this process has mapped in.
const CHUNK_BYTES: u64 = 2 << 20;

fn chunk_bitmap(len: u64) -> Vec<AtomicU64> {
    (0..len.div_ceil(CHUNK_BYTES).div_ceil(64))
        .map(|_| AtomicU64::new(0))
        .collect()
}

impl Segment {
    /// Maps in the pages of a large range this process has not touched yet,
    /// with one system call, before it is copied to or read from: the
    /// alternative is one page fault per 4 KiB during the copy, which costs
    /// more than the copy itself (and on fresh shared memory the kernel
    /// must also allocate and zero the pages). Chunks already mapped in by
    /// this process are skipped.
    pub fn prefault(&self, offset: u64, len: u64) {
        if len < PREFAULT_MIN_BYTES || offset.checked_add(len).is_none_or(|end| end > self.len()) {
            return;
        }
        let first = offset / CHUNK_BYTES;
        let last = (offset + len - 1) / CHUNK_BYTES;
        let mut missing = None::<(u64, u64)>;
        for chunk in first..=last {
            let word = &self.mapped_chunks[(chunk / 64) as usize];
            let bit = 1u64 << (chunk % 64);
            if word.fetch_or(bit, Ordering::Relaxed) & bit == 0 {
                missing = Some(missing.map_or((chunk, chunk), |(a, _)| (a, chunk)));
            }
        }
        if let Some((a, b)) = missing {
            let start = (a * CHUNK_BYTES).max(offset);
            let end = ((b + 1) * CHUNK_BYTES).min(offset + len);
            // In bounds: checked above.
            let ptr = unsafe { self.map.as_mut_ptr().add(start as usize) };
            prefault_for_write(ptr, (end - start) as usize);
        }
    }
}

/// Asks for transparent huge pages on the segment's mapping: where the
/// kernel allows them for shared memory (`shmem_enabled` set to `advise`),
/// a fresh 2 MiB chunk then costs one fault instead of 512. Elsewhere the
/// advice is ignored.
fn advise_huge_pages(map: &MmapRaw) {
    // SAFETY: the range is exactly our own mapping; the advice does not
    // change its contents.
    unsafe {
        libc::madvise(
            map.as_mut_ptr() as *mut libc::c_void,
            map.len(),
            libc::MADV_HUGEPAGE,
        );
    }
}

/// Populates the pages under `[ptr, ptr + len)` in one system call
/// (`MADV_POPULATE_WRITE`, Linux 5.14+) instead of one page fault per 4 KiB
/// during the copy: on fresh shared memory that is the difference between
/// about 1 and several GB/s. On older kernels the call fails and the copy
/// simply faults pages in as before.
fn prefault_for_write(ptr: *mut u8, len: usize) {
    const MADV_POPULATE_WRITE: libc::c_int = 23;
    let page = 4096usize;
    let start = (ptr as usize) & !(page - 1);
    let end = (ptr as usize + len).div_ceil(page) * page;
    // SAFETY: the range lies inside our own shared mapping (bounds were
    // checked by the caller); madvise does not change its contents.
    unsafe {
        libc::madvise(start as *mut libc::c_void, end - start, MADV_POPULATE_WRITE);
    }
}
