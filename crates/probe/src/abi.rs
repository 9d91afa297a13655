//! Numbers shared with the guest; `guest/abi.h` holds the same values (checked by a test).

/// Guest-physical address where the flat probe image is loaded and entered.
pub const LOAD_ADDR: u64 = 0x10_0000;
/// Guest-physical address of the SMP work mailbox page.
pub const MAILBOX_ADDR: u64 = 0x4000;
/// Guest-physical address of the command block.
pub const BLOCK_ADDR: u64 = 0x5000;
/// Size reserved for the command block.
pub const BLOCK_SIZE: u64 = 0x4000;
/// Command block magic ("DVPB").
pub const MAGIC: u32 = 0x4250_5644;
/// Command block layout version.
pub const VERSION: u32 = 1;
/// Maximum number of named regions in a block.
pub const MAX_REGIONS: usize = 8;
/// Bytes reserved for a region name (NUL-padded).
pub const REGION_NAME_LEN: usize = 16;

/// Serial port (COM1) base.
pub const PORT_SERIAL: u16 = 0x3f8;
/// Debug-exit port: the byte written becomes the VMM's exit code.
pub const PORT_DEBUG_EXIT: u16 = 0x501;
/// Trace-mark port: the byte written records a named boot trace point.
pub const PORT_TRACE_MARK: u16 = 0x502;
/// Fault port: the probe writes an exception vector here before stopping.
pub const PORT_PROBE_FAULT: u16 = 0x503;
/// Sleep port: the vCPU thread sleeps for the byte written, in milliseconds (capped by
/// the VMM at one slice).
pub const PORT_SLEEP: u16 = 0x504;
/// Longest sleep the probe asks for in one write to [`PORT_SLEEP`]; a longer sleep is a
/// loop of writes, so the VMM's stop requests are seen between them.
pub const SLEEP_SLICE_MS: u64 = 10;
/// Instance port (read): the VM's instance number as a 32-bit little-endian value (0
/// unless the VMM set one, e.g. clone K of a template is K + 1). Clones run the same
/// script from the same memory; this is how each tells itself apart (`fill-id`).
pub const PORT_INSTANCE: u16 = 0x505;

/// Trace mark written when the probe starts running its script.
pub const MARK_PROBE_START: u8 = 0x01;
/// Trace mark written when the probe has finished its script.
pub const MARK_PROBE_DONE: u8 = 0x02;

/// Opcode: write one byte per 4 KiB page of a range.
pub const OP_TOUCH: u32 = 1;
/// Opcode: fill a range with a byte.
pub const OP_WRITE: u32 = 2;
/// Opcode: print the checksum of a range.
pub const OP_SUM: u32 = 3;
/// Opcode: read one byte per 4 KiB page of a range.
pub const OP_READ: u32 = 4;
/// Opcode: end the VM with an exit code.
pub const OP_EXIT: u32 = 5;
/// Opcode: write a trace mark.
pub const OP_MARK: u32 = 6;
/// Opcode: crash deliberately (tests of the VMM's exit handling).
pub const OP_CRASH: u32 = 7;

/// Opcode: ask for a reset through the i8042 controller.
pub const OP_RESET: u32 = 8;
/// Opcode: sleep for `a` milliseconds through the sleep port.
pub const OP_SLEEP: u32 = 9;
/// Opcode: fill a range with the byte `(instance + 1) & 0xff`, the instance read from
/// [`PORT_INSTANCE`].
pub const OP_FILL_ID: u32 = 10;
/// Opcode: fill a range so that each 64-bit word is its guest address times
/// [`FILL_ADDR_MUL`] (no two words alike; does not compress).
pub const OP_FILL_ADDR: u32 = 11;
/// The multiplier of [`OP_FILL_ADDR`].
pub const FILL_ADDR_MUL: u64 = 0x9E37_79B9_7F4A_7C15;

/// Crash kind: empty IDT then `ud2`, a triple fault.
pub const CRASH_TRIPLE_FAULT: u64 = 1;
/// Crash kind: execute from guest-physical memory with no memory behind it.
pub const CRASH_MMIO_EXEC: u64 = 2;
/// Crash kind: `int3` without a handler.
pub const CRASH_INT3: u64 = 3;

/// Size in bytes of one encoded region entry.
pub const REGION_ENTRY_SIZE: usize = 32;
/// Size in bytes of one encoded command.
pub const COMMAND_SIZE: usize = 32;
/// Offset of the command count in the block.
pub const COMMANDS_OFFSET: usize = 24 + MAX_REGIONS * REGION_ENTRY_SIZE;
/// Most commands a block can hold.
pub const MAX_COMMANDS: usize = (BLOCK_SIZE as usize - COMMANDS_OFFSET - 8) / COMMAND_SIZE;

#[cfg(test)]
mod tests {
    use super::*;

    fn header_value(name: &str) -> u64 {
        let header = include_str!("../guest/abi.h");
        let line = header
            .lines()
            .find(|l| l.split_whitespace().nth(1) == Some(name) && l.starts_with("#define"))
            .unwrap_or_else(|| panic!("{name} missing from abi.h"));
        let value = line.split_whitespace().nth(2).unwrap();
        let value = value.trim_end_matches("UL").trim_end_matches('U');
        match value.strip_prefix("0x") {
            Some(hex) => u64::from_str_radix(hex, 16).unwrap(),
            None => value.parse().unwrap(),
        }
    }

    #[test]
    fn rust_and_c_abi_agree() {
        let pairs: &[(&str, u64)] = &[
            ("PROBE_LOAD_ADDR", LOAD_ADDR),
            ("PROBE_MAILBOX_ADDR", MAILBOX_ADDR),
            ("PROBE_BLOCK_ADDR", BLOCK_ADDR),
            ("PROBE_BLOCK_SIZE", BLOCK_SIZE),
            ("PROBE_MAGIC", MAGIC.into()),
            ("PROBE_VERSION", VERSION.into()),
            ("PROBE_MAX_REGIONS", MAX_REGIONS as u64),
            ("PROBE_REGION_NAME", REGION_NAME_LEN as u64),
            ("PORT_SERIAL", PORT_SERIAL.into()),
            ("PORT_DEBUG_EXIT", PORT_DEBUG_EXIT.into()),
            ("PORT_TRACE_MARK", PORT_TRACE_MARK.into()),
            ("PORT_PROBE_FAULT", PORT_PROBE_FAULT.into()),
            ("PORT_SLEEP", PORT_SLEEP.into()),
            ("SLEEP_SLICE_MS", SLEEP_SLICE_MS),
            ("PORT_INSTANCE", PORT_INSTANCE.into()),
            ("MARK_PROBE_START", MARK_PROBE_START.into()),
            ("MARK_PROBE_DONE", MARK_PROBE_DONE.into()),
            ("OP_TOUCH", OP_TOUCH.into()),
            ("OP_WRITE", OP_WRITE.into()),
            ("OP_SUM", OP_SUM.into()),
            ("OP_READ", OP_READ.into()),
            ("OP_EXIT", OP_EXIT.into()),
            ("OP_MARK", OP_MARK.into()),
            ("OP_CRASH", OP_CRASH.into()),
            ("OP_RESET", OP_RESET.into()),
            ("OP_SLEEP", OP_SLEEP.into()),
            ("OP_FILL_ID", OP_FILL_ID.into()),
            ("OP_FILL_ADDR", OP_FILL_ADDR.into()),
            ("FILL_ADDR_MUL", FILL_ADDR_MUL),
            ("CRASH_TRIPLE_FAULT", CRASH_TRIPLE_FAULT),
            ("CRASH_MMIO_EXEC", CRASH_MMIO_EXEC),
            ("CRASH_INT3", CRASH_INT3),
        ];
        for (name, value) in pairs {
            assert_eq!(
                header_value(name),
                *value,
                "{name} differs between abi.h and abi.rs"
            );
        }
    }
}
