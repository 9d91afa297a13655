//! The probe script language: `;`-separated commands such as
//! `touch 64M; write pmem0 0 1M 0xab; sum ram 0 1M; exit 0`.

use thiserror::Error;

/// A script that could not be parsed.
#[derive(Debug, Error, PartialEq, Eq)]
#[error("probe script command {index} (`{command}`): {reason}")]
pub struct ScriptError {
    /// 1-based position of the command in the script.
    pub index: usize,
    /// The command text as written.
    pub command: String,
    /// What is wrong with it.
    pub reason: String,
}

/// How the probe crashes on purpose (tests of the VMM's exit handling).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CrashKind {
    /// Empty IDT, then `ud2`: a triple fault (KVM_EXIT_SHUTDOWN).
    TripleFault,
    /// Jump into guest-physical memory with nothing behind it.
    MmioExec,
    /// `int3` with no handler installed.
    Int3,
}

/// A range inside a named guest region.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Range {
    /// Region name: `ram` or a named region such as `pmem0`.
    pub region: String,
    /// Byte offset inside the region.
    pub offset: u64,
    /// Length in bytes.
    pub len: u64,
}

/// One probe command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Write one byte in every 4 KiB page of the range (split over all vCPUs).
    Touch(Range),
    /// Read one byte in every 4 KiB page of the range (split over all vCPUs).
    Read(Range),
    /// Fill the range with a byte.
    Write(Range, u8),
    /// Fill the range with the byte `(instance + 1) & 0xff`, where the instance is the
    /// number the VMM gave this VM (0 unless set; clone K of a template gets K + 1), so
    /// that VMs running one script from one memory image write different data.
    FillId(Range),
    /// Fill the range so that each 64-bit word is its guest address times
    /// [`crate::abi::FILL_ADDR_MUL`]: every word differs and nothing compresses.
    FillAddr(Range),
    /// Print `sum REGION OFFSET LEN = HEX` (FNV-1a over little-endian 64-bit words).
    Sum(Range),
    /// Record a guest trace mark.
    Mark(u8),
    /// Crash deliberately.
    Crash(CrashKind),
    /// End the VM; the VMM exits with this code.
    Exit(u8),
    /// Ask for a reset through the i8042 controller (densevm ends the VM, exit code 0).
    Reset,
    /// Idle for this many milliseconds (at most [`MAX_SLEEP_MS`]) with the vCPU thread
    /// asleep on the host, e.g. to keep a VM's memory mapped while the host inspects it.
    Sleep(u64),
}

/// Longest `sleep` a script may ask for, in milliseconds (one minute).
pub const MAX_SLEEP_MS: u64 = 60_000;

/// Parses a size or offset: decimal, `0x` hex, or with a K/M/G (binary) suffix.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    if t.is_empty() {
        return Err("empty size".into());
    }
    if let Some(hex) = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        return u64::from_str_radix(hex, 16).map_err(|_| format!("`{t}` is not a hex number"));
    }
    let (digits, shift) = match t.as_bytes()[t.len() - 1].to_ascii_uppercase() {
        b'K' => (&t[..t.len() - 1], 10),
        b'M' => (&t[..t.len() - 1], 20),
        b'G' => (&t[..t.len() - 1], 30),
        b'T' => (&t[..t.len() - 1], 40),
        _ => (t, 0),
    };
    let value: u64 = digits
        .parse()
        .map_err(|_| format!("`{t}` is not a size (use e.g. 4096, 0x1000, 64K, 256M, 2G)"))?;
    value
        .checked_mul(1u64 << shift)
        .ok_or_else(|| format!("`{t}` is too large"))
}

fn parse_byte(text: &str) -> Result<u8, String> {
    let v = parse_size(text)?;
    u8::try_from(v).map_err(|_| format!("`{text}` does not fit in a byte (0..=255)"))
}

fn parse_range(args: &[&str], name: &str) -> Result<Range, String> {
    match args {
        [region, offset, len] => Ok(Range {
            region: region.to_string(),
            offset: parse_size(offset)?,
            len: parse_size(len)?,
        }),
        _ => Err(format!("usage: {name} REGION OFFSET LEN")),
    }
}

fn parse_command(text: &str) -> Result<Command, String> {
    let words: Vec<&str> = text.split_whitespace().collect();
    let (verb, args) = words.split_first().ok_or("empty command")?;
    match *verb {
        "touch" => match args {
            [size] => Ok(Command::Touch(Range {
                region: "ram".into(),
                offset: 0,
                len: parse_size(size)?,
            })),
            _ => parse_range(args, "touch SIZE | touch").map(Command::Touch),
        },
        "read" => parse_range(args, "read").map(Command::Read),
        "sum" => parse_range(args, "sum").map(Command::Sum),
        "fill-id" => parse_range(args, "fill-id").map(Command::FillId),
        "fill-addr" => parse_range(args, "fill-addr").map(Command::FillAddr),
        "write" => match args {
            [region, offset, len, byte] => Ok(Command::Write(
                parse_range(&[region, offset, len], "write")?,
                parse_byte(byte)?,
            )),
            _ => Err("usage: write REGION OFFSET LEN BYTE".into()),
        },
        "mark" => match args {
            [id] => Ok(Command::Mark(parse_byte(id)?)),
            _ => Err("usage: mark ID".into()),
        },
        "exit" => match args {
            [code] => Ok(Command::Exit(parse_byte(code)?)),
            _ => Err("usage: exit CODE".into()),
        },
        "sleep" => match args {
            [ms] => {
                let ms: u64 = ms
                    .parse()
                    .map_err(|_| format!("`{ms}` is not a number of milliseconds"))?;
                if ms > MAX_SLEEP_MS {
                    return Err(format!(
                        "{ms} ms is longer than the {MAX_SLEEP_MS} ms a sleep may last"
                    ));
                }
                Ok(Command::Sleep(ms))
            }
            _ => Err("usage: sleep MS".into()),
        },
        "reset" => match args {
            [] => Ok(Command::Reset),
            _ => Err("usage: reset".into()),
        },
        "crash" => match args {
            ["triple-fault"] => Ok(Command::Crash(CrashKind::TripleFault)),
            ["mmio-exec"] => Ok(Command::Crash(CrashKind::MmioExec)),
            ["int3"] => Ok(Command::Crash(CrashKind::Int3)),
            _ => Err("usage: crash triple-fault|mmio-exec|int3".into()),
        },
        other => Err(format!(
            "unknown command `{other}` (known: touch, read, write, fill-id, fill-addr, sum, mark, sleep, crash, reset, exit)"
        )),
    }
}

/// Parses a whole script. Empty commands (`;;`, trailing `;`) are ignored.
pub fn parse_script(script: &str) -> Result<Vec<Command>, ScriptError> {
    script
        .split([';', '\n'])
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .enumerate()
        .map(|(i, text)| {
            parse_command(text).map_err(|reason| ScriptError {
                index: i + 1,
                command: text.to_string(),
                reason,
            })
        })
        .collect()
}

/// The checksum the probe prints for `sum`: FNV-1a over little-endian 64-bit words,
/// the last partial word zero-padded. Host-side tests use it to check guest data.
pub fn probe_checksum(data: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for chunk in data.chunks(8) {
        let mut word = [0u8; 8];
        word[..chunk.len()].copy_from_slice(chunk);
        h ^= u64::from_le_bytes(word);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("0x1000"), Ok(4096));
        assert_eq!(parse_size("64K"), Ok(65536));
        assert_eq!(parse_size("256M"), Ok(256 << 20));
        assert_eq!(parse_size("2G"), Ok(2 << 30));
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("99999999999999G").is_err());
    }

    #[test]
    fn full_script() {
        let cmds = parse_script("touch 64M; write pmem0 0 1M 0xab; sum ram 0 1M; exit 3;").unwrap();
        assert_eq!(cmds.len(), 4);
        assert_eq!(
            cmds[1],
            Command::Write(
                Range {
                    region: "pmem0".into(),
                    offset: 0,
                    len: 1 << 20
                },
                0xab
            )
        );
        assert_eq!(cmds[3], Command::Exit(3));
    }

    #[test]
    fn errors_name_the_command() {
        let err = parse_script("touch 1M; wrte ram 0 1 2").unwrap_err();
        assert_eq!(err.index, 2);
        assert!(err.to_string().contains("unknown command `wrte`"));
        assert!(parse_script("exit 256").is_err());
        assert!(parse_script("write ram 0 1").is_err());
    }

    #[test]
    fn fill_id_takes_a_range_and_no_byte() {
        assert_eq!(
            parse_script("fill-id ram 9M 1M; fill-id pmem0 0x1000 4K").unwrap(),
            vec![
                Command::FillId(Range {
                    region: "ram".into(),
                    offset: 9 << 20,
                    len: 1 << 20
                }),
                Command::FillId(Range {
                    region: "pmem0".into(),
                    offset: 0x1000,
                    len: 4096
                }),
            ]
        );
        let err = parse_script("fill-id ram 9M 1M 0x02").unwrap_err();
        assert!(
            err.reason.contains("usage: fill-id REGION OFFSET LEN"),
            "{err}"
        );
        assert!(parse_script("fill-id ram 9M").is_err());
        assert!(parse_script("fill-id 1M").is_err());
        assert!(parse_script("fill-id ram 9Q 1M").is_err());
        assert!(parse_script("fillid ram 0 1")
            .unwrap_err()
            .reason
            .contains("fill-id"));
    }

    #[test]
    fn sleep_takes_bounded_milliseconds() {
        assert_eq!(
            parse_script("sleep 250; sleep 0; sleep 60000").unwrap(),
            vec![
                Command::Sleep(250),
                Command::Sleep(0),
                Command::Sleep(60_000)
            ]
        );
        let err = parse_script("sleep 60001").unwrap_err();
        assert!(err.reason.contains("longer than the 60000 ms"), "{err}");
        assert!(parse_script("sleep").is_err());
        assert!(parse_script("sleep 1 2").is_err());
        assert!(parse_script("sleep 1s").is_err());
        assert!(parse_script("sleep -1").is_err());
    }

    #[test]
    fn checksum_pads_the_tail() {
        assert_ne!(
            probe_checksum(&[1, 2, 3]),
            probe_checksum(&[1, 2, 3, 0, 0, 0, 0, 0, 9])
        );
        assert_eq!(
            probe_checksum(&[1, 2, 3]),
            probe_checksum(&[1, 2, 3, 0, 0, 0, 0, 0])
        );
    }
}
