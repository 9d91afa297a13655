//! Encoding of a parsed script into the guest's command block.

use crate::abi;
use crate::script::{Command, CrashKind, Range};
use thiserror::Error;

/// A guest-physical region the probe may address by name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Region {
    /// Name used in scripts (`ram`, `pmem0`, ...).
    pub name: String,
    /// Guest-physical start address.
    pub gpa: u64,
    /// Size in bytes.
    pub size: u64,
}

/// Why a script cannot run against the given regions.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum BlockError {
    /// The script names a region the VM does not have.
    #[error("command {index}: no region named `{name}` (this VM has: {known})")]
    UnknownRegion {
        /// 1-based command index.
        index: usize,
        /// The unknown name.
        name: String,
        /// Comma-separated list of the VM's regions.
        known: String,
    },
    /// A range does not fit inside its region.
    #[error(
        "command {index}: range {offset:#x}+{len:#x} is outside region `{name}` of size {size:#x}"
    )]
    OutOfRange {
        /// 1-based command index.
        index: usize,
        /// Region name.
        name: String,
        /// Offset requested.
        offset: u64,
        /// Length requested.
        len: u64,
        /// Size of the region.
        size: u64,
    },
    /// Too many regions or commands for the block.
    #[error("too many {what}: {count} (at most {max})")]
    TooMany {
        /// `regions` or `commands`.
        what: &'static str,
        /// How many were given.
        count: usize,
        /// The limit.
        max: usize,
    },
    /// A region name is longer than the block allows.
    #[error("region name `{0}` is longer than 15 bytes")]
    NameTooLong(String),
}

/// Encodes the command block: header, region table and commands, little-endian.
pub fn encode_block(
    commands: &[Command],
    regions: &[Region],
    ncpus: u32,
    tsc_khz: u64,
) -> Result<Vec<u8>, BlockError> {
    if regions.len() > abi::MAX_REGIONS {
        return Err(BlockError::TooMany {
            what: "regions",
            count: regions.len(),
            max: abi::MAX_REGIONS,
        });
    }
    if commands.len() > abi::MAX_COMMANDS {
        return Err(BlockError::TooMany {
            what: "commands",
            count: commands.len(),
            max: abi::MAX_COMMANDS,
        });
    }
    let mut out = Vec::with_capacity(abi::BLOCK_SIZE as usize);
    out.extend_from_slice(&abi::MAGIC.to_le_bytes());
    out.extend_from_slice(&abi::VERSION.to_le_bytes());
    out.extend_from_slice(&ncpus.to_le_bytes());
    out.extend_from_slice(&(regions.len() as u32).to_le_bytes());
    out.extend_from_slice(&tsc_khz.to_le_bytes());
    for i in 0..abi::MAX_REGIONS {
        let mut entry = [0u8; abi::REGION_ENTRY_SIZE];
        if let Some(r) = regions.get(i) {
            if r.name.len() >= abi::REGION_NAME_LEN {
                return Err(BlockError::NameTooLong(r.name.clone()));
            }
            entry[0..8].copy_from_slice(&r.gpa.to_le_bytes());
            entry[8..16].copy_from_slice(&r.size.to_le_bytes());
            entry[16..16 + r.name.len()].copy_from_slice(r.name.as_bytes());
        }
        out.extend_from_slice(&entry);
    }
    debug_assert_eq!(out.len(), abi::COMMANDS_OFFSET);
    out.extend_from_slice(&(commands.len() as u32).to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    for (i, cmd) in commands.iter().enumerate() {
        let index = i + 1;
        let resolve = |range: &Range| -> Result<(u32, u64, u64), BlockError> {
            let (slot, region) = regions
                .iter()
                .enumerate()
                .find(|(_, r)| r.name == range.region)
                .ok_or_else(|| BlockError::UnknownRegion {
                    index,
                    name: range.region.clone(),
                    known: regions
                        .iter()
                        .map(|r| r.name.as_str())
                        .collect::<Vec<_>>()
                        .join(", "),
                })?;
            match range.offset.checked_add(range.len) {
                Some(end) if end <= region.size => Ok((slot as u32, range.offset, range.len)),
                _ => Err(BlockError::OutOfRange {
                    index,
                    name: region.name.clone(),
                    offset: range.offset,
                    len: range.len,
                    size: region.size,
                }),
            }
        };
        let (op, region, a, b, c) = match cmd {
            Command::Touch(r) => {
                let (slot, off, len) = resolve(r)?;
                (abi::OP_TOUCH, slot, off, len, 0)
            }
            Command::Read(r) => {
                let (slot, off, len) = resolve(r)?;
                (abi::OP_READ, slot, off, len, 0)
            }
            Command::Write(r, byte) => {
                let (slot, off, len) = resolve(r)?;
                (abi::OP_WRITE, slot, off, len, u64::from(*byte))
            }
            Command::Sum(r) => {
                let (slot, off, len) = resolve(r)?;
                (abi::OP_SUM, slot, off, len, 0)
            }
            Command::FillId(r) => {
                let (slot, off, len) = resolve(r)?;
                (abi::OP_FILL_ID, slot, off, len, 0)
            }
            Command::FillAddr(r) => {
                let (slot, off, len) = resolve(r)?;
                (abi::OP_FILL_ADDR, slot, off, len, 0)
            }
            Command::Mark(id) => (abi::OP_MARK, 0, u64::from(*id), 0, 0),
            Command::Exit(code) => (abi::OP_EXIT, 0, u64::from(*code), 0, 0),
            Command::Reset => (abi::OP_RESET, 0, 0, 0, 0),
            Command::Sleep(ms) => (abi::OP_SLEEP, 0, *ms, 0, 0),
            Command::Crash(kind) => {
                let k = match kind {
                    CrashKind::TripleFault => abi::CRASH_TRIPLE_FAULT,
                    CrashKind::MmioExec => abi::CRASH_MMIO_EXEC,
                    CrashKind::Int3 => abi::CRASH_INT3,
                };
                (abi::OP_CRASH, 0, k, 0, 0)
            }
        };
        out.extend_from_slice(&op.to_le_bytes());
        out.extend_from_slice(&region.to_le_bytes());
        out.extend_from_slice(&a.to_le_bytes());
        out.extend_from_slice(&b.to_le_bytes());
        out.extend_from_slice(&c.to_le_bytes());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::script::parse_script;

    fn ram() -> Vec<Region> {
        vec![Region {
            name: "ram".into(),
            gpa: 0x40_0000,
            size: 16 << 20,
        }]
    }

    #[test]
    fn encodes_header_and_commands() {
        let cmds = parse_script("touch 1M; sum ram 4K 8K; sleep 1500; exit 7").unwrap();
        let block = encode_block(&cmds, &ram(), 2, 1000).unwrap();
        assert_eq!(&block[0..4], &abi::MAGIC.to_le_bytes());
        assert_eq!(u32::from_le_bytes(block[8..12].try_into().unwrap()), 2);
        let n = u32::from_le_bytes(
            block[abi::COMMANDS_OFFSET..abi::COMMANDS_OFFSET + 4]
                .try_into()
                .unwrap(),
        );
        assert_eq!(n, 4);
        let sum = &block[abi::COMMANDS_OFFSET + 8 + abi::COMMAND_SIZE..];
        assert_eq!(
            u32::from_le_bytes(sum[0..4].try_into().unwrap()),
            abi::OP_SUM
        );
        assert_eq!(u64::from_le_bytes(sum[8..16].try_into().unwrap()), 4096);
        let sleep = &sum[abi::COMMAND_SIZE..];
        assert_eq!(
            u32::from_le_bytes(sleep[0..4].try_into().unwrap()),
            abi::OP_SLEEP
        );
        assert_eq!(u64::from_le_bytes(sleep[8..16].try_into().unwrap()), 1500);
        assert_eq!(
            block.len(),
            abi::COMMANDS_OFFSET + 8 + 4 * abi::COMMAND_SIZE
        );
    }

    #[test]
    fn encodes_fill_id_like_write_without_a_byte() {
        let cmds = parse_script("fill-id ram 8M 1M").unwrap();
        let block = encode_block(&cmds, &ram(), 1, 0).unwrap();
        let cmd = &block[abi::COMMANDS_OFFSET + 8..];
        assert_eq!(
            u32::from_le_bytes(cmd[0..4].try_into().unwrap()),
            abi::OP_FILL_ID
        );
        assert_eq!(u32::from_le_bytes(cmd[4..8].try_into().unwrap()), 0);
        assert_eq!(u64::from_le_bytes(cmd[8..16].try_into().unwrap()), 8 << 20);
        assert_eq!(u64::from_le_bytes(cmd[16..24].try_into().unwrap()), 1 << 20);
        assert_eq!(u64::from_le_bytes(cmd[24..32].try_into().unwrap()), 0);
        let cmds = parse_script("fill-id ram 16M 1").unwrap();
        assert!(matches!(
            encode_block(&cmds, &ram(), 1, 0),
            Err(BlockError::OutOfRange { .. })
        ));
    }

    #[test]
    fn rejects_unknown_region_and_overflow() {
        let cmds = parse_script("write pmem0 0 1M 1").unwrap();
        let err = encode_block(&cmds, &ram(), 1, 0).unwrap_err();
        assert!(err.to_string().contains("no region named `pmem0`"), "{err}");
        let cmds = parse_script("touch 17M").unwrap();
        assert!(matches!(
            encode_block(&cmds, &ram(), 1, 0),
            Err(BlockError::OutOfRange { .. })
        ));
        let cmds = parse_script("sum ram 0xffffffffffffffff 2").unwrap();
        assert!(matches!(
            encode_block(&cmds, &ram(), 1, 0),
            Err(BlockError::OutOfRange { .. })
        ));
    }
}
