//! The probe guest: a small freestanding x86_64 program, built from `guest/` by this
//! crate's build script, that runs memory workloads described by a script. The VMM loads
//! [`PROBE_IMAGE`] at [`abi::LOAD_ADDR`] and the encoded command block at
//! [`abi::BLOCK_ADDR`], then starts every vCPU at the image in 64-bit mode.

pub mod abi;
pub mod block;
pub mod script;

pub use block::{encode_block, BlockError, Region};
pub use script::{
    parse_script, parse_size, probe_checksum, Command, CrashKind, Range, ScriptError, MAX_SLEEP_MS,
};

/// The flat probe image, linked to run at [`abi::LOAD_ADDR`].
pub static PROBE_IMAGE: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/probe.bin"));

#[cfg(test)]
mod tests {
    #[test]
    fn image_is_built_and_small() {
        assert!(super::PROBE_IMAGE.len() > 256);
        assert!((super::PROBE_IMAGE.len() as u64) < super::abi::BLOCK_SIZE * 64);
    }
}
