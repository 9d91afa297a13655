//! Fills every `EVERY`-th cluster (`CLUSTER` bytes) of an existing pcow overlay with the
//! byte `(i / EVERY) % 251 + 1`, i = cluster number — the same writes
//! `qemu-io -c "write -P BYTE OFFSET CLUSTER"` makes in a qcow2 overlay. Used by
//! `scripts/bench-convert.sh`: `bench_overlay OVERLAY.pcow EVERY CLUSTER`.

use std::path::Path;

use pcow::{Chain, OpenOptions};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() != 4 {
        eprintln!("usage: bench_overlay OVERLAY.pcow EVERY CLUSTER");
        std::process::exit(2);
    }
    let every: u64 = args[2].parse().expect("EVERY is a number");
    let cs: u64 = args[3].parse().expect("CLUSTER is a number of bytes");
    let opts = OpenOptions {
        writable: true,
        ..Default::default()
    };
    let mut chain = Chain::open(Path::new(&args[1]), opts).expect("open overlay");
    let n = chain.virtual_size() / cs;
    let data: Vec<(u64, Vec<u8>)> = (0..n)
        .step_by(every as usize)
        .map(|i| (i * cs, vec![((i / every) % 251 + 1) as u8; cs as usize]))
        .collect();
    for batch in data.chunks(512) {
        let parts: Vec<(u64, &[u8])> = batch.iter().map(|(o, d)| (*o, d.as_slice())).collect();
        chain.write_vectored(&parts).expect("write");
    }
    chain.flush().expect("flush");
}
