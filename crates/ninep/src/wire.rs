//! Little-endian 9P primitives: a bounds-checked reader and an appending writer.
//!
//! Every read checks the remaining length first; nothing here can panic on
//! malformed input. Strings are length-prefixed (`u16`) byte strings and are
//! returned borrowed from the message buffer (no copy).

use thiserror::Error;

/// Size of the common message header: `size[4] type[1] tag[2]`.
pub const HEADER_LEN: usize = 7;

/// A decoding failure, naming the field and the offset where it happened.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum DecodeError {
    /// The message ended before a field could be read.
    #[error("message truncated reading {field} at byte {offset} (need {need}, have {have})")]
    Truncated {
        /// Field being read.
        field: &'static str,
        /// Offset in the message.
        offset: usize,
        /// Bytes needed.
        need: usize,
        /// Bytes left.
        have: usize,
    },
    /// Bytes were left over after the last field.
    #[error("{extra} trailing bytes after a {kind} message")]
    Trailing {
        /// Message kind.
        kind: &'static str,
        /// Number of unread bytes.
        extra: usize,
    },
    /// The size field disagrees with the buffer length or the limits.
    #[error("bad message size {size} (buffer {len} bytes, limit {limit})")]
    BadSize {
        /// Size field value.
        size: u32,
        /// Buffer length.
        len: usize,
        /// Negotiated maximum.
        limit: usize,
    },
    /// A field has a value the protocol forbids.
    #[error("invalid {field}: {why}")]
    Invalid {
        /// Field name.
        field: &'static str,
        /// What is wrong with it.
        why: &'static str,
    },
    /// The message type is not a 9P2000.L request this server knows.
    #[error("unknown message type {0}")]
    UnknownType(u8),
}

/// A bounds-checked cursor over a message body.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    /// Starts reading `buf` at offset 0.
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    /// Bytes not yet consumed.
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// Consumes exactly `n` bytes.
    pub fn bytes(&mut self, n: usize, field: &'static str) -> Result<&'a [u8], DecodeError> {
        if self.remaining() < n {
            return Err(DecodeError::Truncated {
                field,
                offset: self.pos,
                need: n,
                have: self.remaining(),
            });
        }
        let out = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    fn array<const N: usize>(&mut self, field: &'static str) -> Result<[u8; N], DecodeError> {
        let b = self.bytes(N, field)?;
        let mut out = [0u8; N];
        out.copy_from_slice(b);
        Ok(out)
    }

    /// Reads a `u8`.
    pub fn u8(&mut self, field: &'static str) -> Result<u8, DecodeError> {
        Ok(self.array::<1>(field)?[0])
    }

    /// Reads a little-endian `u16`.
    pub fn u16(&mut self, field: &'static str) -> Result<u16, DecodeError> {
        Ok(u16::from_le_bytes(self.array(field)?))
    }

    /// Reads a little-endian `u32`.
    pub fn u32(&mut self, field: &'static str) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.array(field)?))
    }

    /// Reads a little-endian `u64`.
    pub fn u64(&mut self, field: &'static str) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.array(field)?))
    }

    /// Reads a `len[2] bytes[len]` string, borrowed.
    pub fn string(&mut self, field: &'static str) -> Result<&'a [u8], DecodeError> {
        let n = self.u16(field)? as usize;
        self.bytes(n, field)
    }

    /// Fails if any byte is left unread.
    pub fn finish(&self, kind: &'static str) -> Result<(), DecodeError> {
        match self.remaining() {
            0 => Ok(()),
            extra => Err(DecodeError::Trailing { kind, extra }),
        }
    }
}

/// Appends little-endian 9P fields to a byte vector.
#[derive(Debug)]
pub struct Writer<'a> {
    buf: &'a mut Vec<u8>,
    start: usize,
}

impl<'a> Writer<'a> {
    /// Starts a message of type `kind` with `tag` at the end of `buf`; the size
    /// is patched by [`Writer::finish`].
    pub fn begin(buf: &'a mut Vec<u8>, kind: u8, tag: u16) -> Self {
        let start = buf.len();
        buf.extend_from_slice(&[0, 0, 0, 0, kind]);
        buf.extend_from_slice(&tag.to_le_bytes());
        Writer { buf, start }
    }

    /// Appends a `u8`.
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.buf.push(v);
        self
    }

    /// Appends a `u16`.
    pub fn u16(&mut self, v: u16) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }

    /// Appends a `u32`.
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }

    /// Appends a `u64`.
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }

    /// Appends a string, truncated to 65535 bytes (the protocol limit).
    pub fn string(&mut self, s: &[u8]) -> &mut Self {
        let s = &s[..s.len().min(u16::MAX as usize)];
        self.u16(s.len() as u16);
        self.buf.extend_from_slice(s);
        self
    }

    /// Appends raw bytes.
    pub fn raw(&mut self, b: &[u8]) -> &mut Self {
        self.buf.extend_from_slice(b);
        self
    }

    /// Bytes written so far for this message, header included.
    pub fn len(&self) -> usize {
        self.buf.len() - self.start
    }

    /// True when only the header has been written.
    pub fn is_empty(&self) -> bool {
        self.len() <= HEADER_LEN
    }

    /// Direct access to the underlying vector (for zero-copy reads into it).
    pub fn buffer(&mut self) -> &mut Vec<u8> {
        self.buf
    }

    /// Patches the size field; returns the message length.
    pub fn finish(&mut self) -> usize {
        let len = self.buf.len() - self.start;
        let size = u32::try_from(len).unwrap_or(u32::MAX);
        self.buf[self.start..self.start + 4].copy_from_slice(&size.to_le_bytes());
        len
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reader_rejects_short_fields() {
        let mut r = Reader::new(&[1, 2, 3]);
        assert_eq!(r.u16("a").unwrap(), 0x0201);
        assert!(matches!(
            r.u32("b"),
            Err(DecodeError::Truncated {
                need: 4,
                have: 1,
                ..
            })
        ));
        let mut r = Reader::new(&[5, 0, b'a']);
        assert!(r.string("s").is_err());
    }

    #[test]
    fn writer_patches_size() {
        let mut v = Vec::new();
        let mut w = Writer::begin(&mut v, 101, 7);
        w.u32(8192).string(b"9P2000.L");
        let n = w.finish();
        assert_eq!(n, v.len());
        assert_eq!(u32::from_le_bytes(v[0..4].try_into().unwrap()) as usize, n);
        assert_eq!(v[4], 101);
        assert_eq!(u16::from_le_bytes([v[5], v[6]]), 7);
    }
}
