//! The `codec` fuzz target's corpus (`fuzz/corpus/codec`), then seeded random and mutated
//! inputs, through its entry point.

use std::path::Path;

fn next(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

#[test]
fn corpus_and_mutations_replay() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/codec");
    let mut corpus = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("fuzz/corpus/codec") {
        corpus.push(std::fs::read(entry.unwrap().path()).unwrap());
    }
    assert!(
        corpus.len() >= 10,
        "only {} inputs in {}",
        corpus.len(),
        dir.display()
    );
    for c in &corpus {
        densevm_9p::fuzz::codec(c);
    }
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for i in 0..3000 {
        let mut v = corpus[i % corpus.len()].clone();
        for _ in 0..1 + next(&mut x) % 6 {
            let n = v.len().max(1);
            let at = (next(&mut x) as usize) % n;
            match next(&mut x) % 3 {
                0 if !v.is_empty() => v[at] = next(&mut x) as u8,
                1 => v.insert(at.min(v.len()), next(&mut x) as u8),
                _ => v.truncate(at),
            }
        }
        densevm_9p::fuzz::codec(&v);
        let len = (next(&mut x) % 64) as usize;
        let random: Vec<u8> = (0..len).map(|_| next(&mut x) as u8).collect();
        densevm_9p::fuzz::codec(&random);
    }
}
