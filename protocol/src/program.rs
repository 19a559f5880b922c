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
//! A node that copies a program takes only its *runnable image*: the bytes
//! up to the end of the last part the program headers describe (what the
//! kernel and the dynamic loader read), without the debug sections and
//! symbol tables linkers put after them. In a debug build those are most of
//! the file (a 341 MB test binary has a 56 MB image), so a node that just
//! joined runs a job's first task that much sooner. The copy names the same
//! program (its build id is in the image); a worker there runs as well,
//! though a backtrace it prints names no functions or lines.
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
    /// The length of its runnable image (see the module's docs): less
    /// than `size` for an ELF file named by its build id that carries
    /// sections after its loaded parts, else `size`. 0 in a record made
    /// before images were copied, which [`Program::image_len`] reads as
    /// `size`.
    #[serde(default)]
    pub image: u64,
    /// The OS it runs on (`std::env::consts::OS` of the process that made
    /// this record from its own executable).
    pub os: String,
    /// Its CPU architecture (`std::env::consts::ARCH`, likewise).
    pub arch: String,
}

/// The most bytes of notes read while looking for a build id.
const NOTES_LIMIT: u64 = 1 << 20;
/// Where the ELF header keeps `e_shoff` (the section headers' offset).
const ELF_SHOFF: usize = 0x28;
/// Where the ELF header keeps `e_shnum`, followed by `e_shstrndx`.
const ELF_SHNUM: usize = 0x3c;
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
        let (id, image) = match build_id(&mut file) {
            Some(id) => (
                format!("build-id:{}", hex(&id)),
                image_end(&mut file).map_or(size, |end| end.min(size)),
            ),
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
                (format!("sha256:{}", hex(&hasher.finalize())), size)
            }
        };
        Ok(Program {
            id,
            size,
            image,
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

    /// How many bytes of the file a copy of the program takes: its
    /// runnable image.
    pub fn image_len(&self) -> u64 {
        if self.image == 0 || self.image > self.size {
            self.size
        } else {
            self.image
        }
    }

    /// Whether `other` names the same program with the same runnable
    /// image: the whole file and a copy of its image are the same program.
    ///
    /// ```no_run
    /// use prism_protocol::program::Program;
    ///
    /// let whole = Program::this()?;
    /// let copy = std::env::temp_dir().join("image-copy");
    /// whole.copy_image(std::path::Path::new("/proc/self/exe"), &copy)?;
    /// let image = Program::of(&copy)?;
    /// assert!(whole.same_image(&image));
    /// assert_eq!(image.size, whole.image_len());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn same_image(&self, other: &Program) -> bool {
        self.id == other.id && self.image_len() == other.image_len()
    }

    /// Makes the file at `copy`, holding this program's first
    /// [`image_len`](Self::image_len) bytes, a runnable image: when it is
    /// shorter than the whole file, the ELF header's section-header fields
    /// (which point past its end) are cleared, so that tools reading it
    /// see an ELF file without sections rather than a cut one.
    ///
    /// # Errors
    ///
    /// The file cannot be read or written.
    pub fn seal_image(&self, copy: &Path) -> std::io::Result<()> {
        use std::io::Write;
        if self.image_len() >= self.size {
            return Ok(());
        }
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(copy)?;
        let mut header = [0u8; 64];
        file.read_exact(&mut header)?;
        clear_sections(&mut header);
        file.seek(SeekFrom::Start(0))?;
        file.write_all(&header)
    }

    /// This program's runnable image, read from `from` (a file holding the
    /// program whole or as an image): its first
    /// [`image_len`](Self::image_len) bytes, with the header sealed as
    /// [`seal_image`](Self::seal_image) does. A source shorter than the
    /// image ends the reader early (its reader sees the short count).
    ///
    /// # Errors
    ///
    /// `from` cannot be opened or read.
    pub fn open_image(&self, from: &Path) -> std::io::Result<impl Read> {
        let mut file = std::fs::File::open(from)?;
        let mut header = vec![0u8; 64.min(self.image_len()) as usize];
        file.read_exact(&mut header)?;
        if self.image_len() < self.size && header.len() == 64 {
            clear_sections(&mut header);
        }
        let rest = self.image_len() - header.len() as u64;
        Ok(std::io::Cursor::new(header).chain(file.take(rest)))
    }

    /// Writes this program's runnable image, read from `from` (see
    /// [`open_image`](Self::open_image)), to `to`, executable.
    ///
    /// # Errors
    ///
    /// Either file cannot be read or written, or `from` is shorter than
    /// the image.
    pub fn copy_image(&self, from: &Path, to: &Path) -> std::io::Result<()> {
        use std::os::unix::fs::PermissionsExt;
        let mut source = self.open_image(from)?;
        let mut target = std::fs::File::create(to)?;
        let copied = std::io::copy(&mut source, &mut target)?;
        if copied != self.image_len() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                format!(
                    "{} holds {copied} bytes of program {}, whose image has {}",
                    from.display(),
                    self.id,
                    self.image_len()
                ),
            ));
        }
        std::fs::set_permissions(to, std::fs::Permissions::from_mode(0o755))
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

/// Clears the section headers' offset, count and string table index in a
/// 64-bit ELF header (`e_shentsize` stays).
fn clear_sections(header: &mut [u8]) {
    header[ELF_SHOFF..ELF_SHOFF + 8].fill(0);
    header[ELF_SHNUM..ELF_SHNUM + 4].fill(0);
}

/// The end of the last byte any program header of a 64-bit
/// little-endian ELF file describes (the loader reads nothing past it),
/// the ELF header and the program headers included; `None` when the
/// headers cannot be read.
fn image_end(file: &mut std::fs::File) -> Option<u64> {
    let mut header = [0u8; 64];
    file.seek(SeekFrom::Start(0)).ok()?;
    file.read_exact(&mut header).ok()?;
    let phoff = u64::from_le_bytes(field(&header, 0x20));
    let phentsize = u64::from(u16::from_le_bytes(field(&header, 0x36)));
    let phnum = u64::from(u16::from_le_bytes(field(&header, 0x38)));
    if phentsize < 56 {
        return None;
    }
    let mut end = phoff.checked_add(phnum.checked_mul(phentsize)?)?.max(64);
    for i in 0..phnum {
        let mut ph = [0u8; 56];
        file.seek(SeekFrom::Start(phoff + i * phentsize)).ok()?;
        file.read_exact(&mut ph).ok()?;
        let offset = u64::from_le_bytes(field(&ph, 8));
        let filesz = u64::from_le_bytes(field(&ph, 32));
        end = end.max(offset.checked_add(filesz)?);
    }
    Some(end)
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
        assert_eq!(
            other.image_len(),
            3,
            "a file named by content is copied whole"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_copy_of_the_runnable_image_is_the_same_program_and_runs() {
        let here = Program::this().unwrap();
        assert!(
            here.image_len() < here.size,
            "a test binary carries debug sections after its image: {here:?}"
        );
        let dir = std::env::temp_dir().join(format!("prism-program-image-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let copy = dir.join("image");
        here.copy_image(Path::new("/proc/self/exe"), &copy).unwrap();
        let image = Program::of(&copy).unwrap();
        assert!(here.same_image(&image), "{here:?} against {image:?}");
        assert_eq!(image.size, here.image_len());
        assert_eq!(image.image_len(), image.size);
        // It runs: the test harness in it lists this very test.
        let name = "program::tests::a_copy_of_the_runnable_image_is_the_same_program_and_runs";
        let listed = std::process::Command::new(&copy)
            .args(["--list", "--exact", name])
            .output()
            .unwrap();
        assert!(listed.status.success(), "{listed:?}");
        assert!(
            String::from_utf8_lossy(&listed.stdout).contains(name),
            "{listed:?}"
        );
        // The first bytes of the whole file, sealed (as a node that
        // fetched them in chunks does), are the same image.
        let sealed = dir.join("sealed");
        let whole = std::fs::read("/proc/self/exe").unwrap();
        std::fs::write(&sealed, &whole[..here.image_len() as usize]).unwrap();
        here.seal_image(&sealed).unwrap();
        assert_eq!(
            std::fs::read(&copy).unwrap(),
            std::fs::read(&sealed).unwrap()
        );
        // An image copied from an image is the same image, byte for byte.
        let again = dir.join("again");
        image.copy_image(&copy, &again).unwrap();
        assert_eq!(
            std::fs::read(&copy).unwrap(),
            std::fs::read(&again).unwrap()
        );
        // A source shorter than the image is refused, not copied short.
        let mut longer = here.clone();
        longer.image = here.image_len() + 1;
        longer.size = longer.image + 1;
        let err = longer.copy_image(&copy, &dir.join("short")).unwrap_err();
        assert!(err.to_string().contains("whose image has"), "{err}");
        // A record from before images (image 0) copies the whole file.
        let mut old = here.clone();
        old.image = 0;
        assert_eq!(old.image_len(), old.size);
        assert!(!old.same_image(here));
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
