//! The snapshot state file: a fixed header, then the payload as JSON.
//!
//! ```text
//! offset  size  field
//!      0    16  magic "DENSEVM-SNAPSHOT"
//!     16     4  format version, u32 little-endian (FORMAT_VERSION)
//!     20     8  payload length in bytes, u64 little-endian (at most MAX_PAYLOAD)
//!     28     4  CRC32C (Castagnoli) of the payload, u32 little-endian
//!     32     …  payload: JSON (serde_json), exactly `length` bytes, nothing after it
//! ```
//!
//! The payload is JSON so that a state file can be inspected with ordinary tools
//! (`tail -c +33 vm.state | jq .`); kvm-bindings structures appear in it as arrays of
//! their bytes. [`write_state`] writes a temporary file next to the target, syncs it,
//! renames it over the target and syncs the directory, so a crash leaves either the old
//! file or the complete new one under the final name, never half of one.
//! [`read_state`] checks the header before it allocates the payload and reports each kind
//! of bad file with its own [`PersistError`]; no input makes it panic. [`decode_state`]
//! makes the same checks on a file already in memory (the fuzz target's entry point).

use super::PersistError;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

/// The first 16 bytes of every state file.
pub const MAGIC: &[u8; 16] = b"DENSEVM-SNAPSHOT";
/// The format version this densevm writes and reads.
pub const FORMAT_VERSION: u32 = 1;
/// Header size: magic, version, payload length, CRC32C.
pub const HEADER_LEN: usize = 16 + 4 + 8 + 4;
/// The largest payload densevm writes or reads (64 MiB; a vCPU's state is tens of KiB).
pub const MAX_PAYLOAD: u64 = 8 << 20;

fn io_err(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> PersistError {
    let path = path.to_path_buf();
    move |error| PersistError::Io { what, path, error }
}

/// The header for `payload`.
fn header(payload: &[u8]) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[..16].copy_from_slice(MAGIC);
    h[16..20].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
    h[20..28].copy_from_slice(&(payload.len() as u64).to_le_bytes());
    h[28..32].copy_from_slice(&crc32c::crc32c(payload).to_le_bytes());
    h
}

/// The temporary name `path` is written under before the rename.
fn temp_path(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!(".{name}.tmp-{}", std::process::id()))
}

/// `payload` as the JSON payload of a state file at `path` (checked against the limit).
fn encode<T: Serialize>(path: &Path, payload: &T) -> Result<Vec<u8>, PersistError> {
    let encode_err = |detail: String| PersistError::Encode {
        path: path.to_path_buf(),
        detail,
    };
    let json = serde_json::to_vec(payload).map_err(|e| encode_err(e.to_string()))?;
    if json.len() as u64 > MAX_PAYLOAD {
        return Err(encode_err(format!(
            "{} bytes of JSON, more than the {MAX_PAYLOAD}-byte limit",
            json.len()
        )));
    }
    if path.file_name().is_none() {
        return Err(encode_err("the path names no file".into()));
    }
    Ok(json)
}

/// Writes `payload` as a state file at `path`, atomically: a crash leaves either what was
/// there before or the complete new file.
pub fn write_state<T: Serialize>(path: &Path, payload: &T) -> Result<(), PersistError> {
    let json = encode(path, payload)?;
    let tmp = temp_path(path);
    let result = write_synced(&tmp, &header(&json), &json)
        .and_then(|()| fs::rename(&tmp, path).map_err(io_err("rename into place", path)));
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result?;
    // The rename is durable only once the directory is.
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err("sync the directory of", path))
}

/// Like [`write_state`] without the syncs, for state that need not survive a host crash
/// (a clone template's state lives no longer than its RAM file, which is in memory).
pub fn write_state_volatile<T: Serialize>(path: &Path, payload: &T) -> Result<(), PersistError> {
    let json = encode(path, payload)?;
    let mut data = header(&json).to_vec();
    data.extend_from_slice(&json);
    fs::write(path, data).map_err(io_err("write", path))
}

fn write_synced(tmp: &Path, header: &[u8], payload: &[u8]) -> Result<(), PersistError> {
    let mut file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(tmp)
        .map_err(io_err("create", tmp))?;
    file.write_all(header)
        .and_then(|()| file.write_all(payload))
        .map_err(io_err("write", tmp))?;
    file.sync_all().map_err(io_err("sync", tmp))
}

/// Reads the state file at `path` written by [`write_state`].
pub fn read_state<T: DeserializeOwned>(path: &Path) -> Result<T, PersistError> {
    let mut file = File::open(path).map_err(io_err("open", path))?;
    let size = file.metadata().map_err(io_err("stat", path))?.len();
    let mut head = Vec::with_capacity(HEADER_LEN);
    (&mut file)
        .take(HEADER_LEN as u64)
        .read_to_end(&mut head)
        .map_err(io_err("read", path))?;
    let (len, crc) = check_header(path, &head, size)?;
    // The length is bounded by MAX_PAYLOAD and by the file's size, so this allocation is
    // what the file really holds.
    let mut payload = Vec::with_capacity(len as usize);
    file.take(len)
        .read_to_end(&mut payload)
        .map_err(io_err("read", path))?;
    if (payload.len() as u64) < len {
        // The file shrank since it was measured.
        return Err(PersistError::Truncated {
            path: path.to_path_buf(),
            expected: HEADER_LEN as u64 + len,
            actual: HEADER_LEN as u64 + payload.len() as u64,
        });
    }
    decode(path, &payload, crc)
}

/// Decodes a whole state file held in memory, with the checks and errors of
/// [`read_state`] (`path` is only named in the errors).
pub fn decode_state<T: DeserializeOwned>(path: &Path, bytes: &[u8]) -> Result<T, PersistError> {
    let head = &bytes[..bytes.len().min(HEADER_LEN)];
    let (len, crc) = check_header(path, head, bytes.len() as u64)?;
    // check_header saw that the file is exactly the header and `len` payload bytes.
    debug_assert_eq!(bytes.len() as u64, HEADER_LEN as u64 + len);
    decode(path, &bytes[HEADER_LEN..], crc)
}

/// Checks a header read from a file of `size` bytes; returns the payload length and CRC.
fn check_header(path: &Path, head: &[u8], size: u64) -> Result<(u64, u32), PersistError> {
    let truncated = |expected: u64| PersistError::Truncated {
        path: path.to_path_buf(),
        expected,
        actual: size,
    };
    let magic_len = head.len().min(MAGIC.len());
    if head[..magic_len] != MAGIC[..magic_len] {
        return Err(PersistError::NotASnapshot {
            path: path.to_path_buf(),
        });
    }
    if head.len() < 20 {
        return Err(truncated(HEADER_LEN as u64));
    }
    let version = u32::from_le_bytes([head[16], head[17], head[18], head[19]]);
    if version != FORMAT_VERSION {
        return Err(PersistError::UnsupportedVersion {
            path: path.to_path_buf(),
            found: version,
            supported: FORMAT_VERSION,
        });
    }
    if head.len() < HEADER_LEN {
        return Err(truncated(HEADER_LEN as u64));
    }
    let mut len_bytes = [0u8; 8];
    len_bytes.copy_from_slice(&head[20..28]);
    let len = u64::from_le_bytes(len_bytes);
    let crc = u32::from_le_bytes([head[28], head[29], head[30], head[31]]);
    if len > MAX_PAYLOAD {
        return Err(PersistError::TooLarge {
            path: path.to_path_buf(),
            len,
            limit: MAX_PAYLOAD,
        });
    }
    let expected = HEADER_LEN as u64 + len;
    if size < expected {
        return Err(truncated(expected));
    }
    if size > expected {
        return Err(PersistError::Corrupt {
            path: path.to_path_buf(),
            detail: format!(
                "{} bytes follow the {len}-byte payload the header announces",
                size - expected
            ),
        });
    }
    Ok((len, crc))
}

fn decode<T: DeserializeOwned>(path: &Path, payload: &[u8], crc: u32) -> Result<T, PersistError> {
    let actual = crc32c::crc32c(payload);
    if actual != crc {
        return Err(PersistError::Corrupt {
            path: path.to_path_buf(),
            detail: format!("payload CRC32C is {actual:#010x}, the header says {crc:#010x}"),
        });
    }
    serde_json::from_slice(payload).map_err(|e| PersistError::Parse {
        path: path.to_path_buf(),
        detail: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Sample {
        name: String,
        values: Vec<u64>,
        nested: Option<(u32, bool)>,
    }

    fn sample() -> Sample {
        Sample {
            name: "vcpu0".into(),
            values: (0..100).map(|i| i * 0x0101_0101).collect(),
            nested: Some((7, true)),
        }
    }

    /// A directory of its own for one test, removed when the test ends.
    struct TestDir(PathBuf);

    impl TestDir {
        fn new(test: &str) -> Self {
            let dir = std::env::temp_dir().join(format!(
                "densevm-persist-file-{}-{test}",
                std::process::id()
            ));
            fs::create_dir_all(&dir).unwrap();
            Self(dir)
        }

        /// A state file holding [`sample`], and its bytes.
        fn written(&self) -> (PathBuf, Vec<u8>) {
            let path = self.0.join("vm.state");
            write_state(&path, &sample()).unwrap();
            let bytes = fs::read(&path).unwrap();
            (path, bytes)
        }
    }

    impl Drop for TestDir {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn a_written_state_reads_back_and_leaves_no_temporary_file() {
        let dir = TestDir::new("round-trip");
        let (path, bytes) = dir.written();
        assert_eq!(&bytes[..16], MAGIC);
        assert_eq!(read_state::<Sample>(&path).unwrap(), sample());
        // The payload is plain JSON after the header.
        let json: serde_json::Value = serde_json::from_slice(&bytes[HEADER_LEN..]).unwrap();
        assert_eq!(json["name"], "vcpu0");
        // Writing again replaces the file whole.
        let other = Sample {
            name: "again".into(),
            values: vec![],
            nested: None,
        };
        write_state(&path, &other).unwrap();
        assert_eq!(read_state::<Sample>(&path).unwrap(), other);
        let leftovers: Vec<_> = fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .filter(|n| n.to_string_lossy().contains(".tmp-"))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
    }

    #[test]
    fn a_flipped_payload_byte_is_corrupt() {
        let dir = TestDir::new("flipped");
        let (path, mut bytes) = dir.written();
        for offset in [HEADER_LEN, HEADER_LEN + 5, bytes.len() - 1] {
            bytes[offset] ^= 0x20;
            fs::write(&path, &bytes).unwrap();
            let err = read_state::<Sample>(&path).unwrap_err();
            assert!(matches!(err, PersistError::Corrupt { .. }), "{err}");
            assert!(err.to_string().contains("CRC32C"), "{err}");
            bytes[offset] ^= 0x20;
        }
        // So is a flipped CRC, and bytes appended after the payload.
        bytes[30] ^= 1;
        fs::write(&path, &bytes).unwrap();
        let err = read_state::<Sample>(&path).unwrap_err();
        assert!(matches!(err, PersistError::Corrupt { .. }), "{err}");
        bytes[30] ^= 1;
        bytes.push(b'\n');
        fs::write(&path, &bytes).unwrap();
        let err = read_state::<Sample>(&path).unwrap_err();
        assert!(matches!(err, PersistError::Corrupt { .. }), "{err}");
    }

    #[test]
    fn every_truncation_is_a_clean_error() {
        let dir = TestDir::new("truncated");
        let (path, bytes) = dir.written();
        for len in 0..bytes.len() {
            fs::write(&path, &bytes[..len]).unwrap();
            match read_state::<Sample>(&path) {
                Err(PersistError::Truncated {
                    expected, actual, ..
                }) => {
                    assert_eq!(actual, len as u64);
                    assert!(expected > actual, "{expected} <= {actual}");
                }
                other => panic!("{len} bytes: {other:?}"),
            }
        }
    }

    #[test]
    fn another_version_is_refused_naming_the_one_this_densevm_reads() {
        let dir = TestDir::new("version");
        let (path, mut bytes) = dir.written();
        bytes[16..20].copy_from_slice(&2u32.to_le_bytes());
        fs::write(&path, &bytes).unwrap();
        let err = read_state::<Sample>(&path).unwrap_err();
        assert!(
            matches!(
                err,
                PersistError::UnsupportedVersion {
                    found: 2,
                    supported: 1,
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("reads version 1"), "{err}");
        // The version is checked before the rest of the header.
        fs::write(&path, &bytes[..20]).unwrap();
        let err = read_state::<Sample>(&path).unwrap_err();
        assert!(
            matches!(err, PersistError::UnsupportedVersion { .. }),
            "{err}"
        );
    }

    #[test]
    fn a_bad_magic_is_not_a_snapshot() {
        let dir = TestDir::new("magic");
        let (path, mut bytes) = dir.written();
        bytes[0] = b'd';
        fs::write(&path, &bytes).unwrap();
        let err = read_state::<Sample>(&path).unwrap_err();
        assert!(matches!(err, PersistError::NotASnapshot { .. }), "{err}");
        fs::write(&path, b"{\"name\": \"just json\"}").unwrap();
        let err = read_state::<Sample>(&path).unwrap_err();
        assert!(matches!(err, PersistError::NotASnapshot { .. }), "{err}");
    }

    #[test]
    fn a_huge_announced_payload_is_refused_before_allocating_it() {
        let dir = TestDir::new("huge");
        let (path, mut bytes) = dir.written();
        for len in [MAX_PAYLOAD + 1, u64::MAX] {
            bytes[20..28].copy_from_slice(&len.to_le_bytes());
            fs::write(&path, &bytes).unwrap();
            let err = read_state::<Sample>(&path).unwrap_err();
            assert!(matches!(err, PersistError::TooLarge { .. }), "{err}");
        }
    }

    #[test]
    fn a_payload_of_another_shape_does_not_parse() {
        let dir = TestDir::new("shape");
        let path = dir.0.join("shape.state");
        write_state(&path, &vec!["not", "a", "sample"]).unwrap();
        let err = read_state::<Sample>(&path).unwrap_err();
        assert!(matches!(err, PersistError::Parse { .. }), "{err}");
        // Valid CRC over bytes that are not JSON at all.
        let junk = b"\xff\xfe not json";
        let mut bytes = header(junk).to_vec();
        bytes.extend_from_slice(junk);
        fs::write(&path, &bytes).unwrap();
        let err = read_state::<Sample>(&path).unwrap_err();
        assert!(matches!(err, PersistError::Parse { .. }), "{err}");
    }

    #[test]
    fn a_missing_file_names_the_path() {
        let dir = TestDir::new("missing");
        let path = dir.0.join("missing.state");
        let err = read_state::<Sample>(&path).unwrap_err();
        assert!(matches!(err, PersistError::Io { .. }), "{err}");
        assert!(err.to_string().contains("missing.state"), "{err}");
    }

    /// decode_state gives what read_state gives for the same bytes: the value, or the
    /// same error with the same message.
    #[test]
    fn decode_state_agrees_with_read_state() {
        let dir = TestDir::new("decode");
        let (path, good) = dir.written();
        let same = |bytes: &[u8]| {
            fs::write(&path, bytes).unwrap();
            let from_file = read_state::<Sample>(&path);
            let from_bytes = decode_state::<Sample>(&path, bytes);
            match (&from_file, &from_bytes) {
                (Ok(a), Ok(b)) => assert_eq!(a, b),
                (Err(a), Err(b)) => assert_eq!(a.to_string(), b.to_string()),
                _ => panic!("{} bytes: {from_file:?} but {from_bytes:?}", bytes.len()),
            }
        };
        same(&good);
        for len in 0..good.len() {
            same(&good[..len]);
        }
        for offset in 0..good.len() {
            let mut bad = good.clone();
            bad[offset] ^= 0x41;
            same(&bad);
        }
        let mut longer = good.clone();
        longer.push(b' ');
        same(&longer);
        same(b"");
        same(b"{}");
    }

    /// Random files, and random changes to a valid one, give errors and never panic.
    #[test]
    fn random_bytes_never_panic() {
        let dir = TestDir::new("random");
        let (path, good) = dir.written();
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            // xorshift64*: deterministic, so a failure reproduces.
            seed ^= seed >> 12;
            seed ^= seed << 25;
            seed ^= seed >> 27;
            seed.wrapping_mul(0x2545_f491_4f6c_dd1d)
        };
        for round in 0..400 {
            let bytes: Vec<u8> = if round % 2 == 0 {
                let len = (next() % 300) as usize;
                let mut b: Vec<u8> = (0..len).map(|_| next() as u8).collect();
                if round % 4 == 0 && b.len() >= 16 {
                    b[..16].copy_from_slice(MAGIC);
                }
                b
            } else {
                let mut b = good.clone();
                for _ in 0..1 + next() % 4 {
                    let i = (next() as usize) % b.len();
                    b[i] = next() as u8;
                }
                b
            };
            fs::write(&path, &bytes).unwrap();
            let result = std::panic::catch_unwind(|| read_state::<Sample>(&path));
            assert!(result.is_ok(), "round {round} panicked on {bytes:?}");
        }
    }
}
