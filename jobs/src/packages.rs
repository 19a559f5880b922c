//! Uploaded `working_dir` packages: zips named by their content hash, as
//! Ray's client makes them (`gcs://_ray_pkg_<hash>.zip`), kept on the
//! head's disk and unpacked once into a folder of their own.

use crate::error::JobError;
use std::io::Read;
use std::path::{Path, PathBuf};

/// A package's name, checked: `_ray_pkg_` (or `_prism_pkg_`), letters and
/// digits, `.zip`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackageName(String);

impl PackageName {
    /// Checks the name part of a package route (`/api/packages/gcs/{name}`).
    pub fn parse(protocol: &str, name: &str) -> Result<PackageName, JobError> {
        if protocol != "gcs" {
            return Err(JobError::BadRequest(format!(
                "packages are stored on the head (protocol \"gcs\"), not {protocol:?}"
            )));
        }
        let stem = name.strip_suffix(".zip").and_then(|s| {
            s.strip_prefix("_ray_pkg_")
                .or_else(|| s.strip_prefix("_prism_pkg_"))
        });
        match stem {
            Some(hash)
                if !hash.is_empty()
                    && hash.len() <= 128
                    && hash.bytes().all(|b| b.is_ascii_alphanumeric()) =>
            {
                Ok(PackageName(name.to_string()))
            }
            _ => Err(JobError::BadRequest(format!(
                "package name {name:?} must be _ray_pkg_<hash>.zip (letters and digits)"
            ))),
        }
    }

    /// Checks a package URI, as `runtime_env.working_dir` names it.
    pub fn from_uri(uri: &str) -> Result<PackageName, JobError> {
        let Some((protocol, name)) = uri.split_once("://") else {
            return Err(JobError::BadRequest(format!(
                "runtime_env.working_dir {uri:?} must be the URI of an uploaded package \
                 (gcs://_ray_pkg_<hash>.zip): a client uploads a local folder and sends its URI"
            )));
        };
        PackageName::parse(protocol, name)
    }

    /// The file name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The packages on the head's disk.
#[derive(Debug)]
pub(crate) struct PackageStore {
    dir: PathBuf,
    limit: u64,
}

impl PackageStore {
    pub(crate) fn open(dir: PathBuf, limit: u64) -> Result<PackageStore, JobError> {
        std::fs::create_dir_all(&dir)
            .map_err(JobError::disk("cannot make the packages folder", &dir))?;
        Ok(PackageStore { dir, limit })
    }

    pub(crate) fn limit(&self) -> u64 {
        self.limit
    }

    fn zip_path(&self, name: &PackageName) -> PathBuf {
        self.dir.join(name.as_str())
    }

    pub(crate) fn exists(&self, name: &PackageName) -> bool {
        self.zip_path(name).is_file()
    }

    pub(crate) fn read(&self, name: &PackageName) -> Result<Vec<u8>, JobError> {
        let path = self.zip_path(name);
        std::fs::read(&path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => JobError::NoSuchPackage(name.as_str().to_string()),
            _ => JobError::disk("cannot read the package", &path)(e),
        })
    }

    /// Stores an upload: written beside, then renamed into place, so a
    /// package is whole or absent.
    pub(crate) fn put(&self, name: &PackageName, bytes: &[u8]) -> Result<(), JobError> {
        if bytes.len() as u64 > self.limit {
            return Err(JobError::TooLarge {
                size: bytes.len() as u64,
                limit: self.limit,
            });
        }
        // A zip at all: its end record must be there.
        zip::ZipArchive::new(std::io::Cursor::new(bytes)).map_err(|e| {
            JobError::BadRequest(format!(
                "the package {} is not a zip file: {e}",
                name.as_str()
            ))
        })?;
        let path = self.zip_path(name);
        let partial = self
            .dir
            .join(format!(".{}.{}.partial", name.as_str(), std::process::id()));
        std::fs::write(&partial, bytes)
            .map_err(JobError::disk("cannot write the package", &partial))?;
        std::fs::rename(&partial, &path).map_err(JobError::disk("cannot store the package", &path))
    }

    /// Removes a package and its unpacked folder (a job still running in
    /// that folder keeps its open files; its new ones fail).
    pub(crate) fn remove(&self, name: &PackageName) -> Result<(), JobError> {
        let stem = name.as_str().trim_end_matches(".zip");
        let unpacked = self.dir.join(stem);
        match std::fs::remove_dir_all(&unpacked) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(JobError::disk("cannot remove", &unpacked)(e)),
        }
        let zip = self.zip_path(name);
        match std::fs::remove_file(&zip) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(JobError::disk("cannot remove", &zip)(e)),
        }
    }

    /// The package unpacked, unpacking it the first time: the folder a
    /// job with this working_dir runs in.
    pub(crate) fn unpacked(&self, name: &PackageName) -> Result<PathBuf, JobError> {
        let stem = name.as_str().trim_end_matches(".zip");
        let target = self.dir.join(stem);
        if target.is_dir() {
            return Ok(target);
        }
        let bytes = self.read(name)?;
        let partial = self.dir.join(format!(
            ".{stem}.{}.unpacking",
            uuid::Uuid::new_v4().simple()
        ));
        let result = unpack(&bytes, &partial, self.limit.saturating_mul(8));
        if let Err(e) = result {
            let _ = std::fs::remove_dir_all(&partial);
            return Err(e);
        }
        match std::fs::rename(&partial, &target) {
            Ok(()) => Ok(target),
            // Another job unpacked it meanwhile.
            Err(_) if target.is_dir() => {
                let _ = std::fs::remove_dir_all(&partial);
                Ok(target)
            }
            Err(e) => Err(JobError::disk("cannot place the unpacked package", &target)(e)),
        }
    }
}

/// Unpacks a zip into `into`: files and folders only, every path inside
/// it, the executable bits kept, at most `limit` bytes in all.
fn unpack(bytes: &[u8], into: &Path, limit: u64) -> Result<(), JobError> {
    let bad = |e: zip::result::ZipError| {
        JobError::BadRequest(format!("the package is not a readable zip: {e}"))
    };
    let mut archive = zip::ZipArchive::new(std::io::Cursor::new(bytes)).map_err(bad)?;
    std::fs::create_dir_all(into).map_err(JobError::disk("cannot make the folder", into))?;
    let mut total: u64 = 0;
    for i in 0..archive.len() {
        let mut entry = archive.by_index(i).map_err(bad)?;
        let Some(relative) = entry.enclosed_name().map(Path::to_path_buf) else {
            return Err(JobError::BadRequest(format!(
                "the package holds a path outside its folder: {:?}",
                entry.name()
            )));
        };
        let path = into.join(&relative);
        if entry.is_dir() {
            std::fs::create_dir_all(&path)
                .map_err(JobError::disk("cannot make the folder", &path))?;
            continue;
        }
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .map_err(JobError::disk("cannot make the folder", parent))?;
        }
        let mut out =
            std::fs::File::create(&path).map_err(JobError::disk("cannot write", &path))?;
        let mut limited = (&mut entry).take(limit.saturating_sub(total) + 1);
        let written = std::io::copy(&mut limited, &mut out)
            .map_err(JobError::disk("cannot unpack into", &path))?;
        total += written;
        if total > limit {
            return Err(JobError::BadRequest(format!(
                "the package unpacks to more than {limit} bytes"
            )));
        }
        if let Some(mode) = entry.unix_mode() {
            use std::os::unix::fs::PermissionsExt;
            let mode = (mode & 0o777) | 0o600;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))
                .map_err(JobError::disk("cannot set the mode of", &path))?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn zip_of(files: &[(&str, &[u8], u32)]) -> Vec<u8> {
        let mut out = std::io::Cursor::new(Vec::new());
        let mut w = zip::ZipWriter::new(&mut out);
        for (name, body, mode) in files {
            let options = zip::write::FileOptions::default().unix_permissions(*mode);
            w.start_file(*name, options).unwrap();
            w.write_all(body).unwrap();
        }
        w.finish().unwrap();
        drop(w);
        out.into_inner()
    }

    #[test]
    fn names_are_checked() {
        assert!(PackageName::parse("gcs", "_ray_pkg_ab12.zip").is_ok());
        assert!(PackageName::parse("s3", "_ray_pkg_ab12.zip").is_err());
        assert!(PackageName::parse("gcs", "../x.zip").is_err());
        assert!(PackageName::from_uri("gcs://_ray_pkg_ab12.zip").is_ok());
        assert!(PackageName::from_uri("/home/me/project").is_err());
    }

    #[test]
    fn a_package_unpacks_once_with_its_modes_and_refuses_escapes_and_bombs() {
        let dir =
            std::env::temp_dir().join(format!("prism-pkg-test-{}", uuid::Uuid::new_v4().simple()));
        let store = PackageStore::open(dir.clone(), 1 << 20).unwrap();
        let name = PackageName::parse("gcs", "_ray_pkg_aa.zip").unwrap();
        store
            .put(
                &name,
                &zip_of(&[
                    ("run.sh", b"#!/bin/sh\necho hi\n", 0o755),
                    ("sub/data.txt", b"x", 0o644),
                ]),
            )
            .unwrap();
        let at = store.unpacked(&name).unwrap();
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(at.join("run.sh"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o111, 0o111);
        assert_eq!(std::fs::read(at.join("sub/data.txt")).unwrap(), b"x");
        assert_eq!(store.unpacked(&name).unwrap(), at);

        let evil = PackageName::parse("gcs", "_ray_pkg_bb.zip").unwrap();
        store
            .put(&evil, &zip_of(&[("../escape.txt", b"x", 0o644)]))
            .unwrap();
        assert!(store
            .unpacked(&evil)
            .unwrap_err()
            .to_string()
            .contains("outside"));
        assert!(!dir.join("escape.txt").exists());

        let big = PackageName::parse("gcs", "_ray_pkg_cc.zip").unwrap();
        let zeros = vec![0u8; 9 << 20];
        store
            .put(&big, &zip_of(&[("zeros", &zeros, 0o644)]))
            .unwrap();
        assert!(store
            .unpacked(&big)
            .unwrap_err()
            .to_string()
            .contains("more than"));

        let err = store.put(&name, &vec![0u8; 2 << 20]).unwrap_err();
        assert!(matches!(err, JobError::TooLarge { .. }), "{err}");
        assert!(store.put(&name, b"not a zip").is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
