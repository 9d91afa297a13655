//! The fuzz entry point of target `snapshot_state` (`fuzz/`, `make fuzz-snapshot`),
//! also replayed by `cargo test -p densevm-vmm` over the committed seed corpus and seeded
//! random and mutated inputs.
//!
//! A snapshot's `state` file is untrusted input (issue #11): `densevm run --restore DIR`
//! reads whatever is there. [`fuzz_snapshot_state`] takes the bytes of a state file through
//! what a restore does with them before it needs KVM: the container decoder
//! ([`file::decode_state`]: magic, version, length, CRC32C), the JSON decode into
//! [`SnapshotState`], the checks of [`read_snapshot`](super::restore::read_snapshot) (CPU
//! model, vCPU count, irqchip, RAM layout) and the legacy devices' and PCI root's own
//! checks of their saved state. No input may panic.

use super::restore::check_state;
use super::SnapshotState;
use crate::persist::{self, file, FORMAT_VERSION, HEADER_LEN, MAGIC, MAX_PAYLOAD};
use densevm_devices::legacy::{Cmos, Serial};
use densevm_devices::pci::PciRoot;
use std::path::Path;
use vmm_sys_util::eventfd::EventFd;

/// The name errors give the fuzzed file.
const NAME: &str = "state";

/// Decodes `data` as a state file and, when it decodes, makes every check a restore makes
/// before it needs KVM. A checksum stops almost every mutation of a payload, so the bytes
/// after the header (or all of `data`, if it does not start with the magic) are also
/// decoded again behind a header that matches them: every input reaches the JSON decoder.
/// Must never panic.
#[doc(hidden)]
pub fn fuzz_snapshot_state(data: &[u8]) {
    run(data);
}

/// [`fuzz_snapshot_state`], returning how many of the (at most two) decodes gave a state.
fn run(data: &[u8]) -> usize {
    let mut decoded = usize::from(state_file(data));
    let payload = if data.len() >= HEADER_LEN && data.starts_with(MAGIC) {
        &data[HEADER_LEN..]
    } else {
        data
    };
    let sealed = seal(payload);
    if sealed != data {
        decoded += usize::from(state_file(&sealed));
    }
    decoded
}

/// `payload` behind the header densevm would write for it.
fn seal(payload: &[u8]) -> Vec<u8> {
    let mut file = Vec::with_capacity(HEADER_LEN + payload.len());
    file.extend_from_slice(MAGIC);
    file.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    file.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    file.extend_from_slice(&crc32c::crc32c(payload).to_le_bytes());
    file.extend_from_slice(payload);
    file
}

/// One state file through the decoder and the checks; whether it decoded.
fn state_file(bytes: &[u8]) -> bool {
    let state: SnapshotState = match file::decode_state(Path::new(NAME), bytes) {
        Ok(state) => state,
        Err(e) => {
            // Every refusal has a message (formatting it must not panic either).
            assert!(!e.to_string().is_empty());
            return false;
        }
    };
    checks(&state);
    round_trip(&state);
    true
}

/// What a restore checks in a decoded state before it creates the VM. The results do not
/// matter here (a fuzzed state is almost never restorable); only that none panics.
fn checks(state: &SnapshotState) {
    if let Err(e) = persist::check_same_cpu(&state.host_cpu) {
        assert!(!e.to_string().is_empty());
    }
    if let Err(e) = check_state(state) {
        assert!(!e.is_empty());
    }
    // DeviceManager::restore: the UART and the CMOS from their saved state.
    if let Ok(irq) = EventFd::new(libc::EFD_NONBLOCK) {
        let _ = Serial::from_state(irq, Box::new(std::io::sink()), &state.legacy.serial);
    }
    if let Some(cmos) = &state.legacy.cmos {
        let _ = Cmos::from_state(cmos);
    }
    // DeviceManager::restore_pci_root, into a root without functions.
    if let Some(pci) = &state.pci {
        if let Err(e) = PciRoot::new().restore_state(pci) {
            assert!(!e.to_string().is_empty());
        }
    }
}

/// A state densevm read encodes again (a restored VM saves what it restored: the device
/// list, the layout) and reads back as the same state.
fn round_trip(state: &SnapshotState) {
    let json = serde_json::to_vec(state).expect("a decoded state encodes again");
    if json.len() as u64 > MAX_PAYLOAD {
        // write_state refuses it with an error.
        return;
    }
    let again: SnapshotState = file::decode_state(Path::new(NAME), &seal(&json))
        .expect("a state densevm encoded decodes again");
    assert_eq!(again.densevm_version, state.densevm_version);
    assert_eq!(again.host_cpu, state.host_cpu);
    assert_eq!(again.memory_bytes, state.memory_bytes);
    assert_eq!(again.regions, state.regions);
    assert_eq!(again.vcpus, state.vcpus);
    assert_eq!(again.legacy.serial.registers, state.legacy.serial.registers);
    assert_eq!(again.legacy.serial.in_buffer, state.legacy.serial.in_buffer);
    assert_eq!(check_state(&again), check_state(state));
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};
    use std::path::PathBuf;

    fn corpus_dir() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/snapshot_state")
    }

    /// The committed seeds, by name.
    fn corpus() -> Vec<(String, Vec<u8>)> {
        let mut seeds: Vec<_> = std::fs::read_dir(corpus_dir())
            .expect("the seed corpus fuzz/corpus/snapshot_state")
            .map(|e| {
                let e = e.unwrap();
                let name = e.file_name().to_string_lossy().into_owned();
                (name, std::fs::read(e.path()).unwrap())
            })
            .collect();
        seeds.sort();
        seeds
    }

    /// The seeds densevm wrote itself (`valid-*`).
    fn valid_seeds() -> Vec<(String, Vec<u8>)> {
        corpus()
            .into_iter()
            .filter(|(name, _)| name.starts_with("valid-"))
            .collect()
    }

    /// Runs one input, naming it if it panics (and leaving it in a file to replay with
    /// `cargo fuzz run snapshot_state FILE`).
    fn replay(what: &str, data: &[u8]) -> usize {
        match std::panic::catch_unwind(|| run(data)) {
            Ok(decoded) => decoded,
            Err(_) => {
                let path = std::env::temp_dir().join(format!(
                    "snapshot_state-crash-{}-{what}",
                    std::process::id()
                ));
                let _ = std::fs::write(&path, data);
                panic!("{what} panicked; the input is in {}", path.display());
            }
        }
    }

    #[test]
    fn the_seed_corpus_replays_and_its_valid_states_decode() {
        let seeds = corpus();
        assert!(seeds.len() >= 20, "only {} seeds", seeds.len());
        for (name, data) in &seeds {
            replay(name, data);
        }
        let valid = valid_seeds();
        assert!(valid.len() >= 3, "{} valid seeds", valid.len());
        for (name, data) in &valid {
            // If this fails, SnapshotState changed: write the seeds again with
            // fuzz/make_snapshot_seeds.py so the fuzzer starts from real state files.
            let state: SnapshotState = file::decode_state(Path::new(name), data)
                .unwrap_or_else(|e| panic!("seed {name}: {e}"));
            check_state(&state).unwrap_or_else(|e| panic!("seed {name}: {e}"));
        }
        // A Linux guest with devices is among them (CMOS, PCI root, virtio functions).
        assert!(valid.iter().any(|(_, data)| {
            let s: SnapshotState = file::decode_state(Path::new(NAME), data).unwrap();
            s.linux && s.pci.is_some() && !s.virtio.is_empty() && s.legacy.cmos.is_some()
        }));
    }

    /// xorshift64*: deterministic, so a failure reproduces.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n.max(1) as u64) as usize
        }
    }

    /// A random node of `v` (objects and arrays included), reached by a random walk.
    fn random_node<'a>(v: &'a mut Value, rng: &mut Rng) -> &'a mut Value {
        let len = match &*v {
            Value::Object(m) => m.len(),
            Value::Array(a) => a.len(),
            _ => 0,
        };
        if len == 0 || rng.below(4) == 0 {
            return v;
        }
        let i = rng.below(len);
        match v {
            Value::Object(m) => random_node(m.values_mut().nth(i).unwrap(), rng),
            Value::Array(a) => random_node(&mut a[i], rng),
            other => other,
        }
    }

    /// A value of a random kind: edge-case numbers, strings, empty and long containers,
    /// deep nesting.
    fn random_value(rng: &mut Rng) -> Value {
        match rng.below(16) {
            0 => Value::Null,
            1 => json!(true),
            2 => json!(0),
            3 => json!(-1),
            4 => json!(u64::MAX),
            5 => json!(i64::MIN),
            6 => json!(1.5e300),
            7 => json!(""),
            8 => json!("ram"),
            9 => json!("\u{0}\u{ffff}é\"\\"),
            10 => json!([]),
            11 => json!({}),
            12 => Value::Array((0..rng.below(5000)).map(|i| json!(i % 256)).collect()),
            13 => Value::Array((0..rng.below(300)).map(|_| json!("")).collect()),
            14 => {
                let mut v = json!(0);
                for _ in 0..rng.below(200) {
                    v = json!([v]);
                }
                v
            }
            _ => json!(rng.next()),
        }
    }

    /// One change to a decoded seed's JSON. Most keep the node's kind (edge-case numbers,
    /// other strings, an element dropped, repeated or cut, a key dropped, a flipped bool),
    /// so that the state often still decodes and the checks after the decoder see it; the
    /// rest put a value of any kind anywhere.
    fn mutate_json(v: &mut Value, rng: &mut Rng) {
        let node = random_node(v, rng);
        if rng.below(4) == 0 {
            *node = random_value(rng);
            return;
        }
        match node {
            Value::Object(m) if !m.is_empty() => {
                let key = m.keys().nth(rng.below(m.len())).unwrap().clone();
                m.remove(&key);
            }
            Value::Array(a) if !a.is_empty() => match rng.below(3) {
                0 => {
                    a.remove(rng.below(a.len()));
                }
                1 => {
                    let i = rng.below(a.len());
                    for _ in 0..1 + rng.below(3) {
                        a.push(a[i].clone());
                    }
                }
                _ => a.truncate(rng.below(a.len())),
            },
            Value::Number(_) => {
                let edges = [0, 1, 0xff, 0x100, 0xffff, 0xffff_ffff, 1 << 32, u64::MAX];
                *node = match rng.below(3) {
                    0 => json!(edges[rng.below(edges.len())]),
                    1 => json!(rng.next() >> rng.below(64)),
                    _ => json!(-(rng.below(1000) as i64)),
                };
            }
            Value::String(s) => match rng.below(3) {
                0 => s.clear(),
                1 => s.push_str("\u{0}é\""),
                _ => *s = ["ram", "ram.1", "kernel.0", "initrd"][rng.below(4)].into(),
            },
            Value::Bool(b) => *b = !*b,
            other => *other = random_value(rng),
        }
    }

    /// 2,000 inputs from a fixed seed: structural JSON mutations of the valid seeds (sealed
    /// behind a right header), byte mutations and truncations of whole state files, and
    /// random bytes with and without the magic. None may panic, and a good share of the
    /// structural ones must still decode, so the checks after the decoder run too.
    #[test]
    fn seeded_random_and_mutated_inputs_never_panic() {
        let valid = valid_seeds();
        let parsed: Vec<Value> = valid
            .iter()
            .map(|(_, data)| serde_json::from_slice(&data[HEADER_LEN..]).unwrap())
            .collect();
        let mut rng = Rng(0x5eed_0f5a_4e57_a7e5);
        let mut decoded = 0;
        let mut structural = 0;
        for round in 0..2000 {
            let pick = rng.below(valid.len());
            let file = &valid[pick].1;
            let (what, data) = match round % 5 {
                0 | 1 => {
                    structural += 1;
                    let mut v = parsed[pick].clone();
                    for _ in 0..1 + rng.below(2) {
                        mutate_json(&mut v, &mut rng);
                    }
                    ("json", seal(&serde_json::to_vec(&v).unwrap()))
                }
                2 => {
                    let mut b = file.clone();
                    for _ in 0..1 + rng.below(8) {
                        let i = rng.below(b.len());
                        b[i] = rng.next() as u8;
                    }
                    ("bytes", b)
                }
                3 => {
                    let len = rng.below(file.len());
                    ("truncated", file[..len].to_vec())
                }
                _ => {
                    let mut b: Vec<u8> = (0..rng.below(600)).map(|_| rng.next() as u8).collect();
                    if rng.below(2) == 0 && b.len() >= HEADER_LEN {
                        b[..16].copy_from_slice(MAGIC);
                        b[16..20].copy_from_slice(&FORMAT_VERSION.to_le_bytes());
                    }
                    ("random", b)
                }
            };
            let n = replay(&format!("round-{round}-{what}"), &data);
            if what == "json" && n > 0 {
                decoded += 1;
            }
        }
        println!("{decoded} of {structural} mutated states decoded");
        assert!(
            decoded * 8 >= structural,
            "only {decoded} of {structural} mutated states decoded"
        );
    }

    /// The checks after the decoder refuse what read_snapshot refuses, with its messages.
    #[test]
    fn check_state_refuses_what_a_restore_refuses() {
        let valid = valid_seeds();
        let (_, probe) = valid
            .iter()
            .find(|(name, _)| name.contains("probe"))
            .expect("a probe seed");
        let state: SnapshotState = file::decode_state(Path::new(NAME), probe).unwrap();
        assert_eq!(check_state(&state), Ok(()));
        let mut s = state.clone();
        s.vcpus.clear();
        assert_eq!(
            check_state(&s).unwrap_err(),
            "0 vCPUs saved (1..=254 allowed)"
        );
        let mut s = state.clone();
        s.vcpus = vec![state.vcpus[0].clone(); 255];
        assert!(check_state(&s).unwrap_err().starts_with("255 vCPUs"));
        let mut s = state.clone();
        s.linux = true;
        s.irqchip = false;
        assert!(check_state(&s).unwrap_err().contains("without its irqchip"));
        let mut s = state.clone();
        for r in &mut s.regions {
            r.name = format!("not-{}", r.name);
        }
        assert!(check_state(&s).unwrap_err().contains("no RAM region"));
    }
}
