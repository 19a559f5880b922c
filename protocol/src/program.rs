//! The program a job's workers run, named by its content.
//!
//! Workers run the driver's own executable. On the driver's machine that is
//! the driver's file; on another node it is that file's copy, fetched once
//! and kept in the node's session directory. Both sides need a name for
//! "this program" that does not depend on where the file lies: a
//! [`Program`] is the file's GNU build id (the hash the linker writes into
//! every executable it makes, read from the ELF notes in a few reads), or,
//! for a file without one, the SHA-256 of its content, with its size and the
//! OS and architecture it was built for.
//!
//! ```no_run
//! use prism_protocol::program::Program;
//!
//! let here = Program::this()?;
//! let same = Program::of(&std::env::current_exe()?)?;
//! assert_eq!(*here, same);
//! here.runs_here()?; // the OS and architecture of this machine
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use serde::{Deserialize, Serialize};
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;
use std::sync::OnceLock;

/// An executable, by content.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Program {
    /// `build-id:<hex>` or `sha256:<hex>`.
    pub id: String,
    /// Its size in bytes.
    pub size: u64,
    /// The OS it runs on (`std::env::consts::OS` of the process that made
    /// this record from its own executable).
    pub os: String,
    /// Its CPU architecture (`std::env::consts::ARCH`, likewise).
    pub arch: String,
}

/// The most bytes of notes read while looking for a build id.
const NOTES_LIMIT: u64 = 1 << 20;
/// `PT_NOTE` in an ELF program header.
const PT_NOTE: u32 = 4;
/// `NT_GNU_BUILD_ID` in an ELF note.
const NT_GNU_BUILD_ID: u32 = 3;

impl Program {
    /// The program at `path`, as built for this machine's OS and
    /// architecture (the file's own are not read: a node compares what a
    /// process reports of itself with what it runs).
    ///
    /// # Errors
    ///
    /// The file cannot be read.
    pub fn of(path: &Path) -> std::io::Result<Program> {
        let mut file = std::fs::File::open(path)?;
        let size = file.metadata()?.len();
        let id = match build_id(&mut file) {
            Some(id) => format!("build-id:{}", hex(&id)),
            None => {
                use sha2::Digest;
                file.seek(SeekFrom::Start(0))?;
                let mut hasher = sha2::Sha256::new();
                let mut buf = vec![0u8; 1 << 20];
                loop {
                    let n = file.read(&mut buf)?;
                    if n == 0 {
                        break;
                    }
                    hasher.update(&buf[..n]);
                }
                format!("sha256:{}", hex(&hasher.finalize()))
            }
        };
        Ok(Program {
            id,
            size,
            os: std::env::consts::OS.to_string(),
            arch: std::env::consts::ARCH.to_string(),
        })
    }

    /// This process's own program (`/proc/self/exe`), read once.
    ///
    /// # Errors
    ///
    /// The executable cannot be read; the message says why.
    pub fn this() -> Result<&'static Program, String> {
        static THIS: OnceLock<Result<Program, String>> = OnceLock::new();
        THIS.get_or_init(|| {
            Program::of(Path::new("/proc/self/exe")).map_err(|e| {
                format!(
                    "cannot read this program's executable (/proc/self/exe): {e}; Prism \
                         names the program its workers run from it, so it needs Linux's /proc"
                )
            })
        })
        .as_ref()
        .map_err(Clone::clone)
    }

    /// Whether this machine can run the program: the same OS and CPU
    /// architecture.
    ///
    /// # Errors
    ///
    /// A message naming both sides' OS and architecture.
    pub fn runs_here(&self) -> Result<(), String> {
        let (os, arch) = (std::env::consts::OS, std::env::consts::ARCH);
        if self.os == os && self.arch == arch {
            return Ok(());
        }
        Err(format!(
            "the job's program ({}, {} bytes) is built for {}/{}, and this machine runs \
             {os}/{arch}: build the driver for {os}/{arch}, or run its work on nodes of its \
             own kind (a custom resource on those nodes steers it there)",
            self.id, self.size, self.os, self.arch
        ))
    }

    /// A file name for this program's folder in a cache: its id with `:`
    /// replaced.
    pub fn folder_name(&self) -> String {
        self.id
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect()
    }
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// The GNU build id of a 64-bit little-endian ELF file, if it has one. A
/// file that is not such an ELF file, or whose headers are cut short or
/// point outside it, has none (it is then named by its content).
fn build_id(file: &mut std::fs::File) -> Option<Vec<u8>> {
    let mut header = [0u8; 64];
    file.read_exact(&mut header).ok()?;
    // Magic, 64-bit class, little-endian data.
    if header[..4] != *b"\x7fELF" || header[4] != 2 || header[5] != 1 {
        return None;
    }
    let phoff = u64::from_le_bytes(field(&header, 0x20));
    let phentsize = u64::from(u16::from_le_bytes(field(&header, 0x36)));
    let phnum = u64::from(u16::from_le_bytes(field(&header, 0x38)));
    if phentsize < 56 {
        return None;
    }
    for i in 0..phnum {
        let mut ph = [0u8; 56];
        let at = phoff.checked_add(i.checked_mul(phentsize)?)?;
        file.seek(SeekFrom::Start(at)).ok()?;
        file.read_exact(&mut ph).ok()?;
        if u32::from_le_bytes(field(&ph, 0)) != PT_NOTE {
            continue;
        }
        let offset = u64::from_le_bytes(field(&ph, 8));
        let filesz = u64::from_le_bytes(field(&ph, 32)).min(NOTES_LIMIT);
        let mut notes = vec![0u8; filesz as usize];
        file.seek(SeekFrom::Start(offset)).ok()?;
        file.read_exact(&mut notes).ok()?;
        if let Some(id) = gnu_build_id(&notes) {
            return Some(id);
        }
    }
    None
}

/// Walks one note segment: each note is its name size, its descriptor
/// size and its type, then the name and the descriptor, each padded to 4
/// bytes.
fn gnu_build_id(mut notes: &[u8]) -> Option<Vec<u8>> {
    let pad = |n: usize| n.div_ceil(4) * 4;
    while notes.len() >= 12 {
        let namesz = u32::from_le_bytes(field(notes, 0)) as usize;
        let descsz = u32::from_le_bytes(field(notes, 4)) as usize;
        let kind = u32::from_le_bytes(field(notes, 8));
        let name_end = 12usize.checked_add(pad(namesz))?;
        let desc_end = name_end.checked_add(pad(descsz))?;
        if desc_end > notes.len() {
            return None;
        }
        if kind == NT_GNU_BUILD_ID && notes[12..12 + namesz] == *b"GNU\0" && descsz > 0 {
            return Some(notes[name_end..name_end + descsz].to_vec());
        }
        notes = &notes[desc_end..];
    }
    None
}

/// `N` bytes of `bytes` from `at` (the caller checked the length).
fn field<const N: usize>(bytes: &[u8], at: usize) -> [u8; N] {
    let mut out = [0u8; N];
    out.copy_from_slice(&bytes[at..at + N]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_program_is_named_by_its_build_id_the_same_from_any_path() {
        let here = Program::this().unwrap();
        assert!(here.id.starts_with("build-id:"), "{here:?}");
        here.runs_here().unwrap();
        let dir = std::env::temp_dir().join(format!("prism-program-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let copy = dir.join("copy");
        std::fs::copy("/proc/self/exe", &copy).unwrap();
        assert_eq!(Program::of(&copy).unwrap(), *here);
        // A file that is not an executable is named by its content.
        let data = dir.join("data");
        std::fs::write(&data, b"abc").unwrap();
        let other = Program::of(&data).unwrap();
        assert_eq!(
            other.id,
            "sha256:ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
        assert_eq!(other.size, 3);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_program_for_another_machine_says_so() {
        let mut p = Program::this().unwrap().clone();
        p.arch = "riscv64".into();
        let err = p.runs_here().unwrap_err();
        assert!(err.contains("built for linux/riscv64"), "{err}");
    }

    #[test]
    fn a_cut_short_executable_is_named_by_its_content() {
        let dir = std::env::temp_dir().join(format!("prism-program-cut-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cut = dir.join("cut");
        let head = std::fs::read("/proc/self/exe").unwrap();
        std::fs::write(&cut, &head[..100]).unwrap();
        assert!(Program::of(&cut).unwrap().id.starts_with("sha256:"));
        // Program headers said to lie far past the end of the file.
        let mut odd = head[..64].to_vec();
        odd[0x20..0x28].copy_from_slice(&u64::MAX.to_le_bytes());
        std::fs::write(&cut, &odd).unwrap();
        assert!(Program::of(&cut).unwrap().id.starts_with("sha256:"));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn truncated_or_odd_notes_are_read_safely() {
        assert_eq!(gnu_build_id(&[]), None);
        let mut note = Vec::new();
        note.extend(4u32.to_le_bytes());
        note.extend(2u32.to_le_bytes());
        note.extend(NT_GNU_BUILD_ID.to_le_bytes());
        note.extend(b"GNU\0");
        note.extend([0xab, 0xcd, 0, 0]);
        assert_eq!(gnu_build_id(&note), Some(vec![0xab, 0xcd]));
        assert_eq!(gnu_build_id(&note[..18]), None);
        let mut huge = note.clone();
        huge[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(gnu_build_id(&huge), None);
    }
}
